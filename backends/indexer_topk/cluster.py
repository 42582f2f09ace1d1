"""The cluster radix select for sm_90 (``cuda/cluster_topk.cu``): build, load, call.

One 8-CTA thread-block cluster a row: each CTA holds an eighth of the row in shared memory (rows
of at most :data:`MAX_KEYS` keys), the row is read from HBM once, and four byte-wide radix passes
find the k-th key, the CTAs summing their bins through distributed shared memory. One launch,
no workspace, exact (kreg's contract: membership by score then position, ascending positions,
-1 padding), CUDA-graph capturable (it launches on the current stream and never synchronizes).
Where it wins is a measured envelope (``plugins/nvidia_hopper.py``, docs/BENCHMARKS.md): few
rows, where one launch and no dependent passes through HBM beat the Triton kernels.

The source is compiled on first use with ``nvcc`` (``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on
``PATH``) for ``sm_90a`` into ``$KREG_HOME/cuda/`` (the file name carries a hash of the source and
of the compiler's version, so an upgrade rebuilds; a file lock keeps concurrent processes from
building twice), then loaded with ctypes. :func:`toolchain` says, without building, whether that
can happen here: selection asks it (``nvidia_hopper.indexer_topk_cluster``'s ``cuda_toolchain``
requirement). A build or load that fails anyway (a broken compiler, an unwritable KREG_HOME)
is logged once; that call is answered by the Triton kernels, ``toolchain`` reports the failure
from then on and the registry's decisions are dropped, so the next dispatch selects the next
implementation and ``kreg explain`` names the cause. Nothing here imports torch at module level.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from registry.errors import KernelUnavailableError, WorkloadError

__all__ = ["DTYPES", "MAX_KEYS", "SOURCE", "build", "indexer_topk_cluster", "library_or_answer",
           "library_path", "load_library", "nvcc", "open_library", "toolchain"]

SOURCE = Path(__file__).with_name("cuda") / "cluster_topk.cu"
#: 8 CTAs of at most 16,384 keys (64 KiB of fp32 keys in shared memory each, plus an 8 KiB
#: candidate list).
MAX_KEYS = 8 * 16384
DTYPES = ("float32", "bfloat16", "float16")
NVCC_FLAGS = ("-O3", "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC")
_ERRORS = {
    1: f"rows longer than {MAX_KEYS} keys",
    2: "no current CUDA device, or its shared-memory limit (72 KiB a block) could not be raised",
    3: "the launch failed (the kernel needs an sm_90 GPU with 3 x 75 KiB of shared memory an SM)",
    4: "an unsupported dtype",
}
_DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
#: Why the kernel could not be built or loaded in this process (then ``toolchain`` says so and
#: selection moves on to the next implementation), empty while it could.
_FAILED: list[str] = []


def nvcc() -> str | None:
    """The CUDA compiler this process would build with, or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        cand = Path(home) / "bin" / "nvcc"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=4)
def _nvcc_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unusable ({exc})"
    if out.returncode != 0:
        return f"unusable (exit {out.returncode})"
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "unknown"


def library_path(compiler: str | None = None, source: Path = SOURCE) -> Path:
    """Where a built kernel lives: ``$KREG_HOME/cuda/<source stem>-<hash>.so``, the hash over
    the source, the headers beside it, the flags and the compiler's version."""
    h = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.cuh")):
        h.update(header.read_bytes())
    h.update(" ".join(NVCC_FLAGS).encode())
    comp = compiler or nvcc()
    h.update((_nvcc_version(comp) if comp else "no-nvcc").encode())
    # KREG_HOME as the registry reads it (default ~/.cache/kreg)
    home = Path(os.environ.get("KREG_HOME") or Path.home() / ".cache" / "kreg").expanduser()
    return home / "cuda" / f"{source.stem}-{h.hexdigest()[:16]}.so"


def toolchain() -> tuple[bool, str]:
    """``(usable, what was found)``: whether this process can load the kernel (``nvcc``
    present to build it, and no build or load of it failed in this process). Never builds."""
    if _FAILED:
        return False, _FAILED[0]
    return _probe_toolchain()


@functools.lru_cache(maxsize=1)
def _probe_toolchain() -> tuple[bool, str]:
    comp = nvcc()
    if comp is None:
        return False, "no nvcc (CUDA_HOME/bin/nvcc or PATH)"
    version = _nvcc_version(comp)
    if version.startswith("unusable"):
        return False, f"nvcc at {comp} is {version}"
    return True, f"nvcc at {comp} ({version})"


_SELECT_OTHER = ("select another implementation with "
                 "KREG_SELECT_INDEXER_TOPK=generic.indexer_topk_radix")


def build(out: Path | None = None, source: Path = SOURCE,
          name: str = "nvidia_hopper.indexer_topk_cluster", fix: str = _SELECT_OTHER) -> Path:
    """Compile a kernel source (the cluster kernel's unless named; ``name`` is the
    implementation it serves and ``fix`` what a user can do without it, for messages) if it is
    not built yet and return the shared library's path. Raises KernelUnavailableError naming
    the cause and the fix."""
    comp = nvcc()
    if comp is None:
        raise KernelUnavailableError(
            f"{name} needs nvcc to build its CUDA kernel once: install "
            f"the CUDA toolkit (or set CUDA_HOME), or {fix}")
    path = out or library_path(comp, source)
    if path.exists():
        return path
    try:
        return _compile(comp, path, source, fix)
    except OSError as exc:   # KREG_HOME not writable, a full disk, ...
        raise KernelUnavailableError(
            f"building {source.name} into {path.parent} failed: {exc}; set KREG_HOME to a "
            f"writable directory") from exc


def _compile(comp: str, path: Path, source: Path = SOURCE, fix: str = _SELECT_OTHER) -> Path:
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if path.exists():
            return path
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        cmd = [comp, *NVCC_FLAGS, "-o", str(tmp), str(source)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise KernelUnavailableError(f"building {source.name} failed to run {comp}: {exc}; "
                                         f"select another implementation") from exc
        if res.returncode != 0:
            tmp.unlink(missing_ok=True)
            tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-8:])
            raise KernelUnavailableError(
                f"building {source.name} with {comp} failed (exit {res.returncode}):\n{tail}\n"
                f"(command: {' '.join(cmd)}); {fix}")
        os.replace(tmp, path)
    return path


def _load_or_fail() -> ctypes.CDLL | None:
    """The loaded kernel, or None after recording why it cannot be had (a failed build or load:
    logged once, ``toolchain`` then reports it, and the registry's decisions are dropped so the
    next dispatch selects another implementation)."""
    if _lib is not None:
        return _lib
    if _FAILED:
        return None
    try:
        return _load()
    except KernelUnavailableError as exc:
        import logging

        import registry

        _FAILED.append(f"the kernel's build or load failed in this process: {exc}")
        logging.getLogger("kreg").warning("nvidia_hopper.indexer_topk_cluster unavailable, "
                                          "the Triton kernels serve instead: %s", exc)
        registry.invalidate()
        return None


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            _lib = load_library(build())
    return _lib


def open_library(path: Path, entry: str, argtypes: list[Any]) -> ctypes.CDLL:
    """A built kernel library, loaded, its entry point ``entry`` declared (int return,
    ``argtypes``); a library that will not load is a KernelUnavailableError naming the fix."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise KernelUnavailableError(f"cannot load {path}: {exc}; delete it to rebuild, "
                                     f"or select another implementation") from exc
    fn = getattr(lib, entry)
    fn.restype = ctypes.c_int
    fn.argtypes = argtypes
    return lib


def load_library(path: Path) -> ctypes.CDLL:
    """A built kernel library, loaded, its entry point's signature declared (the probes load a
    patched build beside the product's this way)."""
    return open_library(path, "kreg_cluster_topk", [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p])


@functools.lru_cache(maxsize=16)
def _capability(index: int) -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]


def indexer_topk_cluster(scores: Any, lengths: Any, k: int = 2048) -> Any:
    """Exact per-row top-k positions (ascending, -1 padded), int32 ``[rows, k]``, by the cluster
    radix select. Inputs as ``indexer_topk`` (:func:`~backends.indexer_topk.check_inputs`);
    scores on an sm_90 GPU, rows of at most :data:`MAX_KEYS` keys."""
    import torch

    from backends.indexer_topk.config import check_inputs

    check_inputs(scores, lengths, k)
    if k > 2**31 - 1:
        raise WorkloadError(f"indexer_topk: k={k} is above int32's range; the kernel's positions "
                            f"and k are int32")
    rows, n = scores.shape
    if n > MAX_KEYS:
        raise WorkloadError(f"nvidia_hopper.indexer_topk_cluster takes rows of at most "
                            f"{MAX_KEYS} keys; got max_keys={n} (use generic.indexer_topk_radix)")
    if scores.device.type != "cuda":
        raise KernelUnavailableError(
            f"nvidia_hopper.indexer_topk_cluster runs on CUDA GPUs (sm_90); scores are on "
            f"{scores.device}")
    index = scores.device.index if scores.device.index is not None else torch.cuda.current_device()
    cap = _capability(index)
    if cap[0] != 9:
        raise KernelUnavailableError(
            f"nvidia_hopper.indexer_topk_cluster is built for sm_90; device {index} is "
            f"sm_{cap[0]}{cap[1]}")
    out = torch.empty((rows, k), dtype=torch.int32, device=scores.device)
    return _launch(scores, lengths, k, out, index)


def library_or_answer(scores: Any, lengths: Any, k: int, out: Any, lib: ctypes.CDLL | None,
                      load: Any) -> tuple[ctypes.CDLL | None, Any]:
    """``(library, None)`` to launch, or ``(None, out answered)`` when the call needs no kernel
    (no rows; no keys: all -1) or has none (``load()`` gave None after a failed build or load:
    the Triton kernels answer it exactly). Shared by the CUDA kernels' launchers."""
    rows, n = scores.shape
    if rows == 0:
        return None, out
    if n == 0:
        return None, out.fill_(-1)
    lib = lib or load()
    if lib is None:   # this call still gets the exact answer, from the Triton kernels
        from backends.indexer_topk.triton_kernels import indexer_topk_triton

        return None, out.copy_(indexer_topk_triton(scores, lengths, k, config={}))
    return lib, None


def _launch(scores: Any, lengths: Any, k: int, out: Any, index: int,
            lib: ctypes.CDLL | None = None) -> Any:
    """Fill ``out`` (int32 ``[rows, k]``, contiguous) on device ``index``; inputs checked.
    ``lib``: a library from :func:`load_library` instead of the product build (probes)."""
    import torch

    rows, n = scores.shape
    lib, answered = library_or_answer(scores, lengths, k, out, lib, _load_or_fail)
    if lib is None:
        return answered
    code = _DTYPE_CODES[str(scores.dtype).removeprefix("torch.")]
    with torch.cuda.device(index):
        stream = torch.cuda.current_stream(index).cuda_stream
        rc = lib.kreg_cluster_topk(scores.data_ptr(), code, scores.stride(0), rows, n,
                                   lengths.data_ptr(), lengths.stride(0), k, out.data_ptr(),
                                   stream)
    if rc:
        raise KernelUnavailableError(f"nvidia_hopper.indexer_topk_cluster: "
                                     f"{_ERRORS.get(rc, f'error {rc}')}")
    return out
