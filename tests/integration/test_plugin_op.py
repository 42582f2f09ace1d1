"""An op defined entirely by a plugin package gets ``kreg bench``, ``kreg tune``, a ``measured``
entry that then wins selection, and the conformance kit, with no edit to kreg.

The package lives in tests/fixtures/rowscale_plugin and is installed the way pip would expose
it: a ``.dist-info`` with an entry point in the ``kreg`` group, on ``PYTHONPATH``. Every command
runs in a fresh process, as a user would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "rowscale_plugin"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    info = site / "kreg_rowscale-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kreg-rowscale\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kreg]\nrowscale = kreg_rowscale\n")
    out = {k: v for k, v in os.environ.items() if not k.startswith(("KREG_", "TRITON_"))}
    out["PYTHONPATH"] = os.pathsep.join([str(site), str(FIXTURE), str(ROOT)])
    out["KREG_HOME"] = str(tmp_path / "home")
    return out


def kreg(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


WORKLOAD = "rows=64,cols=32,dtype=float32"


def test_plugin_op_gets_bench_tune_and_a_winning_measured_entry(env: dict[str, str]) -> None:
    ops = kreg(env, "ops").stdout
    assert "rowscale: out[r] = x[r] * w[r]" in ops

    bench = kreg(env, "bench", "--help").stdout
    assert "rowscale" in bench
    table = kreg(env, "bench", "rowscale").stdout
    assert "rowscale.blocked BLOCK_ROWS=64" in table and "FAIL" not in table
    report = json.loads(kreg(env, "bench", "rowscale", "--json").stdout)
    assert report["schema"] == "kreg.bench/1" and report["op"] == "rowscale"
    assert {m["label"] for m in report["cases"][0]["results"]} == {
        "reference", "auto", "rowscale.blocked"}

    before = json.loads(kreg(env, "explain", "rowscale", "-w", WORKLOAD, "--json").stdout)
    assert before["implementation"] == "rowscale.blocked"
    measured = next(c for c in before["candidates"]
                    if c["implementation"] == "measured.rowscale")
    assert not measured["eligible"]

    dry = kreg(env, "tune", "rowscale", "--dry-run").stdout
    assert "would measure 4: b1, b8, b64, rowscale.one_row" in dry
    assert "pruned b0 (BLOCK_ROWS must be positive)" in dry
    tuned = kreg(env, "tune", "rowscale", "--warmup", "1", "--iters", "3",
                 "--min-gain", "0")
    assert "64x32 float32: measured" in tuned.stdout
    entries = json.loads(kreg(env, "tuning", "list", "--json").stdout)
    assert sorted(e["bucket"]["rows"] for e in entries) == [8, 64]
    assert {e["op"] for e in entries} == {"rowscale"}

    after = json.loads(kreg(env, "explain", "rowscale", "-w", WORKLOAD, "--json").stdout)
    assert after["implementation"] == "measured.rowscale"
    winner = next(e for e in entries if e["bucket"]["rows"] == 64)["config"]
    assert after["config"] == winner
    # Between the measured points the floor rule serves the lower one; outside, nothing.
    mid = json.loads(kreg(env, "explain", "rowscale", "-w", "rows=32,cols=32,dtype=float32",
                          "--json").stdout)
    assert mid["implementation"] == "measured.rowscale"
    low = json.loads(kreg(env, "explain", "rowscale", "-w", "rows=4,cols=32,dtype=float32",
                          "--json").stdout)
    assert low["implementation"] == "rowscale.blocked"


def test_plugin_op_runs_through_the_conformance_kit(env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--kreg-conformance", "rowscale", "-W", "ignore::UserWarning"],
                          env=env, cwd=FIXTURE, capture_output=True, text=True, timeout=300,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "6 passed" in out  # 2 implementations x 3 cases on the CPU


def _kit(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-W", "ignore::UserWarning", "--kreg-conformance", "rowscale", *args],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False)


def test_kreg_conformance_cases_adds_to_the_ops_cases(env: dict[str, str],
                                                     tmp_path: Path) -> None:
    proc = _kit(env, tmp_path, "--kreg-conformance-cases", "rowscale=kreg_rowscale.more_cases",
                "-rA")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "10 passed" in out  # 2 implementations x (3 of the op's + 2 added) cases
    for case in ("small", "ragged_block", "empty", "wide", "tall"):
        assert f"PASSED rowscale.blocked[cpu-float32-{case}]" in out, out
    proc = _kit(env, tmp_path, "--kreg-conformance-cases", "rowscale=kreg_rowscale.clashing_cases")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out  # a usage error
    assert "case 'small' of 'kreg_rowscale.clashing_cases' has the name of a case of " \
           "'kreg_rowscale.conformance'; rename it" in out
    proc = _kit(env, tmp_path, "--kreg-conformance-cases", "rowscal=kreg_rowscale.more_cases")
    assert proc.returncode == 4 and "no op rowscal" in proc.stdout + proc.stderr


def test_plugin_op_gets_its_torch_custom_op(env: dict[str, str]) -> None:
    code = ("import torch, registry\n"
            "assert registry.load_custom_ops(['rowscale']) == "
            "{'rowscale': 'kreg_rowscale.torch_op'}\n"
            "x, w = torch.randn(5, 3), torch.randn(5)\n"
            "f = torch.compile(lambda x, w: torch.ops.kreg_rowscale.rowscale(x, w) + 1, "
            "fullgraph=True, backend='eager')\n"
            "torch.testing.assert_close(f(x, w), x * w[:, None] + 1)\n"
            "with registry.record() as launches:\n"
            "    torch.ops.kreg_rowscale.rowscale(x, w)\n"
            "assert [l.implementation for l in launches] == ['rowscale.blocked'], launches\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
