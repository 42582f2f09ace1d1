"""The selector and the registry around it: priorities, ties, overrides, strict, caches."""

from __future__ import annotations

import logging
import re
import types
from typing import Any

import pytest

import backends.indexer_topk as indexer_op
import plugins.reference as reference_plugin
import registry
from registry import Implementation, hookimpl
from registry.errors import (
    KregError,
    NoEligibleImplementationError,
    OverrideError,
    StrictModeError,
    UnknownImplementationError,
    UnknownOpError,
    WorkloadError,
)
from registry.requirements import ENVELOPE, field_at_least, field_eq, vendor_in

from unit_helpers import seed_workload, setenv

TOPK = {"k": 64, "num_rows": 4, "max_keys": 1024, "dtype": "float32"}


def plugin_with(*impls: Implementation) -> types.SimpleNamespace:
    ns = types.SimpleNamespace()

    @hookimpl
    def kreg_implementations() -> list[Implementation]:
        return list(impls)

    ns.kreg_implementations = kreg_implementations
    return ns


@pytest.fixture
def bare() -> registry.Registry:
    """A registry with only the indexer op and the reference plugin."""
    reg = registry.Registry(load_entry_points=False)
    reg.register_plugin(indexer_op, "indexer_topk")
    reg.register_plugin(reference_plugin, "reference")
    return reg


def impl(name: str, priority: int, *reqs: Any, config: Any = None) -> Implementation:
    return Implementation(op="indexer_topk", name=name, priority=priority, requirements=reqs,
                          config=config, kernel=lambda *a, **k: name)


def test_higher_priority_wins_and_every_candidate_has_a_verdict(bare: registry.Registry) -> None:
    bare.register_plugin(plugin_with(impl("a.low", 10), impl("b.high", 100, vendor_in("amd")),
                                     impl("c.mid", 50)), "abc")
    d = bare.select("indexer_topk", TOPK, "h200")
    assert d.implementation == "c.mid"
    verdicts = {c.implementation: c.eligible for c in d.candidates}
    assert verdicts == {"a.low": True, "b.high": False, "c.mid": True,
                        "reference.indexer_topk": True}
    assert [c.rank for c in d.candidates if c.eligible] == [0, 1, 2]
    assert bare.select("indexer_topk", TOPK, "mi300x").implementation == "b.high"


def test_ties_are_broken_by_name_and_shown(bare: registry.Registry) -> None:
    bare.register_plugin(plugin_with(impl("zeta.x", 50), impl("alpha.x", 50)), "ties")
    d = bare.select("indexer_topk", TOPK, "h200")
    assert d.implementation == "alpha.x"
    assert any("tie at priority 50" in n and "name order" in n for n in d.notes)
    assert "tie at priority 50" in d.explain()


def test_config_resolver_sees_facts_and_workload(bare: registry.Registry) -> None:
    bare.register_plugin(plugin_with(impl("cfg.x", 50, config=lambda f, w: {
        "SMS": f.sm_count, "K": w.k})), "cfg")
    d = bare.select("indexer_topk", TOPK, "h20")
    assert d.config == {"SMS": 78, "K": 64}
    # Values in the fixed config-key order (geometry first, then the rest by name): K, SMS.
    assert d.one_line().startswith("indexer_topk -> cfg.x (64,78) because ")


def test_no_eligible_implementation_embeds_the_trace(bare: registry.Registry) -> None:
    bare.unregister_plugin("reference")
    bare.register_plugin(plugin_with(impl("amd.only", 100, vendor_in("amd"))), "amd")
    with pytest.raises(NoEligibleImplementationError) as info:
        bare.select("indexer_topk", TOPK, "h200")
    msg = str(info.value)
    assert "amd.only" in msg and "vendor: nvidia, requires amd [capability]" in msg
    assert isinstance(info.value, RuntimeError)


def test_unknown_op_and_implementation_list_known_names(bare: registry.Registry) -> None:
    with pytest.raises(UnknownOpError, match="known ops: indexer_topk"):
        bare.select("sparse_decode", {}, "h200")
    with pytest.raises(UnknownImplementationError, match=re.escape("reference.indexer_topk")) \
            as info, bare.override("indexer_topk", "nope.nothing"):
        pass
    assert isinstance(info.value, LookupError)


@pytest.mark.parametrize("bad", ["reference.indexer_topk:fast", "reference.indexer_topk:"])
def test_override_grammar(bare: registry.Registry, bad: str) -> None:
    grammar = re.escape("auto | <implementation> | <implementation>:measure")
    with pytest.raises(OverrideError, match=grammar), bare.override("indexer_topk", bad):
        pass


def test_override_prefers_an_eligible_implementation(bare: registry.Registry) -> None:
    bare.register_plugin(plugin_with(impl("fast.x", 100)), "fast")
    with bare.override("indexer_topk", "reference.indexer_topk"):
        d = bare.select("indexer_topk", TOPK, "h200")
        assert d.implementation == "reference.indexer_topk"
        assert d.override is not None and d.override.honoured
        assert d.fallback
    assert bare.select("indexer_topk", TOPK, "h200").implementation == "fast.x"
    with bare.override("indexer_topk", "auto"):
        assert bare.select("indexer_topk", TOPK, "h200").implementation == "fast.x"


def test_override_not_honoured_warns_once(bare: registry.Registry,
                                          caplog: pytest.LogCaptureFixture) -> None:
    bare.register_plugin(plugin_with(impl("big.x", 100, field_at_least("k", 1000, ENVELOPE)),
                                     impl("amd.x", 100, vendor_in("amd"))), "p")
    caplog.set_level(logging.WARNING, logger="registry")
    with bare.override("indexer_topk", "amd.x"):
        for _ in range(3):
            bare.invalidate()
            d = bare.select("indexer_topk", TOPK, "h200")
    assert d.implementation == "reference.indexer_topk"
    assert d.override is not None and not d.override.honoured
    assert "vendor: nvidia, requires amd" in d.override.reason
    warnings = [r for r in caplog.records if "not honoured" in r.getMessage()]
    assert len(warnings) == 1
    with bare.override("indexer_topk", "big.x:measure"):
        d = bare.select("indexer_topk", TOPK, "h200")
        assert d.implementation == "big.x"
        assert [c.name for c in d.chosen.checks if c.waived] == ["k"]


def test_strict_mode(bare: registry.Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_STRICT", "1")
    bare.invalidate()
    with pytest.raises(StrictModeError, match="torch reference"):
        bare.select("indexer_topk", TOPK, "h200")
    bare.register_plugin(plugin_with(impl("amd.x", 100, vendor_in("amd")),
                                     impl("any.x", 50)), "p")
    assert bare.select("indexer_topk", TOPK, "h200").implementation == "any.x"
    with pytest.raises(StrictModeError, match="cannot be honoured"), \
            bare.override("indexer_topk", "amd.x"):
        bare.select("indexer_topk", TOPK, "h200")


def test_env_override_is_read_on_invalidate(fresh: registry.Registry,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert registry.select("sparse_prefill", seed_workload(),
                           "h100").implementation == "generic.sparse_prefill_table"
    setenv(monkeypatch, "KREG_SELECT_SPARSE_PREFILL", "reference.sparse_prefill")
    d = registry.select("sparse_prefill", seed_workload(), "h100")
    assert d.implementation == "reference.sparse_prefill"
    assert d.override is not None and d.override.source == "KREG_SELECT_SPARSE_PREFILL"
    setenv(monkeypatch, "KREG_SELECT_SPARSE_PREFILL", "nope")
    with pytest.raises(UnknownImplementationError, match="KREG_SELECT_SPARSE_PREFILL='nope'"):
        registry.select("sparse_prefill", seed_workload(), "h100")


def test_cache_hit_returns_the_stored_decision(bare: registry.Registry) -> None:
    first = bare.select("indexer_topk", TOPK, "h200")
    assert first.cached is False
    hit = bare.select("indexer_topk", TOPK, "h200")
    assert hit.cached is True and hit is bare.select("indexer_topk", TOPK, "h200")
    assert hit.implementation == first.implementation
    # a different device, workload or override is a different key
    assert bare.select("indexer_topk", TOPK, "h100").cached is False
    assert bare.select("indexer_topk", {**TOPK, "k": 65}, "h200").cached is False


def test_registering_a_plugin_or_an_override_invalidates(bare: registry.Registry) -> None:
    bare.select("indexer_topk", TOPK, "h200")
    gen = bare.generation
    bare.register_plugin(plugin_with(impl("new.x", 100)), "new")
    assert bare.generation > gen
    assert bare.select("indexer_topk", TOPK, "h200").implementation == "new.x"
    with bare.override("indexer_topk", "reference.indexer_topk"):
        assert bare.select("indexer_topk", TOPK, "h200").implementation == \
            "reference.indexer_topk"
    assert bare.select("indexer_topk", TOPK, "h200").implementation == "new.x"


def test_cache_is_a_bounded_lru() -> None:
    reg = registry.Registry(load_entry_points=False, decision_cache_size=8)
    reg.register_plugin(indexer_op, "indexer_topk")
    reg.register_plugin(reference_plugin, "reference")
    first = reg.select("indexer_topk", {**TOPK, "k": 1}, "h200")
    for k in range(2, 30):
        reg.select("indexer_topk", {**TOPK, "k": 1}, "h200")  # keeps k=1 the most recent
        reg.select("indexer_topk", {**TOPK, "k": k}, "h200")
    assert reg._lru.cache_info().currsize == 8 and len(reg._decisions) <= 8
    again = reg.select("indexer_topk", {**TOPK, "k": 1}, "h200")
    assert again.cached and again.implementation == first.implementation
    assert reg.select("indexer_topk", {**TOPK, "k": 2}, "h200").cached is False  # evicted


@pytest.mark.parametrize("change,field", [
    ({"total_q": -1}, "total_q"), ({"group_size": 0}, "group_size"),
    ({"max_q": 9000}, "max_q"), ({"kind": "decode"}, "kind"), ({"topk": "many"}, "topk"),
    ({"bogus": 1}, "bogus")])
def test_bad_workload_names_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(WorkloadError, match=field) as info:
        registry.select("sparse_prefill", seed_workload(**change), "h200")
    assert isinstance(info.value, ValueError) and isinstance(info.value, KregError)


def test_missing_field_is_named() -> None:
    wl = seed_workload()
    del wl["dtype"]
    with pytest.raises(WorkloadError, match="dtype: required field is missing"):
        registry.select("sparse_prefill", wl, "h200")


def test_decision_round_trips_through_json() -> None:
    d = registry.select("sparse_prefill", seed_workload(), "rtx-pro-6000-blackwell-server")
    again = registry.Decision.model_validate_json(d.model_dump_json())
    assert again == d
    assert again.explain() == d.explain()


def test_new_decision_logged_once_at_info(fresh: registry.Registry,
                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="registry")
    for _ in range(3):
        registry.select("sparse_prefill", seed_workload(), "rtx-pro-6000-blackwell-server")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert lines == ["sparse_prefill -> nvidia_sm120.sparse_prefill_tuned (8,16,4,3) because "
                     "highest priority (100) of 3 eligible; all 11 checks passed"]


def test_implementation_names_must_be_qualified() -> None:
    with pytest.raises(ValueError, match=re.escape("'plugin.impl'")):
        Implementation(op="indexer_topk", name="flat", priority=1)


def test_a_raising_requirement_disqualifies_only_its_candidate(bare: registry.Registry) -> None:
    # field_eq on a field the workload lacks is a plugin bug: shown, never taking selection down
    bare.register_plugin(plugin_with(impl("bad.x", 100, field_eq("head_dim", 256))), "bad")
    d = bare.select("indexer_topk", TOPK, "h200")
    assert d.implementation == "reference.indexer_topk"
    bad = next(c for c in d.candidates if c.implementation == "bad.x")
    assert not bad.eligible
    assert "requirement raised AttributeError" in bad.checks[0].observed
    assert "bug in plugin 'bad'" in bad.checks[0].required


def test_pins_survive_invalidation_until_unpinned() -> None:
    import torch

    reg = registry.Registry(load_entry_points=False)
    reg.register_plugin(indexer_op, "indexer_topk")
    reg.register_plugin(plugin_with(Implementation(
        op="indexer_topk", name="a.fast", priority=100, configurable=False,
        kernel=lambda scores, lengths, k=2048: "fast"), Implementation(
        op="indexer_topk", name="b.slow", priority=1, configurable=False,
        kernel=lambda scores, lengths, k=2048: "slow")), "ab")
    scores, lengths = torch.zeros(2, 8), torch.zeros(2, dtype=torch.int32)
    registry.reset_registry(reg)
    try:
        assert registry.dispatch("indexer_topk", scores, lengths, k=4) == "fast"
        (key,) = list(reg.last_decisions)
        slow = reg.last_decisions[key].model_copy(update={"implementation": "b.slow"})
        reg.pin(key, slow)
        assert registry.dispatch("indexer_topk", scores, lengths, k=4) == "slow"
        reg.invalidate()
        assert registry.dispatch("indexer_topk", scores, lengths, k=4) == "slow"
        assert reg.unpin() == 1
        assert registry.dispatch("indexer_topk", scores, lengths, k=4) == "fast"
    finally:
        registry.reset_registry()
