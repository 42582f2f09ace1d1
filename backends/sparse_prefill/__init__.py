"""The ``sparse_prefill`` op: its contract, workload and hook registration.

Query rows attend only to per-row selected KV slots (online softmax, GQA). Two kinds:

* ``prefill`` — ``dispatch("sparse_prefill", q, k, v, indices, kind="prefill", lengths=None,
  sm_scale=None)``; q ``[total_q, num_q_heads, head_dim]``, k/v ``[num_slots, num_kv_heads,
  head_dim]``, indices ``[total_q, topk]`` int32 slot ids shared by all KV heads (query head j reads
  KV head ``j // group_size``), lengths ``[total_q]`` int32 valid leading entries.
* ``chunk`` — rows continue a cached prefix: the same plus ``cu_seqlens_q`` ``[num_requests + 1]``
  int32, ``prefix_lens`` ``[num_requests]`` int32, ``page_table`` ``[num_requests, max_pages]``
  int32, ``page_size`` (host int, default 1) and ``max_q`` (host int: the longest request's row
  count; required, because kreg never reads ``cu_seqlens_q`` from the device). Row r of request
  b sits at position ``prefix_lens[b] + r - cu_seqlens_q[b]``; its indices are token positions of
  request b, valid when ``0 <= t <= position``, translated to slot
  ``page_table[b, t // page_size] * page_size + t % page_size``.

Negative or out-of-range indices and entries past ``lengths`` are skipped; a row with nothing
valid yields zeros. The output has q's shape and dtype.

The workload's ``kv_len`` (the number of KV slots the rows index) comes from shapes only, never
from device memory: for ``prefill`` it is ``k.shape[0]`` (num_slots); for ``chunk`` it is
``page_table.shape[1] * page_size``, the longest context a request's page table can address
(the true per-request context lengths live in ``prefix_lens`` on the device, which kreg never
reads). A framework that sizes its page table for the model's longest context therefore gets that
length, whatever the batch's contexts. A call with no KV slots (an empty ``k`` or page table)
derives ``kv_len=None``; ``registry.select`` dicts may leave it out (None: unknown).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from backends.sparse_prefill.guarantees import kernel_contract
from registry import OpSpec, Workload, hookimpl
from registry.errors import WorkloadError
from registry.requirements import grid_bound, triton_runtime, when

OP = "sparse_prefill"

__all__ = ["OP", "SparsePrefillWorkload", "call_key", "decode_key", "error_bound"]


class SparsePrefillWorkload(Workload):
    op = OP

    kind: Literal["prefill", "chunk"] = Field(description="prefill (prefix-free) or chunk")
    topk: int = Field(ge=1, description="selected KV slots per query row (indices.shape[1])")
    head_dim: int = Field(ge=1, le=1024, description="q.shape[2]")
    group_size: int = Field(ge=1, description="query heads per KV head")
    num_kv_heads: int = Field(ge=1, description="k.shape[1]")
    total_q: int = Field(ge=0, description="query rows in the batch (q.shape[0])")
    num_requests: int = Field(ge=1, description="requests in the batch")
    max_q: int = Field(ge=0, description="the longest request's query rows")
    dtype: Literal["float16", "bfloat16", "float32", "float64"] = Field(description="q.dtype")
    kv_len: int | None = Field(
        default=None, ge=1,
        description="KV slots the rows index: k.shape[0] for prefill, page_table.shape[1] * "
                    "page_size (the longest context a page table addresses) for chunk; None when "
                    "not given (unknown)")

    @model_validator(mode="after")
    def _consistent(self) -> SparsePrefillWorkload:
        if self.max_q > self.total_q:
            raise ValueError(f"max_q={self.max_q} exceeds total_q={self.total_q}: the longest "
                             f"request cannot have more rows than the batch")
        if self.max_q * self.num_requests < self.total_q:
            raise ValueError(f"max_q={self.max_q} * num_requests={self.num_requests} < "
                             f"total_q={self.total_q}: max_q must be the longest request's rows")
        return self


def error_bound(dtype: str) -> float:
    """Max-abs error bound against the fp32 reference (the seed's 2e-2 for bf16)."""
    return {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-3, "float64": 1e-6}[dtype]


_CALL_KEYWORDS = frozenset({"lengths", "sm_scale", "cu_seqlens_q", "prefix_lens", "page_table",
                            "page_size", "max_q"})


def call_key(q: Any, k: Any, v: Any, indices: Any, kind: str = "prefill",
             **kw: Any) -> tuple[Any, ...]:
    """``(op, device index, kind, q.shape, k.shape, topk, q.dtype, num_requests, max_q
    [, page_table.shape, page_size])`` from shapes and host arguments (the page-table pair for
    kind ``chunk`` only); never reads device memory. :func:`decode_key` derives the workload
    (group size, kv_len, dtype name) and validates it, once per key, on the miss path.

    This is the dispatch hot path: every tensor attribute read costs ~0.1 us, so each is read
    once (``k.shape`` whole rather than ``k.shape[0]`` and ``k.shape[1]``) and nothing is derived
    here; the keywords arrive as one dict (eight keyword defaults cost ~0.2 us more per call);
    unknown keywords are refused all the same.
    """
    if kw and not kw.keys() <= _CALL_KEYWORDS:
        raise WorkloadError(f"sparse_prefill got unknown keyword(s) "
                            f"{sorted(kw.keys() - _CALL_KEYWORDS)}; accepted: kind, "
                            f"{', '.join(sorted(_CALL_KEYWORDS))}")
    try:
        if kind == "prefill":
            return (OP, q.get_device(), kind, q.shape, k.shape, indices.shape[1], q.dtype,
                    1, None)
        if kind == "chunk":
            cu_seqlens_q, max_q = kw.get("cu_seqlens_q"), kw.get("max_q")
            page_table = kw.get("page_table")
            if cu_seqlens_q is None or max_q is None or page_table is None:
                raise WorkloadError("sparse_prefill kind='chunk' needs cu_seqlens_q="
                                    "[num_requests+1] int32, page_table=[num_requests, "
                                    "max_pages] int32 and max_q=<longest request's rows> "
                                    "(a host int: kreg never reads cu_seqlens_q from the device)")
            return (OP, q.get_device(), kind, q.shape, k.shape, indices.shape[1], q.dtype,
                    cu_seqlens_q.shape[0] - 1, max_q, page_table.shape, kw.get("page_size", 1))
    except (AttributeError, IndexError):
        _bad_shapes(q, k, indices)
    raise WorkloadError(f"sparse_prefill kind={kind!r} is not one of 'prefill', 'chunk'")


def decode_key(rest: tuple[Any, ...]) -> tuple[Any, ...]:
    """The workload's field values from a :func:`call_key` tail (the miss path)."""
    kind, q_shape, k_shape, topk, dtype, num_requests, max_q, *paging = rest
    try:
        total_q, hq, d = q_shape
    except ValueError:
        raise WorkloadError(f"sparse_prefill expects q [total_q, num_q_heads, head_dim]; got q "
                            f"{list(q_shape)}") from None
    if len(k_shape) < 2:
        raise WorkloadError(f"sparse_prefill expects k/v [num_slots, num_kv_heads, head_dim]; "
                            f"got k {list(k_shape)}")
    num_slots, hk = k_shape[0], k_shape[1]
    if hk < 1 or hq % hk:
        raise WorkloadError(f"group_size: num_q_heads={hq} is not a multiple of "
                            f"num_kv_heads={hk}; every KV head must serve the same number of "
                            "query heads")
    if paging:
        pt_shape, page_size = paging
        if len(pt_shape) != 2:
            raise WorkloadError(f"sparse_prefill kind='chunk' expects page_table [num_requests, "
                                f"max_pages]; got page_table {list(pt_shape)}")
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
            raise WorkloadError(f"sparse_prefill page_size={page_size!r}: must be a python int "
                                ">= 1 (tokens per page; 1 for an unpaged cache)")
        kv_len = pt_shape[1] * page_size
    else:
        kv_len = num_slots
    return (kind, topk, d, hq // hk, hk, total_q, num_requests,
            total_q if max_q is None else max_q, str(dtype).removeprefix("torch."),
            kv_len or None)  # no KV slots at all (an empty batch): kv_len unknown


def _bad_shapes(q: Any, k: Any, indices: Any) -> None:
    raise WorkloadError(
        "sparse_prefill expects q [total_q, num_q_heads, head_dim], k/v [num_slots, "
        f"num_kv_heads, head_dim] and indices [total_q, topk]; got q {_shape(q)}, "
        f"k {_shape(k)}, indices {_shape(indices)}")


def _shape(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return str(list(shape)) if shape is not None else type(x).__name__


SPEC = OpSpec(name=OP, workload_model=SparsePrefillWorkload, call_key=call_key,
              decode_key=decode_key,
              reference="reference.sparse_prefill", error_bound=error_bound,
              tuner="backends.sparse_prefill.tuning",
              compare="backends.sparse_prefill.compare:compare",
              conformance="backends.sparse_prefill.conformance",
              bench="backends.sparse_prefill.bench:bench_command",
              tuned_kernel="backends.sparse_prefill.triton_kernels:sparse_prefill_triton",
              # The best config depends on the KV length (on the H200 the table wins at KV 8K
              # where the family wins at 32K and 128K): entries are kept per kv_len.
              point_fields=("kv_len", "total_q"), later_point_fields=("kv_len",),
              unmatched_fields=("kv_len", "total_q", "num_requests", "max_q"),
              # Tuned on uniform batches: skewed chunk batches stay off, as the seed's grid
              # bound keeps them off its family.
              measured_requirements=(triton_runtime(), when("kind", "chunk", grid_bound(2))),
              custom_op="backends.sparse_prefill.torch_op",
              # Batch-invariant selection decides at the seed's measurement point (8192 rows of
              # one request: where every family's envelope was measured).
              batch_fields=("total_q", "num_requests", "max_q"),
              batch_reference={"total_q": 8192, "num_requests": 1, "max_q": 8192},
              kernel_contract=kernel_contract,
              doc=(__doc__ or "").strip().splitlines()[0])


@hookimpl
def kreg_ops() -> list[OpSpec]:
    return [SPEC]
