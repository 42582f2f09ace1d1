"""The torch references of every op: eligible wherever torch runs; priority 0 (the fallback)."""

from __future__ import annotations

from registry import Contract, DeviceFacts, Implementation, Workload, hookimpl
from registry.requirements import CAPABILITY, predicate

PRIORITY = 0


def _torch(f: DeviceFacts, w: Workload) -> tuple[bool, str, str]:
    return bool(f.torch_version), f"torch {f.torch_version or 'not installed'}", "torch installed"


TORCH = predicate("torch", CAPABILITY, _torch)


@hookimpl
def kreg_implementations() -> list[Implementation]:
    return [
        Implementation(op="sparse_prefill", name="reference.sparse_prefill", priority=PRIORITY,
                       requirements=(TORCH,), configurable=False, fallback=True,
                       kernel="backends.sparse_prefill.reference:sparse_prefill_reference",
                       # Not batch-invariant: it runs rows in chunks sized by the batch, and a
                       # batched matmul of another size may take another kernel (cuBLAS, MKL).
                       contract=Contract(deterministic=True),
                       description="torch reference: fp32 online-softmax over gathered slots"),
        Implementation(op="indexer_topk", name="reference.indexer_topk", priority=PRIORITY,
                       requirements=(TORCH,), configurable=False, fallback=True,
                       kernel="backends.indexer_topk.reference:indexer_topk_reference",
                       contract=Contract(exact=True),
                       description="torch reference: exact sort by (score desc, position asc)"),
    ]
