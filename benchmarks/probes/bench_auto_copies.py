"""Is a regret point's gap dispatch cost or window noise? Times ``auto`` against the config it
picks under three labels (the same kernel three times), in several windows.

    python benchmarks/probes/bench_auto_copies.py sparse_prefill --grid kind=chunk \\
        --grid group_size=12 --grid kv_len=32768 --grid total_q=32 [--windows 3]

Prints per window the GPU microseconds (CUDA-graph replays) of ``A``, ``B``, ``C`` (the picked
config) and ``auto`` (``registry.dispatch``). Needs a GPU for meaningful numbers.
"""

from __future__ import annotations

import argparse

import registry
from registry.tuning.tune import load_tuner, measure_point


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op")
    ap.add_argument("--grid", action="append", default=[], metavar="AXIS=V1,V2")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=15)
    args = ap.parse_args()
    grid = {g.split("=", 1)[0]: g.split("=", 1)[1].split(",") for g in args.grid}
    tuner = load_tuner(args.op)
    for case in tuner.cases(grid):
        measure_point(args.op, case, {}, warmup=0, iters=1, include_auto=True)  # auto's pick
        dec = next(d for k, d in registry.get_registry().last_decisions.items()
                   if k[0] == args.op)
        cfg = dict(dec.config or {})
        for w in range(args.windows):
            res = measure_point(args.op, case, {"A": cfg, "B": dict(cfg), "C": dict(cfg)},
                                warmup=args.warmup, iters=args.iters, include_auto=True)
            us = {lab: round(r.ms * 1000, 1) for lab, r in res.items() if r.ms}
            print(f"{tuner.label(case)}  window {w}  {dec.implementation}  {us}", flush=True)


if __name__ == "__main__":
    main()
