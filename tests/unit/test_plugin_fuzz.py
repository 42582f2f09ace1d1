"""Fuzzed plugins never take selection down (issue #24).

A plugin named ``evil`` is registered with random hook results (``kreg_ops``,
``kreg_implementations``, ``kreg_configs``, ``kreg_enrich_facts``), and its implementations carry
random priorities, config resolvers and requirements. Whatever it returns: the registry builds,
every op still decides, the other candidates' decisions are those of the registry without it
unless ``evil`` legitimately wins, and whatever of ``evil`` was refused names the plugin.

``KREG_FUZZ_EXAMPLES`` sets the number of examples (default 150).
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import registry
from registry import Implementation, hookimpl
from registry.requirements import predicate

from unit_helpers import seed_workload

EXAMPLES = int(os.environ.get("KREG_FUZZ_EXAMPLES", "150"))
# 64 rows: above the cluster kernel's envelope (nvidia_hopper), whether or not nvcc is here
IDX = {"k": 4, "num_rows": 64, "max_keys": 8, "dtype": "float32"}
CASES = [("sparse_prefill", seed_workload(), "rtx-pro-6000-blackwell-server"),
         ("sparse_prefill", seed_workload(total_q=64, max_q=64), "h200"),
         ("indexer_topk", IDX, "h200"),
         ("indexer_topk", IDX, "mi355x")]


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


junk = st.one_of(st.none(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8),
                 st.booleans(), st.just(_Opaque()),
                 st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=3)), max_size=3),
                 st.dictionaries(st.one_of(st.integers(), st.text(max_size=3)),
                                 st.one_of(st.integers(), st.text(max_size=3), st.none()),
                                 max_size=3))


def _raiser(exc: BaseException) -> Any:
    def fn(*args: Any) -> Any:
        raise exc
    return fn


errors = st.sampled_from([ZeroDivisionError("x"), KeyError("k"), RuntimeError("boom"),
                          TypeError("t"), RecursionError(), SystemExit(2)])
good_config = st.fixed_dictionaries({"BLOCK_M": st.sampled_from([16, 32]),
                                     "num_warps": st.sampled_from([1, 4])})
configs = st.one_of(
    st.none(), good_config, junk,
    good_config.map(lambda c: (lambda f, w: c)),
    junk.map(lambda j: (lambda f, w: j)),
    errors.map(_raiser))
verdicts = st.one_of(st.tuples(st.booleans(), st.text(max_size=4), st.text(max_size=4)), junk)
requirements = st.lists(st.one_of(
    verdicts.map(lambda v: predicate("fuzz", "capability", lambda f, w: v)),
    errors.map(lambda e: predicate("fuzz", "envelope", _raiser(e)))), max_size=3)
priorities = st.one_of(st.integers(-5, 500), st.sampled_from([1e9, 150.0]), junk)


@st.composite
def implementations(draw: st.DrawFn) -> Implementation:
    op = draw(st.sampled_from(["sparse_prefill", "indexer_topk", "no_such_op"]))
    impl = Implementation(op=op, name=f"evil.i{draw(st.integers(0, 3))}", priority=1,
                          requirements=tuple(draw(requirements)), kernel=lambda *a, **k: None)
    # The dataclass is frozen: set what a careless plugin could hand over anyway.
    object.__setattr__(impl, "priority", draw(priorities))
    object.__setattr__(impl, "config", draw(configs))
    return impl


def _generator_raising(items: list[Any], exc: BaseException) -> Iterator[Any]:
    yield from items
    raise exc


impl_results = st.one_of(
    junk, st.lists(st.one_of(implementations(), junk), max_size=4),
    st.tuples(st.lists(implementations(), max_size=2), errors).map(
        lambda t: (lambda: _generator_raising(*t))),
    errors.map(_raiser))
ops_results = st.one_of(junk, st.lists(junk, max_size=2),
                        st.just([registry.get_registry().spec("indexer_topk")]),  # a duplicate
                        errors.map(_raiser))


BASE = registry.Registry()
BASELINE = {(op, d): BASE.select(op, wl, d) for op, wl, d in CASES}


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(impls=impl_results, ops=ops_results, cfgs=junk, enrich=junk)
def test_a_fuzzed_plugin_never_takes_selection_down(impls: Any, ops: Any, cfgs: Any,
                                                    enrich: Any) -> None:
    evil = types.SimpleNamespace(
        kreg_implementations=hookimpl(lambda: impls() if callable(impls) else impls),
        kreg_ops=hookimpl(lambda: ops() if callable(ops) else ops),
        kreg_configs=hookimpl(lambda op: cfgs),
        kreg_enrich_facts=hookimpl(lambda facts: enrich))
    reg = registry.Registry()
    reg.register_plugin(evil, "evil")
    for op, wl, device in CASES:
        d = reg.select(op, wl, device)
        base = BASELINE[(op, device)]
        if d.implementation.startswith("evil."):
            # It may win only on its merits: an integer priority above the baseline's, a
            # config that resolved, every check passed.
            chosen = d.chosen
            assert chosen.eligible and chosen.priority >= base.chosen.priority
        else:
            assert (d.implementation, d.config) == (base.implementation, base.config)
        for cand in d.candidates:
            if cand.implementation.startswith("evil.") and not cand.eligible:
                failed = [c for c in cand.checks if not c.passed]
                assert failed
                # A refusal caused by evil's garbage names it (a clean verdict False is not
                # garbage; kreg's own bug would name kreg).
                for c in failed:
                    if c.name in ("priority", "config") or "raised" in c.observed:
                        assert "plugin 'evil'" in c.required, c
    rec = reg.plugins["evil"]
    if rec.error:
        assert rec.name == "evil"
    reg.offered_configs("indexer_topk")
    facts = reg.facts_for_index(-1)
    assert isinstance(reg.select("indexer_topk", IDX, facts), registry.Decision)
    reg.plugin_fingerprint()
