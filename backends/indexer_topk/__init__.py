"""The ``indexer_topk`` op: its contract, workload and hook registration.

``dispatch("indexer_topk", scores, lengths, k=2048)``: scores ``[rows, max_keys]`` float32,
bfloat16 or float16, lengths ``[rows]`` int32. Returns int32 ``[rows, k]``: for each row the exact
top-k of its first ``lengths[r]`` scores by (score descending, position ascending), emitted in
ascending position order, padded with -1 when a row has fewer than k valid keys. NaN ranks below
-inf; +inf and -inf are ordinary values. No approximation, no dropped candidates on ties.

**Inputs** (:func:`check_inputs`, which the reference and the Triton kernels run at their entry,
and a plugin's kernel should too; it raises :class:`registry.errors.WorkloadError` naming the
argument, the rule and the fix): ``scores`` a 2-D float32 / bfloat16 / float16 tensor with unit
stride along keys (the row stride is free); ``lengths`` an int32 tensor ``[rows]`` on scores'
device, any stride, each entry in ``[0, max_keys]``; ``k`` a python int >= 1. Metadata only,
never a device read: the ``lengths`` values are checked where they are in host memory (a CPU
tensor); on a GPU they are not read, and an entry outside ``[0, max_keys]`` counts as its clamp
(the reference's rule), never as an error.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from backends.indexer_topk.config import check_inputs
from registry import Contract, OpSpec, Workload, hookimpl
from registry.errors import WorkloadError
from registry.requirements import triton_runtime

OP = "indexer_topk"

__all__ = ["OP", "IndexerTopkWorkload", "call_key", "check_inputs", "decode_key"]


class IndexerTopkWorkload(Workload):
    op = OP

    k: int = Field(ge=1, description="keys selected per row")
    num_rows: int = Field(ge=0, description="scores.shape[0]")
    max_keys: int = Field(ge=0, description="scores.shape[1]")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(description="scores.dtype")


def call_key(scores: Any, lengths: Any, k: int = 2048) -> tuple[Any, ...]:
    """``(op, device index, k, scores.shape, scores.dtype)``; never reads device memory.
    :func:`decode_key` derives the workload on the miss path."""
    try:
        return (OP, scores.get_device(), k, scores.shape, scores.dtype)
    except AttributeError:
        raise WorkloadError(f"indexer_topk expects scores, a tensor [rows, max_keys]; got "
                            f"{type(scores).__name__}") from None


def decode_key(rest: tuple[Any, ...]) -> tuple[Any, ...]:
    """The workload's field values from a :func:`call_key` tail (the miss path)."""
    k, shape, dtype = rest
    try:
        rows, keys = shape
    except ValueError:
        raise WorkloadError(f"indexer_topk expects scores [rows, max_keys]; got "
                            f"{list(shape)}") from None
    return (k, rows, keys, str(dtype).removeprefix("torch."))


# Every kernel of the op returns the one defined answer (membership by score then position,
# ascending order, -1 padding): exact, hence deterministic and batch-invariant.
EXACT = Contract(exact=True)

SPEC = OpSpec(name=OP, workload_model=IndexerTopkWorkload, call_key=call_key,
              decode_key=decode_key,
              reference="reference.indexer_topk", error_bound=lambda dtype: 0.0,
              tuner="backends.indexer_topk.tuning",
              compare="backends.indexer_topk.compare:compare",
              conformance="backends.indexer_topk.conformance",
              bench="backends.indexer_topk.bench:bench_command",
              tuned_kernel="backends.indexer_topk.triton_kernels:indexer_topk_triton",
              point_fields=("num_rows", "max_keys"),
              measured_requirements=(triton_runtime(),),
              custom_op="backends.indexer_topk.torch_op",
              batch_fields=("num_rows",), batch_reference={"num_rows": 1024},
              kernel_contract=EXACT,
              doc=(__doc__ or "").strip().splitlines()[0])


@hookimpl
def kreg_ops() -> list[OpSpec]:
    return [SPEC]
