"""The indexer_topk kernels compile for the GPUs nobody here has a driver for, on a CPU.

The interpreter (every other CPU test) runs the kernels as Python and accepts what Triton's
compiler refuses (for one, a variable that a branch redefines with another type), so a kernel
change can pass CI and fail its first GPU launch. This test cross-compiles every launch of the
default configs (the four-launch path at 1 row, the fused path with ROW_SPLIT at 64 rows,
without it at 1024, in one launch (ONE_PASS) at 4096, the rare tiers' launch included) for
sm_90, and the 64-row launches for gfx950 (the MI355X's target), default and ONE_PASS, in a
subprocess without ``TRITON_INTERPRET``
(``benchmarks/probes/xcompile_topk.py``, which exits 1 when a launch fails to compile).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("target", "rows", "config"), [
    ("sm90", "1,64,1024,4096", ""), ("gfx950", "64", ""), ("gfx950", "64", "ONE_PASS=1")])
def test_every_default_launch_cross_compiles(target: str, rows: str, config: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks/probes/xcompile_topk.py"),
                          "--rows", rows, "--target", target, "--config", config], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("rows")]
    assert res.returncode == 0 and lines, res.stdout[-3000:] + res.stderr[-3000:]
    assert not any("FAILED" in ln for ln in lines), "\n".join(lines)
    want = {"_row_kernel", "_tie_kernel"} | ({"_gmax_kernel"} if not config else set())
    if "1" in rows.split(","):   # the four-launch path
        want |= {"_bound_kernel", "_place_kernel", "_select_kernel"}
    assert want <= {ln.split()[2] for ln in lines}, lines
    # ONE_PASS (the default at 4096 rows on 132 SMs, pinned on gfx950): no gmax launch
    if "4096" in rows.split(",") or config:
        one = [ln for ln in lines if ln.split()[1] == "4096" or config]
        assert one and not any(ln.split()[2] == "_gmax_kernel" for ln in one), lines


def test_the_tuners_precompile_pass_runs_every_candidate() -> None:
    """``benchmarks/probes/precompile_topk.py`` (run by ``device_run.sh tune-indexer`` before
    the tune) enumerates the tuner's candidates and runs each once, exactly, in worker
    processes: under the interpreter here, at a small shape, with two workers."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    probe = str(ROOT / "benchmarks/probes/precompile_topk.py")
    args = ["--rows", "2", "--keys", "4096", "--k", "64"]
    listed = subprocess.run([sys.executable, probe, *args, "--list"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr[-3000:]
    pairs = [ln for ln in listed.stdout.splitlines() if ln.startswith("2x4096 ")]
    assert len(pairs) >= 8 and any("4-launch" in p for p in pairs) \
        and any("fused" in p for p in pairs), listed.stdout
    res = subprocess.run([sys.executable, probe, *args, "--workers", "2"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    ran = [ln for ln in res.stdout.splitlines() if ln.startswith("2x4096 ")]
    assert res.returncode == 0 and len(ran) == len(pairs), res.stdout[-3000:] + res.stderr
    assert all(ln.endswith(" exact") for ln in ran), ran
    assert f"precompiled {len(pairs)} (shape, config) pairs in 2 processes" in res.stdout
