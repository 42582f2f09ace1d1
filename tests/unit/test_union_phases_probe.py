"""benchmarks/probes/union_phases.py: a provider with an unknown suffix ends in one clear
line before any GPU work, not a traceback (the probe itself needs a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_an_unknown_suffix_names_the_known_ones() -> None:
    r = subprocess.run([sys.executable, "benchmarks/probes/union_phases.py", "--configs",
                        "h200,h200@g1@r0,h200@g2"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert "'h200@g2' has an unknown suffix; expected any of @g1, @old, @r0" in r.stderr
    assert "Traceback" not in r.stderr
