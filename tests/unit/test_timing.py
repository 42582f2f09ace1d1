"""registry.tuning.timing on the CPU: round-robin order, medians, and the GPU-only knobs ignored."""

from __future__ import annotations

import pytest

from registry.tuning import timing as _timing

torch = pytest.importorskip("torch")


def test_round_robin_medians_and_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    order: list[str] = []
    clock = iter(range(10_000))
    # Each call advances a fake perf_counter by its provider's cost (a: 1 ms, b: 3 ms).
    now = [0.0]

    def fake_counter() -> float:
        next(clock)
        return now[0]

    def make(name: str, cost: float):  # type: ignore[no-untyped-def]
        def fn() -> None:
            order.append(name)
            now[0] += cost / 1e3
        return fn

    monkeypatch.setattr(_timing.time, "perf_counter", fake_counter)
    got = _timing.interleaved_median_ms({"a": make("a", 1.0), "b": make("b", 3.0)}, warmup=1,
                                        iters=4, graphs=True, min_warm_s=5.0, min_window_s=5.0)
    assert got == {"a": pytest.approx(1.0), "b": pytest.approx(3.0)}
    # 1 warm-up round, then 4 timed rounds (the GPU-only time minimums do not stretch a CPU run;
    # graphs are ignored), each provider once a round and first once in every 2 rounds.
    assert order[:2] == ["a", "b"] and len(order) == 10
    rounds = [order[i:i + 2] for i in range(2, 10, 2)]
    assert all(sorted(r) == ["a", "b"] for r in rounds)
    assert {rounds[0][0], rounds[1][0]} == {rounds[2][0], rounds[3][0]} == {"a", "b"}


def test_orders_vary_the_predecessor_and_repeat_run_to_run() -> None:
    n, rounds = 5, 40
    orders = _timing._orders(n, rounds)
    assert orders == _timing._orders(n, rounds)  # seeded: the same windows every run
    assert all(sorted(o) == list(range(n)) for o in orders)
    for block in range(0, rounds, n):  # each provider first once a block
        assert sorted(o[0] for o in orders[block:block + n]) == list(range(n))
    # a provider does not always run right after the same one (it did with plain rotation)
    for p in range(n):
        before = {o[o.index(p) - 1] for o in orders if o.index(p) > 0}
        assert len(before) >= 3, (p, before)


def test_empty_and_isolated() -> None:
    assert _timing.interleaved_median_ms({}) == {}
    assert _timing.isolated_median_ms(lambda: None, warmup=0, iters=3) >= 0.0
