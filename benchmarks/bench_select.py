"""The selection hot paths, timed against bare baselines in the same run.

    python benchmarks/bench_select.py [--fuzz 10000]

Rows:
* select (cache hit) vs a bare ``functools.lru_cache`` selector on the same workload: the
  baseline hashes the same inputs (op, workload items, device name) and returns a stored answer.
* dispatch overhead: ``registry.dispatch`` of a no-op implementation vs calling the bound
  kernel directly, on real CPU tensors with the real sparse_prefill call-key extraction.
* dispatch with ``registry.record_outputs(every=16)``: the observer path on every dispatch and
  an output digest every 16th, against plain dispatch (the cost of leaving output agreement on).
* cold selection: a decision from scratch over every in-tree implementation (cache cleared).
* ``--fuzz N``: runs the hypothesis fuzz test with N examples and reports the count.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import registry
from registry import Implementation, hookimpl

SEED = {"kind": "chunk", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
        "total_q": 8192, "num_requests": 1, "max_q": 8192, "dtype": "bfloat16"}
DEVICE = "rtx-pro-6000-blackwell-server"


def per_call_ns(fn: Callable[[], Any], n: int = 200_000, repeats: int = 7) -> float:
    """Median over repeats of the mean time per call, in nanoseconds (cold path: medians)."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def interleaved(fns: dict[str, Callable[[], Any]], n: int, repeats: int = 9) -> dict[str, float]:
    """Per-call ns of each callable: the fastest of ``repeats`` rounds, the rounds alternating
    between the callables. The minimum, as timeit advises: on a shared VM the slower rounds
    measure other tenants, not this code."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats):
        names = list(fns)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            fn = fns[name]
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            out[name].append((time.perf_counter_ns() - t0) / n)
    return {k: min(v) for k, v in out.items()}


def bench_select() -> tuple[float, float]:
    reg = registry.get_registry()
    answer = reg.select("sparse_prefill", SEED, DEVICE)

    @functools.lru_cache(maxsize=4096)
    def bare(op: str, items: tuple[Any, ...], device: str) -> Any:
        return answer

    wl = SEED
    res = interleaved({
        "kreg": lambda: registry.select("sparse_prefill", wl, DEVICE),
        "lru": lambda: bare("sparse_prefill", tuple(wl.items()), DEVICE),
    }, n=100_000)
    return res["kreg"], res["lru"]


def bench_dispatch() -> tuple[float, float]:
    import torch

    noop = Implementation(op="sparse_prefill", name="bench.noop", priority=1000,
                          kernel=lambda q, k, v, idx, **kw: q, configurable=False)
    # The marker on a plain function of a namespace: pluggy < 1.7 does not see it through a
    # staticmethod (the bench then timed the torch reference and never finished on pluggy 1.6).
    plugin = types.SimpleNamespace(kreg_implementations=hookimpl(lambda: [noop]))
    registry.register_plugin(plugin, "bench")
    try:
        q = torch.zeros(8, 6, 64)
        k = torch.zeros(16, 1, 64)
        idx = torch.zeros(8, 4, dtype=torch.int32)
        with registry.record() as launches:
            registry.dispatch("sparse_prefill", q, k, k, idx, kind="prefill")
        if launches[0].implementation != noop.name:
            raise SystemExit(f"the no-op implementation was not selected ({launches[0]}): "
                             "the dispatch row would time a real kernel")
        direct = noop.bind(None)
        res = interleaved({
            "dispatch": lambda: registry.dispatch("sparse_prefill", q, k, k, idx, kind="prefill"),
            "direct": lambda: direct(q, k, k, idx, kind="prefill"),
        }, n=50_000)
        # registry.record_outputs at its default rate: the observer path on every dispatch,
        # an output digest on every 16th (what agree(outputs=True) compares across ranks).
        with registry.record_outputs(["sparse_prefill"], every=16):
            rec = interleaved({"recorded": lambda: registry.dispatch(
                "sparse_prefill", q, k, k, idx, kind="prefill")}, n=20_000)
    finally:
        registry.unregister_plugin("bench")
    return res["dispatch"], res["direct"], rec["recorded"]


def bench_cold() -> float:
    reg = registry.get_registry()
    n_impls = sum(len(v) for v in reg.impls.values())

    def cold() -> None:
        reg._lru.cache_clear()
        reg._decisions.clear()
        reg.select("sparse_prefill", SEED, DEVICE)

    return per_call_ns(cold, n=2000, repeats=5), n_impls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fuzz", type=int, default=0, help="run the select fuzz with N examples")
    args = ap.parse_args()
    import torch

    # Rows print as they are measured, so a run cut short still says where it stopped.
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}", flush=True)
    print(f"{'measurement':<44} {'kreg':>10} {'baseline':>10} {'ratio/diff':>12}  target",
          flush=True)
    kreg_ns, lru_ns = bench_select()
    print(f"{'select, cache hit vs lru_cache selector':<44} {kreg_ns:>8.0f}ns {lru_ns:>8.0f}ns "
          f"{kreg_ns / lru_ns:>11.2f}x  <= 1.5x", flush=True)
    disp_ns, direct_ns, rec_ns = bench_dispatch()
    print(f"{'dispatch vs direct call (overhead)':<44} {disp_ns:>8.0f}ns {direct_ns:>8.0f}ns "
          f"{(disp_ns - direct_ns) / 1000:>10.2f}us  <= 2 us", flush=True)
    print(f"{'dispatch with record_outputs(every=16)':<44} {rec_ns:>8.0f}ns {disp_ns:>8.0f}ns "
          f"{(rec_ns - disp_ns) / 1000:>10.2f}us  (added per dispatch)", flush=True)
    cold_ns, n_impls = bench_cold()
    print(f"{'cold select over all impls (' + str(n_impls) + ' in-tree)':<44} "
          f"{cold_ns / 1000:>8.1f}us {'':>10} {'':>12}", flush=True)
    if args.fuzz:
        env = {**os.environ, "KREG_FUZZ_EXAMPLES": str(args.fuzz)}
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/unit/test_select_fuzz.py"], env=env, capture_output=True,
                              text=True)
        status = "passed" if proc.returncode == 0 else "FAILED"
        print(f"{'select fuzz (hypothesis) examples':<44} {args.fuzz:>10} {status:>10} "
              f"{time.perf_counter() - t0:>10.0f}s")
        if proc.returncode:
            print(proc.stdout[-3000:])
            sys.exit(1)


if __name__ == "__main__":
    main()
