"""Probe: the register-tile k-th search of indexer_topk's selection, halving against radix steps.

    python3 benchmarks/probes/search_tile_probe.py [--rows 64,1056] [--cap 4096,8192]
        [--warps 8,4] [--reps 16] [--n 2800]

Each program holds a tile of ``CAP`` int32 order keys (``n`` candidates of a N(0,1) row's
upper tail, the rest INT32_MIN, as the selection's register tile holds them) and finds the
largest t with #(x >= t) >= k (k = 2048) ``reps`` times (k alternating by one so that no pass
can be hoisted). Variants (every one checked equal to the halving search's t on every row):

* ``halve``: the halving search ``_kth_search_tile`` was until session 25 (one probe a step,
  one tl.sum, int64 state); ``halve32`` the same with int32 state;
* ``hist16`` / ``hist32``: NB buckets of ``(x - lo) >> s`` a step, counted by tl.histogram
  (the tie tier's ``_bucket_shift`` / ``_pick_bucket``);
* ``pack8``: 8 buckets a step, their counts in 16-bit fields of two int64 sums;
* ``interp``: ``_kth_search_tile`` as shipped since session 25 (two probes a step aimed by
  interpolation, see its docstring).

Prints one line per (variant, rows, cap, warps): us a launch (CUDA-graph replays in one
interleaved window) and per search. Needs a CUDA GPU; ``TRITON_INTERPRET=1 ... --interpret``
checks that the variants agree, on a CPU.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import triton
import triton.language as tl

from backends.indexer_topk.triton_kernels import _bucket_shift, _kth_search_tile, _pick_bucket


@triton.jit
def _search_halve(x, k, lo, hi):
    """The halving search ``_kth_search_tile`` was until session 25 (int64 state)."""
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        c = tl.sum((x >= mid.to(tl.int32)).to(tl.int32), axis=0)
        ge = c >= k
        lo = tl.where(ge, mid, lo)
        hi = tl.where(ge, hi, mid - 1)
    return lo


@triton.jit
def _search_hist(x, k, lo, hi, NB: tl.constexpr):
    above = tl.sum((x.to(tl.int64) > hi).to(tl.int32), axis=0)
    while lo < hi:
        s, smask = _bucket_shift(lo, hi, NB)
        inr = (x.to(tl.int64) >= lo) & (x.to(tl.int64) <= hi)
        b = tl.where(inr, ((x - lo.to(tl.int32)) >> s) & smask, 0)
        h = tl.histogram(b, NB, mask=inr)
        lo, hi, _, above = _pick_bucket(h, lo, s, hi, above, k, NB)
    return lo


@triton.jit
def _search_pack8(x, k, lo, hi):
    # 8 buckets of (x - lo) >> s; bucket j's count in bits 16*(j & 3) of word j >> 2
    above = tl.sum((x.to(tl.int64) > hi).to(tl.int32), axis=0).to(tl.int64)
    while lo < hi:
        s, smask = _bucket_shift(lo, hi, 8)
        inr = (x.to(tl.int64) >= lo) & (x.to(tl.int64) <= hi)
        b = (((x - lo.to(tl.int32)) >> s) & smask).to(tl.int64)
        one = tl.where(inr, tl.full([], 1, tl.int64) << ((b & 3) * 16), 0)
        w0 = tl.sum(tl.where(b < 4, one, 0), axis=0)
        w1 = tl.sum(tl.where(b >= 4, one, 0), axis=0)
        # keys >= bucket j's first value, j = 7 .. 0; take the largest j with >= k
        ge = above
        j = tl.full([], 0, tl.int64)
        found = tl.full([], 0, tl.int32)
        n_ge = above
        n_above = above
        for jj in tl.static_range(7, -1, -1):
            h = ((w1 >> (16 * (jj - 4))) if jj >= 4 else (w0 >> (16 * jj))) & 0xFFFF
            ge_new = ge + h
            take = (found == 0) & (ge_new >= k)
            j = tl.where(take, jj, j)
            n_ge = tl.where(take, ge_new, n_ge)
            n_above = tl.where(take, ge, n_above)
            found = tl.where(take, 1, found)
            ge = ge_new
        lo = lo + (j << s.to(tl.int64))
        hi = tl.minimum(hi, lo + (tl.full([], 1, tl.int64) << s.to(tl.int64)) - 1)
        above = n_above
    return lo


@triton.jit
def _search_halve32(x, k, lo, hi):
    """:func:`_kth_search_tile` with int32 state (the bracket's width as uint32)."""
    lo = lo.to(tl.int32)
    hi = hi.to(tl.int32)
    while lo < hi:
        mid = hi - ((hi - lo).to(tl.uint32) >> 1).to(tl.int32)
        ge = tl.sum((x >= mid).to(tl.int32), axis=0) >= k
        lo = tl.where(ge, mid, lo)
        hi = tl.where(ge, hi, mid - 1)
    return lo


@triton.jit
def _probe_kernel(xp, lop, outp, k, REPS: tl.constexpr, CAP: tl.constexpr, V: tl.constexpr):
    row = tl.program_id(0)
    o = tl.arange(0, CAP)
    x = tl.load(xp + row.to(tl.int64) * CAP + o)
    lo0 = tl.load(lop + row).to(tl.int64)
    hi0 = tl.max(x, axis=0).to(tl.int64)
    t = lo0
    cge0 = tl.sum((x >= tl.maximum(lo0, -2147483647).to(tl.int32)).to(tl.int32), axis=0)
    for r in range(REPS):
        kr = k - (r % 2)
        if V == 0:
            t = _search_halve(x, kr, lo0, hi0)
        elif V == 2:
            t = _search_hist(x, kr, lo0, hi0, 16)
        elif V == 3:
            t = _search_hist(x, kr, lo0, hi0, 32)
        elif V == 4:
            t = _search_pack8(x, kr, lo0, hi0)
        elif V == 5:
            t = _search_halve32(x, kr, lo0, hi0).to(tl.int64)
        else:
            t = _kth_search_tile(x, kr, lo0, hi0, cge0, 0).to(tl.int64)
    tl.store(outp + row, t.to(tl.int32))


VARIANTS = {"halve": 0, "hist16": 2, "hist32": 3, "pack8": 4, "halve32": 5,
            "interp": 6}


def make_tiles(rows: int, cap: int, n: int, device: str, dist: str = "randn"):
    import torch

    from backends.indexer_topk.distributions import make_scores
    from backends.indexer_topk.reference import score_keys
    g = torch.Generator(device="cpu").manual_seed(0)
    s = make_scores(dist, rows, 131072)
    top = torch.topk(s, n, dim=1).values
    keys = score_keys(top).to(torch.int32)
    perm = torch.argsort(torch.rand(rows, n, generator=g), dim=1)
    keys = torch.gather(keys, 1, perm)
    tile = torch.full((rows, cap), -2**31, dtype=torch.int32)
    tile[:, :n] = keys
    lo = keys.min(dim=1).values
    return tile.to(device), lo.to(device)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="64,1056")
    ap.add_argument("--cap", default="4096,8192")
    ap.add_argument("--warps", default="8,4")
    ap.add_argument("--reps", type=int, default=16)
    ap.add_argument("--n", type=int, default=2800)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--dists", default="randn")
    ap.add_argument("--interpret", action="store_true")
    args = ap.parse_args()
    import torch
    dev = "cpu" if args.interpret else "cuda"
    k = 2048
    names = args.variants.split(",")
    for dist, rows, cap in ((d, int(r), int(c)) for d in args.dists.split(",")
                            for r in args.rows.split(",") for c in args.cap.split(",")):
        if True:
            n = min(args.n, cap)
            tile, lo = make_tiles(rows, cap, n, dev, dist)
            want = torch.sort(tile.long(), dim=1, descending=True).values[:, k - 1].int()
            for nw in (int(w) for w in args.warps.split(",")):
                outs = {v: torch.empty(rows, dtype=torch.int32, device=dev) for v in names}

                def fn(v: str, reps: int = args.reps, rows: int = rows, tile: Any = tile,
                       lo: Any = lo, outs: Any = outs, cap: int = cap, nw: int = nw) -> None:
                    _probe_kernel[(rows,)](tile, lo, outs[v], k, REPS=reps, CAP=cap,
                                           V=VARIANTS[v], num_warps=nw)
                bad = []
                for v in names:
                    fn(v, 1)
                    if not torch.equal(outs[v].cpu(), want.cpu()):
                        bad.append(v)
                if bad:
                    print(f"MISMATCH {dist} rows {rows} cap {cap} warps {nw}: {bad}", flush=True)
                if args.interpret:
                    print(f"{dist} rows {rows} cap {cap} warps {nw}: checked {names}", flush=True)
                    continue
                from registry.tuning import interleaved_median_ms
                ms = interleaved_median_ms({v: (lambda v=v: fn(v)) for v in names}, graphs=True,
                                           iters=30)
                base = ms[names[0]]
                print(f"{dist:8s} rows {rows:5d} cap {cap:5d} warps {nw}: " + "  ".join(
                    f"{v} {ms[v] * 1e3:7.1f} us ({ms[v] * 1e3 / args.reps:5.2f}/search, "
                    f"{ms[v] / base:4.2f}x)" for v in names), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
