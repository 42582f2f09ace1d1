"""``nvidia_hopper.indexer_topk_stream`` on a CPU: where the policy takes it, why it does not
elsewhere (in ``kreg explain``'s words), its input checks, the failed-build handover, and that
the retry path's sample rule is the kernel's.

The toolchain probes are patched in every selection test, so the verdicts are the same on a
machine with or without ``nvcc``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import plugins.nvidia_hopper as hopper
import registry
from backends.indexer_topk import cluster, stream
from registry.errors import KernelUnavailableError, WorkloadError

NAME = "nvidia_hopper.indexer_topk_stream"
WL = {"k": 2048, "num_rows": 1024, "max_keys": 131072, "dtype": "float32"}


@pytest.fixture
def nvcc_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "toolchain", lambda: (True, "nvcc at /x/nvcc (V13.0.88)"))
    monkeypatch.setattr(stream, "toolchain", lambda: (True, "nvcc at /x/nvcc (V13.0.88)"))


@pytest.mark.usefixtures("nvcc_found")
@pytest.mark.parametrize("device", ["h200", "h100"])
@pytest.mark.parametrize("rows", [hopper.STREAM_MIN_ROWS, 1024, 4096, 65536])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_taken_on_the_measured_parts_from_its_rows(device: str, rows: int, dtype: str) -> None:
    d = registry.select("indexer_topk", {**WL, "num_rows": rows, "dtype": dtype}, device=device)
    assert d.implementation == NAME, d.explain()
    text = d.explain()
    assert "guarantees: exact" in text
    assert "path: CUDA one-read streaming select" in text
    assert f"from {hopper.STREAM_MIN_ROWS} rows" in text


@pytest.mark.usefixtures("nvcc_found")
@pytest.mark.parametrize("change, reason", [
    ({"num_rows": hopper.STREAM_MIN_ROWS - 1}, "num_rows"),
    ({"max_keys": stream.MAX_KEYS + 1}, "max_keys"),
    ({"max_keys": hopper.STREAM_MIN_KEYS - 1}, "max_keys"),
    ({"k": stream.MAX_K + 1}, "k:"),
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


def test_without_nvcc_the_reason_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "toolchain", lambda: (False, "no nvcc (CUDA_HOME/bin/nvcc or "
                                                            "PATH)"))
    d = registry.select("indexer_topk", WL, device="h200")
    assert d.implementation == "generic.indexer_topk_radix"
    text = d.explain()
    row = next(line for line in text.splitlines() if line.strip().startswith(NAME))
    assert "rejected" in row and "cuda_toolchain: no nvcc" in text


@pytest.mark.usefixtures("nvcc_found")
def test_measure_waives_the_envelope_only() -> None:
    with registry.override("indexer_topk", f"{NAME}:measure"):
        assert registry.select("indexer_topk", {**WL, "num_rows": 1},
                               device="h200").implementation == NAME
        assert registry.select("indexer_topk", WL, device="h20").implementation == NAME
        assert registry.select("indexer_topk", WL, device="gb10").implementation != NAME
        assert registry.select("indexer_topk", {**WL, "k": stream.MAX_K + 1},
                               device="h200").implementation != NAME   # a capability


def test_inputs_are_checked_before_any_device_work() -> None:
    torch = pytest.importorskip("torch")
    scores = torch.randn(2, 100)
    lengths = torch.full((2,), 100, dtype=torch.int32)
    with pytest.raises(KernelUnavailableError, match="runs on CUDA GPUs"):
        stream.indexer_topk_stream(scores, lengths, 8)
    with pytest.raises(WorkloadError):
        stream.indexer_topk_stream(scores, lengths, 0)   # the op's own input checks first
    with pytest.raises(WorkloadError, match=rf"takes k <= {stream.MAX_K}; got k=3073 \(use "):
        stream.indexer_topk_stream(scores, lengths, 3073)
    wide = torch.zeros(1, stream.MAX_KEYS + 1)
    with pytest.raises(WorkloadError, match=r"at most 1048576 keys; got max_keys=1048577"):
        stream.indexer_topk_stream(wide, torch.ones(1, dtype=torch.int32), 8)


def test_the_python_constants_are_the_kernels() -> None:
    text = stream.SOURCE.read_text()
    assert 'extern "C" int kreg_stream_topk(' in text
    assert '#include "topk_keys.cuh"' in text
    consts = dict(re.findall(r"#define (STREAM_\w+) (\d+)", text))
    assert int(consts["STREAM_SAMPLE"]) == stream.SAMPLE
    assert int(consts["STREAM_CAP"]) // 2 == stream.MAX_K
    assert re.search(rf"constexpr int CW = {stream.SAMPLE_CHUNK};", text)
    assert re.search(r"constexpr int MAX_KEYS = 1 << 20;", text) and stream.MAX_KEYS == 1 << 20


def test_library_name_and_hash_cover_the_shared_header(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("KREG_HOME", str(tmp_path))
    src = tmp_path / "src"
    src.mkdir()
    (src / "stream_topk.cu").write_text(stream.SOURCE.read_text())
    (src / "topk_keys.cuh").write_text("// one\n")
    first = cluster.library_path("/no/nvcc", src / "stream_topk.cu")
    (src / "topk_keys.cuh").write_text("// two\n")
    second = cluster.library_path("/no/nvcc", src / "stream_topk.cu")
    assert first.name.startswith("stream_topk-") and first != second


def test_a_failed_build_hands_over_to_the_triton_kernels(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "cuda" / "bin"
    root.mkdir(parents=True)
    exe = root / "nvcc"
    exe.write_text('#!/bin/sh\ncase "$1" in --version) echo "V12.9";; *) echo "nvcc fatal : '
                   'Unsupported gpu architecture" >&2; exit 1;; esac\n')
    exe.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(stream, "_FAILED", [])
    monkeypatch.setattr(stream, "_lib", None)
    cluster._nvcc_version.cache_clear()
    cluster._probe_toolchain.cache_clear()
    try:
        with registry.override("indexer_topk", f"{NAME}:measure"):
            assert registry.select("indexer_topk", WL, device="h200").implementation == NAME
        with caplog.at_level("WARNING", logger="kreg"):
            assert stream._load_or_fail() is None
        assert "the Triton kernels serve instead" in caplog.text
        ok, seen = stream.toolchain()
        assert not ok and "Unsupported gpu architecture" in seen
        with registry.override("indexer_topk", f"{NAME}:measure"):
            d = registry.select("indexer_topk", WL, device="h200")   # the cache was dropped
        assert d.implementation == "generic.indexer_topk_radix"
        assert "cuda_toolchain: the kernel's build or load failed" in d.explain()
        assert stream._load_or_fail() is None   # no second build attempt
    finally:
        cluster._nvcc_version.cache_clear()
        cluster._probe_toolchain.cache_clear()


def test_the_bench_reports_no_scratch_for_the_cuda_kernels() -> None:
    torch = pytest.importorskip("torch")
    from backends.indexer_topk import bench
    from backends.indexer_topk.config import default_config, scratch_bytes_per_row
    from registry.tuning.measure import Trial

    case = bench.BenchCase(rows=64, keys=131072)
    cfg = default_config(64, 131072, 2048)
    trials = [Trial("stream", lambda: None, implementation=NAME),
              Trial("cluster", lambda: None, implementation="nvidia_hopper.indexer_topk_cluster"),
              Trial("triton", lambda: None, implementation="generic.indexer_topk_radix",
                    config=cfg)]
    extra = bench._floor(torch.zeros(64, 131072), trials, case)
    assert extra["scratch_bytes_per_row"] == {
        "stream": 0, "cluster": 0, "triton": scratch_bytes_per_row(cfg, 2048, 131072)}
    assert "stream 0 KiB" in extra["note"]


def test_kreg_tune_measures_it_beside_the_triton_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner's candidates include it at every row count (its envelope waived, as for the
    cluster kernel), so `kreg tune indexer_topk` on a GPU measures it before any policy does."""
    from registry.tuning.tune import implementation_candidates

    facts = registry.get_registry().resolve_device("h200")
    monkeypatch.setattr(stream, "toolchain", lambda: (True, "nvcc at /x/nvcc"))
    found = {name: (cfg, why) for name, cfg, why in
             implementation_candidates("indexer_topk", {**WL, "num_rows": 64}, facts,
                                       family="generic.indexer_topk_radix")}
    assert found[NAME] == ({}, "")
    monkeypatch.setattr(stream, "toolchain", lambda: (False, "no nvcc"))
    found = {name: (cfg, why) for name, cfg, why in
             implementation_candidates("indexer_topk", WL, facts,
                                       family="generic.indexer_topk_radix")}
    cfg, why = found[NAME]
    assert cfg is None and "cuda_toolchain" in why and "no nvcc" in why
