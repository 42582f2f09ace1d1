"""Check mode and the launch recorder (registry/observe/), and ``kreg stats``.

The planted plugins here register at run time (``registry.register_plugin``) an implementation
whose kernel returns a slightly wrong result; check mode must catch it at rate 1.0 and must not
even look at rate 0.0.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import registry
from registry import Implementation, hookimpl
from registry import observe as obs
from registry._default import build_registry
from registry.errors import ConfigError, StrictModeError
from registry.observe import checker, hub, persist
from registry.observe.cli import stats as stats_command
from registry.observe.state import _state

PLANTED = "planted"
WRONG = "planted.sparse_prefill_off"


def wire_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Point each op's OpSpec.compare/conformance at its modules where backends/ does not yet."""
    import dataclasses
    import importlib

    changed = False
    for op in ("sparse_prefill", "indexer_topk"):
        pkg = importlib.import_module(f"backends.{op}")
        if not pkg.SPEC.compare or not pkg.SPEC.conformance:
            monkeypatch.setattr(pkg, "SPEC", dataclasses.replace(
                pkg.SPEC, compare=pkg.SPEC.compare or f"backends.{op}.compare:compare",
                conformance=pkg.SPEC.conformance or f"backends.{op}.conformance"))
            changed = True
    if changed:
        registry.get_registry()._rebuild()


@pytest.fixture(autouse=True)
def _clean_observe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    wire_specs(monkeypatch)
    obs.reset_stats()
    yield
    obs.check(0.0, seed=0)
    _state.explicit = False
    obs.reset_stats()  # nothing dirty: no write to the real KREG_HOME at exit
    for name in ("planted", "planted_ok", "planted_topk"):
        if name in registry.get_registry().plugins:
            registry.unregister_plugin(name)
    assert not registry.get_registry().observers
    monkeypatch.undo()
    registry.get_registry()._rebuild()  # drop the wired specs again


def _reference(*args: Any, **kwargs: Any) -> Any:
    from backends.sparse_prefill.reference import sparse_prefill_reference

    return sparse_prefill_reference(*args, **kwargs)


def _off_by_a_bit(q: Any, k: Any, v: Any, indices: Any, *, config: dict[str, Any],
                  **kwargs: Any) -> Any:
    """Right everywhere except one element of row 0, by 0.05 (> every dtype's bound)."""
    out = _reference(q, k, v, indices, **kwargs)
    out[0, 0, 0] += 0.05
    return out


def _exact(q: Any, k: Any, v: Any, indices: Any, *, config: dict[str, Any], **kwargs: Any) -> Any:
    return _reference(q, k, v, indices, **kwargs)


def _plugin(name: str, impl: str, kernel: Any, op: str = "sparse_prefill") -> object:
    class Plugin:
        @hookimpl
        def kreg_implementations(self) -> list[Implementation]:
            return [Implementation(op=op, name=impl, priority=500, config={"TILE": 7},
                                   kernel=kernel, description="planted by test_observe")]

    return Plugin()


def _inputs(total_q: int = 4, seed: int = 0) -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(total_q, 4, 16, generator=g)
    k = torch.randn(24, 2, 16, generator=g)
    v = torch.randn(24, 2, 16, generator=g)
    idx = torch.randint(0, 24, (total_q, 8), generator=g, dtype=torch.int32)
    return (q, k, v, idx), {"kind": "prefill"}


def test_no_observer_unless_check_or_record() -> None:
    reg = registry.get_registry()
    assert reg.observers == []
    with registry.check(0.5) as scope:
        assert reg.observers == [hub._hub]
        assert registry.stats().rate == 0.5
        with registry.check(0.0):
            assert reg.observers == []  # rate 0: the hit path pays nothing
        assert reg.observers == [hub._hub]
        other = build_registry(load_entry_points=False)  # a second registry gets it too
        assert other.observers == [hub._hub] and reg.observers == [hub._hub]
    assert scope.previous == 0.0 and reg.observers == [] and other.observers == []
    with registry.record():
        with registry.record():
            assert reg.observers == [hub._hub]  # one hub however many recorders
        assert reg.observers == [hub._hub]
    assert reg.observers == []


def test_check_rejects_a_rate_outside_0_1() -> None:
    for bad in (-0.1, 1.5, "0.5", True):
        with pytest.raises(ConfigError, match=r"expected a number in \[0, 1\]"):
            registry.check(bad)  # type: ignore[arg-type]


def test_planted_wrong_kernel_is_caught_at_rate_1_and_missed_at_rate_0(
        caplog: pytest.LogCaptureFixture) -> None:
    registry.register_plugin(_plugin(PLANTED, WRONG, _off_by_a_bit), PLANTED)
    args, kwargs = _inputs()
    with registry.check(0.0):
        for _ in range(3):
            registry.dispatch("sparse_prefill", *args, **kwargs)
    assert registry.stats().counters == []  # never looked
    with caplog.at_level(logging.WARNING, logger="registry.observe"), \
            registry.check(1.0) as scope:
        for _ in range(3):
            out = registry.dispatch("sparse_prefill", *args, **kwargs)
    assert float((out - _reference(*args, **kwargs)).abs().max()) == pytest.approx(0.05, abs=1e-6)
    c = registry.stats().counter(WRONG, {"TILE": 7})
    assert (c.dispatches, c.checked, c.violations, c.errors) == (3, 3, 3, 0)
    assert c.last_workload is not None and c.last_workload["total_q"] == 4
    assert "max |out - ref| = 0.05" in (c.last_violation or "")
    assert len(scope.violations) == 3
    v = scope.violations[0]
    assert (v.implementation, dict(v.config)) == (WRONG, {"TILE": 7})
    # logged once per (implementation, config, workload), with the workload
    logged = [r.getMessage() for r in caplog.records if "violation" in r.getMessage()]
    assert len(logged) == 1
    assert WRONG in logged[0] and "total_q=4" in logged[0] and "TILE=7" in logged[0]


def test_a_correct_kernel_passes_and_the_reference_is_not_compared_with_itself() -> None:
    registry.register_plugin(_plugin("planted_ok", "planted_ok.sparse_prefill", _exact),
                             "planted_ok")
    args, kwargs = _inputs()
    with registry.check(1.0):
        registry.dispatch("sparse_prefill", *args, **kwargs)
        with registry.override("sparse_prefill", "reference.sparse_prefill"):
            registry.dispatch("sparse_prefill", *args, **kwargs)
    st = registry.stats()
    ok = st.counter("planted_ok.sparse_prefill")
    assert (ok.checked, ok.violations) == (1, 0)
    ref = st.counter("reference.sparse_prefill")
    assert (ref.dispatches, ref.checked) == (1, 0)
    assert st.violations == 0


def test_strict_mode_raises_on_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    registry.register_plugin(_plugin(PLANTED, WRONG, _off_by_a_bit), PLANTED)
    monkeypatch.setenv("KREG_STRICT", "1")
    args, kwargs = _inputs()
    with registry.check(1.0), pytest.raises(registry.errors.CheckViolationError) as info:
        registry.dispatch("sparse_prefill", *args, **kwargs)
    assert isinstance(info.value, StrictModeError) and isinstance(info.value, AssertionError)
    assert WRONG in str(info.value) and "KREG_STRICT" in str(info.value)
    assert registry.stats().counter(WRONG).violations == 1


def test_indexer_topk_compare_is_exact() -> None:
    from backends.indexer_topk.reference import indexer_topk_reference

    def one_swapped(scores: Any, lengths: Any, k: int = 2048, *, config: dict[str, Any]) -> Any:
        out = indexer_topk_reference(scores, lengths, k)
        out[1, -1] = out[1, -1] + 1  # one position off by one in one row
        return out

    registry.register_plugin(_plugin("planted_topk", "planted_topk.swapped", one_swapped,
                                     op="indexer_topk"), "planted_topk")
    scores = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([64, 40, 5], dtype=torch.int32)
    with registry.check(1.0) as scope:
        registry.dispatch("indexer_topk", scores, lengths, k=8)
    [v] = scope.violations
    assert v.op == "indexer_topk" and "row 1" in v.message and "1 of 3 row(s)" in v.message


def test_sampling_is_deterministic_given_the_seed() -> None:
    registry.register_plugin(_plugin("planted_ok", "planted_ok.sparse_prefill", _exact),
                             "planted_ok")
    args, kwargs = _inputs(total_q=2)
    counts = []
    for _ in range(2):
        obs.reset_stats()
        with obs.check(0.3, seed=7):  # registry.check(rate, seed=) once the facade passes seed
            for _ in range(40):
                registry.dispatch("sparse_prefill", *args, **kwargs)
        counts.append(registry.stats().counter("planted_ok.sparse_prefill").checked)
    rng = random.Random(7)
    assert counts == [sum(rng.random() < 0.3 for _ in range(40))] * 2
    assert 0 < counts[0] < 40


def test_a_failing_check_never_breaks_the_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    registry.register_plugin(_plugin("planted_ok", "planted_ok.sparse_prefill", _exact),
                             "planted_ok")

    def boom(actual: Any, expected: Any) -> str | None:
        raise RuntimeError("compare exploded")

    args, kwargs = _inputs()
    with registry.check(1.0):
        monkeypatch.setattr(checker, "_resolve",
                            lambda reg, op: checker._OpCheck(lambda *a, **k: None, boom))
        _state.checks.clear()
        out = registry.dispatch("sparse_prefill", *args, **kwargs)
    assert out.shape == (4, 4, 16)
    c = registry.stats().counter("planted_ok.sparse_prefill")
    assert (c.checked, c.errors, c.violations) == (0, 1, 0)


def test_recorder_captures_the_geometry_that_ran() -> None:
    args, kwargs = _inputs(total_q=4)
    with registry.override("sparse_prefill", "reference.sparse_prefill"), \
            registry.record() as launches:
        registry.dispatch("sparse_prefill", *args, **kwargs)
    with registry.record() as outer:
        registry.register_plugin(_plugin("planted_ok", "planted_ok.sparse_prefill", _exact),
                                 "planted_ok")
        registry.dispatch("sparse_prefill", *args, **kwargs)
        with registry.record() as inner:
            registry.dispatch("sparse_prefill", *args, kind="prefill", sm_scale=0.5)
    registry.dispatch("sparse_prefill", *args, **kwargs)  # after the blocks: not recorded
    [ref] = launches
    assert (ref.op, ref.implementation, dict(ref.config), ref.fallback) == (
        "sparse_prefill", "reference.sparse_prefill", {}, True)
    assert ref.workload["total_q"] == 4 and ref.workload["group_size"] == 2
    assert [x.implementation for x in outer] == ["planted_ok.sparse_prefill"] * 2
    assert [dict(x.config) for x in inner] == [{"TILE": 7}]
    with pytest.raises(TypeError):
        inner[0].config["TILE"] = 8  # type: ignore[index]
    with pytest.raises(AttributeError):
        inner[0].implementation = "x"  # type: ignore[misc]


def test_recorder_sees_the_generic_table_geometry() -> None:
    """The Triton kernel (through the interpreter on a CPU) with the table's geometry."""
    facts = registry.get_registry().facts_for_index(-1)  # the inputs are CPU tensors
    if registry.select("sparse_prefill", {"kind": "prefill", "topk": 8, "head_dim": 16,
                                          "group_size": 2, "num_kv_heads": 2, "total_q": 4,
                                          "num_requests": 1, "max_q": 4, "dtype": "float32"},
                       facts).implementation != "generic.sparse_prefill_table":
        pytest.skip("generic.sparse_prefill_table is not eligible here (no Triton runtime)")
    args, kwargs = _inputs(total_q=4)
    with registry.record() as launches, registry.check(1.0) as scope:
        registry.dispatch("sparse_prefill", *args, **kwargs)
    [launch] = launches
    assert launch.implementation == "generic.sparse_prefill_table"
    assert dict(launch.config) == {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2}
    assert scope.violations == []
    assert registry.stats().counter("generic.sparse_prefill_table").checked == 1


def test_install_reads_kreg_check(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = registry.Registry(load_entry_points=False)
    monkeypatch.setenv("KREG_CHECK", "0.25")
    obs.install(fake)
    assert fake.observers == [hub._hub] and registry.stats().rate == 0.25
    obs.check(0.0)
    assert fake.observers == []
    other = registry.Registry(load_entry_points=False)
    _state.explicit = False
    monkeypatch.delenv("KREG_CHECK")
    obs.install(other)
    assert other.observers == []
    monkeypatch.setenv("KREG_CHECK", "2")
    with pytest.raises(ConfigError, match="KREG_CHECK"):
        obs.install(other)


def test_counters_are_persisted_and_kreg_stats_shows_them(tmp_path: Path) -> None:
    registry.register_plugin(_plugin(PLANTED, WRONG, _off_by_a_bit), PLANTED)
    args, kwargs = _inputs()
    runner = CliRunner()
    empty = runner.invoke(stats_command, [])
    assert empty.exit_code == 0 and "no check-mode counters" in empty.output
    with registry.check(1.0):
        registry.dispatch("sparse_prefill", *args, **kwargs)  # a violation is written at once
    path = Path(os.environ["KREG_HOME"]) / "stats.json"
    doc = json.loads(path.read_text())
    mine = doc["processes"][str(os.getpid())]
    assert mine["counters"][0]["implementation"] == WRONG
    assert mine["counters"][0]["violations"] == 1
    shown = runner.invoke(stats_command, [])
    assert shown.exit_code == 0, shown.output
    assert WRONG in shown.output and "TILE=7" in shown.output
    assert "last violation on [kind=prefill" in shown.output
    assert runner.invoke(stats_command, ["--fail-on-violation"]).exit_code == 1
    as_json = json.loads(runner.invoke(stats_command, ["--json"]).output)
    assert as_json[str(os.getpid())]["counters"][0]["violations"] == 1
    assert "removed" in runner.invoke(stats_command, ["--clear"]).output
    assert not path.exists()


def test_persisting_is_rate_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    registry.register_plugin(_plugin("planted_ok", "planted_ok.sparse_prefill", _exact),
                             "planted_ok")
    writes: list[int] = []
    monkeypatch.setattr(persist, "_write", lambda snap: writes.append(snap.checked))
    _state.last_write = 0.0
    args, kwargs = _inputs(total_q=2)
    with registry.check(1.0):
        for _ in range(20):
            registry.dispatch("sparse_prefill", *args, **kwargs)
    assert len(writes) == 1  # the first change; the next ones fall within the same second
    persist._maybe_persist(force=True)  # what the atexit hook does
    assert writes[-1] == 20


CHILD = """
import sys, torch, registry
from registry import Implementation, hookimpl
from backends.sparse_prefill.reference import sparse_prefill_reference

wired = bool(registry.get_registry().observers)  # KREG_CHECK=1 installed the hub at creation
print("WIRED" if wired else "NOT-WIRED")
if not wired:
    sys.exit(0)

def kernel(q, k, v, indices, *, config, **kwargs):
    return sparse_prefill_reference(q, k, v, indices, **kwargs)

class Plugin:
    @hookimpl
    def kreg_implementations(self):
        return [Implementation(op="sparse_prefill", name="child.exact", priority=500,
                               config={"TILE": 3}, kernel=kernel)]

registry.register_plugin(Plugin(), "child")
q, k, v = torch.randn(2, 2, 8), torch.randn(6, 1, 8), torch.randn(6, 1, 8)
idx = torch.randint(0, 6, (2, 4), dtype=torch.int32)
for _ in range(3):
    registry.dispatch("sparse_prefill", q, k, v, idx)
"""


def test_kreg_check_from_the_environment_persists_at_exit(tmp_path: Path) -> None:
    """KREG_CHECK=1 in a fresh process: the hub is installed when the registry is created, three
    dispatches are checked, and the counters reach stats.json by the exit hook (the last two fall
    within a second of the first write)."""
    import subprocess
    import sys

    home = tmp_path / "child_home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREG_")}
    env.update({"KREG_CHECK": "1", "KREG_HOME": str(home)})
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "WIRED" in proc.stdout and "NOT-WIRED" not in proc.stdout, proc.stdout
    persisted = obs.read_persisted(home)
    [st] = persisted.values()
    c = st.counter("child.exact", {"TILE": 3})
    assert (st.rate, c.dispatches, c.checked, c.violations) == (1.0, 3, 3, 0)
    shown = CliRunner().invoke(stats_command, ["--home", str(home)])
    assert "child.exact" in shown.output and "TILE=3" in shown.output
