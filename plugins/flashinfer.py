"""FlashInfer's kernels for both ops: a hosted third-party kernel library; priority 5.

Two implementations, each closing the gap between what FlashInfer guarantees and kreg's contract
(docs/PLUGINS.md, "Hosting an existing kernel library", with the FlashInfer source lines read):

* ``flashinfer.indexer_topk``: ``flashinfer.top_k_ragged_transform(scores, offsets=0, lengths,
  k, tie_break=1)`` (FlashInfer's FilteredTopK: membership by value, ties to the smaller index,
  rows of at most ``k`` valid keys as ``0..len-1``, -1 padding, unsorted output). FlashInfer
  orders raw bit patterns (``+0.0`` above ``-0.0``; a positive NaN above ``+inf``) and, for
  float32, bins on an fp16 copy in which every NaN is a positive NaN, so kreg re-encodes the
  scores first (:func:`order_keys`: every NaN just below ``-inf``, ``-0.0`` as ``+0.0``, the order
  of everything else kept), clamps lengths to ``[0, max_keys]`` and sorts the result ascending
  with -1 padding last (:func:`ascending_positions`). Exact; no host synchronization.
* ``flashinfer.sparse_prefill``: ``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)``
  with ``page_size=1``: every query row is a request whose pages are its valid slots (for
  ``chunk``, the positions translated through kreg's page table first, by the reference's
  :func:`~backends.sparse_prefill.reference.resolve_slots`). :func:`paged_kv_args` builds
  ``indptr`` (cumulative valid counts), the concatenated slots and ``last_page_len = 1``; a row
  with nothing valid gets one page (slot 0), since FlashInfer gives a request of no pages one
  token, and its output is zeroed. ``plan()``'s ``indptr`` is the data (how many of each row's
  entries are valid) and it reads it on the host: one device-to-host copy a call, so the
  implementation is not CUDA-graph capturable. ``plan()`` itself runs only when its arguments
  change (same valid counts, as every layer of a forward step has: the planned page tensor is
  refilled in place and ``run()`` called). The workspace (one per device) and the wrapper (one
  per head shape and dtypes) are cached.

Selection never imports FlashInfer: :func:`availability` asks ``importlib.util.find_spec`` (and
the installed metadata, for the version) once per process; the real import happens at the first
dispatch. Without FlashInfer the plugin loads and both implementations fail the ``library``
capability check ("flashinfer not importable: ..."). Priority 5, below kreg's own kernels: with
no measurement kreg's kernels stay the default; ``kreg tune`` entries that FlashInfer won (served
by the ``measured`` plugin) or ``KREG_SELECT_<OP>=flashinfer.<op>`` choose it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from backends.indexer_topk import EXACT, IndexerTopkWorkload
from backends.sparse_prefill import SparsePrefillWorkload
from backends.sparse_prefill.paged import PagedKV, paged_kv_args
from registry import Contract, DeviceFacts, Implementation, Workload, hookimpl
from registry.errors import KernelUnavailableError, WorkloadError
from registry.requirements import CAPABILITY, Requirement, predicate, vendor_in
from registry.versions import version_at_least

__all__ = ["MEASURED_VERSION", "PRIORITY", "Availability", "PagedKV", "ascending_positions",
           "availability", "indexer_topk", "neg_inf_bits", "order_keys", "paged_kv_args",
           "selected_slots", "sparse_prefill"]

PRIORITY = 5
DISTRIBUTION = "flashinfer-python"
#: The FlashInfer release these wrappers were written against (0.6.18.post1 is the one issue 27
#: measured on the H200); older ones are refused.
MEASURED_VERSION = "0.6.18"

#: FilteredTopK, FlashInfer's only top-k path that honours ``tie_break``, needs 128 KiB of shared
#: memory per SM (FILTERED_TOPK_SMEM_DYNAMIC, include/flashinfer/topk.cuh:2510;
#: CanImplementFilteredTopK, topk.cuh:3540): the data-center parts, not sm_86 / sm_89 / sm_120.
TOPK_ARCHS = ("sm_80", "sm_90", "sm_100", "sm_103")
#: ... and ``k`` at most FILTERED_TOPK_MAX_K (topk.cuh:2507), else cudaErrorNotSupported.
TOPK_MAX_K = 2048
#: The tensor-core (FA2 prefill) kernels behind tensor-core decode: the parts FlashInfer builds
#: them for with head dim 256 (the seed's) in reach.
ATTENTION_ARCHS = ("sm_80", "sm_90", "sm_100", "sm_103")
ATTENTION_DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128, 256)
#: FlashInfer's float workspace (split-KV partial results), one per device, zeroed once.
WORKSPACE_BYTES = 256 << 20
_INT32_MAX = 2**31 - 1

# ---------------------------------------------------------------------------------------------
# availability (never imports flashinfer)


@dataclass(frozen=True)
class Availability:
    """Whether FlashInfer can be imported here: its version, or None with the reason."""

    version: str | None
    reason: str = ""


_AVAILABILITY: list[Availability] = []
_LOCK = threading.Lock()


def availability() -> Availability:
    """FlashInfer's availability in this process, probed once (``find_spec``, metadata)."""
    if not _AVAILABILITY:
        with _LOCK:
            if not _AVAILABILITY:
                _AVAILABILITY.append(_probe())
    return _AVAILABILITY[0]


def _probe() -> Availability:
    hint = "pip install 'kreg[flashinfer]'"
    for module, missing in (("flashinfer", "no module named 'flashinfer'"),
                            ("tvm_ffi", "its dependency apache-tvm-ffi (module tvm_ffi) is "
                                        "missing")):
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            return Availability(None, f"finding {module} raised {type(exc).__name__}: {exc}")
        if found is None:
            return Availability(None, f"{missing} ({hint})")
    try:
        return Availability(importlib.metadata.version(DISTRIBUTION))
    except importlib.metadata.PackageNotFoundError:
        return Availability(None, f"module flashinfer found but no {DISTRIBUTION} distribution "
                                  f"metadata (its version is unknown; {hint})")


def _library(f: DeviceFacts, w: Workload) -> tuple[bool, str, str]:
    req = f"{DISTRIBUTION} >= {MEASURED_VERSION}, importable"
    # What-if facts may say what FlashInfer a device has (extra["flashinfer"]: a version, or
    # why it is not importable); else this process's probe.
    told = f.extra.get("flashinfer")
    if told is not None:
        a = Availability(told) if told[:1].isdigit() else Availability(None, told)
    else:
        a = availability()
    if a.version is None:
        return False, f"flashinfer not importable: {a.reason}", req
    try:
        ok = version_at_least(a.version, MEASURED_VERSION)
    except ValueError:
        return False, f"flashinfer {a.version} (unparsable version)", req
    return ok, f"flashinfer {a.version}", req


LIBRARY = predicate("library", CAPABILITY, _library)


def _archs(archs: tuple[str, ...], why: str) -> Requirement:
    req = "one of {" + ", ".join(archs) + "} (" + why + ")"
    return predicate("arch", CAPABILITY, lambda f, w: (f.arch in archs, f.arch, req))


# ---------------------------------------------------------------------------------------------
# requirements


def _topk_k(f: DeviceFacts, w: IndexerTopkWorkload) -> tuple[bool, str, str]:
    return w.k <= TOPK_MAX_K, str(w.k), f"<= {TOPK_MAX_K} (FlashInfer's FILTERED_TOPK_MAX_K)"


def _topk_keys(f: DeviceFacts, w: IndexerTopkWorkload) -> tuple[bool, str, str]:
    return w.max_keys < _INT32_MAX, str(w.max_keys), "< 2**31 - 1 (int32 positions)"


TOPK_REQUIREMENTS = (
    LIBRARY,
    vendor_in("nvidia"),
    _archs(TOPK_ARCHS, "FilteredTopK, its only path with tie_break, needs 128 KiB "
                       "of shared memory per SM"),
    predicate("k", CAPABILITY, _topk_k),
    predicate("max_keys", CAPABILITY, _topk_keys),
)


def _dtype(f: DeviceFacts, w: SparsePrefillWorkload) -> tuple[bool, str, str]:
    return (w.dtype in ATTENTION_DTYPES, w.dtype,
            "one of {float16, bfloat16} (FlashInfer's attention kernels take 16-bit inputs)")


def _head_dim(f: DeviceFacts, w: SparsePrefillWorkload) -> tuple[bool, str, str]:
    return w.head_dim in HEAD_DIMS, str(w.head_dim), "one of {64, 128, 256}"


def _pages(f: DeviceFacts, w: SparsePrefillWorkload) -> tuple[bool, str, str]:
    n = w.total_q * w.topk
    return n < _INT32_MAX, f"{w.total_q} rows x {w.topk} = {n} pages", \
        "< 2**31 - 1 pages (int32 indptr)"


SPARSE_REQUIREMENTS = (
    LIBRARY,
    vendor_in("nvidia"),
    _archs(ATTENTION_ARCHS, "FlashInfer's tensor-core attention kernels"),
    predicate("dtype", CAPABILITY, _dtype),
    predicate("head_dim", CAPABILITY, _head_dim),
    predicate("pages", CAPABILITY, _pages),
)

# ---------------------------------------------------------------------------------------------
# the import, at the first dispatch

_MODULE: list[Any] = []


def _flashinfer() -> Any:
    """``import flashinfer`` (once). A failure is remembered, so selections made after the next
    ``registry.reset_registry()`` see it in the ``library`` check, and raised as
    KernelUnavailableError."""
    if _MODULE:
        return _MODULE[0]
    with _LOCK:
        if not _MODULE:
            try:
                _MODULE.append(importlib.import_module("flashinfer"))
            except Exception as exc:
                why = f"import failed: {type(exc).__name__}: {exc}"
                _AVAILABILITY[:] = [Availability(None, why)]
                raise KernelUnavailableError(
                    f"flashinfer not importable: {why}; select another implementation") from exc
    return _MODULE[0]


# ---------------------------------------------------------------------------------------------
# indexer_topk: the pure logic


def order_keys(scores: Any) -> Any:
    """``scores`` re-encoded so that FlashInfer's order of raw bits is kreg's score order:
    every NaN becomes ``-inf``, every other negative value moves one step toward zero in bit
    space (``-inf`` to ``-max``, ..., the smallest negative subnormal to ``-0.0``) and ``-0.0``
    becomes ``+0.0``. The map keeps kreg's order and its ties exactly (NaN < -inf < ... < 0 <
    ... < +inf, all NaNs equal, ``-0.0 == +0.0``) and leaves no NaN and no negative zero, so
    FlashInfer's fine key (the bits with the sign handled) and float32's coarse fp16 bins agree
    with it. A new contiguous tensor of ``scores``' dtype; on a GPU one Triton pass
    (:mod:`plugins.flashinfer_keys`)."""
    import torch

    if scores.is_cuda:
        from plugins.flashinfer_keys import order_keys_triton

        return order_keys_triton(scores)
    int_t = torch.int32 if scores.dtype == torch.float32 else torch.int16
    b = scores.contiguous().view(int_t)
    low = torch.iinfo(int_t).min
    t = torch.where(b < 0, b - 1, b)          # -0.0 (low) wraps here; replaced next
    t = torch.where(b == low, torch.zeros_like(t), t)
    t = torch.where(torch.isnan(scores.contiguous()), torch.full_like(t, neg_inf_bits(
        scores.dtype)), t)
    return t.view(scores.dtype)


def neg_inf_bits(dtype: Any) -> int:
    """The bit pattern of ``-inf`` in ``dtype`` as a signed integer of its width."""
    import torch

    return {torch.float32: -(2**23), torch.float16: -1024, torch.bfloat16: -128}[dtype]


def ascending_positions(raw: Any) -> Any:
    """FlashInfer's unordered top-k rows (-1 where a row has fewer than k valid keys) in kreg's
    order: positions ascending, -1 padding last (int32)."""
    import torch

    big = torch.iinfo(torch.int32).max
    s = raw.to(torch.int32).masked_fill(raw < 0, big).sort(dim=1).values
    return s.masked_fill(s == big, -1)


def indexer_topk(scores: Any, lengths: Any, k: int = 2048) -> Any:
    """``indexer_topk`` through FlashInfer (kreg's contract: backends/indexer_topk/__init__.py)."""
    import torch

    from backends.indexer_topk.config import check_inputs

    check_inputs(scores, lengths, k)
    rows, n = scores.shape
    if rows == 0 or n == 0:
        return torch.full((rows, k), -1, dtype=torch.int32, device=scores.device)
    fi = _flashinfer()
    keys = order_keys(scores)
    lens = lengths.clamp(0, n).to(torch.int32).contiguous()
    offsets = torch.zeros(rows, dtype=torch.int32, device=scores.device)
    raw = fi.top_k_ragged_transform(keys, offsets, lens, k, deterministic=False, tie_break=1)
    return ascending_positions(raw)


# ---------------------------------------------------------------------------------------------
# sparse_prefill: the pure logic


def selected_slots(indices: Any, *, kind: str, lengths: Any, num_slots: int,
                   cu_seqlens_q: Any = None, prefix_lens: Any = None, page_table: Any = None,
                   page_size: int = 1) -> tuple[Any, Any]:
    """Each row's KV slots and which are valid: ``(slot int64 [rows, topk], valid bool)``, by
    the reference's rule (for ``chunk``, positions translated through the page table)."""
    from backends.sparse_prefill.reference import resolve_slots

    return resolve_slots(indices, kind=kind, lengths=lengths, num_slots=num_slots,
                         cu_seqlens_q=cu_seqlens_q, prefix_lens=prefix_lens,
                         page_table=page_table, page_size=page_size)


_WORKSPACES: dict[Any, Any] = {}
_WRAPPERS: OrderedDict[tuple[Any, ...], _Planned] = OrderedDict()
#: Wrappers kept (least recently used dropped): one per device, head shape and dtypes.
MAX_WRAPPERS = 8


@dataclass
class _Planned:
    """A decode wrapper and its last ``plan()``: the arguments, the host ``indptr`` and the page
    tensor it was given. FlashInfer keeps a device tensor of the right dtype as it is
    (``self._paged_kv_indices_buf = indices.to(self.device)``, decode.py:1512, which returns
    ``indices`` itself), so a call whose plan arguments match refills that tensor in place and
    skips plan(); where the wrapper holds a copy instead (checked after each plan), every call
    plans."""

    wrapper: Any
    planned: tuple[Any, ...] | None = None
    indptr: Any = None   # the host indptr of the last plan()
    pages: Any = None    # the page tensor run() reads, when it is the one plan() was given
    lock: threading.Lock = field(default_factory=threading.Lock)


def _decode_wrapper(fi: Any, q: Any, k: Any) -> _Planned:
    """The tensor-core decode wrapper for this device, head shape and dtypes (cached; created
    once with the device's workspace)."""
    import torch

    key = (q.device, q.shape[1], k.shape[1], q.shape[2], q.dtype, k.dtype)
    with _LOCK:
        entry = _WRAPPERS.get(key)
        if entry is not None:
            _WRAPPERS.move_to_end(key)
            return entry
        ws = _WORKSPACES.get(q.device)
        if ws is None:   # "must be initialized to 0 for its first use" (decode.py)
            ws = _WORKSPACES[q.device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8,
                                                     device=q.device)
        entry = _WRAPPERS[key] = _Planned(
            fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True))
        while len(_WRAPPERS) > MAX_WRAPPERS:
            _WRAPPERS.popitem(last=False)
        return entry


def sparse_prefill(q: Any, k: Any, v: Any, indices: Any, *, kind: str = "prefill",
                   lengths: Any = None, sm_scale: float | None = None, cu_seqlens_q: Any = None,
                   prefix_lens: Any = None, page_table: Any = None, page_size: int = 1,
                   max_q: int | None = None) -> Any:
    """``sparse_prefill`` through FlashInfer's paged decode (kreg's contract:
    backends/sparse_prefill/__init__.py); ``max_q`` is accepted and ignored.

    ``plan()`` (FlashInfer's host-side scheduling, tens of milliseconds at 8192 rows) runs only
    when its arguments change: the layers of one forward step share their rows' valid counts,
    so after the first layer a call costs the page list, one device-to-host copy of ``indptr``
    (compared on the host with the planned one) and ``run()``."""
    import torch

    _check_attention(q, k, v, indices, kind)
    total_q, hq, d = q.shape
    num_slots, hkv, _ = k.shape
    if total_q == 0:
        return torch.empty_like(q)
    if num_slots == 0 or indices.shape[1] == 0:
        return torch.zeros_like(q)
    slot, valid = selected_slots(indices, kind=kind, lengths=lengths, num_slots=num_slots,
                                 cu_seqlens_q=cu_seqlens_q, prefix_lens=prefix_lens,
                                 page_table=page_table, page_size=page_size)
    pages = paged_kv_args(slot, valid)
    fi = _flashinfer()
    entry = _decode_wrapper(fi, q, k)
    scale = float(sm_scale) if sm_scale is not None else d ** -0.5
    planned = (hq, hkv, d, q.dtype, k.dtype, scale)
    with entry.lock:   # the wrapper's plan and page tensor are shared state
        if entry.pages is not None and entry.planned == planned \
                and torch.equal(entry.indptr, pages.indptr):
            entry.pages.copy_(pages.indices)
        else:
            entry.planned = entry.pages = None   # a plan() that raises leaves nothing to reuse
            entry.wrapper.plan(pages.indptr, pages.indices, pages.last_page_len, hq, hkv, d, 1,
                               pos_encoding_mode="NONE", q_data_type=q.dtype,
                               kv_data_type=k.dtype, sm_scale=scale)
            entry.planned, entry.indptr = planned, pages.indptr
            held = getattr(entry.wrapper, "_paged_kv_indices_buf", None)
            entry.pages = pages.indices if held is pages.indices else None
        out = entry.wrapper.run(q.contiguous(), (k.unsqueeze(1), v.unsqueeze(1)))
    return out.masked_fill_(pages.empty[:, None, None], 0)


def _check_attention(q: Any, k: Any, v: Any, indices: Any, kind: str) -> None:
    import torch

    if kind not in ("prefill", "chunk"):
        raise WorkloadError(f"sparse_prefill kind={kind!r}: must be 'prefill' or 'chunk'")
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v, indices)):
        raise WorkloadError("sparse_prefill: q, k, v and indices must be tensors")
    if q.dim() != 3 or k.dim() != 3 or tuple(k.shape) != tuple(v.shape) \
            or k.shape[2] != q.shape[2] or indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise WorkloadError(f"sparse_prefill expects q [total_q, hq, d], k = v [num_slots, hkv, "
                            f"d] and indices [total_q, topk]; got q {list(q.shape)}, k "
                            f"{list(k.shape)}, v {list(v.shape)}, indices {list(indices.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise WorkloadError(f"sparse_prefill: q, k and v dtypes differ ({q.dtype}, {k.dtype}, "
                            f"{v.dtype}); cast k and v to q's dtype")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise WorkloadError("sparse_prefill: k and v need a contiguous head_dim axis")


# ---------------------------------------------------------------------------------------------
# the implementations


def _unavailable_note() -> str:
    a = availability()
    return "" if a.version is not None else f"; not available here: flashinfer not importable: " \
                                              f"{a.reason}"


@hookimpl
def kreg_implementations() -> list[Implementation]:
    note = _unavailable_note()
    return [
        Implementation(
            op="indexer_topk", name="flashinfer.indexer_topk", priority=PRIORITY,
            requirements=TOPK_REQUIREMENTS, configurable=False,
            kernel="plugins.flashinfer:indexer_topk", contract=EXACT,
            description="FlashInfer's top_k_ragged_transform (FilteredTopK, tie_break=1) on "
                        "scores re-encoded to its key order (NaN below -inf, -0.0 == +0.0), "
                        "positions sorted ascending: exact; no host synchronization (CUDA-graph "
                        "capturable once its first call has built the kernel)" + note),
        Implementation(
            op="sparse_prefill", name="flashinfer.sparse_prefill", priority=PRIORITY,
            requirements=SPARSE_REQUIREMENTS, configurable=False,
            kernel="plugins.flashinfer:sparse_prefill",
            # Deterministic: plan() is a host function of the lengths, and nothing in the FA2
            # path accumulates with atomics (none in include/flashinfer/attention/prefill.cuh,
            # cascade.cuh's merge of split-KV partials, scheduler.cuh), so the same inputs give
            # the same bits (tests: the GPU test beside the kit). Not batch-invariant: how a
            # row's KV is split depends on the batch (FlashInfer documents batch-size invariance
            # only with fixed_split_size, decode.py:1354-1360, not used here).
            contract=Contract(deterministic=True),
            description="FlashInfer's tensor-core paged decode (FA2), page_size 1: each row's "
                        "valid slots are its pages; every call copies indptr to the host "
                        "(plan() reruns only when the valid counts change): NOT CUDA-graph "
                        "capturable" + note),
    ]
