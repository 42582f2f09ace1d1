"""A plugin never takes selection down (issue #24): garbage from any hook, a config resolver or a
priority disqualifies that plugin's contribution only, naming the plugin; kreg's own bugs are
blamed on kreg; out-of-range workloads and device facts are refused at validation."""

from __future__ import annotations

import importlib.metadata
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import registry
from registry import Implementation, OpSpec, hookimpl
from registry._select import select_pure
from registry.errors import ConfigError, KregError, NoEligibleImplementationError, WorkloadError
from registry.requirements import rows_per_request_at_least

from unit_helpers import allow_plugin, seed_workload

# 64 rows: above the cluster kernel's envelope (nvidia_hopper), whether or not nvcc is here
IDX = {"k": 4, "num_rows": 64, "max_keys": 8, "dtype": "float32"}
SERVER = "rtx-pro-6000-blackwell-server"


def plugin(**hooks: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{name: hookimpl(fn) for name, fn in hooks.items()})


def still_selects(reg: registry.Registry) -> None:
    """Both ops still decide as without the bad plugin."""
    assert reg.select("sparse_prefill", seed_workload(), SERVER).implementation == \
        "nvidia_sm120.sparse_prefill_tuned"
    assert reg.select("indexer_topk", IDX, "h200").implementation.startswith("generic.")


def _raises_midway() -> Iterator[Any]:
    yield Implementation(op="indexer_topk", name="midway.ok", priority=1)
    raise RuntimeError("table file vanished")


GARBAGE: dict[str, Any] = {
    "[None]": lambda: [None],
    "5": lambda: 5,
    "'abc'": lambda: "abc",
    "a dict": lambda: {"a": 1},
    "a generator that raises mid-way": _raises_midway,
}


@pytest.mark.parametrize("hook", ["kreg_implementations", "kreg_ops"])
@pytest.mark.parametrize("what", list(GARBAGE))
def test_garbage_hook_results_fail_only_that_plugin(hook: str, what: str) -> None:
    reg = registry.Registry()
    reg.register_plugin(plugin(**{hook: GARBAGE[what]}), "junk")
    assert reg.plugins["junk"].error and "junk" not in reg.impls.get("indexer_topk", {})
    assert hook in reg.plugins["junk"].error
    assert not any(n.startswith("midway.") for n in reg.impls["indexer_topk"])
    still_selects(reg)


def test_garbage_at_load_through_an_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("junk_plugin")
    mod.kreg_implementations = hookimpl(lambda: 5)  # type: ignore[attr-defined]

    class EP:
        name, value = "junk", "junk_plugin"

        def load(self) -> object:
            return mod

    real = list(importlib.metadata.entry_points(group="kreg"))
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [*real, EP()])
    allow_plugin(monkeypatch, "junk")
    reg = registry.Registry()
    assert "hook kreg_implementations returned int 5" in str(reg.plugins["junk"].error)
    still_selects(reg)


def test_an_item_of_the_wrong_shape_is_refused_by_name() -> None:
    bad = Implementation(op="indexer_topk", name="shape.bad", priority=1)
    object.__setattr__(bad, "requirements", [None])
    reg = registry.Registry()
    reg.register_plugin(plugin(kreg_implementations=lambda: [bad]), "shape")
    assert "requirements must be a tuple of Requirement" in str(reg.plugins["shape"].error)
    assert "shape.bad" not in reg.impls["indexer_topk"]
    still_selects(reg)


def test_sys_exit_at_import_is_a_named_failure(monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    class EP:
        name, value = "quitter", "quitter.plugin"

        def load(self) -> object:
            sys.exit(3)

    real = list(importlib.metadata.entry_points(group="kreg"))
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [*real, EP()])
    allow_plugin(monkeypatch, "quitter")
    caplog.set_level(logging.WARNING, logger="registry")
    reg = registry.Registry()  # before: SystemExit ended the host process here
    assert reg.plugins["quitter"].error == "Error importing plugin 'quitter': SystemExit: 3"
    still_selects(reg)


def test_sys_exit_in_a_hook_is_a_named_failure() -> None:
    reg = registry.Registry()
    reg.register_plugin(plugin(kreg_implementations=lambda: sys.exit("bye")), "quitter")
    assert "hook kreg_implementations raised SystemExit: bye" in str(reg.plugins["quitter"].error)
    still_selects(reg)


@pytest.mark.parametrize("result", [5, "abc", [1], {1: {"a": 1}}, {"x": 5}])
def test_garbage_configs_hook_is_named(result: Any) -> None:
    reg = registry.Registry()
    reg.register_plugin(plugin(kreg_configs=lambda op: result), "cfgjunk")
    offered = reg.offered_configs("indexer_topk")
    assert not any(k.startswith("cfgjunk.") for k in offered)
    assert "kreg_configs" in str(reg.plugins["cfgjunk"].error)


@pytest.mark.parametrize("result", [5, "abc", ["a"], {"k": "v" * 5000}])
def test_garbage_enrich_facts_is_named_and_ignored(result: Any) -> None:
    reg = registry.Registry()
    reg.register_plugin(plugin(kreg_enrich_facts=lambda facts: result), "factsjunk")
    reg.register_plugin(plugin(kreg_enrich_facts=lambda facts: {"good": "1"}), "factsgood")
    facts = reg.facts_for_index(-1)  # before: dict(more) raised for every op on the machine
    assert facts.extra["good"] == "1" and "k" not in facts.extra
    assert "kreg_enrich_facts" in str(reg.plugins["factsjunk"].error)
    assert reg.select("indexer_topk", IDX, facts).implementation


# -- config resolvers and priorities -------------------------------------------------------------

BAD_CONFIGS: dict[str, Any] = {
    "raises": lambda f, w: 1 / 0,
    "a string": lambda f, w: "garbage",
    "int keys": lambda f, w: {1: 2},
    "a non-JSON value": lambda f, w: {"BLOCK_M": object()},
    "a constant list": [1, 2],
}


def _top(name: str, **kw: Any) -> Implementation:
    return Implementation(op="indexer_topk", name=name, priority=kw.pop("priority", 500), **kw)


@pytest.mark.parametrize("what", list(BAD_CONFIGS))
def test_a_bad_config_resolver_disqualifies_its_candidate_only(what: str) -> None:
    reg = registry.Registry()
    bad = _top("cfgbug.top", config=None)
    object.__setattr__(bad, "config", BAD_CONFIGS[what])  # bypass the load-time shape check
    reg.impls["indexer_topk"][bad.name] = bad
    d = reg.select("indexer_topk", IDX, "h200")
    assert d.implementation.startswith("generic.")
    [cand] = [c for c in d.candidates if c.implementation == "cfgbug.top"]
    assert not cand.eligible
    [check] = [c for c in cand.checks if c.name == "config"]
    assert "plugin 'cfgbug'" in check.required
    if what == "raises":
        assert "ZeroDivisionError" in check.observed


def test_a_bad_config_under_an_override_is_not_honoured() -> None:
    reg = registry.Registry()
    reg.impls["indexer_topk"]["cfgbug.top"] = _top("cfgbug.top", config=lambda f, w: 1 / 0)
    with reg.override("indexer_topk", "cfgbug.top"):
        d = reg.select("indexer_topk", IDX, "h200")
    assert d.implementation.startswith("generic.")
    assert d.override is not None and not d.override.honoured
    assert "ZeroDivisionError" in d.override.reason


def test_a_raising_describe_config_is_a_note_not_a_failure() -> None:
    reg = registry.Registry()
    reg.impls["indexer_topk"]["desc.top"] = _top(
        "desc.top", config={"num_warps": 4}, describe_config=lambda cfg: str(1 / 0))
    d = reg.select("indexer_topk", IDX, "h200")
    assert d.implementation == "desc.top"   # still chosen: the path note is only shown
    assert any("desc.top's describe_config raised ZeroDivisionError" in n for n in d.notes)
    reg.impls["indexer_topk"]["desc.top"] = _top(
        "desc.top", config={"num_warps": 4}, describe_config=lambda cfg: f"w{cfg['num_warps']}")
    reg.invalidate()
    assert "path: w4" in reg.select("indexer_topk", IDX, "h200").notes


@pytest.mark.parametrize("priority", ["abc", None, 1.5, float("nan"), [1], True])
def test_a_non_integer_priority_disqualifies_its_candidate(priority: Any) -> None:
    reg = registry.Registry()
    reg.register_plugin(plugin(kreg_implementations=lambda: [_top("prio.bad",
                                                                  priority=priority)]), "prio")
    assert registry.implementations  # sorting the listing must not raise either
    assert "prio.bad" in reg.impls["indexer_topk"]
    d = reg.select("indexer_topk", IDX, "h200")
    assert d.implementation.startswith("generic.")
    [cand] = [c for c in d.candidates if c.implementation == "prio.bad"]
    [check] = [c for c in cand.checks if c.name == "priority"]
    assert "plugin 'prio'" in check.required
    reg.plugin_fingerprint()  # and the daemon's fingerprint still computes


def test_an_integral_float_priority_counts() -> None:
    reg = registry.Registry()
    reg.impls["indexer_topk"]["prio.float"] = _top("prio.float", priority=500.0)
    assert reg.select("indexer_topk", IDX, "h200").implementation == "prio.float"


# -- kreg's own bugs, and what validation refuses ----------------------------------------------


def test_a_crash_in_kreg_requirement_code_blames_kreg() -> None:
    from backends.sparse_prefill import SparsePrefillWorkload

    huge = SparsePrefillWorkload.model_construct(**{**seed_workload(), "total_q": 10**400,
                                                    "max_q": 10**400})
    impl = Implementation(op="sparse_prefill", name="vendor.x", priority=5,
                          requirements=(rows_per_request_at_least(4),))
    ref = Implementation(op="sparse_prefill", name="ref.x", priority=0)
    d = select_pure("sparse_prefill", registry.profiles()["h200"], huge, [impl, ref])
    [check] = [c for c in d.candidates[0].checks if not c.passed]
    assert "OverflowError" in check.observed
    assert "a bug in kreg (registry/requirements.py" in check.required
    assert "not in plugin 'vendor'" in check.required


def test_a_crash_in_plugin_code_blames_the_plugin() -> None:
    from registry.requirements import predicate

    impl = Implementation(op="indexer_topk", name="vendor.y", priority=5,
                          requirements=(predicate("mine", "capability", lambda f, w: 1 / 0),))
    reg = registry.Registry()
    reg.impls["indexer_topk"][impl.name] = impl
    d = reg.select("indexer_topk", IDX, "h200")
    [cand] = [c for c in d.candidates if c.implementation == "vendor.y"]
    assert "a bug in plugin 'vendor'" in cand.checks[0].required


@pytest.mark.parametrize("value", [10**400, 2**63])
def test_workload_ints_are_bounded_at_validation(value: int) -> None:
    with pytest.raises(WorkloadError, match=r"total_q: .*64-bit"):
        registry.select("sparse_prefill", seed_workload(total_q=value, max_q=value), SERVER)


def test_an_int_too_long_to_print_is_refused_readably() -> None:
    with pytest.raises(WorkloadError, match="num_rows: an integer of 16610 bits is outside"):
        registry.select("indexer_topk", {**IDX, "num_rows": 10**5000}, "h200")
    with pytest.raises(WorkloadError, match="got <an int of 16610 bits>"):  # a field's own error
        registry.select("indexer_topk", {**IDX, "num_rows": -(10**5000)}, "h200")


@pytest.mark.parametrize("change", [{"name": ""}, {"name": "x" * 300}, {"arch": ""},
                                    {"triton_version": "9" * 200}, {"sm_count": 10**30},
                                    {"extra": {"k": "v" * 5000}}])
def test_device_strings_and_sizes_are_bounded_at_validation(change: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="invalid device facts"):
        registry.profiles()["h200"].what_if(**change)


# -- a daemon decision this process cannot run ---------------------------------------------------


def test_a_daemon_decision_naming_an_unknown_implementation_falls_back(
        caplog: pytest.LogCaptureFixture) -> None:
    import torch

    reg = registry.Registry()
    local = reg.select("indexer_topk", IDX, "h200")

    def remote(reg_: Any, op: str, facts: Any, wl: Any, raw: Any) -> tuple[Any, None]:
        return local.model_copy(update={"implementation": "ghost.topk", "source": "daemon"}), None

    reg.invalidate()
    reg.remote = remote
    caplog.set_level(logging.WARNING, logger="registry")
    d = reg.select("indexer_topk", {**IDX, "k": 3}, "h200")
    assert d.implementation.startswith("generic.") and d.source == "local"
    assert any("ghost.topk" in n and "selected in-process" in n for n in d.notes)
    registry.reset_registry(reg)
    try:  # dispatch too: before, a KeyError in dispatch_miss
        out = registry.dispatch("indexer_topk", torch.zeros(2, 8), torch.tensor([8, 8],
                                dtype=torch.int32), k=2)
        assert out.shape == (2, 2)
    finally:
        registry.reset_registry()


def test_every_such_error_is_a_kreg_error() -> None:
    with pytest.raises(KregError):
        registry.select("indexer_topk", {**IDX, "k": 10**400}, "h200")
    reg = registry.Registry()
    for name in list(reg.impls["indexer_topk"]):
        reg.impls["indexer_topk"][name] = _top(name, config=lambda f, w: "garbage")
    with pytest.raises(NoEligibleImplementationError, match="config resolver returned str"):
        reg.select("indexer_topk", IDX, "h200")


def test_an_op_spec_of_the_wrong_shape_is_refused_by_name() -> None:
    spec = OpSpec(name="odd_op", workload_model=dict,  # type: ignore[arg-type]
                  call_key=lambda *a: ("odd_op", -1))
    reg = registry.Registry()
    reg.register_plugin(plugin(kreg_ops=lambda: [spec]), "oddops")
    assert "workload_model must be a registry.Workload subclass" in str(
        reg.plugins["oddops"].error)
    still_selects(reg)
