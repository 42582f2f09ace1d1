"""GPU time per kernel of one indexer_topk call (torch.profiler), to split a total.

    python benchmarks/profile_indexer.py [--rows 1,64,1024,4096] [--keys 131072]
        [--config KEY=VAL:KEY=VAL]

Prints, per shape, each Triton kernel's mean device time per call over ``--iters`` calls (after
a warm-up), and their sum. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from backends.indexer_topk.bench import BenchCase, make_inputs, parse_geometry
from backends.indexer_topk.triton_kernels import indexer_topk_triton


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="1,64,1024,4096")
    ap.add_argument("--keys", type=int, default=131072)
    ap.add_argument("--config", default="")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    cfg = parse_geometry(args.config) if args.config else {}
    for rows in (int(r) for r in args.rows.split(",")):
        scores, lengths = make_inputs(BenchCase(rows=rows, keys=args.keys))
        for _ in range(3):
            indexer_topk_triton(scores, lengths, 2048, config=cfg)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                indexer_topk_triton(scores, lengths, 2048, config=cfg)
            torch.cuda.synchronize()
        per: dict[str, float] = collections.defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name] += ev.device_time / args.iters
        total = sum(per.values())
        parts = "  ".join(f"{name[:24]} {us:8.1f} us" for name, us in
                          sorted(per.items(), key=lambda kv: -kv[1]))
        print(f"{rows}x{args.keys} {args.config or 'default'}: {total:8.1f} us  ({parts})",
              flush=True)


if __name__ == "__main__":
    main()
