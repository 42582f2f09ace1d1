"""compute-sanitizer target: the one-read streaming select (``backends/indexer_topk/stream.py``)
on small batches of every distribution at 131072 keys (full, short and ragged rows), in three
dtypes, an unaligned view, rows that mislead the sample (the retry reads), rows of fewer than k
keys and of exactly the sample's size, each checked against the reference."""
import sys

import torch

from backends.indexer_topk import stream
from backends.indexer_topk.distributions import make_scores
from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches

n, k = 131072, 2048
bad = 0


def check(label, s, ln, kk=k):
    global bad
    mm = topk_mismatches(stream.indexer_topk_stream(s, ln, kk), indexer_topk_reference(s, ln, kk))
    bad += bool(mm)
    print(label, "exact" if not mm else mm[0], flush=True)


for name in sys.argv[1].split(","):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        s = make_scores(name, 3, n, dtype=dtype, seed=2, device="cuda")
        check(f"{name} {dtype}", s, torch.tensor([n, n - 3, 3 * k], dtype=torch.int32,
                                                 device="cuda"))
wide = torch.randn(2, n + 1, device="cuda")
check("unaligned", wide[:, 1:], torch.tensor([n, n - 5], dtype=torch.int32, device="cuda"))
pos = torch.tensor(stream.sample_positions(n), device="cuda")
s = torch.randn(2, n, device="cuda")
s[0, pos] = 100.0 + torch.rand(pos.numel(), device="cuda")   # too few above the threshold
s[1] = torch.randn(n, device="cuda")
hidden = torch.ones(n, dtype=torch.bool, device="cuda")
hidden[pos] = False
idx = hidden.nonzero().flatten()[:9000]
s[1, idx] = 50.0                                             # too many
check("misleading samples", s, torch.full((2,), n, dtype=torch.int32, device="cuda"))
check("short rows", torch.randn(3, 8192, device="cuda"),
      torch.tensor([8192, 5000, 1000], dtype=torch.int32, device="cuda"))
torch.cuda.synchronize()
sys.exit(1 if bad else 0)
