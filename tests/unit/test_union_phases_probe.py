"""benchmarks/probes/union_phases.py: a provider with an unknown suffix ends in one clear
line before any GPU work, not a traceback (the probe itself needs a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _probe(configs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/probes/union_phases.py", "--configs",
                           configs], cwd=ROOT, capture_output=True, text=True, timeout=120)


# @g1 and @r0 were the CUDA union pre-pass's A/B forms (rows counted one at a time, entries
# strided), gone with the runs form: they are unknown suffixes now, as any other is
@pytest.mark.parametrize("bad", ["h200@g1", "h200@r0", "h200@old@g2"])
def test_an_unknown_suffix_names_the_known_ones(bad: str) -> None:
    r = _probe(f"h200,h200@old,{bad}")   # @old is known: the bad one is named first
    assert r.returncode == 2
    assert f"{bad!r} has an unknown suffix; expected any of @old after the provider" in r.stderr
    assert "Traceback" not in r.stderr


def test_old_without_the_earlier_files_says_which_option_names_them() -> None:
    r = _probe("h200,h200@old")
    assert r.returncode == 2
    assert "'h200@old' runs the earlier kernels, which --old PATHS names" in r.stderr
    assert "Traceback" not in r.stderr
