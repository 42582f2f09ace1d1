"""Registry state (issue #24): overrides and invalidation that fail leave nothing behind, the
dispatch map keeps hot keys, unknown KREG_* settings are named, bad arguments are KregErrors."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest
import torch

import registry
from registry import Implementation, _knobs, _registry, hookimpl
from registry.errors import ConfigError, KregError, OverrideError, UnknownOpError, WorkloadError

# 64 rows: above the cluster kernel's envelope (nvidia_hopper), whether or not nvcc is here
IDX = {"k": 4, "num_rows": 64, "max_keys": 8, "dtype": "float32"}


def test_override_entered_under_a_bad_strict_setting_does_not_stay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reg = registry.Registry()
    monkeypatch.setenv("KREG_STRICT", "banana")  # read at the next invalidation
    with pytest.raises(ConfigError, match="KREG_STRICT"), \
            reg.override("indexer_topk", "reference.indexer_topk"):
        pytest.fail("the block must not run")
    assert reg._settings.context_overrides["indexer_topk"] == []
    monkeypatch.delenv("KREG_STRICT")
    reg.invalidate()
    d = reg.select("indexer_topk", IDX, "h200")
    assert d.override is None and d.implementation.startswith("generic.")


def test_a_failed_invalidate_leaves_no_stale_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = registry.Registry()
    first = reg.select("indexer_topk", IDX, "h200")
    assert reg.select("indexer_topk", IDX, "h200").cached
    monkeypatch.setenv("KREG_SELECT_INDEXER_TOPK", "reference.indexer_topk")
    monkeypatch.setenv("KREG_STRICT", "banana")
    with pytest.raises(ConfigError):
        reg.invalidate()
    assert reg._lru.cache_info().currsize == 0 and not reg._decisions
    assert not reg.dispatch_map and not reg.last_decisions
    monkeypatch.setenv("KREG_STRICT", "0")
    reg.invalidate()
    d = reg.select("indexer_topk", IDX, "h200")
    assert d.implementation == "reference.indexer_topk" != first.implementation


# -- the dispatch map --------------------------------------------------------------------------


@pytest.fixture
def noop() -> Any:
    impl = Implementation(op="indexer_topk", name="lru.noop", priority=1000,
                          kernel=lambda scores, lengths, k=2048: k, configurable=False)
    reg = registry.Registry()
    reg.register_plugin(types.SimpleNamespace(kreg_implementations=hookimpl(lambda: [impl])),
                        "lru")
    registry.reset_registry(reg)
    selects: list[Any] = []
    real = reg.select

    def counting(op: str, wl: Any, device: Any = None) -> Any:
        selects.append(wl)
        return real(op, wl, device)

    reg.select = counting  # type: ignore[method-assign]
    yield reg, selects
    registry.reset_registry()


def _dispatch(rows: int) -> Any:
    scores = torch.zeros(rows, 8)
    return registry.dispatch("indexer_topk", scores, torch.full((rows,), 8, dtype=torch.int32),
                             k=4)


def test_a_hot_key_survives_4096_newer_ones(noop: Any) -> None:
    _, selects = noop
    _dispatch(1)
    for rows in range(2, 2 + _registry.DISPATCH_MAP_SIZE + 10):
        _dispatch(rows)
        if rows % 256 == 0:
            _dispatch(1)  # used now and then: never selected again
    _dispatch(1)
    assert sum(1 for wl in selects if wl.num_rows == 1) == 1
    assert len(selects) == 1 + _registry.DISPATCH_MAP_SIZE + 10


def test_any_key_survives_as_many_newer_ones_and_the_map_stays_bounded(
        noop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_registry, "DISPATCH_MAP_SIZE", 64)
    reg, selects = noop
    _dispatch(1)
    for rows in range(2, 2 + 64):
        _dispatch(rows)
    n = len(selects)
    _dispatch(1)  # 64 newer keys later: still there (promoted, not selected again)
    assert len(selects) == n
    for rows in range(1000, 1000 + 5 * 64 + 7):
        _dispatch(rows)
        held = len(reg.dispatch_map) + len(reg._dispatch_old)
        assert held <= 2 * 64
        assert len(reg.last_decisions) == held
    _dispatch(1)  # not used for 5 generations: selected again
    assert len(selects) == n + 5 * 64 + 7 + 1


def test_pins_survive_generations(noop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_registry, "DISPATCH_MAP_SIZE", 64)
    reg, _ = noop
    _dispatch(1)
    (key,) = list(reg.last_decisions)
    ref = reg.implementation("indexer_topk", "reference.indexer_topk")
    pinned = reg.last_decisions[key].model_copy(update={"implementation": ref.name,
                                                        "config": None})
    reg.pin(key, pinned)
    for rows in range(2, 2 + 3 * 64):
        _dispatch(rows)
    with registry.record() as launches:
        _dispatch(1)
    assert launches[0].implementation == ref.name


# -- unknown settings ------------------------------------------------------------------------


def test_unknown_kreg_variables_are_named_once_with_the_closest(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_knobs, "_warned", set())
    monkeypatch.setenv("KREG_SELECT_SPARSE_PREFIL", "generic.sparse_prefill_table")
    monkeypatch.setenv("KREG_STRCT", "1")
    monkeypatch.setenv("KREG_SELECT_DECODE", "x")
    caplog.set_level(logging.WARNING, logger="registry")
    registry.Registry()
    text = caplog.text
    assert "unknown setting KREG_SELECT_SPARSE_PREFIL='generic.sparse_prefill_table' is " \
           "ignored; did you mean KREG_SELECT_SPARSE_PREFILL?" in text
    assert "unknown setting KREG_STRCT='1' is ignored; did you mean KREG_STRICT?" in text
    assert "KREG_SELECT_DECODE" in text
    caplog.clear()
    registry.Registry()
    assert "unknown setting" not in caplog.text  # once per process


def test_known_variables_cover_the_knobs_and_the_ops() -> None:
    names = _knobs.known_variables(["sparse_prefill"])
    assert {"KREG_STRICT", "KREG_HOME", "KREG_SELECT_SPARSE_PREFILL",
            "KREG_FUZZ_EXAMPLES"} <= names
    assert _knobs.warn_unknown_settings(["sparse_prefill"], {"KREG_STRICT": "1"}) == []


# -- argument types --------------------------------------------------------------------------

SCORES = torch.zeros(2, 8)
LENGTHS = torch.tensor([8, 8], dtype=torch.int32)
Q, K = torch.zeros(4, 2, 8), torch.zeros(8, 1, 8)
IND = torch.zeros(4, 2, dtype=torch.int32)

BAD_CALLS: dict[str, Any] = {
    "select op 5": (lambda: registry.select(5, IDX, "h200"), UnknownOpError),  # type: ignore
    "select op list": (lambda: registry.select(["x"], IDX, "h200"), UnknownOpError),  # type: ignore
    "select k list": (lambda: registry.select("indexer_topk", {**IDX, "k": [1]}, "h200"),
                      WorkloadError),
    "dispatch op list": (lambda: registry.dispatch(["x"], 1), UnknownOpError),  # type: ignore
    "dispatch op int": (lambda: registry.dispatch(5, 1), UnknownOpError),  # type: ignore
    "dispatch k list": (lambda: registry.dispatch("indexer_topk", SCORES, LENGTHS, k=[4]),
                        WorkloadError),
    "dispatch k dict": (lambda: registry.dispatch("indexer_topk", SCORES, LENGTHS, k={}),
                        WorkloadError),
    "dispatch k str": (lambda: registry.dispatch("indexer_topk", SCORES, LENGTHS, k="abc"),
                       WorkloadError),
    "dispatch max_q list": (lambda: registry.dispatch(
        "sparse_prefill", Q, K, K, IND, kind="chunk", cu_seqlens_q=torch.tensor([0, 4]),
        page_table=torch.zeros(1, 8, dtype=torch.int32), max_q=[4]), WorkloadError),
    "override op list": (lambda: registry.override(["x"], "auto").__enter__(),  # type: ignore
                         UnknownOpError),
    "override value int": (lambda: registry.override("indexer_topk", 5).__enter__(),  # type: ignore
                           OverrideError),
    "override value list": (lambda: registry.override("indexer_topk", ["a"]).__enter__(),  # type: ignore
                            OverrideError),
}


@pytest.mark.parametrize("what", list(BAD_CALLS))
def test_bad_argument_types_are_kreg_errors(what: str) -> None:
    call, error = BAD_CALLS[what]
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, KregError)


def test_a_registry_keeps_fewer_than_30_attributes() -> None:
    """CPython 3.11 specializes a method call only on an instance whose attribute dict shares
    its keys, which stops at 30 attributes: with 35 the select hit path (``reg.select(...)``)
    measured 7% slower (benchmarks/bench_select.py). New state goes into the holders
    (``_settings``, ``_loading``, ``_profile_cache``) or another one."""
    assert len(vars(registry.Registry(load_entry_points=False))) < 30
    assert len(vars(registry.get_registry())) < 30
