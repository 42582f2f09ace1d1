"""Plugin loading: entry points, allow/deny lists, and isolation of broken plugins."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import sys
import types

import pytest
from click.testing import CliRunner

import cli
import registry
from registry import Implementation, hookimpl

from unit_helpers import allow_plugin, setenv

IN_TREE = {"sparse_prefill", "indexer_topk", "reference", "generic", "nvidia_sm120",
           "amd_mi355x"}


def test_in_tree_plugins_load_through_entry_points() -> None:
    eps = {ep.name for ep in importlib.metadata.entry_points(group="kreg")}
    assert eps >= IN_TREE
    reg = registry.Registry()
    loaded = {name for name, rec in reg.plugins.items() if rec.loaded}
    assert loaded >= IN_TREE
    assert reg.plugins["nvidia_sm120"].implementations == ["nvidia_sm120.sparse_prefill_tuned"]
    assert reg.plugins["sparse_prefill"].ops == ["sparse_prefill"]


def test_deny_list(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_DISABLE_PLUGINS", "nvidia_sm120, amd_mi355x")
    reg = registry.Registry()
    assert reg.plugins["nvidia_sm120"].skipped_reason == "in KREG_DISABLE_PLUGINS"
    assert "nvidia_sm120.sparse_prefill_tuned" not in reg.impls["sparse_prefill"]
    d = reg.select("sparse_prefill", {"kind": "prefill", "topk": 2051, "head_dim": 256,
                                      "group_size": 6, "num_kv_heads": 1, "total_q": 8192,
                                      "num_requests": 1, "max_q": 8192, "dtype": "bfloat16"},
                   "rtx-pro-6000-blackwell-server")
    assert d.implementation == "generic.sparse_prefill_table"


def test_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_PLUGINS", "indexer_topk,reference")
    reg = registry.Registry()
    # the reference plugin serves both ops: the op package it needs loads with it
    assert set(reg.ops) == {"indexer_topk", "sparse_prefill"}
    assert list(reg.impls["indexer_topk"]) == ["reference.indexer_topk"]
    assert list(reg.impls["sparse_prefill"]) == ["reference.sparse_prefill"]
    assert reg.plugins["generic"].skipped_reason == "not in KREG_PLUGINS"
    assert not any(r.failed for r in reg.plugins.values()), {
        n: r.errors for n, r in reg.plugins.items() if r.failed}


class _EP:
    def __init__(self, name: str, value: str, loader: object) -> None:
        self.name, self.value, self._loader = name, value, loader

    def load(self) -> object:
        return self._loader()  # type: ignore[operator]


def _boom() -> object:
    raise ImportError("No module named 'vendor_kernels'")


def test_a_plugin_that_fails_to_import_is_named_and_isolated(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real = list(importlib.metadata.entry_points(group="kreg"))
    fake = [*real, _EP("broken_vendor", "broken_vendor.plugin", _boom)]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: fake)
    allow_plugin(monkeypatch, "broken_vendor")
    caplog.set_level(logging.WARNING, logger="registry")
    reg = registry.Registry()
    rec = reg.plugins["broken_vendor"]
    assert not rec.loaded
    assert rec.error == ("Error importing plugin 'broken_vendor': ImportError: No module named "
                         "'vendor_kernels'")
    assert any("broken_vendor" in r.getMessage() for r in caplog.records)
    assert {n for n, r in reg.plugins.items() if r.loaded} >= IN_TREE
    # and `kreg plugins` shows it
    registry.reset_registry(reg)
    try:
        out = CliRunner().invoke(cli.main, ["plugins"]).output
    finally:
        registry.reset_registry()
    assert "broken_vendor  [FAILED]" in out and "No module named 'vendor_kernels'" in out


def test_a_raising_hook_is_isolated(caplog: pytest.LogCaptureFixture) -> None:
    bad = types.SimpleNamespace()

    @hookimpl
    def kreg_implementations() -> list[Implementation]:
        raise RuntimeError("vendor table missing")

    bad.kreg_implementations = kreg_implementations
    caplog.set_level(logging.WARNING, logger="registry")
    reg = registry.Registry()
    reg.register_plugin(bad, "flaky")
    assert "hook kreg_implementations raised RuntimeError: vendor table missing" in str(
        reg.plugins["flaky"].error)
    assert not reg.plugins["flaky"].loaded
    assert "generic.sparse_prefill_table" in reg.impls["sparse_prefill"]


def test_duplicate_names_are_refused_naming_both() -> None:
    dup = types.SimpleNamespace()

    @hookimpl
    def kreg_implementations() -> list[Implementation]:
        return [Implementation(op="indexer_topk", name="reference.indexer_topk", priority=5)]

    dup.kreg_implementations = kreg_implementations
    reg = registry.Registry()
    reg.register_plugin(dup, "copycat")
    assert "already registered by plugin 'reference'" in str(reg.plugins["copycat"].error)
    assert reg.impls["indexer_topk"]["reference.indexer_topk"].priority == 0
    with pytest.raises(registry.errors.PluginError, match="already registered"):
        reg.register_plugin(types.SimpleNamespace(), "copycat")


def test_an_implementation_for_an_unknown_op_is_reported() -> None:
    odd = types.SimpleNamespace()

    @hookimpl
    def kreg_implementations() -> list[Implementation]:
        return [Implementation(op="sparse_decode", name="odd.decode", priority=5)]

    odd.kreg_implementations = kreg_implementations
    reg = registry.Registry()
    reg.register_plugin(odd, "odd")
    assert "no loaded plugin defines" in str(reg.plugins["odd"].error)


def test_enrich_facts_hook_merges_vendor_facts() -> None:
    vendor = types.SimpleNamespace()

    @hookimpl
    def kreg_enrich_facts(facts: registry.DeviceFacts) -> dict[str, str]:
        return {"xcd_count": "8"}

    vendor.kreg_enrich_facts = kreg_enrich_facts
    reg = registry.Registry()
    reg.register_plugin(vendor, "vendor_facts")
    facts = reg.facts_for_index(-1)
    assert facts.extra["xcd_count"] == "8"


def test_selection_does_not_import_torch_or_triton() -> None:
    import subprocess

    code = (
        "import sys, registry\n"
        "d = registry.select('sparse_prefill', dict(kind='chunk', topk=2051, head_dim=256, "
        "group_size=6, num_kv_heads=1, total_q=8192, num_requests=1, max_q=8192, "
        "dtype='bfloat16'), 'rtx-pro-6000-blackwell-server')\n"
        "assert d.implementation == 'nvidia_sm120.sparse_prefill_tuned'\n"
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]\n"
        "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- KREG_PLUGINS and the op packages, every error, kreg plugins' verdict -----------------


def test_kreg_plugins_loads_the_op_packages_a_listed_plugin_needs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_PLUGINS", "nvidia_sm120")
    reg = registry.Registry()
    assert not reg.plugins["nvidia_sm120"].failed, reg.plugins["nvidia_sm120"].errors
    assert reg.plugins["sparse_prefill"].loaded and reg.plugins["sparse_prefill"].notes == [
        "not in KREG_PLUGINS: loaded because it defines op 'sparse_prefill', which plugin "
        "'nvidia_sm120' implements"]
    assert list(reg.impls["sparse_prefill"]) == ["nvidia_sm120.sparse_prefill_tuned"]
    assert reg.plugins["indexer_topk"].skipped_reason == "not in KREG_PLUGINS"
    # the reference is a policy plugin: not loaded, and the message says what to add
    with pytest.raises(registry.errors.KernelUnavailableError,
                       match=r"op 'sparse_prefill' \(plugin 'sparse_prefill'\): OpSpec.reference="
                             r"'reference.sparse_prefill' is not loaded: plugin 'reference' is "
                             r"not in KREG_PLUGINS; add it to KREG_PLUGINS"):
        reg.reference_kernel("sparse_prefill")
    registry.reset_registry(reg)
    try:
        result = CliRunner().invoke(cli.main, ["plugins"])
    finally:
        registry.reset_registry()
    assert result.exit_code == 0, result.output
    assert "sparse_prefill  [loaded]" in result.output
    assert "note: not in KREG_PLUGINS: loaded because it defines op 'sparse_prefill'" in \
        result.output


def test_a_disabled_op_package_skips_the_implementations_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_DISABLE_PLUGINS", "indexer_topk")
    reg = registry.Registry()
    assert set(reg.ops) == {"sparse_prefill"}
    assert not reg.plugins["reference"].failed and not reg.plugins["generic"].failed
    assert "its implementations of op 'indexer_topk' are skipped: the op's package " \
           "'indexer_topk' is in KREG_DISABLE_PLUGINS" in reg.plugins["reference"].notes


def test_an_op_nobody_defines_names_what_to_add_to_kreg_plugins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_PLUGINS", "reference")
    odd = types.SimpleNamespace(kreg_implementations=hookimpl(
        lambda: [Implementation(op="sparse_decode", name="odd.decode", priority=5)]))
    reg = registry.Registry()
    reg.register_plugin(odd, "odd")
    assert "op 'sparse_decode', which no loaded plugin defines" in str(reg.plugins["odd"].error)
    assert "add the plugin that defines op 'sparse_decode' to it" in str(reg.plugins["odd"].error)


def test_a_plugin_keeps_every_error_and_kreg_plugins_exits_1() -> None:
    bad = types.SimpleNamespace()

    @hookimpl
    def kreg_implementations() -> list[object]:
        return ["not an implementation", Implementation(op="nope", name="bad.x", priority=1)]

    @hookimpl
    def kreg_enrich_facts(facts: registry.DeviceFacts) -> dict[str, str]:
        raise OSError("no /dev/vendor0")

    bad.kreg_implementations = kreg_implementations
    bad.kreg_enrich_facts = kreg_enrich_facts
    reg = registry.Registry()
    reg.register_plugin(bad, "bad")
    registry.reset_registry(reg)
    try:
        result = CliRunner().invoke(cli.main, ["plugins"])
        relaxed = CliRunner().invoke(cli.main, ["plugins", "--allow-failed"])
        as_json = CliRunner().invoke(cli.main, ["plugins", "--json"])
    finally:
        registry.reset_registry()
    assert result.exit_code == 1, result.output
    assert "bad  [FAILED]" in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("    error: ")]
    assert any("returned str 'not an implementation'" in e for e in errors)
    assert any("op 'nope', which no loaded plugin defines" in e for e in errors)
    # kreg plugins probes this device: the enrich hook's failure is shown, not "[loaded]"
    assert any("hook kreg_enrich_facts raised OSError: no /dev/vendor0" in e for e in errors)
    assert "1 plugin(s) FAILED: bad" in result.output
    assert relaxed.exit_code == 0 and "bad  [FAILED]" in relaxed.output
    record = next(p for p in json.loads(as_json.output) if p["name"] == "bad")
    assert as_json.exit_code == 1 and record["state"] == "FAILED" and len(record["errors"]) == 3


def _op_plugin(reference: str) -> types.SimpleNamespace:
    from registry import OpSpec, Workload

    class TinyWorkload(Workload):
        op = "tiny"
        n: int

    spec = OpSpec(name="tiny", workload_model=TinyWorkload,
                  call_key=lambda x: ("tiny", -1, len(x)), reference=reference,
                  custom_op="tiny_vendor.no_such_module")
    return types.SimpleNamespace(
        kreg_ops=hookimpl(lambda: [spec]),
        kreg_implementations=hookimpl(lambda: [Implementation(
            op="tiny", name="tinyplug.ref", priority=0, kernel=lambda x: x,
            configurable=False, fallback=True)]))


def test_a_reference_that_is_a_module_function_blames_the_ops_plugin() -> None:
    reg = registry.Registry()
    reg.register_plugin(_op_plugin("tiny_vendor.ops:reference"), "tinyplug")
    error = str(reg.plugins["tinyplug"].error)
    assert "op 'tiny' (plugin 'tinyplug'): OpSpec.reference='tiny_vendor.ops:reference' is " \
           "not an implementation name" in error
    assert "OpSpec.reference must name an implementation ('<plugin>.<impl>')" in error
    assert "register Implementation(op='tiny', name='tinyplug.reference', " \
           "kernel='tiny_vendor.ops:reference'" in error
    assert not reg.plugins["reference"].errors  # the reference plugin is not blamed
    with pytest.raises(registry.errors.KernelUnavailableError, match="plugin 'tinyplug'"):
        reg.reference_kernel("tiny")
    other = registry.Registry()
    other.register_plugin(_op_plugin("tinyplug.missing"), "tinyplug")
    assert "names no registered implementation (plugin 'tinyplug' registers tinyplug.ref)" in \
        str(other.plugins["tinyplug"].error)
    fine = registry.Registry()
    fine.register_plugin(_op_plugin("tinyplug.ref"), "tinyplug")
    assert not fine.plugins["tinyplug"].errors
    assert fine.reference_kernel("tiny")([1]) == [1]


def test_a_disabled_reference_plugin_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_DISABLE_PLUGINS", "reference")
    reg = registry.Registry()
    assert not reg.plugins["sparse_prefill"].errors
    with pytest.raises(registry.errors.KernelUnavailableError,
                       match=r"plugin 'reference' is in KREG_DISABLE_PLUGINS; remove it from "
                             r"KREG_DISABLE_PLUGINS"):
        reg.reference_kernel("sparse_prefill")


def test_load_custom_ops_registers_every_ops_torch_op() -> None:
    assert registry.load_custom_ops() == {"indexer_topk": "backends.indexer_topk.torch_op",
                                          "sparse_prefill": "backends.sparse_prefill.torch_op"}
    import torch

    assert hasattr(torch.ops.kreg, "sparse_prefill") and hasattr(torch.ops.kreg, "indexer_topk")
    with pytest.raises(registry.errors.UnknownOpError):
        registry.load_custom_ops(["nope"])
    reg = registry.Registry()
    reg.register_plugin(_op_plugin("tinyplug.ref"), "tinyplug")
    registry.reset_registry(reg)
    try:
        with pytest.raises(registry.errors.KernelUnavailableError,
                           match=r"op 'tiny' \(plugin 'tinyplug'\): cannot import its "
                                 r"OpSpec.custom_op module 'tiny_vendor.no_such_module'"):
            registry.load_custom_ops()
    finally:
        registry.reset_registry()


def test_explain_names_the_indexer_path_for_each_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kreg explain indexer_topk`` says which launches the chosen config makes: four below
    32 rows, two (with two row programs a row at 64 rows) from 32, one (ONE_PASS) from 30 rows
    an SM on the H200; the MI355X geometry, which pins only its slices, the default's path.
    Up to 16 rows the H200 runs the CUDA cluster kernel where nvcc can build it, and the Triton
    kernels' four launches where it cannot (the paths below: no nvcc, so no CUDA kernel)."""
    from backends.indexer_topk import cluster, stream

    reg = registry.get_registry()
    monkeypatch.setattr(cluster, "toolchain", lambda: (True, "nvcc"))
    d = reg.select("indexer_topk", {"k": 2048, "num_rows": 1, "max_keys": 131072,
                                    "dtype": "float32"}, "h200")
    assert any(n.startswith("path: CUDA cluster radix select") for n in d.notes), d.notes
    monkeypatch.setattr(cluster, "toolchain", lambda: (False, "no nvcc"))
    monkeypatch.setattr(stream, "toolchain", lambda: (False, "no nvcc"))
    reg.invalidate()   # the decision above is cached

    def path(rows: int, device: str = "h200") -> str:
        d = reg.select("indexer_topk", {"k": 2048, "num_rows": rows, "max_keys": 131072,
                                        "dtype": "float32"}, device)
        notes = [n for n in d.notes if n.startswith("path: ")]
        assert len(notes) == 1, d.notes
        return notes[0]

    assert path(1).startswith("path: four launches: group maxima of 32 keys")
    assert "then 2 row programs a row" in path(64)
    assert path(1024).startswith("path: two launches") and "one row program a row" in path(1024)
    assert path(4096).startswith("path: one launch (ONE_PASS=1)")
    assert "two launches" in path(3959) and "rare tiers' launch" in path(4096)
    mi = path(4096, "mi355x")
    assert mi.startswith("path: the default path for the shape") and "SLICE_KEYS=1024" in mi
