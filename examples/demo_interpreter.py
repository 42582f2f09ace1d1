"""Part of `make demo`: the Triton implementations, dispatched on a CPU under the interpreter.

Run with TRITON_INTERPRET=1 in the environment (examples/demo.py does), so the generic Triton
kernels are eligible on the CPU; each result is checked against the reference here.
"""

from __future__ import annotations

import torch

import registry
from backends.indexer_topk.reference import indexer_topk_reference
from backends.sparse_prefill.reference import sparse_prefill_reference

gen = torch.Generator().manual_seed(0)
q = torch.randn(16, 6, 64, generator=gen)
k = torch.randn(128, 1, 64, generator=gen)
v = torch.randn(128, 1, 64, generator=gen)
idx = torch.randint(-4, 132, (16, 40), generator=gen, dtype=torch.int32)  # some out of range
with registry.record() as launches:
    out = registry.dispatch("sparse_prefill", q, k, v, idx, kind="prefill")
ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx, kind="prefill")
print(f"  {launches[0]}\n    max abs err vs the float64 reference: "
      f"{(out.double() - ref).abs().max().item():.1e}")

scores = torch.randn(4, 4096, generator=gen)
scores[1] = 0.0  # a row of ties
lengths = torch.tensor([10, 4096, 3000, 2049], dtype=torch.int32)
with registry.record() as launches:
    top = registry.dispatch("indexer_topk", scores, lengths, k=2048)
exact = torch.equal(top, indexer_topk_reference(scores, lengths, 2048))
print(f"  {launches[0].op} -> {launches[0].implementation}\n    exact against the reference "
      f"(entry by entry): {exact}")
if not exact:
    raise SystemExit("indexer_topk differs from the reference")
