"""Helpers shared by the kernel tests (imported by bare name: pytest puts tests/kernels on
sys.path for the test files here)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

#: The CUDA emulator (tests/kernels/cuda_emu) and the C++ compiler that builds its drivers.
EMU_DIR = Path(__file__).resolve().parent / "cuda_emu"
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
NO_CXX = "the CUDA emulator needs a C++17 compiler (g++ or c++ on PATH, or CXX)"
needs_cxx = pytest.mark.skipif(CXX is None, reason=NO_CXX)


def build_emu(driver: str, out: Path, source: Path, *defines: str,
              includes: tuple[Path, ...] = ()) -> Path:
    """An emulator driver (``cuda_emu/<driver>``) built with the kernel ``source`` under
    ``-DKREG_CUDA_EMU`` (and ``defines``) into ``out``; the test skips without a compiler."""
    if CXX is None:
        pytest.skip(NO_CXX)
    res = subprocess.run([CXX, "-std=c++17", "-O1", "-DKREG_CUDA_EMU", *defines, f"-I{EMU_DIR}",
                          f"-I{source.parent}", *(f"-I{d}" for d in includes),
                          str(EMU_DIR / driver), "-o", str(out)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    return out

#: What a poisoned int tensor holds: large, positive, and no valid slot, length or index.
POISON_INT = 0x3FFF0001


def poison_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every torch.empty / empty_like (outputs and scratch) comes back poisoned: NaN floats,
    :data:`POISON_INT` ints, so an element an implementation never writes cannot pass for a
    right one."""
    real_empty, real_like = torch.empty, torch.empty_like

    def fill(t: Any) -> Any:
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype in (torch.int32, torch.int64):
            t.fill_(POISON_INT)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: fill(real_empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: fill(real_like(*a, **kw)))


def nasty_scores(n: int, g: torch.Generator) -> torch.Tensor:
    """Six fp32 rows of ``n`` N(0,1) keys striped with NaN, +-inf, -0.0 and +0.0; row 0 only
    NaN (selectable, last, by position), row 1 one value (the first k positions win), row 2 the
    k-th key inside a tie from position 3000 on; rows 3-5 for the caller to specialise."""
    s = torch.randn(6, n, generator=g)
    s[:, ::97] = float("nan")
    s[:, 5::101] = float("inf")
    s[:, 9::103] = float("-inf")
    s[:, 7::89] = -0.0
    s[:, 11::89] = 0.0
    s[0] = float("nan")
    s[1, :] = 2.0
    s[2, 3000:] = -1.0
    return s


def cuda_kernel_marks(what: str) -> tuple[Any, Any]:
    """``(needs_nvcc, gpu90)`` for a CUDA kernel's tests (``what`` names it in skip reasons):
    a build test needs nvcc (a CPU machine too); a GPU test is marked ``gpu`` and skipped, with
    the reason, off sm_90."""
    from backends.indexer_topk.cluster import nvcc

    needs_nvcc = pytest.mark.skipif(nvcc() is None, reason=f"no nvcc here: {what} cannot be "
                                                           "built (CUDA_HOME/bin/nvcc or PATH)")
    sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9

    def gpu90(fn: Any) -> Any:
        return pytest.mark.gpu(pytest.mark.skipif(not sm90, reason=f"{what} needs an sm_90 "
                                                                   "GPU")(fn))

    return needs_nvcc, gpu90


def check_topk_graph_replay(topk: Any, rows: int) -> None:
    """An indexer_topk kernel (``topk(scores, lengths, k)``) captured in a CUDA graph on random
    rows answers exactly for the scores the replay finds (``recent`` rows)."""
    from backends.indexer_topk import distributions as D
    from backends.indexer_topk.reference import indexer_topk_reference

    n, k = 131072, 2048
    s = D.make_scores("randn", rows, n, seed=2, device="cuda")
    lengths = torch.full((rows,), n, dtype=torch.int32, device="cuda")
    topk(s, lengths, k)   # built and loaded outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = topk(s, lengths, k)
    s.copy_(D.make_scores("recent", rows, n, seed=9, device="cuda"))
    want = indexer_topk_reference(s, lengths, k)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def check_wrong_tie_rule_is_caught(got: Any, scores: Any, lengths: Any, k: int) -> None:
    """Negative control: on rows whose k-th key sits in a tie, the last positions of the tie
    (the reference of the flipped rows, mapped back) differ from ``got`` entry by entry."""
    from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches

    n = scores.shape[1]
    wrong = (n - 1 - indexer_topk_reference(scores.flip(1), lengths, k)).flip(1)
    assert topk_mismatches(got, wrong) != []
