"""Interleaved device timing shared by ``kreg bench`` and ``kreg tune``.

Timed providers alternate inside one window: sequential per-provider runs measure the first
provider up to several percent high from clock state (the sm120 seed saw 6.8%), so ratios are
only meaningful between providers timed together.
"""

from __future__ import annotations

import statistics
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
                          iters: int = 100, graphs: bool = False) -> dict[str, float]:
    """Median milliseconds of each callable, timed round-robin with CUDA events in one window.

    Each iteration runs every provider once, in a rotated order so no provider is always first.
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
        fns = {n: graphed(fns[n]) for n in names}
    for _ in range(warmup):
        for name in names:
            fns[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        make = torch.cuda.Event
        events = [[(make(enable_timing=True), make(enable_timing=True))  # type: ignore[no-untyped-call]
                   for _ in names] for _ in range(iters)]
        for it in range(iters):
            shift = it % len(names)
            for j in range(len(names)):
                slot = (j + shift) % len(names)
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
        import time

        for it in range(iters):
            shift = it % len(names)
            for j in range(len(names)):
                name = names[(j + shift) % len(names)]
                t0 = time.perf_counter()
                fns[name]()
                samples[name].append((time.perf_counter() - t0) * 1e3)
    return {n: statistics.median(v) for n, v in samples.items()}


def isolated_median_ms(fn: Callable[[], Any], *, warmup: int = 1, iters: int = 3) -> float:
    """Median milliseconds of one callable in its own short window (context columns)."""
    return interleaved_median_ms({"_": fn}, warmup=warmup, iters=iters)["_"]
