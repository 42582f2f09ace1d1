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

**Inputs** (:func:`check_inputs`, which the reference, the Triton and Gluon kernels and any
plugin's kernel run at their entry, and which raises :class:`registry.errors.WorkloadError`
naming the argument, the rule and the fix): q, k, v, indices are tensors on one device (as are
the chunk tensors and ``lengths``); q is float16, bfloat16, float32 or float64 and k, v have
q's dtype (no implicit casts); k and v have the same shape, their head_dim is q's, and
num_q_heads is a positive multiple of num_kv_heads; ``indices`` is int32 ``[total_q, topk]``
(int64 is refused, not narrowed: a cast would wrap entries >= 2**31 into valid slots);
``lengths`` is None or int32 ``[total_q]``; chunk: ``cu_seqlens_q`` int32 ``[num_requests +
1]`` (num_requests >= 1), ``prefix_lens`` int32 ``[num_requests]``, ``page_table`` int32
``[num_requests, max_pages]`` (kind ``prefill`` refuses them: its indices are slots, so a
forgotten ``kind="chunk"`` would otherwise read positions as slots); ``page_size`` a python int
>= 1, ``max_q`` None or a python int in ``[0, total_q]``, ``sm_scale`` None (``head_dim **
-0.5``) or a finite real number. Layout:
the last axis of q, k, v, indices and page_table has unit stride (when it has more than one
element); every other stride is free (padded rows, a KV cache's head slice, strided 1-D
``lengths`` / ``cu_seqlens_q`` / ``prefix_lens`` views). Only this metadata is checked, never a
value: the check reads no device memory, never synchronizes, and is safe under CUDA-graph
capture. Entry values outside the valid ranges above are not errors: they are skipped.

**Non-finite values** (the reference defines them; check mode and the conformance kit hold every
implementation to it). For query row r and query head j (KV head ``h = j // group_size``), let
``s_e = sm_scale * (q[r, j] . k[slot_e, h])`` for each *valid* entry e of the row (a slot listed
twice is two entries). Then:

* K and V rows that no valid entry of the row selects are never read: a NaN or inf there (an
  unused or uninitialized cache slot) never reaches ``out[r]``.
* A row-head with no valid entry is zeros, whatever ``q[r, j]`` holds.
* If some ``s_e`` is NaN or +inf (a NaN in ``q[r, j]`` or in a selected K row; an infinity whose
  product is not -inf; ``inf * 0``), ``out[r, j, :]`` is NaN, every element.
* Otherwise ``out[r, j] = sum_e w_e * v[slot_e, h]`` with ``w = softmax(s)``; an entry with
  ``s_e = -inf`` has weight exactly 0 (when every entry scores -inf all weights are 0: zeros) but
  its V row is still multiplied by that 0.
* A NaN in ``v[slot_e, h, d]`` of a valid entry makes ``out[r, j, d]`` NaN (also at weight 0);
  a +-inf there makes it non-finite: that infinity when the weight is positive, NaN when it is 0
  or when +inf and -inf meet. Which of the two a kernel gives for an infinity can depend on how
  its weights round (an fp16 weight underflows to 0 sooner), so ``compare`` accepts NaN where the
  reference has an infinity, and nothing else: NaN where the reference is NaN, finite within the
  bound where it is finite.

Rows and heads are independent: a non-finite value reaches only the row-heads whose valid
entries (or query) hold it.

The workload's ``kv_len`` (the number of KV slots the rows index) comes from shapes only, never
from device memory: for ``prefill`` it is ``k.shape[0]`` (num_slots); for ``chunk`` it is
``page_table.shape[1] * page_size``, the longest context a request's page table can address
(the true per-request context lengths live in ``prefix_lens`` on the device, which kreg never
reads). A framework that sizes its page table for the model's longest context therefore gets that
length, whatever the batch's contexts. A call with no KV slots (an empty ``k`` or page table)
derives ``kv_len=None``; ``registry.select`` dicts may leave it out (None: unknown).
"""

from __future__ import annotations

import math
from typing import Any, Literal, NoReturn

from pydantic import Field, model_validator

from backends.sparse_prefill.guarantees import kernel_contract
from registry import OpSpec, Workload, hookimpl
from registry.errors import WorkloadError
from registry.requirements import grid_bound, triton_runtime, when

OP = "sparse_prefill"

__all__ = ["OP", "SparsePrefillWorkload", "call_key", "check_inputs", "decode_key",
           "error_bound"]


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


def check_inputs(q: Any, k: Any, v: Any, indices: Any, *, kind: str = "prefill",
                 lengths: Any = None, sm_scale: Any = None, cu_seqlens_q: Any = None,
                 prefix_lens: Any = None, page_table: Any = None, page_size: Any = 1,
                 max_q: Any = None) -> None:
    """Raise :class:`WorkloadError` unless the call meets the op's input rules (module doc,
    "Inputs"): the argument, the rule and the fix in one message.

    Every implementation runs it at its entry with the arguments it was called with (the
    reference, ``sparse_prefill_triton`` for the Triton and Gluon engines; a plugin's kernel
    should too), so a call is refused, or accepted, the same way everywhere. Host metadata only
    (types, shapes, dtypes, devices, strides): no device read, no synchronization, safe under
    CUDA-graph capture. About 3 us for a prefill call on a CPU host (kernel wrappers pay it on
    every dispatch; the dispatch map's hit path itself checks nothing).
    """
    import torch

    tensor = torch.Tensor
    if not (isinstance(q, tensor) and isinstance(k, tensor) and isinstance(v, tensor)
            and isinstance(indices, tensor)):
        for name, t in (("q", q), ("k", k), ("v", v), ("indices", indices)):
            if not isinstance(t, tensor):
                _fail(f"{name} must be a torch.Tensor {_SHAPES[name]}; got {type(t).__name__}")
    if kind != "prefill" and kind != "chunk":
        _fail(f"kind={kind!r} must be 'prefill' or 'chunk'")
    qs, ks, vs = q.shape, k.shape, v.shape
    if len(qs) != 3:
        _fail(f"q.shape={list(qs)}: q must be 3-D {_SHAPES['q']}")
    if len(ks) != 3:
        _fail(f"k.shape={list(ks)}: k must be 3-D {_SHAPES['k']}")
    total_q, hq, d = qs
    _, hkv, dk = ks
    if vs != ks:
        _kv_mismatch(ks, vs)
    if dk != d:
        _fail(f"k.shape[2]={dk} != q.shape[2]={d}: q, k and v must share head_dim")
    if d < 1:
        _fail(f"q.shape={list(qs)}: head_dim must be >= 1")
    if hkv < 1 or hq < 1 or hq % hkv:
        _fail(f"num_q_heads={hq} is not a multiple of num_kv_heads={hkv}: GQA needs "
              f"num_q_heads = group_size * num_kv_heads with both >= 1 (q.shape[1], k.shape[1])")
    dt = q.dtype
    if dt not in _float_dtypes(torch):
        _fail(f"q.dtype={dt}: must be float16, bfloat16, float32 or float64 (cast q)")
    if k.dtype is not dt or v.dtype is not dt:
        _fail(f"dtypes q={dt}, k={k.dtype}, v={v.dtype}: must all be equal (no implicit "
              f"casts: cast k and v to q's dtype, e.g. k.to(q.dtype), or q to theirs)")
    dev = q.device
    if k.device != dev or v.device != dev or indices.device != dev:
        for name, t in (("k", k), ("v", v), ("indices", indices)):
            if t.device != dev:
                _fail(f"{name} is on {t.device} but q is on {dev}: every tensor argument must "
                      f"be on q's device (move {name} there)")
    ish = indices.shape
    if len(ish) != 2 or ish[0] != total_q:
        _fail(f"indices.shape={list(ish)}: must be [total_q={total_q}, topk] (one row of "
              f"selected entries per query row of q)")
    if indices.dtype is not torch.int32:
        _fail(f"indices.dtype={indices.dtype}: must be torch.int32 (slot ids or token "
              f"positions). kreg does not convert: a cast would wrap entries >= 2**31 into "
              f"valid ones; build int32 indices, or set out-of-range entries to -1 and use "
              f"indices.to(torch.int32)")
    for name, t, n in (("q", q, d), ("k", k, d), ("v", v, d), ("indices", indices, ish[1])):
        if t.stride(-1) != 1 and n > 1:
            _fail(f"{name}.stride(-1)={t.stride(-1)}: the last axis of {name} must be contiguous "
                  f"(unit stride; other strides are free): use {name}.contiguous()")
    if lengths is not None:
        _int_tensor("lengths", lengths, (total_q,), dev, f"[total_q={total_q}]: the count of "
                    f"valid leading entries of each row; None: all topk",
                    "lengths.clamp(0, topk).to(torch.int32)")
    if sm_scale is not None and type(sm_scale) is not float:
        _check_scale(sm_scale)
    elif sm_scale is not None and not math.isfinite(sm_scale):
        _fail(f"sm_scale={sm_scale!r}: must be None (head_dim ** -0.5) or a finite real number")
    if type(page_size) is not int or page_size < 1:
        _fail(f"page_size={page_size!r}: must be a python int >= 1 (tokens per page; 1 for an "
              f"unpaged cache)")
    if max_q is not None and (type(max_q) is not int or not 0 <= max_q <= total_q):
        _fail(f"max_q={max_q!r}: must be None or a python int in [0, total_q={total_q}] (the "
              f"longest request's rows; a host int: kreg never reads cu_seqlens_q)")
    if kind == "prefill":
        if cu_seqlens_q is not None or prefix_lens is not None or page_table is not None:
            given = [n for n, t in (("cu_seqlens_q", cu_seqlens_q), ("prefix_lens", prefix_lens),
                                    ("page_table", page_table)) if t is not None]
            _fail(f"kind='prefill' takes no {', '.join(given)}: prefill indices are KV slots "
                  f"and these would be ignored; rows that continue a cached prefix (indices "
                  f"are token positions) need kind='chunk'")
        return
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("prefix_lens", prefix_lens),
                    ("page_table", page_table)):
        if t is None:
            _fail(f"{name} is required for kind='chunk' ({_CHUNK[name]}; see the op contract)")
    if not isinstance(cu_seqlens_q, tensor) or cu_seqlens_q.dim() != 1 \
            or cu_seqlens_q.shape[0] < 2:
        _fail(f"cu_seqlens_q: must be a 1-D int32 tensor [num_requests + 1] with "
              f"num_requests >= 1 (row offsets of the requests); got {_shape(cu_seqlens_q)}")
    nreq = cu_seqlens_q.shape[0] - 1
    _int_tensor("cu_seqlens_q", cu_seqlens_q, (nreq + 1,), dev,
                "[num_requests + 1]: the requests' row offsets", "cu_seqlens_q.to(torch.int32)")
    _int_tensor("prefix_lens", prefix_lens, (nreq,), dev,
                f"[num_requests={nreq}]: the cached tokens before each request's rows",
                "prefix_lens.to(torch.int32)")
    if not isinstance(page_table, tensor) or page_table.dim() != 2 \
            or page_table.shape[0] != nreq:
        _fail(f"page_table: must be an int32 tensor [num_requests={nreq}, max_pages] (one "
              f"row of page ids per request); got {_shape(page_table)}")
    _int_tensor("page_table", page_table, tuple(page_table.shape), dev,
                f"[num_requests={nreq}, max_pages]", "page_table.to(torch.int32)")
    if page_table.stride(-1) != 1 and page_table.shape[1] > 1:
        _fail(f"page_table.stride(-1)={page_table.stride(-1)}: the last axis of page_table "
              f"must be contiguous (unit stride; the row stride is free): use "
              f"page_table.contiguous()")


_SHAPES = {"q": "[total_q, num_q_heads, head_dim]", "k": "[num_slots, num_kv_heads, head_dim]",
           "v": "[num_slots, num_kv_heads, head_dim]", "indices": "[total_q, topk] int32"}
_CHUNK = {"cu_seqlens_q": "int32 [num_requests + 1]", "prefix_lens": "int32 [num_requests]",
          "page_table": "int32 [num_requests, max_pages]"}
_FLOATS: frozenset[Any] = frozenset()


def _float_dtypes(torch: Any) -> frozenset[Any]:
    global _FLOATS
    if not _FLOATS:
        _FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
    return _FLOATS


def _fail(msg: str) -> NoReturn:
    raise WorkloadError(f"sparse_prefill: {msg}")


def _kv_mismatch(ks: Any, vs: Any) -> None:
    if len(vs) != 3:
        _fail(f"v.shape={list(vs)}: v must be 3-D {_SHAPES['v']}")
    axis = next(i for i in range(3) if vs[i] != ks[i])
    what = ("num_slots: one V row per K row; pass k and v of the same cache slots",
            "num_kv_heads", "head_dim: q, k and v must share head_dim")[axis]
    _fail(f"v.shape={list(vs)} != k.shape={list(ks)}: v must have k's shape (axis {axis}, "
          f"{what})")


def _int_tensor(name: str, t: Any, shape: tuple[int, ...], device: Any, what: str,
                fix: str) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        _fail(f"{name}: must be an int32 tensor {what}; got {type(t).__name__} (a python "
              f"number or list is not accepted: build the tensor on q's device)")
    if t.shape != shape:
        _fail(f"{name}.shape={list(t.shape)}: must be {list(shape)} ({what})")
    if t.dtype is not torch.int32:
        _fail(f"{name}.dtype={t.dtype}: must be torch.int32 (use {fix})")
    if t.device != device:
        _fail(f"{name} is on {t.device} but q is on {device}: every tensor argument must be on "
              f"q's device (move {name} there)")


def _check_scale(sm_scale: Any) -> None:
    import numbers

    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real) \
            or not math.isfinite(sm_scale):
        hint = (" (a tensor would have to be read from the device: pass float(x) once, "
                "outside the hot loop)" if hasattr(sm_scale, "shape") else "")
        _fail(f"sm_scale={sm_scale!r}: must be None (head_dim ** -0.5) or a finite real number "
              f"(a python float){hint}")


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
