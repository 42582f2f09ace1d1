"""Probe: can another copy engine or a deeper pipeline gather faster than the cp.async floor?

Gather-only kernels over sparse_prefill's indices (prefill, 8192 rows, group 6, KV 32K and 8K),
next to the table geometry, the H200 family and `probe_gather_floor.py`'s kernel (`ldg`), in one
interleaved window (CUDA-graph replays):

* ``triton-tma``: plain Triton, one tensor-descriptor load (a TMA copy) of a [1, 1, head_dim] box
  per gathered K or V row, U rows unrolled a step, the loop pipelined over S stages;
* ``gluon-tma``: Gluon (Hopper), the same per-row TMA boxes issued by hand into a ring of NBUF
  stages of BN rows (mbarrier completion, NBUF - 1 stages in flight while one is read);
* ``gluon-cp``: Gluon, cp.async of BN x head_dim tiles into a ring of NBUF stages (NBUF - 1
  commit groups outstanding).

The consumers read every tile (from registers or shared memory) and sum it, so nothing is dead.

    python benchmarks/probes/probe_gluon_gather.py
"""
from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@triton.jit
def _gather_tma(KD, VD, IDX, LENS, OUT, topk, s_it, HEAD_DIM: tl.constexpr, U: tl.constexpr,
                STAGES: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(LENS + r), 0), topk)
    acc = tl.zeros([1, 1, HEAD_DIM], dtype=tl.float32)
    for start in tl.range(0, n // U * U, U, num_stages=STAGES):
        for u in tl.static_range(U):
            t = tl.maximum(tl.load(IDX + r * s_it + start + u), 0)
            acc += KD.load([t, 0, 0]).to(tl.float32) + VD.load([t, 0, 0]).to(tl.float32)
    offs = tl.arange(0, HEAD_DIM)
    tl.store(OUT + r * HEAD_DIM + offs, tl.reshape(acc, [HEAD_DIM]))


@gluon.jit
def _issue_tma(KD, VD, IDX_row, kbuf, vbuf, bars, tile, BN: gl.constexpr, D: gl.constexpr,
               NBUF: gl.constexpr):
    s = tile % NBUF
    bar = bars.index(s)
    mbarrier.expect(bar, 2 * BN * D * 2)
    kb = kbuf.index(s)
    vb = vbuf.index(s)
    for j in gl.static_range(BN):
        t = gl.maximum(gl.load(IDX_row + tile * BN + j), 0)
        tma.async_copy_global_to_shared(KD, [t, 0], bar, kb.slice(j, 1))
        tma.async_copy_global_to_shared(VD, [t, 0], bar, vb.slice(j, 1))


@gluon.jit
def _gather_tma_gl(KD, VD, IDX, LENS, OUT, topk, s_it, D: gl.constexpr, BN: gl.constexpr,
                   NBUF: gl.constexpr, num_warps: gl.constexpr):
    r = gl.program_id(0).to(gl.int64)
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    ntiles = n // BN
    kbuf = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, D], KD.layout)
    vbuf = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, D], VD.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NBUF):
        mbarrier.init(bars.index(i), count=1)
    IDX_row = IDX + r * s_it
    for i in gl.static_range(NBUF - 1):
        if i < ntiles:
            _issue_tma(KD, VD, IDX_row, kbuf, vbuf, bars, i, BN, D, NBUF)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    acc = gl.zeros([BN, D], gl.float32, layout)
    for t in range(ntiles):
        nxt = t + NBUF - 1
        if nxt < ntiles:
            _issue_tma(KD, VD, IDX_row, kbuf, vbuf, bars, nxt, BN, D, NBUF)
        s = t % NBUF
        mbarrier.wait(bars.index(s), (t // NBUF) & 1)
        acc += kbuf.index(s).load(layout).to(gl.float32) + vbuf.index(s).load(layout).to(
            gl.float32)
        gl.thread_barrier()
    offs = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    gl.store(OUT + r * D + offs, gl.sum(acc, 0))


@gluon.jit
def _issue_cp(K, V, IDX_row, kbuf, vbuf, tile, ntiles, offs_n, offs_d, s_kt, BN: gl.constexpr,
              D: gl.constexpr, NBUF: gl.constexpr):
    """cp.async of tile ``tile``'s K and V rows into ring stage ``tile % NBUF`` (nothing past
    the last tile), as one commit group."""
    ok = (offs_n < BN) & (tile < ntiles)
    t = gl.maximum(gl.load(IDX_row + tile * BN + offs_n, mask=ok, other=0), 0)
    off = t[:, None] * s_kt + offs_d[None, :]
    m = ok[:, None] & (offs_d < D)[None, :]
    cp.async_copy_global_to_shared(kbuf.index(tile % NBUF), K + off, mask=m)
    cp.async_copy_global_to_shared(vbuf.index(tile % NBUF), V + off, mask=m)
    cp.commit_group()


@gluon.jit
def _gather_cp_gl(K, V, IDX, LENS, OUT, topk, s_it, s_kt, D: gl.constexpr, BN: gl.constexpr,
                  NBUF: gl.constexpr, num_warps: gl.constexpr):
    r = gl.program_id(0).to(gl.int64)
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    ntiles = n // BN
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    kbuf = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, D], sl)
    vbuf = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, D], sl)
    IDX_row = IDX + r * s_it
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    for i in gl.static_range(NBUF - 1):
        _issue_cp(K, V, IDX_row, kbuf, vbuf, i, ntiles, offs_n, offs_d, s_kt, BN, D, NBUF)
    acc = gl.zeros([BN, D], gl.float32, layout)
    for t in range(ntiles):
        _issue_cp(K, V, IDX_row, kbuf, vbuf, t + NBUF - 1, ntiles, offs_n, offs_d, s_kt, BN, D,
                  NBUF)
        cp.wait_group(NBUF - 1)
        gl.thread_barrier()
        s = t % NBUF
        acc += kbuf.index(s).load(layout).to(gl.float32) + vbuf.index(s).load(layout).to(
            gl.float32)
        gl.thread_barrier()
    gl.store(OUT + r * D + offs_d, gl.sum(acc, 0))


_TRITON_TMA = ((1, 6, 1), (8, 3, 1), (8, 3, 2))                       # (U, stages, warps)
_GLUON_TMA = ((16, 2, 1), (16, 3, 1), (16, 4, 1), (8, 4, 1), (32, 3, 2), (16, 6, 1))
_GLUON_CP = ((8, 2, 1), (8, 3, 1), (16, 2, 1), (16, 3, 1), (16, 4, 1), (16, 2, 2), (32, 2, 2),
              (32, 3, 2), (32, 2, 4), (32, 4, 4))                        # (BN, NBUF, warps)


def providers(kv: int, g: int) -> dict[str, Any]:
    """The window of one case: name -> zero-argument launch."""
    import torch
    from probe_gather_floor import _gather_only
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.tools.tensor_descriptor import TensorDescriptor as TritonDescriptor

    from backends.sparse_prefill import triton_kernels as tk
    from backends.sparse_prefill.bench import BenchCase, make_inputs
    from plugins.generic import sparse_prefill_table_config
    from plugins.nvidia_hopper import H200_PREFILL_CONFIGS

    x = make_inputs(BenchCase(kind="prefill", group_size=g, kv_len=kv, total_q=8192))
    q, k, v, idx, kw = x["q"], x["k"], x["v"], x["indices"], x["kwargs"]
    rows, d, topk, s_it, lens = q.shape[0], k.shape[2], idx.shape[1], idx.stride(0), kw["lengths"]
    out = torch.empty((rows, d), device=q.device, dtype=torch.float32)
    lay = gl.NVMMASharedLayout(0, 16, rank=2)
    kd = TensorDescriptor.from_tensor(k[:, 0, :], [1, d], lay)
    vd = TensorDescriptor.from_tensor(v[:, 0, :], [1, d], lay)
    kd3 = TritonDescriptor(k, list(k.shape), list(k.stride()), [1, 1, d])
    vd3 = TritonDescriptor(v, list(v.shape), list(v.stride()), [1, 1, d])
    table = sparse_prefill_table_config(g, 8192)
    fam = H200_PREFILL_CONFIGS[("prefill", g)]
    fns: dict[str, Any] = {
        "table": lambda: tk.sparse_prefill_triton(q, k, v, idx, config=table, **kw),
        "family": lambda: tk.sparse_prefill_triton(q, k, v, idx, config=fam, **kw),
        "ldg 32x2w": lambda: _gather_only[(rows,)](k, v, idx, lens, out, k.shape[0], topk,
                                                   k.stride(0), s_it, HEAD_DIM=d, BLOCK_N=32,
                                                   num_warps=2)}
    for u, st, w in _TRITON_TMA:
        fns[f"triton-tma u{u} s{st} {w}w"] = partial(
            _gather_tma[(rows,)], kd3, vd3, idx, lens, out, topk, s_it, HEAD_DIM=d, U=u,
            STAGES=st, num_warps=w)
    for bn, nb, w in _GLUON_TMA:
        fns[f"gluon-tma bn{bn} nb{nb} {w}w"] = partial(
            _gather_tma_gl[(rows,)], kd, vd, idx, lens, out, topk, s_it, D=d, BN=bn, NBUF=nb,
            num_warps=w)
    for bn, nb, w in _GLUON_CP:
        fns[f"gluon-cp bn{bn} nb{nb} {w}w"] = partial(
            _gather_cp_gl[(rows,)], k, v, idx, lens, out, topk, s_it, k.stride(0), D=d, BN=bn,
            NBUF=nb, num_warps=w)
    return fns


def main() -> None:
    import torch

    from backends.sparse_prefill.bench import probe_header
    from registry.tuning.timing import interleaved_median_ms

    print(probe_header("graph replays, ms; gathered rows: 15.05 GB at KV 8K, 17.2 GB at 32K"))
    for kv in (32768, 8192):
        fns = {}
        for name, fn in providers(kv, 6).items():
            try:
                fn()
                torch.cuda.synchronize()
                fns[name] = fn
            except Exception as exc:  # a variant that does not build is reported
                print(f"  {name}: {type(exc).__name__}: {str(exc)[:300]}")
        res = interleaved_median_ms(fns, warmup=3, iters=15, graphs=True)
        byt = 15.05e9 if kv == 8192 else 17.2e9
        print(f"\nKV {kv}, group 6: table / 1.3 = {res['table'] / 1.3:.4f} ms")
        for name, ms in res.items():
            print(f"  {name:26s} {ms:8.4f} ms  {byt / ms / 1e9:5.2f} TB/s of gathered rows")


if __name__ == "__main__":
    main()
