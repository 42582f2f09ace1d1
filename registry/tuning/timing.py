"""Interleaved device timing shared by ``kreg bench`` and ``kreg tune``.

Timed providers alternate inside one window: sequential per-provider runs measure the first
provider up to several percent high from clock state (the sm120 seed saw 6.8%), so ratios are
only meaningful between providers timed together.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["graphed", "interleaved_median_ms", "isolated_median_ms"]


def graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` captured once in a CUDA graph; the returned callable replays it."""
    import torch

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()   # allocations and compilation outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def interleaved_median_ms(fns: Mapping[str, Callable[[], Any]], *, warmup: int = 10,
                          iters: int = 100, graphs: bool = False, min_warm_s: float = 0.1,
                          min_window_s: float = 0.1) -> dict[str, float]:
    """Median milliseconds of each callable, timed round-robin with CUDA events in one window.

    Each iteration runs every provider once. The order is a permutation rotated one place a
    round, so in every block of ``len(fns)`` rounds each provider goes first once, and the
    permutation is drawn anew (seeded: the same sequence every run) each block, so no provider
    always follows the same one: a kernel's time depends on the kernel before it (the L1 /
    shared-memory split is reconfigured between kernels that need different ones; a 60 us
    kernel measured 12% slower behind one neighbour than behind another in the same window).
    On a GPU the warm-up runs at least ``warmup`` rounds and at least ``min_warm_s`` seconds
    (clocks leave their idle state; short kernels measured right after a slow reference ran
    up to 30% slow in one window and not in the next), and the timed window at least ``iters``
    rounds and at least ``min_window_s`` seconds (at most 20 x ``iters`` rounds).
    ``graphs``: each callable is captured once in a CUDA graph and its replays are timed (the
    GPU time of the work, without host launch cost: how a captured decode step runs it).
    Falls back to ``time.perf_counter`` around a synchronize when CUDA is absent (CPU runs;
    ``graphs`` is then ignored).
    """
    import torch

    names = list(fns)
    if not names:
        return {}
    if graphs and torch.cuda.is_available():
        timed: dict[str, Callable[[], Any]] = {}
        for n in names:
            try:
                timed[n] = graphed(fns[n])
            except Exception as exc:   # not capturable (it synchronizes): timed plainly
                import warnings

                warnings.warn(f"{n}: not capturable in a CUDA graph ({exc}); timed with plain "
                              "launches", stacklevel=2)
                timed[n] = fns[n]
        fns = timed
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    rounds = 0
    while rounds < warmup or (cuda and time.perf_counter() - t0 < min_warm_s
                              and rounds < warmup + 10000):
        for name in names:
            fns[name]()
        rounds += 1
        if cuda and rounds >= warmup:
            torch.cuda.synchronize()
    samples: dict[str, list[float]] = {n: [] for n in names}
    if cuda:
        torch.cuda.synchronize()
        t1 = time.perf_counter()   # one more round, synchronized: the time a round takes
        for name in names:
            fns[name]()
        torch.cuda.synchronize()
        per_round = time.perf_counter() - t1
        iters = min(max(iters, math.ceil(min_window_s / max(per_round, 1e-6))), 20 * iters)
        make = torch.cuda.Event
        events = [[(make(enable_timing=True), make(enable_timing=True))  # type: ignore[no-untyped-call]
                   for _ in names] for _ in range(iters)]
        for it, order in enumerate(_orders(len(names), iters)):
            for slot in order:
                start, end = events[it][slot]
                start.record()
                fns[names[slot]]()
                end.record()
        torch.cuda.synchronize()
        for it in range(iters):
            for slot, name in enumerate(names):
                start, end = events[it][slot]
                samples[name].append(start.elapsed_time(end))
    else:
        for order in _orders(len(names), iters):
            for slot in order:
                name = names[slot]
                t0 = time.perf_counter()
                fns[name]()
                samples[name].append((time.perf_counter() - t0) * 1e3)
    return {n: statistics.median(v) for n, v in samples.items()}


def _orders(n: int, rounds: int) -> list[list[int]]:
    """The provider order of each timed round (see :func:`interleaved_median_ms`)."""
    rng = random.Random(0)
    perm = list(range(n))
    out = []
    for it in range(rounds):
        if it % n == 0:
            rng.shuffle(perm)
        out.append([perm[(j + it) % n] for j in range(n)])
    return out


def isolated_median_ms(fn: Callable[[], Any], *, warmup: int = 1, iters: int = 3) -> float:
    """Median milliseconds of one callable in its own short window (context columns)."""
    return interleaved_median_ms({"_": fn}, warmup=warmup, iters=iters)["_"]
