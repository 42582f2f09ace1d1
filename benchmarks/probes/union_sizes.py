"""The union path's work by tile height (issue 26), on the CPU: for the bench's index sets,
the mean union of ``RP`` consecutive rows and the tensor-core work of the union tiles
(tiles x 128 query lines x union) against the per-row kernel's (valid entries x HP lines).

    python3 benchmarks/probes/union_sizes.py --indices topk,walk --rp 16,21,32

A tile of 128 lines holds ``128 // HP`` rows: 16 at HP 8 (group 6 rounded up to a power of
two, ``TILE_HEADS="pow2"``, the default) and 21 at HP 6 (the group itself, 126 of 128 lines
used: ``TILE_HEADS="group"``). The table says what a tile of exact heads saves in line-keys;
``benchmarks/probes/device_run.sh exact-heads`` times it.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    import torch
    from union_phases import case_args

    from backends.sparse_prefill.bench import BenchCase, make_inputs

    ap = argparse.ArgumentParser()
    case_args(ap)
    ap.add_argument("--indices", default="topk,walk")
    ap.add_argument("--rp", default="16,21,32", help="rows a tile, comma-separated")
    ap.add_argument("--lines", type=int, default=128, help="query lines a tile (BLOCK_M)")
    a = ap.parse_args()
    try:
        rps = [int(x) for x in a.rp.split(",")]
    except ValueError:
        ap.error(f"--rp {a.rp!r}: expected comma-separated whole numbers, e.g. 16,21,32")
    if min(rps) < 1 or a.lines < 1 or a.group_size < 1:
        ap.error("--rp, --lines and --group-size must be at least 1")
    kinds = a.indices.split(",")
    if not set(kinds) <= {"topk", "walk"}:
        ap.error(f"--indices {a.indices!r}: expected topk, walk or both (comma-separated)")
    hp_row = 1 << (a.group_size - 1).bit_length()   # the per-row kernel's lines a row
    print(f"| indices | rows a tile | tiles | mean union | union-tile line-keys (M) | "
          f"per-row line-keys (M, {hp_row} lines a row) |")
    print("|---|---:|---:|---:|---:|---:|")
    for ix in kinds:
        case = BenchCase(kind=a.kind, group_size=a.group_size, kv_len=a.kv_len,
                         total_q=a.total_q, indices=ix, dtype="float32", head_dim=16)
        inp = make_inputs(case, device="cpu")
        idx = inp["indices"].reshape(inp["indices"].shape[0], -1)
        lens = inp["kwargs"].get("lengths")
        rows = []
        for r in range(idx.shape[0]):
            row = idx[r, : int(lens[r])] if lens is not None else idx[r]
            rows.append(row[row >= 0])
        valid = sum(int(r.numel()) for r in rows)
        for rp in rps:
            unions = [torch.unique(torch.cat(rows[t:t + rp])).numel()
                      for t in range(0, len(rows), rp)]
            tot = sum(unions)
            print(f"| {ix} | {rp} | {len(unions)} | {tot / len(unions):.0f} | "
                  f"{a.lines * tot / 1e6:.1f} | {valid * hp_row / 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
