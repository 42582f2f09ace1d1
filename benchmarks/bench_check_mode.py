"""The cost of check mode: dispatch time at check rates 0, 0.01 and 1, per op.

    python benchmarks/bench_check_mode.py [--reps 5] [--impl OP=IMPLEMENTATION] [--small]

For each op, one workload is dispatched in batches at each rate, the rates interleaved batch by
batch (so drift hits every rate alike); each batch ends with a device synchronize, and the
median over batches of the per-dispatch time is reported, with the slowdown against rate 0 and
how many dispatches were actually checked. Rate 0 is the production path (no observer installed);
at rate r a dispatch costs about ``kernel + r * (reference + compare)``, and every checked
dispatch synchronizes the device (the comparison reads the result).

On a GPU the implementation is the one selected for the workload (the seed's sparse-prefill
shape and a 64k-key top-2048). On a CPU the workloads are small and, because check mode never
compares the reference with itself, the torch reference is also registered as a non-fallback
implementation (``bench.<op>``) so that there is something to check.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import registry
from registry import Implementation, hookimpl, observe

RATES = (0.0, 0.01, 1.0)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def sparse_prefill_call(device: str, small: bool) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    import torch

    g = torch.Generator().manual_seed(0)
    if small:
        total_q, hq, hkv, d, topk, slots, dtype = 32, 6, 1, 64, 64, 256, torch.float32
    else:  # the seed shape (rank group 6 / 1 KV head, top-k 2051, head dim 256), 1,024 rows
        total_q, hq, hkv, d, topk, slots, dtype = 1024, 6, 1, 256, 2051, 8192, torch.bfloat16
    q = torch.randn(total_q, hq, d, generator=g).to(device, dtype)
    k = torch.randn(slots, hkv, d, generator=g).to(device, dtype)
    v = torch.randn(slots, hkv, d, generator=g).to(device, dtype)
    idx = torch.randint(0, slots, (total_q, topk), generator=g, dtype=torch.int32).to(device)
    label = f"prefill q={total_q} topk={topk} d={d} {str(dtype).removeprefix('torch.')}"
    return (q, k, v, idx), {"kind": "prefill"}, label


def indexer_topk_call(device: str, small: bool) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    import torch

    g = torch.Generator().manual_seed(0)
    rows, keys, k = (8, 4096, 256) if small else (64, 65536, 2048)
    scores = torch.randn(rows, keys, generator=g).to(device)
    lengths = torch.full((rows,), keys, dtype=torch.int32).to(device)
    return (scores, lengths), {"k": k}, f"rows={rows} keys={keys} k={k} float32"


CALLS: dict[str, Callable[[str, bool], tuple[tuple[Any, ...], dict[str, Any], str]]] = {
    "sparse_prefill": sparse_prefill_call,
    "indexer_topk": indexer_topk_call,
}


def _bench_plugin() -> object:
    """The torch references as non-fallback implementations, so check mode compares them."""

    class Bench:
        @hookimpl
        def kreg_implementations(self) -> list[Implementation]:
            return [
                Implementation(op="sparse_prefill", name="bench.sparse_prefill", priority=1000,
                               configurable=False,
                               kernel="backends.sparse_prefill.reference:sparse_prefill_reference"),
                Implementation(op="indexer_topk", name="bench.indexer_topk", priority=1000,
                               configurable=False,
                               kernel="backends.indexer_topk.reference:indexer_topk_reference"),
            ]

    return Bench()


def run(op: str, device: str, small: bool, reps: int, batch: int) -> list[dict[str, Any]]:
    args, kwargs, label = CALLS[op](device, small)
    registry.dispatch(op, *args, **kwargs)  # select, load and warm the kernel
    with registry.record() as launches:
        registry.dispatch(op, *args, **kwargs)
    impl = launches[0].implementation
    with observe.check(1.0):  # warm the reference and the comparison too
        registry.dispatch(op, *args, **kwargs)
    _sync()
    times: dict[float, list[float]] = {r: [] for r in RATES}
    checked: dict[float, int] = dict.fromkeys(RATES, 0)
    for rep in range(reps):
        order = RATES[rep % len(RATES):] + RATES[:rep % len(RATES)]
        for rate in order:
            n = batch if rate < 1.0 else max(2, batch // 10)
            observe.reset_stats()
            with observe.check(rate, seed=rep):  # rate 0: no observer, the production path
                _sync()
                t0 = time.perf_counter()
                for _ in range(n):
                    registry.dispatch(op, *args, **kwargs)
                _sync()
                times[rate].append((time.perf_counter() - t0) / n)
            checked[rate] += registry.stats().checked if rate else 0
    base = statistics.median(times[0.0])
    rows = []
    for rate in RATES:
        t = statistics.median(times[rate])
        rows.append({"op": op, "workload": label, "implementation": impl, "rate": rate,
                     "ms": t * 1e3, "slowdown": t / base, "checked": checked[rate],
                     "dispatches": sum(batch if rate < 1.0 else max(2, batch // 10)
                                       for _ in range(reps))})
    return rows


def host_overhead(n: int = 20_000, reps: int = 7) -> list[tuple[str, float]]:
    """ns per dispatch of a no-op kernel on CPU tensors: the observer machinery alone."""
    import torch

    class Noop:
        @hookimpl
        def kreg_implementations(self) -> list[Implementation]:
            return [Implementation(op="sparse_prefill", name="noop.sparse_prefill", priority=2000,
                                   configurable=False, kernel=lambda q, k, v, idx, **kw: q)]

    registry.register_plugin(Noop(), "noop")
    q, k, v = torch.zeros(4, 2, 8), torch.zeros(4, 1, 8), torch.zeros(4, 1, 8)
    idx = torch.zeros(4, 4, dtype=torch.int32)

    def batch() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            registry.dispatch("sparse_prefill", q, k, v, idx)
        return (time.perf_counter_ns() - t0) / n

    modes: dict[str, Callable[[], Any]] = {
        "rate 0 (no observer)": lambda: observe.check(0.0),
        "rate 1e-9 (observer, never sampled)": lambda: observe.check(1e-9, seed=0),
        "recorder on, rate 0": lambda: observe.check(0.0),
    }
    out: dict[str, list[float]] = {m: [] for m in modes}
    try:
        batch()
        for _ in range(reps):
            for mode, enter in modes.items():
                enter()
                if mode.startswith("recorder"):
                    with registry.record():
                        out[mode].append(batch())
                else:
                    out[mode].append(batch())
    finally:
        observe.check(0.0)
        registry.unregister_plugin("noop")
    return [(m, statistics.median(v)) for m, v in out.items()]


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="batches per rate (interleaved)")
    parser.add_argument("--batch", type=int, default=0,
                        help="dispatches per batch at rates < 1 (default 200 GPU, 50 CPU); "
                             "rate 1 runs a tenth")
    parser.add_argument("--small", action="store_true", help="small workloads (CPU default)")
    parser.add_argument("--impl", action="append", default=[], metavar="OP=IMPLEMENTATION",
                        help="force an implementation (registry.override) for an op")
    parser.add_argument("--ops", default="sparse_prefill,indexer_topk")
    a = parser.parse_args()
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    small = a.small or not gpu
    batch = a.batch or (200 if gpu else 50)
    observe.reset_stats()
    if not gpu:
        registry.register_plugin(_bench_plugin(), "bench")
    facts = registry.probe()
    print(f"# check mode cost on {facts.describe()}; python {platform.python_version()}")
    print(f"# {a.reps} interleaved batches per rate, {batch} dispatches a batch "
          f"({max(2, batch // 10)} at rate 1); median per-dispatch time")
    rows: list[dict[str, Any]] = []
    overrides = dict(x.split("=", 1) for x in a.impl)
    for op in a.ops.split(","):
        if op in overrides:
            with registry.override(op, overrides[op]):
                rows += run(op, device, small, a.reps, batch)
        else:
            rows += run(op, device, small, a.reps, batch)
    header = ("op", "workload", "implementation", "rate", "ms/dispatch", "x rate 0", "checked")
    table = [header] + [(r["op"], r["workload"], r["implementation"], f"{r['rate']:g}",
                         f"{r['ms']:.4f}", f"{r['slowdown']:.2f}",
                         f"{r['checked']}/{r['dispatches']}") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print()
    print("# host overhead: a no-op implementation on CPU tensors, ns per dispatch (median)")
    print("| mode | ns/dispatch |")
    print("|---|---|")
    for mode, ns in host_overhead():
        print(f"| {mode} | {ns:.0f} |")
    observe.reset_stats()  # nothing to persist from a benchmark


if __name__ == "__main__":
    sys.exit(main())
