"""Device profiles as data: the shipped files, the file format, --set spellings, KREG_PROFILES,
the kreg_profiles hook and kreg_enrich_facts on profiles."""

from __future__ import annotations

import json
import subprocess
import sys
import types
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest

import registry
from registry import DeviceFacts, hookimpl
from registry._facts import load_profile, profiles_in
from registry.errors import ConfigError, UnknownDeviceError
from registry.requirements import CAPABILITY, predicate

from unit_helpers import setenv

ROOT = Path(__file__).resolve().parents[2]
B200 = """\
vendor = "nvidia"
name = "NVIDIA B200"
arch = "sm_100"
compute_capability = "10.0"
sm_count = 148
memory_bytes = 191_000_000_000
torch_version = "2.13.0+cu130"
triton_version = "3.7.1"
runtime_version = "13.0"

[extra]
tma_multicast = "1"
dies = 2
"""


def test_the_shipped_profiles_are_data_files_of_the_package() -> None:
    folder = files("registry") / "profiles"
    names = sorted(f.name for f in folder.iterdir() if f.name.endswith(".toml"))
    assert names == sorted(f"{n}.toml" for n in registry.profiles())
    for name, facts in registry.profiles().items():
        assert load_profile(folder / f"{name}.toml") == facts
    assert registry.get_registry().profile_sources()["h200"] == "shipped"


def test_the_wheel_ships_the_profile_files(tmp_path: Path) -> None:
    """hatchling's wheel (pyproject: only-include registry/) holds every profile file."""
    proc = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = tmp_path.glob("kreg-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("registry/profiles/")}
    assert shipped == {f"registry/profiles/{n}.toml" for n in registry.profiles()}


def test_model_dump_json_and_to_toml_are_valid_profile_files(tmp_path: Path) -> None:
    h200 = registry.profiles()["h200"]
    (tmp_path / "h200.json").write_text(json.dumps(h200.model_dump(mode="json")))
    assert load_profile(tmp_path / "h200.json") == h200
    b = h200.what_if(profile=None, extra={"nvlink": "4"})
    (tmp_path / "mine.toml").write_text(b.to_toml())
    assert load_profile(tmp_path / "mine.toml") == b.what_if(profile="mine")  # named by file
    (tmp_path / "b200.toml").write_text(B200)
    facts = load_profile(str(tmp_path / "b200.toml"))
    assert (facts.profile, facts.compute_capability, facts.extra) == (
        "b200", (10, 0), {"tma_multicast": "1", "dies": "2"})
    (tmp_path / "x.toml").write_text('profile = "b200-nvl"\n' + B200)
    assert load_profile(tmp_path / "x.toml").profile == "b200-nvl"  # the field names it


@pytest.mark.parametrize("name,text,message", [
    ("missing.toml", None, r"no profile file .*missing.toml: it does not exist"),
    ("b200.yaml", "vendor: nvidia", r"ends in .toml or .json \(got '.yaml'\)"),
    ("b200.toml", "vendor = nvidia", r"is not valid TOML: .*line 1"),
    ("b200.json", "{", r"is not valid JSON"),
    ("b200.toml", B200.replace("sm_count", "sm_counts"),
     r"(?=.*sm_counts: unknown field; known fields: vendor, name, arch, )"
     r"(?=.*sm_count: missing \(required\))"),
    ("b200.toml", B200.replace('"10.0"', '"ten"'),
     r"compute_capability: expected MAJOR.MINOR such as 10.0 .*\(got 'ten'\)"),
    ("b200.toml", B200.replace('"3.7.1"', '"abc"'),
     r"triton_version: not a version: expected release numbers such as 3.7.1, or none \(got "
     r"'abc'\)"),
    ("b200.toml", B200.replace('"nvidia"', '"intel"'), r"vendor: Input should be 'nvidia'"),
    ("b200.json", "[1, 2]", r"expected a table of DeviceFacts fields, got list"),
])
def test_a_bad_profile_file_is_one_clear_error(tmp_path: Path, name: str, text: str | None,
                                               message: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        registry.get_registry().resolve_device(str(path))
    assert str(path) in str(info.value)
    if text is not None:  # the fix: where the schema is, and how to start a file
        assert "kreg profiles h200 --toml" in str(info.value) or "ends in" in str(info.value)


def test_a_profile_file_is_accepted_wherever_a_profile_name_is(tmp_path: Path) -> None:
    wl = {"k": 2048, "num_rows": 64, "max_keys": 131072, "dtype": "float32"}
    path = tmp_path / "mi355x.json"
    path.write_text(json.dumps(registry.profiles()["mi355x"].model_dump(mode="json")))
    by_name = registry.select("indexer_topk", wl, "mi355x")
    by_file = registry.select("indexer_topk", wl, str(path))
    by_path = registry.select("indexer_topk", wl, path)  # a PathLike too
    assert by_name.implementation == by_file.implementation == by_path.implementation == \
        "amd_mi355x.indexer_topk_sliced"
    assert by_name.candidates == by_file.candidates and by_name.facts == by_file.facts
    with pytest.raises(UnknownDeviceError, match=r"or the path of a .toml/.json profile file"):
        registry.select("indexer_topk", wl, "mi356x")


def test_compute_capability_spellings() -> None:
    h200 = registry.profiles()["h200"]
    for text in ("10.0", "10,0", "(10, 0)", "[10, 0]", " 10 . 0 "):
        assert h200.with_settings([f"compute_capability={text}"]).compute_capability == (10, 0)
    assert DeviceFacts.model_validate({**h200.model_dump(), "compute_capability": [10, 0]}
                                      ).compute_capability == (10, 0)
    assert h200.with_settings(["compute_capability=none"]).compute_capability is None
    for bad in ("10", "ten", "10.0.1", "(10, )"):
        with pytest.raises(ConfigError, match=r"compute_capability: expected MAJOR.MINOR"):
            h200.with_settings([f"compute_capability={bad}"])


def test_with_settings_sets_every_field_and_names_what_changed() -> None:
    h200 = registry.profiles()["h200"]
    b200 = h200.with_settings([
        "vendor=nvidia", "name=NVIDIA B200", "arch=sm_100", "compute_capability=10.0",
        "sm_count=148", "memory_bytes=191000000000", "torch_version=2.13.0+cu130",
        "triton_version=3.7.1", "runtime_version=none", "extra.tma_multicast=1",
        "extra.note=a=b,c"])
    assert (b200.vendor, b200.name, b200.arch, b200.compute_capability, b200.sm_count,
            b200.memory_bytes, b200.torch_version, b200.triton_version,
            b200.runtime_version) == ("nvidia", "NVIDIA B200", "sm_100", (10, 0), 148,
                                      191000000000, "2.13.0+cu130", "3.7.1", None)
    assert b200.extra == {"tma_multicast": "1", "note": "a=b,c"}
    # the profile says what changed, so an explain of it never reads as the plain h200
    assert b200.profile is not None and b200.profile.startswith(
        "h200 with vendor=nvidia, name=NVIDIA B200, arch=sm_100, compute_capability=10.0")
    named = h200.with_settings(["compute_capability=10.0", "profile=b200"])
    assert named.profile == "b200"
    assert named.with_settings(["extra="]).extra == {}
    assert h200.with_settings([]) is h200
    for settings, message in [
        (["sm_counts=1"], r"DeviceFacts has no field 'sm_counts'; known fields: vendor, .*"
                          r"\(and extra.KEY\)"),
        (["sm_count=1", "sm_count=2"], r"sm_count is given twice \('1' and '2'\)"),
        (["triton_version=abc"], r"triton_version: not a version"),
        (["sm_count=many"], r"sm_count: Input should be a valid integer"),
        (["extra=1"], r"set one extra fact with extra.KEY=VALUE"),
        (["extra.=1"], r"name the extra fact"),
        (["sm_count"], r"is not FIELD=VALUE"),
    ]:
        with pytest.raises(ConfigError, match=message):
            h200.with_settings(settings)


def test_kreg_profiles_adds_directories_and_files(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "b200.toml").write_text(B200)
    h200 = registry.profiles()["h200"]
    (first / "h200.json").write_text(json.dumps(h200.what_if(triton_version="3.7.0")
                                                .model_dump(mode="json")))
    (first / "README.md").write_text("not a profile")  # ignored
    (second / "b200.toml").write_text(B200.replace("148", "140"))  # the first entry wins
    one = tmp_path / "gb300.toml"
    one.write_text(B200.replace("B200", "GB300"))
    setenv(monkeypatch, "KREG_PROFILES", f"{first}:{second}:{one}")
    reg = registry.get_registry()
    sources = reg.profile_sources()
    assert sources["b200"] == f"file {first}/b200.toml"
    assert sources["h200"] == f"file {first}/h200.json"  # replaces the shipped one
    assert sources["gb300"] == f"file {one}" and sources["l20"] == "shipped"
    assert registry.profiles()["b200"].sm_count == 148
    assert registry.profiles()["h200"].triton_version == "3.7.0"
    assert registry.select("indexer_topk", {"k": 8, "num_rows": 1, "max_keys": 8,
                                            "dtype": "float32"}, "b200").facts.arch == "sm_100"
    (first / "bad.toml").write_text("sm_count = 1")
    registry.invalidate()
    with pytest.raises(ConfigError, match=r"profile file .*/a/bad.toml: vendor: missing"):
        registry.profiles()
    setenv(monkeypatch, "KREG_PROFILES", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"no profile file or directory .*nowhere"):
        registry.profiles()
    monkeypatch.delenv("KREG_PROFILES")
    registry.invalidate()
    assert "b200" not in registry.profiles()


def _plugin(**hooks: object) -> types.SimpleNamespace:
    ns = types.SimpleNamespace()
    for name, fn in hooks.items():
        setattr(ns, name, hookimpl(fn))  # type: ignore[call-overload]
    return ns


def test_a_plugin_ships_profiles(tmp_path: Path) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "b200.toml").write_text(B200)
    gb300 = registry.profiles()["h200"].what_if(name="NVIDIA GB300", profile="gb300")

    def kreg_profiles() -> list[object]:
        return [folder, gb300]

    reg = registry.Registry()
    reg.register_plugin(_plugin(kreg_profiles=kreg_profiles), "bvendor")
    assert reg.profile_sources()["b200"] == "plugin bvendor"
    assert reg.profile_sources()["gb300"] == "plugin bvendor"
    assert reg.resolve_device("b200").extra["tma_multicast"] == "1"
    assert not reg.plugins["bvendor"].errors

    def clash() -> list[object]:
        return [registry.profiles()["h200"], "not/a/file.toml", 42,
                DeviceFacts(vendor="cpu", name="x", arch="cpu", sm_count=1, memory_bytes=0)]

    def boom() -> list[object]:
        raise RuntimeError("profiles missing from the wheel")

    reg.register_plugin(_plugin(kreg_profiles=clash), "clash")
    reg.register_plugin(_plugin(kreg_profiles=boom), "boom")
    assert set(reg.profile_sources()) >= {"b200", "h200", "gb300"}
    errors = reg.plugins["clash"].errors
    assert any("profile 'h200' (DeviceFacts) is already shipped; rename it" in e for e in errors)
    assert any("no profile file or directory not/a/file.toml" in e for e in errors)
    assert any("returned int 42" in e for e in errors)
    assert any("without a profile name" in e for e in errors)
    assert len(errors) == 4  # every error, once
    assert "hook kreg_profiles raised RuntimeError: profiles missing" in str(
        reg.plugins["boom"].error)
    assert reg.resolve_device("b200").name == "NVIDIA B200"  # the others still load


def _nvlink(f: DeviceFacts, w: object) -> tuple[bool, str, str]:
    got = f.extra.get("nvlink_generation")
    return got == "5", f"nvlink {got or 'unknown'}", "NVLink 5"


def test_enrich_facts_runs_on_profiles(tmp_path: Path) -> None:
    """A requirement on an enriched fact is explained for a device nobody here has."""
    seen: list[str] = []

    def kreg_enrich_facts(facts: DeviceFacts) -> dict[str, str] | None:
        seen.append(facts.name)
        if facts.name.startswith("NVIDIA B200"):
            return {"nvlink_generation": "5", "tma_multicast": "0"}
        return None

    def kreg_implementations() -> list[registry.Implementation]:
        return [registry.Implementation(op="indexer_topk", name="enrich.topk", priority=500,
                                        requirements=(predicate("nvlink", CAPABILITY, _nvlink),),
                                        configurable=False)]

    reg = registry.Registry()
    reg.register_plugin(_plugin(kreg_enrich_facts=kreg_enrich_facts,
                                kreg_implementations=kreg_implementations), "enrich")
    (tmp_path / "b200.toml").write_text(B200)
    wl = {"k": 8, "num_rows": 1, "max_keys": 8, "dtype": "float32"}
    for device in (str(tmp_path / "b200.toml"), registry.profiles()["h200"]
                   .with_settings(["name=NVIDIA B200"])):
        facts = reg.resolve_device(device)
        d = reg.select("indexer_topk", wl, reg.enrich(facts))
        assert d.implementation == "enrich.topk", d.explain()
        assert d.facts.extra["nvlink_generation"] == "5"
    # the profile's own extra facts are kept: the hook adds, it never overrides
    assert reg.resolve_device(str(tmp_path / "b200.toml")).extra["tma_multicast"] == "1"
    assert reg.resolve_device(str(tmp_path / "b200.toml"), enrich=False).extra == {
        "tma_multicast": "1", "dies": "2"}
    d = reg.select("indexer_topk", wl, "h200")
    cand = next(c for c in d.candidates if c.implementation == "enrich.topk")
    assert [str(c) for c in cand.failed] == ["nvlink: nvlink unknown, requires NVLink 5"]
    assert "NVIDIA H200" in seen

    def broken(facts: DeviceFacts) -> dict[str, str]:
        raise KeyError("firmware table")

    reg.register_plugin(_plugin(kreg_enrich_facts=broken), "broken")
    assert reg.resolve_device("l20").name == "NVIDIA L20"  # isolated per plugin
    assert "hook kreg_enrich_facts raised KeyError" in str(reg.plugins["broken"].error)
    assert reg.plugins["broken"].failed


def test_profiles_in_lists_a_directory_sorted(tmp_path: Path) -> None:
    (tmp_path / "z.toml").write_text(B200)
    (tmp_path / "a.json").write_text(json.dumps(load_profile(tmp_path / "z.toml")
                                                .model_dump(mode="json") | {"profile": None}))
    assert [f.profile for f, _ in profiles_in(tmp_path)] == ["a", "z"]
