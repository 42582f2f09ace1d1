"""``kreg tune`` chooses between implementations, and the ``measured`` plugin routes to the winner.

A small op defined here (``pick``: ``out = 2 * x``) has a tuned family (configs that sleep 2 or 3
ms), and a second plugin offers other implementations of it: ``fakes.fast`` (a torch kernel that
wins), ``fakes.slow`` (a configurable one that loses, until its config says otherwise) and
``fakes.nope`` (NVIDIA only: pruned on a CPU, with the reason). Timing on the CPU is
``perf_counter`` around each call, so sleeps order the candidates reliably.
"""

from __future__ import annotations

import functools
import json
import runpy
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from click.testing import CliRunner
from pydantic import Field

import cli
import registry
from registry import Contract, Implementation, OpSpec, Workload, hookimpl
from registry.requirements import CAPABILITY, predicate, vendor_in
from registry.tuning import TuningStore
from registry.tuning.tune import IMPLEMENTATION_KEY, tune

ROOT = Path(__file__).resolve().parents[2]
OP = "pick"
WL = {"rows": 8, "dtype": "float32"}
STATE: dict[str, Any] = {}


class PickWorkload(Workload):
    op = OP

    rows: int = Field(ge=0)
    dtype: Literal["float32"] = "float32"


def call_key(x: Any) -> tuple[Any, ...]:
    return (OP, x.get_device(), x.shape[0], str(x.dtype).removeprefix("torch."))


def reference(x: Any) -> Any:
    return x * 2


def _work(ms: float, x: Any) -> Any:
    if ms:   # no sleep(0): on a busy machine a yield can cost a time slice
        time.sleep(ms / 1e3)
    return x * 2


def family_kernel(x: Any, *, config: dict[str, Any]) -> Any:
    return _work(config["SLEEP_MS"], x)


def fast(x: Any) -> Any:
    return _work(STATE["fast_ms"], x)


def slow(x: Any, *, config: dict[str, Any]) -> Any:
    return _work(config["SLEEP_MS"], x)


# The op's package: its spec, its tuner (a module, as OpSpec.tuner names one) and kernels.
PKG = types.ModuleType("kreg_test_pick")
PKG.__dict__.update(
    FAMILY="pickop.family", family_kernel=family_kernel,
    cases=lambda grid: [{"rows": int(r), "dtype": "float32"} for r in grid.get("rows", ["8"])],
    label=lambda case: f"rows={case['rows']}", bucket=lambda case: dict(case),
    candidates=lambda case, facts: [("s2", {"SLEEP_MS": 2}, ""), ("s3", {"SLEEP_MS": 3}, "")],
    baseline=lambda case, facts: "s2",
    inputs=lambda case: ((torch.ones(case["rows"], 4),), {}))

SPEC = OpSpec(name=OP, workload_model=PickWorkload, call_key=call_key,
              reference="pickop.reference", error_bound=lambda dtype: 1e-6,
              tuner="kreg_test_pick", tuned_kernel="kreg_test_pick:family_kernel",
              point_fields=("rows",), doc="out = 2 x (a test op)")

PICKOP = types.SimpleNamespace(
    kreg_ops=hookimpl(lambda: [SPEC]),
    kreg_implementations=hookimpl(lambda: [
        Implementation(op=OP, name="pickop.reference", priority=0, kernel=reference,
                       configurable=False, fallback=True),
        Implementation(op=OP, name="pickop.family", priority=10,
                       kernel="kreg_test_pick:family_kernel", config={"SLEEP_MS": 2})]))


def _ready(f: registry.DeviceFacts, w: Workload) -> tuple[bool, str, str]:
    return STATE["ready"], "ready" if STATE["ready"] else "library gone", "ready"


FAKES = types.SimpleNamespace(kreg_implementations=hookimpl(lambda: [
    Implementation(op=OP, name="fakes.fast", priority=1, kernel=fast, configurable=False,
                   requirements=(predicate("library", CAPABILITY, _ready),),
                   contract=Contract(exact=True), description="the one that wins"),
    Implementation(op=OP, name="fakes.slow", priority=1, kernel=slow,
                   config=lambda f, w: {"SLEEP_MS": STATE["slow_ms"]}),
    Implementation(op=OP, name="fakes.nope", priority=1, kernel=fast, configurable=False,
                   requirements=(vendor_in("nvidia"),)),
]))


def load() -> registry.Registry:
    """A fresh default registry (it reads the store) with the op and the fakes registered."""
    reg = registry.reset_registry()
    reg.register_plugin(PICKOP, "pickop")
    reg.register_plugin(FAKES, "fakes")
    return reg


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("KREG_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "kreg_test_pick", PKG)
    STATE.update(fast_ms=0.0, slow_ms=5, ready=True)
    load()
    yield tmp_path
    registry.reset_registry()


def _tune(**kw: Any) -> Any:
    (res,) = tune(OP, {"rows": ["8"]}, facts=registry.probe(), store=TuningStore(), warmup=1,
                  iters=5, command="test", **kw)
    return res


def test_tune_measures_every_implementation_and_records_the_winner(home: Path) -> None:
    res = _tune()
    assert res.implementations == ["fakes.fast", "fakes.slow"]
    assert ("fakes.nope", None, "vendor: cpu, requires nvidia") in res.candidates
    assert not any(lab.startswith(("pickop.", "measured.")) for lab, _, _ in res.candidates)
    assert set(res.timings) == {"s2", "s3", "fakes.fast", "fakes.slow"}
    assert all(t.ok for t in res.timings.values())
    assert res.winner == "fakes.fast" and res.baseline == "s2"
    (entry,) = TuningStore().load()
    assert (entry.family, entry.config) == ("fakes.fast", {IMPLEMENTATION_KEY: "fakes.fast"})
    assert set(entry.timings_ms) == set(res.timings)
    assert entry.timings_ms["fakes.fast"] < entry.timings_ms["s2"] < entry.timings_ms["fakes.slow"]


def test_a_win_that_does_not_hold_in_a_second_window_keeps_the_baseline(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import registry.tuning.tune as tune_mod

    real, windows = tune_mod.measure_point, []

    def measure_point(*a: Any, **kw: Any) -> Any:   # fakes.fast is fast in the first window only
        windows.append(sorted([*a[2], *(kw.get("implementations") or {})]))
        STATE["fast_ms"] = 0.0 if len(windows) == 1 else 6.0
        return real(*a, **kw)

    monkeypatch.setattr(tune_mod, "measure_point", measure_point)
    res = _tune()
    assert windows == [["fakes.fast", "fakes.slow", "s2", "s3"], ["fakes.fast", "s2"]]
    assert res.fastest == "fakes.fast" and res.unconfirmed == "fakes.fast"
    assert res.winner == "s2" and "won the first window, not a second one" in res.note
    (entry,) = TuningStore().load()
    assert (entry.family, entry.config) == ("pickop.family", {"SLEEP_MS": 2})
    # the CLI says which win did not hold and what was kept
    TuningStore().clear()
    windows.clear()
    out = CliRunner().invoke(cli.main, ["tune", OP, "--grid", "rows=8", "--warmup", "1",
                                        "--iters", "5"]).output
    assert "fakes.fast won the first window, not a second one" in out
    assert "kept the baseline s2" in out and "winner fakes.fast" not in out


def test_a_winner_that_raises_in_the_second_window_is_not_stored(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin's kernel that wins one window and then raises: only that candidate fails, the
    tune goes on and stores the baseline, and the note says why."""
    calls = {"n": 0}

    def flaky(x: Any) -> Any:
        calls["n"] += 1
        if STATE.get("broken"):
            raise RuntimeError("the vendor kernel fell over")
        return _work(0.0, x)

    monkeypatch.setattr(sys.modules[__name__], "fast", flaky)
    load()
    import registry.tuning.tune as tune_mod

    real, windows = tune_mod.measure_point, []

    def measure_point(*a: Any, **kw: Any) -> Any:
        windows.append(1)
        STATE["broken"] = len(windows) > 1
        return real(*a, **kw)

    monkeypatch.setattr(tune_mod, "measure_point", measure_point)
    try:
        res = _tune()
    finally:
        STATE["broken"] = False
    assert len(windows) == 2 and calls["n"] > 0
    assert res.fastest == "fakes.fast" and res.unconfirmed == "fakes.fast"
    assert res.winner == "s2" and "fakes.fast won the first window but failed in the second" \
        in res.note
    (entry,) = TuningStore().load()
    assert (entry.family, entry.config) == ("pickop.family", {"SLEEP_MS": 2})


def test_the_measured_entry_routes_dispatch_to_the_winner(home: Path) -> None:
    from registry.observe import record

    _tune()
    reg = load()   # the measured plugin reads the store when the registry loads
    d = registry.select(OP, WL)
    assert d.implementation == "measured.pick"
    assert d.config == {IMPLEMENTATION_KEY: "fakes.fast"}
    assert d.guarantees == ["exact", "deterministic", "batch_invariant"]   # the winner's
    text = d.explain(verbose=True)
    assert "config: implementation=fakes.fast" in text
    assert "the point's winner: fakes.fast" in text and "faster than the next (s2 " in text
    x = torch.arange(32.0).reshape(8, 4)
    with record() as launches:
        out = registry.dispatch(OP, x)
        again = registry.dispatch(OP, x)
    assert torch.equal(out, x * 2) and torch.equal(again, x * 2)
    assert [launch.implementation for launch in launches] == ["measured.pick"] * 2
    # the dispatch cache holds the winner's kernel itself: the hit path calls it directly
    assert reg.dispatch_map[call_key(x)] is fast


def test_a_winner_that_cannot_run_here_is_not_routed_to(home: Path) -> None:
    _tune()
    load()
    STATE["ready"] = False
    registry.invalidate()
    d = registry.select(OP, WL)
    assert d.implementation == "pickop.family"
    measured = next(c for c in d.candidates if c.implementation == "measured.pick")
    [check] = measured.failed
    assert check.name == "tuning_entry" and check.kind == "capability"
    assert "the point's winner fakes.fast cannot run here: library: library gone, requires " \
        "ready" in str(check)
    STATE["ready"] = True
    registry.get_registry().unregister_plugin("fakes")
    d = registry.select(OP, WL)
    assert d.implementation == "pickop.family"
    assert "the point's winner fakes.fast is not loaded" in d.explain()


def test_a_configurable_winner_runs_with_its_config_and_a_new_winner_replaces_the_old(
        home: Path) -> None:
    _tune()
    STATE.update(fast_ms=8.0, slow_ms=0)   # now the configurable one wins, with SLEEP_MS 0
    res = _tune(resume=False)
    assert res.winner == "fakes.slow"
    (entry,) = TuningStore().load()   # one entry a point: fakes.fast's is gone
    assert (entry.family, entry.config) == ("fakes.slow", {IMPLEMENTATION_KEY: "fakes.slow",
                                                          "SLEEP_MS": 0})
    reg = load()
    d = registry.select(OP, WL)
    assert d.config == {IMPLEMENTATION_KEY: "fakes.slow", "SLEEP_MS": 0}
    assert d.guarantees == []
    x = torch.ones(8, 4)
    assert torch.equal(registry.dispatch(OP, x), x * 2)
    bound = reg.dispatch_map[call_key(x)]
    assert isinstance(bound, functools.partial) and bound.func is slow
    assert bound.keywords == {"config": {"SLEEP_MS": 0}}
    # and when the family wins again, the entry is a plain config of the tuned kernel
    STATE.update(slow_ms=9)
    assert _tune(resume=False).winner == "s2"
    (entry,) = TuningStore().load()
    assert (entry.family, entry.config) == ("pickop.family", {"SLEEP_MS": 2})
    load()
    assert registry.select(OP, WL).config == {"SLEEP_MS": 2}


def test_an_entry_without_the_key_is_a_config_of_the_tuned_kernel_whatever_its_family(
        home: Path) -> None:
    """Stores and tables written before tune measured implementations serve as they did: a
    vendor's family name with a plain config drives the tuned kernel."""
    from registry.tuning import TuningEntry, identity_of

    device, software = identity_of(registry.probe())
    TuningStore().put([TuningEntry(op=OP, family="fakes.slow", device=device, software=software,
                                   bucket=dict(WL), config={"SLEEP_MS": 3},
                                   timings_ms={"s3": 3.0}, command="old")])
    reg = load()
    d = registry.select(OP, WL)
    assert (d.implementation, d.config) == ("measured.pick", {"SLEEP_MS": 3})
    x = torch.ones(8, 4)
    registry.dispatch(OP, x)
    bound = reg.dispatch_map[call_key(x)]
    assert bound.func is family_kernel and bound.keywords == {"config": {"SLEEP_MS": 3}}


def test_resume_skips_a_point_whichever_implementation_won_it(home: Path) -> None:
    _tune()
    assert _tune().status == "skipped (in store)"


def test_kreg_tune_prints_the_winning_implementation_and_the_pruned_one(home: Path) -> None:
    res = CliRunner().invoke(cli.main, ["tune", OP, "--grid", "rows=8", "--warmup", "1",
                                        "--iters", "3"])
    assert res.exit_code == 0, res.output
    assert "rows=8: measured; winner fakes.fast" in res.output
    assert "pruned fakes.nope (vendor: cpu, requires nvidia)" in res.output
    dry = CliRunner().invoke(cli.main, ["tune", OP, "--grid", "rows=16", "--dry-run"])
    assert "would measure 4: s2, s3, fakes.fast, fakes.slow" in dry.output


def test_the_regret_bench_times_the_implementations_and_matches_the_routed_winner(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    _tune()
    load()
    monkeypatch.setattr(sys, "argv", ["bench_regret.py", OP, "--grid", "rows=8", "--warmup", "1",
                                      "--iters", "5", "--limit", "0.5"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "benchmarks" / "bench_regret.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert "measured fakes.fast" in out   # auto's pick, named by the candidate it equals


def test_points_that_share_a_bucket_are_tuned_and_judged_as_one_selection(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """A grid axis the workload cannot see (indexer_topk's ``dist``): ``fakes.fast`` (1 ms, then
    9) is fastest at one point and 4.5x the fastest at the other, ``s2`` (2 ms) 2x at worst, so
    the one entry for the bucket is ``s2`` (minimax), and the regret bench judges that single
    selection: 0% selection regret, though ``s2`` loses to ``fakes.fast`` at one point by far
    more than 2%."""
    monkeypatch.setattr(PKG, "cases", lambda grid: [
        {"rows": 8, "dtype": "float32", "dist": d} for d in grid.get("dist", ["a"])])
    monkeypatch.setattr(PKG, "label", lambda case: f"rows=8 {case['dist']}")
    monkeypatch.setattr(PKG, "bucket", lambda case: {"rows": case["rows"], "dtype": "float32"})
    real_inputs = PKG.inputs

    def inputs(case: dict[str, Any]) -> Any:   # the point being timed sets fakes.fast's speed
        STATE["fast_ms"] = 1.0 if case["dist"] == "a" else 9.0
        return real_inputs(case)

    monkeypatch.setattr(PKG, "inputs", inputs)
    STATE["slow_ms"] = 12
    results = tune(OP, {"dist": ["a", "b"]}, facts=registry.probe(), store=TuningStore(),
                   warmup=1, iters=5, command="test")
    assert [r.fastest for r in results] == ["fakes.fast", "s2"]
    (entry,) = TuningStore().load()
    assert (entry.family, entry.config) == ("pickop.family", {"SLEEP_MS": 2})
    load()
    monkeypatch.setattr(sys, "argv", ["bench_regret.py", OP, "--grid", "dist=a,b", "--warmup",
                                      "1", "--iters", "5", "--json", str(home / "r.json")])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "benchmarks" / "bench_regret.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert "2 points, one selection:" in out and "selection regret 0.0%" in out
    rows = json.loads((home / "r.json").read_text())
    assert [r["point"] for r in rows] == ["rows=8 a", "rows=8 b"]
    assert rows[0]["regret"] > 0.5 and rows[1]["regret"] == pytest.approx(0.0)
    assert all(r["bucket_points"] == 2 and r["selection_regret"] == pytest.approx(0.0)
               for r in rows)


def test_a_candidate_that_cannot_be_captured_is_timed_plainly_in_the_same_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What FlashInfer's attention gets in a graph window on the GPU (plan() synchronizes):
    timed, with plain launches, and said so; no ratio against graph replays."""
    import importlib

    from registry.tuning import timing

    m = importlib.import_module("registry.tuning.measure")  # the package exports measure()

    def graphed(fn: Any) -> Any:
        if getattr(fn, "syncs", False):
            raise RuntimeError("operation not permitted when stream is capturing")
        return fn

    def plan_then_run() -> Any:
        return torch.ones(2)

    plan_then_run.syncs = True  # type: ignore[attr-defined]
    windows: list[list[str]] = []
    monkeypatch.setattr(m, "_cuda", lambda: True)
    monkeypatch.setattr(timing, "graphed", graphed)
    monkeypatch.setattr(timing, "interleaved_median_ms", lambda fns, **kw: (
        windows.append(list(fns)) or {n: 1.0 for n in fns}))
    res = {r.label: r for r in m.measure(
        [m.Trial("kernel", lambda: torch.ones(2)), m.Trial("planned", plan_then_run)],
        expected=torch.ones(2), compare=lambda a, b: None, graphs=True, baseline="kernel")}
    assert windows == [["kernel", "planned"]]          # one window, both timed
    assert res["kernel"].timing == "graphs" and res["kernel"].ratio == 1.0
    assert res["planned"].ms == 1.0 and res["planned"].ratio is None
    assert res["planned"].timing == ("plain: not capturable in a CUDA graph (RuntimeError: "
                                     "operation not permitted when stream is capturing)")
