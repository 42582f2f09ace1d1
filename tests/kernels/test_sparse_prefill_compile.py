"""The sparse_prefill row-tile kernels keep their wgmma pipelined, checked on a CPU.

ptxas serializes a loop's wgmma (waits for each before issuing the next) when it finds a path
that defines the accumulators between a wgmma and its wait (its warning C7515, which Triton
does not surface): a loop that may run zero times was enough, and it cost the DENSE and UNION
kernels 2-8% on the H200 (docs/notes/sparse_prefill.md, "Session 20"). This test cross-compiles
every shipped DENSE and UNION launch for sm_90 in a subprocess without ``TRITON_INTERPRET``
(``benchmarks/probes/xcompile_sparse.py --wgmma``) and reads the SASS: at most a quarter of the
wgmma instructions may be followed by a wait before the next (a pipelined step waits once).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


#: exact-head tiles (TILE_HEADS="group", a line's counts by one-hot MMAs), not shipped yet
EXACT = "16x16x1x2:rev:split2:v2:lean:o32:dense250:union300:ut128x64x8x2:xh"
#: the prefill g6 policy with its union tiles on the warp-specialized Gluon kernel (gluon_ws;
#: not gluon_ws_overlap, pipelined with Triton 3.6's ptxas 12.8, the device's, but serialized
#: for registers by Triton 3.9's 13.4: docs/notes/sparse_prefill.md, "Session 47")
WS = "8x16x1x2:rev:split2:v2:lean:o32:uc:dense250:union300:ut128x64x8x2:ud60:uws"


def _xcompile(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, str(ROOT / "benchmarks/probes/xcompile_sparse.py"),
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_row_tile_kernels_keep_their_wgmma_pipelined() -> None:
    res = _xcompile("--wgmma", "--geometry", EXACT, "--geometry", WS)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # the warp-specialized union kernel: group 6 (group 12 refuses the 8-line per-row geometry)
    ws = [ln for ln in res.stdout.splitlines() if " _union_ws " in ln]
    assert len(ws) == 1 and ws[0].startswith("extra[prefill,6]") and "pipelined" in ws[0], \
        res.stdout[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if (" _dense_fwd " in ln or " _union_fwd " in ln)
             and ":uws" not in ln]
    assert {ln.split("]")[0] for ln in lines} == {
        "H200_DENSE_CONFIGS[prefill,6", "H200_DENSE_CONFIGS[prefill,12",
        "H200_UNION_CONFIGS[prefill,6", "H200_UNION_CONFIGS[prefill,12",
        "H200_UNION_CONFIGS[chunk,6", "H200_UNION_CONFIGS[chunk,12",
        "extra[prefill,6", "extra[prefill,12"}, res.stdout
    # both exact-head kernels of each group: the dense one and the union one
    assert sum(ln.startswith("extra[") for ln in lines) == 4, "\n".join(lines)
    assert all("pipelined" in ln for ln in lines), "\n".join(lines)


def test_a_bad_geometry_is_one_line_naming_the_fix() -> None:
    res = _xcompile("--geometry", "8x16x1")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "--geometry: geometry='8x16x1': expected BMxBNxWxS like 16x64x4x3" in res.stderr
