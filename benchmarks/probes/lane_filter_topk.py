"""Prototype for issue 25 (session 21, not a product path; never dispatched): exact top-k of the
rows a sampled threshold can take, with one pass over the scores that places candidates without
a scan across threads.

1. ``sample_k`` (grid rows): a threshold t a row from ``NS`` keys read as evenly spaced lines of
   32 (a fraction f of the row): the value with about 1.45 k f sampled keys above it, kept only
   when the row's count of keys >= t then lies in [k, CAP] by 4.5-5 standard deviations of the
   sampling (no threshold otherwise, or where a tie spans that window).
2. ``stream_k`` (grid rows x S): the row's 16-byte vectors dealt round-robin over (program s,
   lane v) pairs: round r's vector (r S + s) V + v goes to lane v of program s, so a crowded
   stretch of the row (a recent window, a ramp's top end) spreads over every lane. Each lane
   appends its keys >= t to its own ``LCAP`` slots (an in-thread prefix only: no barrier, no
   shuffle in the loop on sm_90) and writes its count.
3. ``select_k`` (grid rows): a row whose lanes hold at least k and at most CAP keys, none
   overflowing, has its top k among them (all keys >= t are there and k of them reach t), so
   it is exact whatever the sample said: the lanes' slots compacted in lane order, T = the k-th
   largest (a 5-way search: four probes counted in one packed reduction), the keys == T beyond
   need broken by a search over their positions, and the k positions sorted ascending
   (``tl.sort``; a bitmap of the row's positions read back in order compiled to twice the
   SASS with 384 barriers, so it went). ``done[row]`` says which rows it took; the product would
   send the others down the default path.

Measured (session 22, H200, docs/notes/indexer_topk.md v44): rejected, 2.3-3.3x the default
kernels on every distribution it takes (1024 random rows: sample 113.5 us, stream 391.4, select
533.5 against the default's 340 in all). Kept as the record of the design and its SASS counts.
CPU: ``tests/kernels/test_indexer_topk_lane_filter.py`` (interpreter). Commands:

    PYTHONPATH=/tmp/tri36:$PWD python3 benchmarks/probes/lane_filter_topk.py --xcompile 1024
    python3 benchmarks/probes/lane_filter_topk.py            # on a GPU: the A/B table
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())

from backends.indexer_topk.triton_kernels import _row_len, _to_key

OFF = tl.constexpr(2147483647)


@triton.jit
def _count4(x, p1, p2, p3, p4):
    """#(x >= p_i) for four probes, packed 16 bits apart in one int64 sum (x has < 65536
    entries)."""
    return tl.sum((x >= p1).to(tl.int64) + ((x >= p2).to(tl.int64) << 16)
                  + ((x >= p3).to(tl.int64) << 32) + ((x >= p4).to(tl.int64) << 48), axis=0)


@triton.jit
def _search5(x, k, lo, hi, cnt_lo, slack):
    """The largest t in [lo, hi] with #(x >= t) >= k (``slack`` 0), or the first such t found
    with at most k + slack values >= it: five-way, four probes a pass. Invariants: #(x >= lo)
    = cnt_lo >= k, #(x >= hi + 1) < k; lo, hi int64. Returns (t, #(x >= t))."""
    while (lo < hi) & (cnt_lo > k + slack):
        step = (hi - lo + 5) // 5
        p1 = tl.minimum(lo + step, hi + 1)
        p2 = tl.minimum(lo + 2 * step, hi + 1)
        p3 = tl.minimum(lo + 3 * step, hi + 1)
        p4 = tl.minimum(lo + 4 * step, hi + 1)
        tot = _count4(x, p1.to(tl.int32), p2.to(tl.int32), p3.to(tl.int32), p4.to(tl.int32))
        c1 = tot & 0xFFFF
        c2 = (tot >> 16) & 0xFFFF
        c3 = (tot >> 32) & 0xFFFF
        c4 = (tot >> 48) & 0xFFFF
        js = (c1 >= k).to(tl.int64) + (c2 >= k).to(tl.int64) + (c3 >= k).to(tl.int64) \
            + (c4 >= k).to(tl.int64)
        cnt_lo = tl.where(js == 0, cnt_lo, tl.where(js == 1, c1, tl.where(js == 2, c2, tl.where(
            js == 3, c3, c4))))
        lo = lo + js * step
        hi = tl.minimum(hi, lo + step - 1)
    return lo, cnt_lo


@triton.jit
def sample_k(scores_ptr, lengths_ptr, T, n_keys, stride_s, k, NS: tl.constexpr,
             CAP: tl.constexpr, JMIN: tl.constexpr):
    row = tl.program_id(0)
    length = _row_len(lengths_ptr, row, n_keys)
    t = tl.full([], OFF, tl.int32)
    if length > k:
        per: tl.constexpr = NS // 32
        nl = length // 32
        ss = tl.maximum((nl + per - 1) // per, 1)
        n_lines = (nl + ss - 1) // ss
        i = tl.arange(0, NS)
        line = i // 32
        m = line < n_lines
        pos = line * (ss * 32) + i % 32
        x = tl.load(scores_ptr + row.to(tl.int64) * stride_s + pos, mask=m, other=0.0)
        key = tl.where(m, _to_key(x.to(tl.float32)), -2147483648)
        n_s = n_lines * 32
        fs = n_s.to(tl.float32) / length.to(tl.float32)
        kf = k * fs
        cf = CAP * fs
        # sample counts j whose row count C (about j / f, sd sqrt(j) / f) is >= k and <= CAP
        # by 4.5 and 5 sd: j - 4.5 sqrt(j) >= k f, j + 5 sqrt(j) <= CAP f
        rlo = 2.25 + tl.sqrt(kf + 5.0625)
        j_min = tl.ceil(rlo * rlo).to(tl.int32)
        rhi = tl.sqrt(cf + 6.25) - 2.5
        j_max = tl.floor(rhi * rhi).to(tl.int32)
        j_t = tl.maximum(tl.ceil(1.45 * kf).to(tl.int32), j_min)
        if (j_t >= JMIN) & (j_t <= j_max) & (j_t <= n_s):
            hi = tl.max(key, axis=0).to(tl.int64)
            lo = tl.min(tl.where(m, key, 2147483647), axis=0).to(tl.int64)
            lb64, cnt = _search5(key, j_t, lo, hi, n_s.to(tl.int64),
                                 tl.maximum(j_max - j_t, 0).to(tl.int64))
            lb = lb64.to(tl.int32)
            if cnt <= j_max:
                t = lb
            elif tl.sum((key > lb).to(tl.int32), axis=0) >= j_min:
                t = lb + 1   # a tie at lb spans the window; the keys above it still fit
    tl.store(T + row, t)


@triton.jit
def stream_k(scores_ptr, lengths_ptr, T, FP, FK, FC, n_keys, stride_s, k, S: tl.constexpr,
             V: tl.constexpr, VEC: tl.constexpr, LCAP: tl.constexpr):
    """Program (row, s): round r reads vectors (r * S + s) * V + v, one a lane (a [V, VEC]
    tile, one vector a thread); each lane appends its keys >= t to its own LCAP slots."""
    row = tl.program_id(0)
    s = tl.program_id(1)
    length = _row_len(lengths_ptr, row, n_keys)
    t = tl.load(T + row)
    v = tl.arange(0, V)[:, None]
    c = tl.arange(0, VEC)[None, :]
    run = tl.zeros([V, 1], dtype=tl.int32)
    lane = (row * S + s) * V + v
    regp = FP + lane.to(tl.int64) * LCAP
    regk = FK + lane.to(tl.int64) * LCAP
    src = scores_ptr + row.to(tl.int64) * stride_s
    if (length > k) & (t != OFF):
        RK: tl.constexpr = S * V * VEC
        nr = tl.cdiv(length, RK)
        for r in range(0, nr):
            pos = ((r * S + s) * V + v) * VEC + c
            if (r + 1) * RK <= length:
                key = _to_key(tl.load(src + pos).to(tl.float32))
            else:
                m = pos < length
                x = tl.load(src + pos, mask=m, other=0.0).to(tl.float32)
                key = tl.where(m, _to_key(x), -2147483648)
            ci = (key >= t).to(tl.int32)
            dst = run + tl.cumsum(ci, axis=1) - ci
            wm = (ci != 0) & (dst < LCAP)
            tl.store(regp + dst, pos, mask=wm)
            tl.store(regk + dst, key, mask=wm)
            run += tl.sum(ci, axis=1, keep_dims=True)
    tl.store(FC + lane, run)


@triton.jit
def select_k(lengths_ptr, T, FP, FK, FC, OUT, DONE, n_keys, k, SV: tl.constexpr,
             LCAP: tl.constexpr, CAP: tl.constexpr, LCH: tl.constexpr):
    row = tl.program_id(0)
    length = _row_len(lengths_ptr, row, n_keys)
    t = tl.load(T + row)
    done = tl.full([], 0, tl.int32)
    if (length > k) & (t != OFF):
        fc = FC + row.to(tl.int64) * SV
        cnt = tl.load(fc + tl.arange(0, SV))
        total = tl.sum(cnt, axis=0)
        over = tl.max(cnt, axis=0) > LCAP
        if (over == 0) & (total >= k) & (total <= CAP):
            bp = FP + row.to(tl.int64) * (SV * LCAP)
            bk = FK + row.to(tl.int64) * (SV * LCAP)
            sl = tl.arange(0, LCAP)
            acc = tl.full([], 0, tl.int32)
            for l0 in range(0, SV, LCH):
                ln = l0 + tl.arange(0, LCH)
                c_l = tl.load(fc + ln)
                o_l = acc + tl.cumsum(c_l, axis=0) - c_l
                acc += tl.sum(c_l, axis=0)
                m2 = sl[None, :] < c_l[:, None]
                si = ln[:, None] * LCAP + sl[None, :]
                kk = tl.load(bk + si, mask=m2, other=0)
                pp = tl.load(bp + si, mask=m2, other=0)
                tl.debug_barrier()   # destinations lie at or below the sources: loads first
                di = o_l[:, None] + sl[None, :]
                tl.store(bk + di, kk, mask=m2)
                tl.store(bp + di, pp, mask=m2)
                tl.debug_barrier()
            o = tl.arange(0, CAP)
            mk = o < total
            keys = tl.load(bk + o, mask=mk, other=-2147483648)
            hi = tl.max(keys, axis=0).to(tl.int64)
            kt64, _ = _search5(keys, k, t.to(tl.int64), hi, total.to(tl.int64),
                               tl.full([], 0, tl.int64))
            kt = kt64.to(tl.int32)
            gt = keys > kt
            eq = keys == kt
            need = k - tl.sum(gt.to(tl.int32), axis=0)
            pos = tl.load(bp + o, mask=mk, other=2147483647)
            pcut = length
            if tl.sum(eq.to(tl.int32), axis=0) > need:
                # the need-th smallest position among the keys == T
                lo = tl.full([], 0, tl.int32)
                hi2 = length
                while lo < hi2:
                    mid = (lo + hi2) // 2
                    cm = tl.sum((eq & (pos <= mid)).to(tl.int32), axis=0)
                    lo = tl.where(cm >= need, lo, mid + 1)
                    hi2 = tl.where(cm >= need, mid, hi2)
                pcut = lo
            sel = gt | (eq & (pos <= pcut))
            srt = tl.sort(tl.where(sel, pos, 2147483647))
            tl.store(OUT + row.to(tl.int64) * k + o, srt, mask=o < k)
            done = tl.full([], 1, tl.int32)
    tl.store(DONE + row, done)


def lane_topk(scores, lengths, k, *, S=8, NW=4, LCAP=16, CAP=4096, NS=16384, SW=8, FW=8,
              LCH=256, JMIN=64, poison=None, only=None):
    """(out, done): ``out[row]`` the exact top-k positions (ascending) where ``done[row]``;
    other rows are left as allocated (``poison`` fills everything first). ``only`` (any value):
    return the three launches as closures over one set of buffers instead, for timing apart."""
    import torch

    rows, n = scores.shape
    dev = scores.device
    V = 32 * NW
    SV = S * V

    def e(shape):
        if poison is None:
            return torch.empty(shape, dtype=torch.int32, device=dev)
        return torch.full(shape, poison, dtype=torch.int32, device=dev)

    T, FC, done = e((rows,)), e((rows * SV,)), e((rows,))
    FP, FK = e((rows * SV * LCAP,)), e((rows * SV * LCAP,))
    out = e((rows, k))
    vec = 16 // scores.element_size()

    def sample():
        sample_k[(rows,)](scores, lengths, T, n, scores.stride(0), k, NS=NS, CAP=CAP,
                          JMIN=JMIN, num_warps=SW)

    def stream():
        stream_k[(rows, S)](scores, lengths, T, FP, FK, FC, n, scores.stride(0), k, S=S, V=V,
                            VEC=vec, LCAP=LCAP, num_warps=NW)

    def select():
        select_k[(rows,)](lengths, T, FP, FK, FC, out, done, n, k, SV=SV, LCAP=LCAP, CAP=CAP,
                          LCH=min(LCH, SV), num_warps=FW)

    phases = {"sample": sample, "stream": stream, "select": select}
    if only is not None:
        return phases
    for fn in phases.values():
        fn()
    return out, done


VARIANTS = {
    "lane": {},
    "lane,s16": {"S": 16},
    "lane,v64c32": {"NW": 2, "LCAP": 32},
    "lane,f4": {"FW": 4},
}


def _xcompile(rows: int) -> int:
    """Cross-compile every launch of each variant for sm_90 (no GPU): registers, spills and the
    SASS counts that matter here (barriers, shuffles, shared-memory traffic)."""
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from benchmarks.probes.xcompile_topk import Launch, _local_per_function, _usage, compile_launch

    for name, kw in VARIANTS.items():
        cap: list[Launch] = []
        saved = {}
        for fn in (sample_k, stream_k, select_k):
            def grab(*args, grid=None, warmup=False, _fn=fn, _cap=cap, **k2):
                _cap.append(Launch(_fn, args, k2))
            saved[fn] = fn.__dict__.get("run")
            fn.run = grab
        try:
            lane_topk(torch.zeros(rows, 131072), torch.full((rows,), 131072, dtype=torch.int32),
                      2048, **kw)
        finally:
            for fn, run in saved.items():
                if run is None:
                    del fn.run
                else:
                    fn.run = run
        for launch in cap:
            c = compile_launch(launch)
            path = f"/tmp/lane_sass/{name}/{launch.name}.sass"
            info = _local_per_function(c.asm["cubin"], path)
            with open(path) as f:
                txt = f.read()
            counts = " ".join(f"{op} {len(re.findall(pat, txt))}" for op, pat in (
                ("BAR", r"\bBAR\b"), ("SHFL", r"\bSHFL"), ("STS", r"\bSTS"), ("LDS", r"\bLDS")))
            print(f"{name:12s} {launch.name:9s} {_usage(c.asm['cubin'])} {info} {counts}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--xcompile", type=int, default=0, help="rows: cross-compile only")
    ap.add_argument("--rows", default="64,1024,4096")
    ap.add_argument("--dists", default="randn,recent,ramp,relu,quant256,fp8,lowbits,ties")
    a = ap.parse_args()
    if a.xcompile:
        return _xcompile(a.xcompile)
    import torch

    from backends.indexer_topk import triton_kernels as tk
    from backends.indexer_topk.distributions import make_scores
    from backends.indexer_topk.reference import indexer_topk_reference
    from registry.tuning import interleaved_median_ms

    k, rows_list = 2048, [int(r) for r in a.rows.split(",")]
    lines = []
    for dist in a.dists.split(","):
        full = make_scores(dist, max(rows_list), 131072, seed=1).cuda()
        for rows in (rows_list if dist == "randn" else [1024]):
            s = full[:rows].contiguous()
            lens = torch.full((rows,), 131072, dtype=torch.int32, device="cuda")
            nchk = min(rows, 256)
            want = indexer_topk_reference(s[:nchk], lens[:nchk], k)
            fns = {"default": lambda s=s, lens=lens: tk.indexer_topk_triton(s, lens, k,
                                                                              config={})}
            notes = []
            for name, kw in VARIANTS.items():
                got, done = lane_topk(s, lens, k, poison=2147483647, **kw)
                d = done[:nchk].bool()
                bad = int((got[:nchk][d] != want[d]).any(1).sum())
                notes.append(f"{name}: {int(done.sum())}/{rows} taken, {bad} wrong")
                if not bad:
                    fns[name] = lambda s=s, lens=lens, kw=kw: lane_topk(s, lens, k, **kw)
            if dist in ("randn", "ties") and rows == 1024:
                ph = lane_topk(s, lens, k, only=True)
                for fn in ph.values():
                    fn()
                fns.update({f"lane.{n}": fn for n, fn in ph.items()})
            ms = interleaved_median_ms(fns, warmup=3, iters=20, graphs=True)
            line = f"{dist:9s} {rows:5d} " + "  ".join(
                f"{n} {1000 * v:7.1f} us ({v / ms['default']:.3f}x)" for n, v in ms.items())
            print(line, "|", "; ".join(notes), flush=True)
            lines.append(line)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
