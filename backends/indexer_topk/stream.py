"""The one-read streaming select for sm_90 (``cuda/stream_topk.cu``): build, load, call.

One CTA a row reads the row once (plus a 1/16 sample that sets a threshold), appends the keys
above the threshold to a shared-memory buffer and marks the keys equal to it in a shared-memory
bitmap of the row's positions, then selects the k-th key from the buffer and writes the
selected positions in order from the bitmap. No workspace (0 scratch bytes a row), one launch,
exact (kreg's contract: membership by score then position, ascending positions, -1 padding),
CUDA-graph capturable. A row whose sample misled the threshold is read again with a corrected
one (``stats`` counts those reads), so the answer never depends on the sample.

Built and loaded like the cluster kernel (:mod:`backends.indexer_topk.cluster`: nvcc on first
use into ``$KREG_HOME/cuda/``, a failed build or load logged once, then the Triton kernels answer
and selection moves on). Nothing here imports torch at module level.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

from backends.indexer_topk import cluster as _cluster
from registry.errors import KernelUnavailableError, WorkloadError

__all__ = ["DTYPES", "MAX_K", "MAX_KEYS", "SOURCE", "build", "indexer_topk_stream",
           "load_library", "sample_positions", "toolchain"]

NAME = "nvidia_hopper.indexer_topk_stream"
SOURCE = Path(__file__).with_name("cuda") / "stream_topk.cu"
#: The bitmap of a row's positions lives in shared memory (MAX_KEYS / 8 bytes).
MAX_KEYS = 1 << 20
#: k at most half the buffer (6,144 entries), so a sample's threshold has room on both sides.
MAX_K = 3072
DTYPES = _cluster.DTYPES
#: The sample (the kernel's SAMPLE and CW): SAMPLE keys in SAMPLE / CHUNK evenly spaced chunks.
SAMPLE, SAMPLE_CHUNK = 8192, 64
_ERRORS = {
    1: f"rows longer than {MAX_KEYS} keys",
    2: "no current CUDA device, or its shared-memory limit could not be raised",
    3: "the launch failed (the kernel needs an sm_90 GPU)",
    4: "an unsupported dtype",
    5: f"k above {MAX_K}",
    6: "an unknown CTA geometry (wide: -1, 0, 1, 2 or 4)",
}
_DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_FAILED: list[str] = []


def sample_positions(length: int) -> list[int]:
    """The positions a row of ``length`` keys samples (the kernel's rule; tests build rows that
    mislead it). A row of at most SAMPLE keys samples every key."""
    if length <= SAMPLE:
        return list(range(length))
    chunks = SAMPLE // SAMPLE_CHUNK
    return [c * (length - SAMPLE_CHUNK) // (chunks - 1) + o for c in range(chunks)
            for o in range(SAMPLE_CHUNK)]


def toolchain() -> tuple[bool, str]:
    """``(usable, what was found)``, as :func:`backends.indexer_topk.cluster.toolchain`."""
    if _FAILED:
        return False, _FAILED[0]
    return _cluster._probe_toolchain()


def build(out: Path | None = None) -> Path:
    """Compile the kernel if needed; its shared library's path."""
    return _cluster.build(out, SOURCE, NAME)


def load_library(path: Path) -> ctypes.CDLL:
    """A built library, loaded, its entry point's signature declared."""
    return _cluster.open_library(path, "kreg_stream_topk", [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int, ctypes.c_void_p])


def _load_or_fail() -> ctypes.CDLL | None:
    global _lib
    if _lib is not None:
        return _lib
    if _FAILED:
        return None
    try:
        with _lock:
            if _lib is None:
                _lib = load_library(build())
        return _lib
    except KernelUnavailableError as exc:
        import logging

        import registry

        _FAILED.append(f"the kernel's build or load failed in this process: {exc}")
        logging.getLogger("kreg").warning("%s unavailable, the Triton kernels serve instead: %s",
                                          NAME, exc)
        registry.invalidate()
        return None


def check(scores: Any, lengths: Any, k: int) -> None:
    """The op's input rules plus this kernel's limits (rows of at most MAX_KEYS keys, k at most
    MAX_K, an sm_90 CUDA device), each broken one named with its fix."""
    from backends.indexer_topk.config import check_inputs

    check_inputs(scores, lengths, k)
    if k > MAX_K:
        raise WorkloadError(f"{NAME} takes k <= {MAX_K}; got k={k} (use "
                            f"generic.indexer_topk_radix)")
    if scores.shape[1] > MAX_KEYS:
        raise WorkloadError(f"{NAME} takes rows of at most {MAX_KEYS} keys; got "
                            f"max_keys={scores.shape[1]} (use generic.indexer_topk_radix)")
    if scores.device.type != "cuda":
        raise KernelUnavailableError(f"{NAME} runs on CUDA GPUs (sm_90); scores are on "
                                     f"{scores.device}")


def indexer_topk_stream(scores: Any, lengths: Any, k: int = 2048) -> Any:
    """Exact per-row top-k positions (ascending, -1 padded), int32 ``[rows, k]``, by the
    one-read streaming select. Inputs as ``indexer_topk``; scores on an sm_90 GPU."""
    import torch

    check(scores, lengths, k)
    index = scores.device.index if scores.device.index is not None else torch.cuda.current_device()
    cap = _cluster._capability(index)
    if cap[0] != 9:
        raise KernelUnavailableError(f"{NAME} is built for sm_90; device {index} is "
                                     f"sm_{cap[0]}{cap[1]}")
    out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
    return _launch(scores, lengths, k, out, index)


def _launch(scores: Any, lengths: Any, k: int, out: Any, index: int,
            lib: ctypes.CDLL | None = None, stats: Any = None, wide: int = -1) -> Any:
    """Fill ``out`` (int32 ``[rows, k]``, contiguous) on device ``index``; inputs checked.
    ``stats``: an int32 CUDA tensor of one element the kernel adds its extra row reads to.
    ``wide``: the CTA geometry (-1: by the row count: one 512-thread CTA an SM below the SM
    count, three 256-thread CTAs an SM from it, and clusters of two or four 512-thread CTAs a
    row while those fit the SMs if the build's STREAM_SPLIT_MAX allows; 0 / 1 / 2 / 4: one of
    them, for tests and probes)."""
    import torch

    rows, n = scores.shape
    lib, answered = _cluster.library_or_answer(scores, lengths, k, out, lib, _load_or_fail)
    if lib is None:
        return answered
    code = _DTYPE_CODES[str(scores.dtype).removeprefix("torch.")]
    with torch.cuda.device(index):
        stream = torch.cuda.current_stream(index).cuda_stream
        rc = lib.kreg_stream_topk(scores.data_ptr(), code, scores.stride(0), rows, n,
                                  lengths.data_ptr(), lengths.stride(0), k, out.data_ptr(),
                                  None if stats is None else stats.data_ptr(), wide, stream)
    if rc:
        raise KernelUnavailableError(f"{NAME}: {_ERRORS.get(rc, f'error {rc}')}")
    return out
