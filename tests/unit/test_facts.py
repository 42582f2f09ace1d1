"""Device facts: profiles, what-ifs, and the probe driven through mocked torch device facts."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

import registry
from registry import _facts
from registry.errors import ConfigError, UnknownDeviceError

EXPECTED_PROFILES = {
    "rtx-pro-6000-blackwell-server": ("sm_120", 188),
    "rtx-pro-6000-blackwell-workstation": ("sm_120", 188),
    "rtx-5090": ("sm_120", 170),
    "gb10": ("sm_121", None),
    "h200": ("sm_90", 132),
    "h100": ("sm_90", 132),
    "h20": ("sm_90", 78),
    "l20": ("sm_89", 92),
    "mi355x": ("gfx950", 256),
    "mi300x": ("gfx942", 304),
}


def test_every_design_profile_ships() -> None:
    profs = registry.profiles()
    assert set(profs) == set(EXPECTED_PROFILES)
    for name, (arch, sms) in EXPECTED_PROFILES.items():
        assert profs[name].arch == arch
        assert profs[name].profile == name
        if sms is not None:
            assert profs[name].sm_count == sms
        assert profs[name].triton_version and profs[name].torch_version


def test_server_profile_carries_the_seed_triton() -> None:
    server = registry.profiles()["rtx-pro-6000-blackwell-server"]
    assert server.triton_version == "3.7.1"
    assert server.name == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    ws = registry.profiles()["rtx-pro-6000-blackwell-workstation"]
    assert ws.name != server.name and ws.sm_count == server.sm_count


def test_facts_are_frozen_and_what_if_validates() -> None:
    h200 = registry.profiles()["h200"]
    with pytest.raises(ValidationError):
        h200.sm_count = 1  # type: ignore[misc]
    older = h200.what_if(triton_version="3.5.0")
    assert older.triton_version == "3.5.0" and h200.triton_version == "3.6.0"
    assert older.fingerprint != h200.fingerprint
    assert h200.what_if().fingerprint == h200.fingerprint
    with pytest.raises(ConfigError, match="no field"):
        h200.what_if(sm_counts=3)
    with pytest.raises(ConfigError, match="sm_count"):
        h200.what_if(sm_count=-1)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(UnknownDeviceError, match="rtx-5090") as info:
        registry.select("indexer_topk", {"k": 8, "num_rows": 1, "max_keys": 8,
                                         "dtype": "float32"}, "rtx-9090")
    assert isinstance(info.value, LookupError)


class _Props:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


def _fake_torch(props: _Props, *, hip: str | None = None,
                cuda: str | None = "13.0") -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "2.99.0"  # type: ignore[attr-defined]
    calls: list[str] = []

    def sync(*a: object) -> None:
        raise AssertionError("probe must never synchronize the device")

    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: True, current_device=lambda: 0, device_count=lambda: 1,
        get_device_properties=lambda i: (calls.append(f"props{i}"), props)[1],
        synchronize=sync)
    torch.version = types.SimpleNamespace(cuda=cuda, hip=hip)  # type: ignore[attr-defined]
    torch.calls = calls  # type: ignore[attr-defined]
    return torch


@pytest.fixture
def no_probe_cache() -> Iterator[None]:
    _facts._clear_probe_cache()
    yield
    _facts._clear_probe_cache()


def test_probe_cuda_through_mocked_torch(monkeypatch: pytest.MonkeyPatch,
                                         no_probe_cache: None) -> None:
    props = _Props(name="NVIDIA RTX PRO 6000 Blackwell Server Edition", major=12, minor=0,
                   multi_processor_count=188, total_memory=96 * 2**30)
    fake = _fake_torch(props)
    monkeypatch.setitem(sys.modules, "torch", fake)
    facts = _facts.probe()
    assert (facts.vendor, facts.arch, facts.compute_capability, facts.sm_count) == (
        "nvidia", "sm_120", (12, 0), 188)
    assert facts.runtime_version == "13.0" and facts.torch_version == "2.99.0"
    # once per device index
    assert _facts.probe(0) is facts
    assert fake.calls == ["props0"]  # type: ignore[attr-defined]
    # the real sm120 selection on probed facts
    d = registry.select("sparse_prefill", {
        "kind": "prefill", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
        "total_q": 8192, "num_requests": 1, "max_q": 8192, "dtype": "bfloat16"},
        facts.what_if(triton_version="3.7.1"))
    assert d.implementation == "nvidia_sm120.sparse_prefill_tuned"


def test_probe_sm121_is_not_sm120(monkeypatch: pytest.MonkeyPatch, no_probe_cache: None) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(_Props(
        name="NVIDIA GB10", major=12, minor=1, multi_processor_count=48, total_memory=2**30)))
    assert _facts.probe().arch == "sm_121"


def test_probe_rocm_reads_gcn_arch_name(monkeypatch: pytest.MonkeyPatch,
                                        no_probe_cache: None) -> None:
    props = _Props(name="AMD Instinct MI355X", major=9, minor=5, multi_processor_count=256,
                   total_memory=288 * 2**30, gcnArchName="gfx950:sramecc+:xnack-")
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(props, hip="7.2.0", cuda=None))
    facts = _facts.probe()
    assert (facts.vendor, facts.arch, facts.sm_count, facts.runtime_version) == (
        "amd", "gfx950", 256, "7.2.0")
    d = registry.select("indexer_topk", {"k": 2048, "num_rows": 4, "max_keys": 131072,
                                         "dtype": "float32"}, facts)
    assert d.implementation == "amd_mi355x.indexer_topk_sliced"
    assert d.config is not None and d.config["SLICE_KEYS"] == 1024
    assert d.config["MAX_SLICES"] == 64


def test_probe_without_gpu_is_cpu(monkeypatch: pytest.MonkeyPatch, no_probe_cache: None) -> None:
    fake = _fake_torch(_Props())
    fake.cuda.is_available = lambda: False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    facts = _facts.probe()
    assert facts.vendor == "cpu" and facts.arch == "cpu" and facts.compute_capability is None


def test_probe_does_not_import_triton() -> None:
    import subprocess

    code = ("import sys, registry; registry.probe(); "
            "assert 'triton' not in sys.modules, 'probe imported triton'")
    subprocess.run([sys.executable, "-c", code], check=True)
