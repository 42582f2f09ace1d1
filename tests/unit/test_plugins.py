"""Plugin loading: entry points, allow/deny lists, and isolation of broken plugins."""

from __future__ import annotations

import importlib.metadata
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
    assert set(reg.ops) == {"indexer_topk"}
    assert list(reg.impls["indexer_topk"]) == ["reference.indexer_topk"]
    assert reg.plugins["generic"].skipped_reason == "not in KREG_PLUGINS"


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
