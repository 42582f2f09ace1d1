"""A row-at-a-time NumPy model of the streaming kernel's algorithm (``cuda/stream_topk.cu``):
the sample's window and bisection, the stream's buffer (above t) and ties (equal to t), the
retries on a missed sample (the second one by radix counts), the selection and the tie cut,
with the kernel's constants (``backends/indexer_topk/stream.py``). It checks the algorithm, not
the CUDA (tests/kernels/test_indexer_topk_stream_emu.py runs the CUDA source on the CPU): any
distribution's exactness and how many extra reads its rows would cost, before a GPU runs it.

    python3 benchmarks/probes/stream_model.py [--dists randn,ties,...] [--rows 8] [--keys 131072]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backends.indexer_topk import stream

CAP = 2 * stream.MAX_K


def order_keys(x: np.ndarray) -> np.ndarray:
    """The kernel's unsigned fp32 order keys (topk_keys.cuh): NaN 1, -0 = +0."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    b[b == 0x80000000] = 0
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    key = np.where(b & 0x80000000, b ^ 0x7FFFFFFF, b)
    return np.where(nan, 1, key ^ 0x80000000)


def key_float(u: int) -> np.float32:
    """The float of an fp32 order key (the kernel's ``Floats<float>::of_key``)."""
    bits = (u ^ 0x80000000) if u >= 0x80000000 else (~u & 0xFFFFFFFF)
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def above_equal(x: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """The stream's compares (STREAM_LOOP 1) against a real key t: in floats, NaN's key t = 1
    taking every number as above and NaN as equal."""
    x = np.asarray(x, dtype=np.float32)
    if t == 1:
        return ~np.isnan(x), np.isnan(x)
    ft = key_float(t)
    with np.errstate(invalid="ignore"):
        return x > ft, x == ft


def bisect(vals: np.ndarray, lo: int, need: int, stop: int) -> tuple[int, bool]:
    """The kernel's ``bisect``: the largest c with ``need`` values >= c, stopping early at a
    count in [need, stop] and then snapping up to the least value >= c; (c, stopped early)."""
    vals = vals[vals != 0]
    hi = int(vals.max()) if vals.size else 0
    if hi <= lo:
        return hi, False
    top = (lo ^ hi).bit_length() - 1
    c0 = lo & ~((2 << top) - 1) & 0xFFFFFFFF
    for b in range(top, -1, -1):
        c = c0 | (1 << b)
        got = int((vals >= c).sum())
        if got >= need:
            c0 = c
            if got <= stop:
                return int(vals[vals >= c0].min()), True
    return c0, False


RADIX_READS = 3   # radix_kth's reads of a row of 32-bit keys (digits of 11, 11 and 10 bits)


def row_topk(x: np.ndarray, k: int) -> tuple[list[int], int]:
    """One row's selected positions (ascending, -1 padded) and its extra reads."""
    n = len(x)
    if n <= k:
        return list(range(n)) + [-1] * (k - n), 0
    u = order_keys(x)
    if n <= stream.SAMPLE:
        sample, r_lo, r_hi = u, k, k
    else:
        sample = u[stream.sample_positions(n)]
        f = stream.SAMPLE / n
        a, b = k * f, CAP * f
        lo, hi = math.ceil(a + 4 * math.sqrt(a)), math.floor(b - 4 * math.sqrt(b))
        if lo > hi:
            lo = hi = max(1, math.floor(0.5 * (a + b)))
        r_lo, r_hi = max(lo, 1), max(hi, 1)
    t = max(bisect(sample, 1, r_lo, r_hi)[0], 1)
    reads = overflows = 0
    while True:
        reads += 1
        above, equal = above_equal(x, t)
        assert (above == (u > t)).all() and (equal == (u == t)).all(), t   # the float rule
        gt, eq = np.nonzero(above)[0], np.nonzero(equal)[0]
        if len(gt) > CAP:
            if t == 1 or (overflows := overflows + 1) > 1:
                # radix_kth: the exact k-th key, in RADIX_READS counting reads
                reads += RADIX_READS
                t = int(np.sort(u[gt])[-k])
                continue
            # the kernel keeps the first CAP appended: the warps' appends run in position
            # order step by step, so model it as the first CAP by position (the prefix a row
            # whose keys above t rise with position biases)
            t = bisect(u[gt[:CAP]], t + 1, k, k)[0]
            continue
        if len(gt) + len(eq) < k:
            t = 1
            continue
        break
    chosen = np.zeros(n, dtype=bool)
    kth, need = t, k - len(gt)
    if len(gt) >= k:
        kth, early = bisect(u[gt], t + 1, k, k)
        need = 0 if early else k - int((u[gt] > kth).sum())
        ties = gt[u[gt] == kth] if need else gt[:0]
        if early:
            kth -= 1
    else:
        ties = eq
    chosen[np.sort(ties)[:need]] = True
    chosen[gt[u[gt] > kth]] = True
    return np.nonzero(chosen)[0].tolist(), reads - 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dists", default="randn,ties,zeros,recent,lowbits,relu,relu10,quant256,"
                                       "fp8,ramp")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--keys", type=int, default=131072)
    ap.add_argument("--k", type=int, default=2048)
    a = ap.parse_args()
    import torch

    from backends.indexer_topk.distributions import make_scores
    from backends.indexer_topk.reference import indexer_topk_reference

    bad = 0
    print("| dist | rows exact | extra reads |\n|---|---:|---:|")
    for name in a.dists.split(","):
        s = make_scores(name, a.rows, a.keys, seed=1)
        want = indexer_topk_reference(s, torch.full((a.rows,), a.keys, dtype=torch.int32), a.k)
        exact = reads = 0
        for r in range(a.rows):
            got, extra = row_topk(s[r].float().numpy(), a.k)
            exact += got == want[r].tolist()
            reads += extra
        bad += a.rows - exact
        print(f"| {name} | {exact} / {a.rows} | {reads} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
