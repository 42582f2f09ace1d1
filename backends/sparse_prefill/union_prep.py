"""The union path's pre-pass in one CUDA kernel (``cuda/union_prep.cu``; ``UNION_PREP="cuda"``).

One CTA a tile builds the tile's bitmap, word prefixes and each row's 16-bit counts in shared
memory and writes what the Triton pre-pass's four launches write (``tile_kernels.
union_prep_triton``: FLAG, USZ, the union's slots, the counts), by the same rules, so the union
kernel runs unchanged after either. Built with nvcc on first use into ``$KREG_HOME/cuda/`` as
the indexer's CUDA kernels are (:mod:`backends.indexer_topk.cluster`); where it cannot be had
(no nvcc, a failed build or load, not an sm_90 device, an id range whose bitmap does not fit
the shared memory) :func:`run` says so and the caller runs the Triton pre-pass: the answer
never depends on which one ran. Nothing here imports torch at module level.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path
from typing import Any

from backends.indexer_topk import cluster as _cluster
from registry.errors import KernelUnavailableError

__all__ = ["SOURCE", "available", "run", "shared_bytes"]

NAME = "sparse_prefill union pre-pass (UNION_PREP='cuda')"
SOURCE = Path(__file__).with_name("cuda") / "union_prep.cu"
#: The kernel's shared memory a block (the H100 / H200 opt-in limit, 227 KiB, less its
#: static part: union_prep.cu's ``Shared``, 304 bytes, asserted there to stay within 512); the
#: host checks a call's need against it before taking this path.
MAX_SHARED = 227 * 1024 - 512
#: Shared memory for the tile rows' counts (bytes): the kernel counts as many rows at once as
#: their ceil(U / 2) words fit (16 rows of a 2,355-slot union in one group), two barriers a
#: group; at least one row's worst case (umax / 2 words) whatever this says.
COUNT_SHARED = 64 * 1024
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_FAILED: list[str] = []
#: what a user can do without it (the Triton pre-pass runs meanwhile, with the same answer)
_FIX = "set UNION_PREP='triton' in the config to silence this"
_ERRORS = {1: "the id range's bitmap does not fit the shared memory",
           2: "no current CUDA device, or its shared-memory limit could not be raised",
           3: "the launch failed (the kernel is built for sm_90a)"}
_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
             ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
             ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
             ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
             ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
             ctypes.c_void_p]


def shared_bytes(num_ids: int, umax: int) -> int:
    """Dynamic shared memory a call needs at least: the bitmap and the word prefixes over the
    id range, and one row's count words."""
    return (2 * ((num_ids + 31) // 32) + umax // 2) * 4


def count_words(num_ids: int, umax: int) -> int:
    """The count words a launch gives the kernel: ``COUNT_SHARED`` worth, at least one row's
    (``umax / 2``), within ``MAX_SHARED`` beside the bitmap and the prefixes."""
    room = (MAX_SHARED - shared_bytes(num_ids, 0)) // 4
    return max(umax // 2, min(COUNT_SHARED // 4, room))


def _load() -> ctypes.CDLL | None:
    global _lib
    if _lib is not None or _FAILED:
        return _lib
    try:
        with _lock:
            if _lib is None:
                path = _cluster.build(None, SOURCE, NAME, fix=_FIX)
                _lib = _cluster.open_library(path, "kreg_union_prep", _ARGTYPES)
    except KernelUnavailableError as exc:
        _FAILED.append(str(exc))
        logging.getLogger("kreg").warning("%s unavailable, the Triton pre-pass runs instead: %s",
                                          NAME, exc)
    return _lib


def available(device: Any, num_ids: int, umax: int) -> tuple[bool, str]:
    """``(usable, why not)`` for a call on ``device`` over ``num_ids`` ids: an sm_90 CUDA
    device, nvcc (or an earlier build) and a bitmap that fits the shared memory. Never builds."""
    import torch

    if device.type != "cuda":
        return False, f"ids on {device}, not a CUDA device"
    cap = torch.cuda.get_device_capability(device)
    if cap[0] != 9:
        return False, f"built for sm_90a; the device is sm_{cap[0]}{cap[1]}"
    if shared_bytes(num_ids, umax) > MAX_SHARED:
        return False, (f"{num_ids} ids need {shared_bytes(num_ids, umax)} bytes of shared "
                       f"memory (at most {MAX_SHARED})")
    if _FAILED:
        return False, _FAILED[0]
    if _lib is None:
        ok, what = _cluster._probe_toolchain()
        if not ok:
            return False, what
    return True, ""


def run(idx: Any, lens: Any, stats: tuple[Any, Any, Any] | None, flag: Any, usz: Any, slots: Any,
        cnt: Any, by_req: tuple[Any, Any, int, int] | None, *, num_ids: int, tile0: int,
        ntiles: int, rp: int, dense_span: int, pct: int, umax: int, union_dense: int = 0,
        stats_out: tuple[Any, Any, Any] | None = None) -> bool:
    """The pre-pass of tiles ``tile0 .. tile0 + ntiles`` (scratch rows ``0 .. ntiles``) on the
    current stream: True when launched, False when the kernel cannot be had (the caller runs
    the Triton pre-pass). ``idx`` int32 ``[total_q, topk]`` (unit column stride); ``lens`` None
    or int32 ``[total_q]``; ``stats`` (LO, HI, NV), or None when no DENSE tiles need them:
    the kernel then takes its tiles' statistics from their ids in a first pass (the same
    values, no ``_row_stats`` launch) and, given ``stats_out`` (three int32 ``[total_q]``),
    writes them there for its tiles' rows as ``_row_stats`` would; ``by_req`` None or (rows'
    requests, page table, page size, page-table row stride) for chunk positions.
    ``union_dense`` > 0 (UNION_DENSE, with ``dense_span``): the pre-pass runs before the dense
    kernels and writes every tile's FLAG, DENSE's tiles included (1, or 2 where their union is
    at most that percent of their span; a tile whose largest row alone has more valid entries
    than that stays 1 ungated)."""
    import torch

    lib = _load()
    if lib is None:
        return False
    total_q, topk = idx.shape
    lo, hi, nv = stats if stats is not None else (None, None, None)
    rr, pt, page_size, s_pb = by_req if by_req is not None else (None, None, 1, 0)
    outs = (None, None, None) if stats_out is None or stats is not None else \
        tuple(t.data_ptr() for t in stats_out)
    dev = idx.device
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev).cuda_stream
        rc = lib.kreg_union_prep(
            idx.data_ptr(), idx.stride(0), None if lens is None else lens.data_ptr(),
            *(None if t is None else t.data_ptr() for t in (lo, hi, nv)), flag.data_ptr(),
            usz.data_ptr(),
            slots.data_ptr(), slots.stride(0), cnt.data_ptr(), cnt.stride(0), cnt.stride(1),
            None if rr is None else rr.data_ptr(), None if pt is None else pt.data_ptr(),
            s_pb, page_size, num_ids, topk, tile0, ntiles, total_q, rp, dense_span, pct,
            union_dense, umax, count_words(num_ids, umax), *outs, stream)
    if rc:
        raise KernelUnavailableError(f"{NAME}: {_ERRORS.get(rc, f'error {rc}')}")
    return True
