"""bench_regret's judgement of points that share a workload bucket (indexer_topk's ``dist``):
one selection serves them all, so the run judges the selection by the worst-ratio rule the tuner
stores by, not each distribution's own fastest config."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest


def _module() -> Any:
    path = Path(__file__).parents[2] / "benchmarks" / "bench_regret.py"
    spec = importlib.util.spec_from_file_location("bench_regret_unit", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(times: dict[str, float], picked: str) -> dict[str, Any]:
    return {"all_ms": {**times, "auto": times[picked] * 1.01}, "selection_ms": times[picked],
            "matched": picked}


# the session-16 H200 window at 64 rows: r128 fastest on randn, r0 on ties
RANDN = {"r128": 0.0445, "r0": 0.0455, "b16": 0.0460}
TIES = {"r128": 0.0410, "r0": 0.0390, "b16": 0.0434}


def test_the_minimax_pick_has_no_selection_regret_though_one_point_loses() -> None:
    judge = _module()._judge_bucket
    rows = [(_row(RANDN, "r0"), "r128"), (_row(TIES, "r0"), "r128")]
    sel, vs_table = judge(rows)
    assert RANDN["r0"] / RANDN["r128"] - 1 > 0.02        # the per-point regret the run ignores
    assert sel == pytest.approx(0.0)
    assert vs_table == pytest.approx((0.0455 / 0.0445) / (0.0410 / 0.0390))
    assert rows[0][0]["bucket_points"] == 2 and rows[1][0]["selection_regret"] == sel
    assert rows[0][0]["worst_ratio"]["r128"] == pytest.approx(0.0410 / 0.0390)


def test_a_pick_worse_than_the_minimax_one_is_regret() -> None:
    judge = _module()._judge_bucket
    sel, vs_table = judge([(_row(RANDN, "b16"), "r128"), (_row(TIES, "b16"), "r128")])
    w_b16 = max(0.0460 / 0.0445, 0.0434 / 0.0390)
    w_r0 = max(0.0455 / 0.0445, 1.0)
    assert sel == pytest.approx(w_b16 / w_r0 - 1) and sel > 0.02
    assert vs_table == pytest.approx(w_b16 / (0.0410 / 0.0390))


def test_a_candidate_missing_at_one_point_is_not_a_possible_selection() -> None:
    judge = _module()._judge_bucket
    ties = {k: v for k, v in TIES.items() if k != "r0"}
    ties["x"] = 0.0300   # only timed here: no worst ratio, so not the minimax reference
    sel, _ = judge([(_row(RANDN, "r128"), "r128"), (_row(ties, "r128"), "r128")])
    assert sel == pytest.approx(0.0)   # r128: worst ratio 0.0410 / 0.0300 either way
