"""``nvidia_hopper.indexer_topk_cluster`` on a CPU: where the policy takes it, why it does not
elsewhere (in ``kreg explain``'s words), the toolchain probe, and the build's errors.

The toolchain probe is patched in every selection test, so the verdicts are the same on a
machine with or without ``nvcc``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import plugins.nvidia_hopper as hopper
import registry
from backends.indexer_topk import cluster
from registry.errors import KernelUnavailableError

NAME = "nvidia_hopper.indexer_topk_cluster"
WL = {"k": 2048, "num_rows": 4, "max_keys": 131072, "dtype": "float32"}


@pytest.fixture
def nvcc_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "toolchain", lambda: (True, "nvcc at /x/nvcc (V13.0.88)"))


@pytest.fixture
def no_nvcc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "toolchain",
                        lambda: (False, "no nvcc (CUDA_HOME/bin/nvcc or PATH)"))


@pytest.mark.usefixtures("nvcc_found")
@pytest.mark.parametrize("device", ["h200", "h100"])
@pytest.mark.parametrize("rows", [1, 2, 8, hopper.CLUSTER_MAX_ROWS])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_taken_on_the_measured_parts_up_to_its_rows(device: str, rows: int, dtype: str) -> None:
    d = registry.select("indexer_topk", {**WL, "num_rows": rows, "dtype": dtype}, device=device)
    assert d.implementation == NAME, d.explain()
    text = d.explain()
    assert "guarantees: exact" in text
    assert "path: CUDA cluster radix select" in text
    assert f"up to {hopper.CLUSTER_MAX_ROWS} rows" in text


@pytest.mark.usefixtures("nvcc_found")
@pytest.mark.parametrize("change, reason", [
    ({"num_rows": hopper.CLUSTER_MAX_ROWS + 1}, "num_rows"),
    ({"num_rows": 4096}, "num_rows"),
    ({"max_keys": cluster.MAX_KEYS + 1}, "max_keys"),
])
def test_not_taken_outside_its_envelope(change: dict[str, int], reason: str) -> None:
    d = registry.select("indexer_topk", {**WL, **change}, device="h200")
    assert d.implementation != NAME
    text = d.explain()
    row = next(line for line in text.splitlines() if line.strip().startswith(NAME))
    assert "rejected" in row and reason in text


@pytest.mark.usefixtures("nvcc_found")
@pytest.mark.parametrize("device", ["h20", "gb10", "mi355x", "rtx-pro-6000-blackwell-server"])
def test_other_devices_unaffected(device: str) -> None:
    assert registry.select("indexer_topk", WL, device=device).implementation != NAME


@pytest.mark.usefixtures("no_nvcc")
def test_without_nvcc_the_reason_is_named() -> None:
    d = registry.select("indexer_topk", WL, device="h200")
    assert d.implementation == "generic.indexer_topk_radix"
    text = d.explain()
    assert "cuda_toolchain: no nvcc" in text and "[capability]" in text


@pytest.mark.usefixtures("nvcc_found")
def test_measure_waives_the_envelope_only() -> None:
    with registry.override("indexer_topk", f"{NAME}:measure"):
        d = registry.select("indexer_topk", {**WL, "num_rows": 4096}, device="h200")
        assert d.implementation == NAME
        d = registry.select("indexer_topk", WL, device="h20")
        assert d.implementation == NAME   # an sm_90 part outside the measured set
        d = registry.select("indexer_topk", WL, device="gb10")
        assert d.implementation != NAME   # sm_121: a capability, never waived


def test_toolchain_probe_and_library_path(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))   # no nvcc here
    cluster._probe_toolchain.cache_clear()
    try:
        assert cluster.nvcc() is None
        ok, seen = cluster.toolchain()
        assert not ok and "no nvcc" in seen
        with pytest.raises(KernelUnavailableError, match=r"needs nvcc .* install the CUDA "
                                                         r"toolkit"):
            cluster.build()
    finally:
        cluster._probe_toolchain.cache_clear()


def _fake_nvcc(root: Path, body: str) -> Path:
    (root / "bin").mkdir(parents=True)
    exe = root / "bin" / "nvcc"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_a_failing_build_names_the_compiler_output(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    _fake_nvcc(tmp_path / "cuda", 'case "$1" in --version) echo "Cuda compilation tools, '
                                  'release 99.0, V99.0.0";; *) echo "fatal: no sm_90a here" '
                                  '>&2; exit 2;; esac\n')
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    cluster._nvcc_version.cache_clear()
    cluster._probe_toolchain.cache_clear()
    try:
        ok, seen = cluster.toolchain()
        assert ok and "V99.0.0" in seen
        path = cluster.library_path()
        assert path.parent == tmp_path / "home" / "cuda" and path.name.startswith("cluster_topk-")
        with pytest.raises(KernelUnavailableError, match=r"(?s)failed \(exit 2\).*no sm_90a "
                                                         r"here.*KREG_SELECT_INDEXER_TOPK"):
            cluster.build()
        assert not path.exists() and not list(path.parent.glob("*.tmp"))
    finally:
        cluster._nvcc_version.cache_clear()
        cluster._probe_toolchain.cache_clear()


def test_library_name_follows_the_source_and_the_compiler(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setenv("KREG_HOME", str(tmp_path))
    names = set()
    for version in ("1.0", "2.0"):
        root = tmp_path / f"cuda{version}"
        _fake_nvcc(root, f'echo "Cuda compilation tools, V{version}"\n')
        cluster._nvcc_version.cache_clear()
        names.add(cluster.library_path(str(root / "bin" / "nvcc")).name)
    cluster._nvcc_version.cache_clear()
    assert len(names) == 2   # a compiler upgrade rebuilds


def test_cpu_tensors_are_refused_with_the_reason() -> None:
    torch = pytest.importorskip("torch")
    scores = torch.randn(2, 100)
    lengths = torch.full((2,), 100, dtype=torch.int32)
    with pytest.raises(KernelUnavailableError, match="runs on CUDA GPUs"):
        cluster.indexer_topk_cluster(scores, lengths, 8)
    with pytest.raises(registry.errors.WorkloadError):
        cluster.indexer_topk_cluster(scores, lengths, 0)   # the op's own input checks first
    with pytest.raises(registry.errors.WorkloadError, match="above int32's range"):
        cluster.indexer_topk_cluster(scores, lengths, 2**31)
    wide = torch.zeros(1, cluster.MAX_KEYS + 1)
    with pytest.raises(registry.errors.WorkloadError,
                       match=r"at most 131072 keys; got max_keys=131073 \(use generic"):
        cluster.indexer_topk_cluster(wide, torch.ones(1, dtype=torch.int32), 8)


def test_source_ships_inside_the_package() -> None:
    assert cluster.SOURCE.is_file()
    text = cluster.SOURCE.read_text()
    assert 'extern "C" int kreg_cluster_topk(' in text
    assert os.path.commonpath([cluster.SOURCE, Path(cluster.__file__).parent]) == str(
        Path(cluster.__file__).parent)


def test_kreg_tune_measures_it_beside_the_triton_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.tuning.tune import implementation_candidates

    facts = registry.get_registry().resolve_device("h200")
    monkeypatch.setattr(cluster, "toolchain", lambda: (True, "nvcc at /x/nvcc"))
    found = {name: (cfg, why) for name, cfg, why in
             implementation_candidates("indexer_topk", {**WL, "num_rows": 1024}, facts,
                                       family="generic.indexer_topk_radix")}
    assert found[NAME] == ({}, "")   # a candidate at 1024 rows too: its envelope is waived
    monkeypatch.setattr(cluster, "toolchain", lambda: (False, "no nvcc"))
    found = {name: (cfg, why) for name, cfg, why in
             implementation_candidates("indexer_topk", WL, facts,
                                       family="generic.indexer_topk_radix")}
    cfg, why = found[NAME]
    assert cfg is None and "cuda_toolchain" in why and "no nvcc" in why


def test_a_failed_build_hands_over_to_the_triton_kernels(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    _fake_nvcc(tmp_path / "cuda", 'case "$1" in --version) echo "V12.9";; *) echo "nvcc fatal '
                                  ': Unsupported gpu architecture" >&2; exit 1;; esac\n')
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cluster, "_FAILED", [])
    monkeypatch.setattr(cluster, "_lib", None)
    cluster._nvcc_version.cache_clear()
    cluster._probe_toolchain.cache_clear()
    try:
        assert registry.select("indexer_topk", WL, device="h200").implementation == NAME
        with caplog.at_level("WARNING", logger="kreg"):
            assert cluster._load_or_fail() is None
        assert "the Triton kernels serve instead" in caplog.text
        ok, seen = cluster.toolchain()
        assert not ok and "Unsupported gpu architecture" in seen
        d = registry.select("indexer_topk", WL, device="h200")   # the cache was dropped
        assert d.implementation == "generic.indexer_topk_radix"
        assert "cuda_toolchain: the kernel's build or load failed" in d.explain()
        assert cluster._load_or_fail() is None   # no second build attempt
    finally:
        cluster._nvcc_version.cache_clear()
        cluster._probe_toolchain.cache_clear()


def test_an_unwritable_home_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_nvcc(tmp_path / "cuda", 'echo "V12.9"\n')
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    blocker = tmp_path / "home"
    blocker.write_text("a file where KREG_HOME's directory should be")
    monkeypatch.setenv("KREG_HOME", str(blocker))
    cluster._nvcc_version.cache_clear()
    try:
        with pytest.raises(KernelUnavailableError, match="set KREG_HOME to a writable"):
            cluster.build()
    finally:
        cluster._nvcc_version.cache_clear()
