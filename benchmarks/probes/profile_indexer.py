"""GPU time per kernel of one indexer_topk call (torch.profiler), to split a total.

    python benchmarks/probes/profile_indexer.py [--rows 1,64,1024,4096] [--keys 131072]
        [--config KEY=VAL:KEY=VAL] [--ragged] [--phases] [--dist randn,recent,...]

Prints, per shape, each Triton kernel's mean device time per call over ``--iters`` calls (after
a warm-up), and their sum. ``--phases`` (fused path) also times the row kernel stopped after its
bound, its compaction and its gather, and prints each phase's share as the differences (the
outputs of those runs are not the top-k). ``--dist``: the score distributions
(``backends/indexer_topk/distributions.py``) to profile, each at every row count. Needs a
CUDA GPU. For hardware counters on the lent H200: ``ncu --clock-control none -k
regex:_row_kernel --set full python benchmarks/probes/profile_indexer.py --rows 1024 --iters
1``.
"""

from __future__ import annotations

import argparse
import collections
import itertools

import torch
from torch.profiler import ProfilerActivity, profile

from backends.indexer_topk.bench import BenchCase, make_inputs, parse_geometry
from backends.indexer_topk.triton_kernels import _indexer_topk_stopped, indexer_topk_triton


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="1,64,1024,4096")
    ap.add_argument("--keys", type=int, default=131072)
    ap.add_argument("--config", default="")
    ap.add_argument("--ragged", action="store_true",
                    help="causal batch: row r has (r + 1) * keys / rows valid keys")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dist", default="randn",
                    help="comma-separated score distributions (distributions.DISTRIBUTIONS)")
    ap.add_argument("--phases", action="store_true",
                    help="time the fused row kernel phase by phase (differences of stopped runs)")
    args = ap.parse_args()
    cfg = parse_geometry(args.config) if args.config else {}
    for dist, rows in itertools.product(args.dist.split(","),
                                        (int(r) for r in args.rows.split(","))):
        scores, lengths = make_inputs(BenchCase(rows=rows, keys=args.keys, ragged=args.ragged,
                                                dist=dist))
        per = _kernel_us(scores, lengths, cfg, args.iters)
        total = sum(per.values())
        parts = "  ".join(f"{name[:24]} {us:8.1f} us" for name, us in
                          sorted(per.items(), key=lambda kv: -kv[1]))
        shape = f"{rows}x{args.keys} {dist}{' causal' if args.ragged else ''}"
        print(f"{shape} {args.config or 'default'}: {total:8.1f} us  ({parts})",
              flush=True)
        if args.phases:
            fused = {**cfg, "FUSED": 1}
            ends = [_kernel_us(scores, lengths, fused, args.iters, stop).get("_row_kernel", 0.0)
                    for stop in (1, 2, 3, 0)]
            names = ("bound", "compaction", "gather", "selection")
            shares = [ends[0]] + [b - a for a, b in itertools.pairwise(ends)]
            print("  row kernel by phase: " + "  ".join(
                f"{n} {us:7.1f} us" for n, us in zip(names, shares, strict=True)), flush=True)


def _kernel_us(scores: torch.Tensor, lengths: torch.Tensor, cfg: dict[str, int], iters: int,
               stop: int = 0) -> dict[str, float]:
    """Mean device microseconds per call of each kernel of one indexer_topk call (``stop``:
    the fused row program ended after that phase, through the probes' private entry point)."""
    def call() -> None:
        if stop:
            _indexer_topk_stopped(scores, lengths, 2048, config=cfg, stop=stop)
        else:
            indexer_topk_triton(scores, lengths, 2048, config=cfg)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    per: dict[str, float] = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name] += ev.device_time / iters
    return dict(per)


if __name__ == "__main__":
    main()
