"""benchmarks/probes/union_sizes.py: bad options end in one clear line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("args", "says"), [
    (["--rp", "0"], "must be at least 1"),
    (["--rp", "16,x"], "expected comma-separated whole numbers"),
    (["--indices", "topk,foo"], "expected topk, walk or both"),
])
def test_bad_options_name_the_fix(args: list[str], says: str) -> None:
    r = subprocess.run([sys.executable, "benchmarks/probes/union_sizes.py", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert says in r.stderr
    assert "Traceback" not in r.stderr


def test_one_small_case_prints_its_row() -> None:
    r = subprocess.run([sys.executable, "benchmarks/probes/union_sizes.py", "--total-q", "64",
                        "--kv-len", "1024", "--indices", "walk", "--rp", "16"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    row = [ln for ln in r.stdout.splitlines() if ln.startswith("| walk | 16 |")]
    assert len(row) == 1 and row[0].split("|")[3].strip() == "4"   # 64 rows / 16 a tile
