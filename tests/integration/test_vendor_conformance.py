"""The conformance kit on every in-tree vendor plugin, judged on its target profiles and run on
this machine (a CPU: the Triton interpreter), as CI runs it; and broken copies of a vendor
plugin fail it.

Each run is ``pytest --kreg-conformance PLUGIN`` in a fresh process, as a vendor would run it.
CPU time: the vendor cases run the seed's top-k 2051 / head dim 256 with rows of a few dozen
valid entries and one full row each (``plugins/nvidia_*.py``: ``CONFORMANCE_CASES``; a full
row costs ~0.5 s under the interpreter, a short one milliseconds), and the configs found by
probing larger sizes run at one dtype, so each plugin's whole kit takes 4-7 s on one core
(nvidia_sm120 ~4.5 s, nvidia_hopper ~7 s, amd_mi355x ~4.5 s, the broken copies ~4 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def kit(*args: str, env: dict[str, str] | None = None, cwd: Path = FIXTURES
        ) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KREG_", "TRITON_"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-W", "ignore::UserWarning", *args], env={**base, **(env or {})},
                          cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def passed(out: str) -> set[str]:
    return set(re.findall(r"^PASSED (\S+)", out, re.M))


def test_nvidia_sm120_executes_the_seed_tuples_on_the_server_profile(tmp_path: Path) -> None:
    code, out = kit("--kreg-conformance", "nvidia_sm120", "--kreg-conformance-device",
                    "rtx-pro-6000-blackwell-server", "-rA", cwd=tmp_path)
    assert code == 0, out
    name = "nvidia_sm120.sparse_prefill_tuned[rtx-pro-6000-blackwell-server:cpu-{}-{}]"
    assert passed(out) == {name.format(dt, case) for dt in ("float32", "float16")
                           for case in ("seed_g6", "seed_g12x2", "seed_chunk_g12",
                                        "seed_full_row")}, out
    assert "kreg conformance nvidia_sm120: 8 executed (8 passed), judged on " \
           "rtx-pro-6000-blackwell-server; 28 skipped" in out, out  # the op's own cases
    # both tuned geometries (g6: BLOCK_M 8, g12: BLOCK_M 16) ran
    assert "sparse_prefill: 2 of the 2 configs plugin 'nvidia_sm120' offers executed" in out
    # the op's own cases do not fit the seed's capability, and say why
    assert "topk: 32, requires = 2051 [capability]" in out


def test_nvidia_hopper_executes_its_triton_configs_and_names_the_gluon_ones(
        tmp_path: Path) -> None:
    code, out = kit("--kreg-conformance", "nvidia_hopper", "-rA", cwd=tmp_path)
    assert code == 0, out
    assert ("sparse_prefill: 12 of the 16 configs plugin 'nvidia_hopper' offers executed; not "
            "runnable here (not tested): gluon.prefill_g6, wgmma.prefill_g6, wgmma.prefill_g12, "
            "wgmma.chunk_g12"
            in out), out
    assert "ENGINE='gluon_wgmma' does not run under TRITON_INTERPRET=1" in out
    ran = passed(out)
    for config in ("long_kv.prefill_g6", "dense.prefill_g6", "long_kv.prefill_g12",
                   "dense.prefill_g12", "long_kv.chunk_g6", "long_kv.chunk_g12",
                   "union.chunk_g6", "union.prefill_g6"):
        assert any(n.endswith(f"@{config}]") and n.startswith(
            "nvidia_hopper.sparse_prefill_tuned[h200:cpu-float32-") for n in ran), (config, out)
    assert {"nvidia_hopper.sparse_prefill_tuned[h200:cpu-float32-seed_prefill_g6]",
            "nvidia_hopper.sparse_prefill_tuned[h200:cpu-float32-seed_chunk_g6x2]",
            "nvidia_hopper.sparse_prefill_tuned[h200:cpu-float32-seed_chunk_g12x2]"} <= ran
    # 5 cases x 2 dtypes and the 8 Triton configs found at larger sizes
    assert "kreg conformance nvidia_hopper: 18 executed (18 passed), judged on h200, this " \
           "machine; 4 not runnable here (not tested)" in out, out
    assert "nvidia_hopper.sparse_prefill_tuned[h200:cpu-float16-seed_full_row]" in ran


def test_amd_mi355x_executes_its_geometry_on_the_mi355x_profile(tmp_path: Path) -> None:
    code, out = kit("--kreg-conformance", "amd_mi355x", "-rA", cwd=tmp_path)
    assert code == 0, out
    ran = passed(out)
    for case in ("k2048", "k2048_ties", "k2048_nan_inf", "k2048_past_64_slices"):
        assert f"amd_mi355x.indexer_topk_sliced[mi355x:cpu-float32-{case}]" in ran, out
    assert "indexer_topk: 1 of the 1 configs plugin 'amd_mi355x' offers executed" in out
    assert "vendor: cpu, requires amd [capability]" in out  # on this machine: skipped, why


@pytest.fixture
def copies(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    info = site / "kreg_vendor_copies-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kreg-vendor-copies\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[kreg]\nbroken_block = kreg_vendor_copies:BROKEN_BLOCK\n"
        "broken_drop = kreg_vendor_copies:BROKEN_DROP\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), str(FIXTURES / "vendor_copies"),
                                           str(ROOT)])}


def test_broken_copies_of_a_vendor_plugin_fail(copies: dict[str, str], tmp_path: Path) -> None:
    code, out = kit("--kreg-conformance", "broken_block,broken_drop", "-k",
                    "float32 and seed_", env=copies, cwd=tmp_path)
    assert code == 1, out
    block = "broken_block.sparse_prefill_tuned[rtx-pro-6000-blackwell-server:cpu-float32-{}]"
    drop = "broken_drop.sparse_prefill_tuned[rtx-pro-6000-blackwell-server:cpu-float32-{}]"
    # the config below the group size fails where it is chosen (group 6), not elsewhere
    assert f"FAILED {block.format('seed_g6')}" in out and \
        f"FAILED {block.format('seed_full_row')}" in out, out
    assert f"FAILED {block.format('seed_g12x2')}" not in out
    assert "BLOCK_M=4 is below group_size=6" in out
    # the kernel dropping an index fails every case, with the worst element
    for case in ("seed_g6", "seed_g12x2", "seed_chunk_g12", "seed_full_row"):
        assert f"FAILED {drop.format(case)}" in out, out
    assert "max |out - ref|" in out


def test_bad_kit_input_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    code, out = kit("--kreg-conformance", "nvidia_sm120", "--kreg-conformance-device", "h300",
                    cwd=tmp_path)
    assert code == 4 and "unknown device profile 'h300'; known profiles: gb10" in out, out
    code, out = kit("--kreg-conformance", "nvidia_sm120", "--kreg-conformance-device",
                    "./b300.toml", cwd=tmp_path)
    assert code == 4 and "no profile file ./b300.toml: it does not exist" in out, out
    assert "Traceback" not in out
