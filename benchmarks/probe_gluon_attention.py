"""Probe: hand-written Gluon (Hopper) sparse_prefill kernels for prefill rows (prototypes).

One program a query row and KV head; the group's heads tile BM padded lines; K/V rows gathered
by cp.async into shared memory; every variant masks invalid, negative and out-of-range entries
and entries past ``lengths`` (zero-filled copies, -inf scores). Variant families
(``--variants``):

* ``plain`` (``_attn_gl``): S = Q K^T and O += P V on ``mma_v2``, warps split S's keys and O's
  head_dim; Q from registers or shared memory.
* ``T`` (``_attn_gl_t``): the transposed products S^T = K Q^T, O^T = V^T P^T (the lines on the
  MMA's n side); WN warps split the lines, the others head_dim. WN = 1 with 16 keys and 2 warps
  is the product kernel, ``backends/sparse_prefill/gluon_kernels.py`` (ENGINE="gluon").
* ``WS`` (``_attn_ws``): warp-specialized, a cp.async producer warp filling an mbarrier ring.
* ``WG`` (``_attn_wg``): the transposed products on wgmma, one warpgroup, 64-key tiles.
* ``WG1`` (``_attn_wg1``): ``WG`` with one K/V buffer (V gathered into the buffer K left) and
  chunked gathers; prepared, not yet run on a GPU.
* ``SD`` (``_attn_sd``): split head_dim with a cross-warp sum of S^T (batched ``mma_v2``).

Each checked against the fp32 reference and timed next to the table geometry and the Triton
family (CUDA-graph replays, one window per case). Results: docs/BENCHMARKS.md, "Session 11".

    python benchmarks/probe_gluon_attention.py [--kv 32768,8192] [--groups 6,12]
        [--variants plain,T,WS,WG,WG1,SD]
"""
from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
)

from backends.sparse_prefill.gluon_kernels import _softmax_step_t, _store_t


@gluon.jit
def _tile_idx(IDX_row, tile, n, offs_n, BN: gl.constexpr):
    """Tile ``tile``'s index entries (-1 past ``n``) and their positions."""
    j = tile * BN + offs_n
    return gl.load(IDX_row + j, mask=j < n, other=-1), j


@gluon.jit
def _issue(K_h, V_h, kbuf, vbuf, t, j, tile, n, num_slots, s_kt, s_vt, offs_d, D: gl.constexpr,
           OFFS32: gl.constexpr, NST: gl.constexpr, LEAN: gl.constexpr):
    """cp.async of the K and V rows of entries ``t`` into ring stage ``tile % NST`` (V
    zero-filled where invalid; K too unless LEAN, which reads row 0 there: its scores are
    masked anyway), one commit group; returns which entries are valid."""
    ok = (t >= 0) & (t < num_slots) & (j < n)
    # OFFS32: the caller proved (num_slots - 1) * stride + D < 2**31
    row = gl.where(ok, t, 0) if OFFS32 else gl.where(ok, t, 0).to(gl.int64)
    m = ok[:, None] & (offs_d < D)[None, :]
    if LEAN:
        cp.async_copy_global_to_shared(kbuf.index(tile % NST), K_h + (row * s_kt)[:, None]
                                       + offs_d[None, :])
    else:
        cp.async_copy_global_to_shared(kbuf.index(tile % NST), K_h + (row * s_kt)[:, None]
                                       + offs_d[None, :], mask=m)
    cp.async_copy_global_to_shared(vbuf.index(tile % NST), V_h + (row * s_vt)[:, None]
                                   + offs_d[None, :], mask=m)
    cp.commit_group()
    return ok


@gluon.jit
def _row_start(Q, K, V, IDX, LENS, r, h, group, num_slots, topk, s_qt, s_qh, s_kt, s_kh, s_vt,
               s_vh, s_it, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
               OFFS32: gl.constexpr, NST: gl.constexpr, LEAN: gl.constexpr,
               num_warps: gl.constexpr):
    """A program's row: allocates the NST-stage K/V ring, finds its entry count, index row and
    K/V head bases, issues tile 0 (``ok``: which of its entries are valid) and loads the
    group's Q lines ([BM, D], zero past the group) in the gather layout ``ld``."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    sw: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    kbuf = gl.allocate_shared_memory(gl.bfloat16, [NST, BN, D], sw)
    vbuf = gl.allocate_shared_memory(gl.bfloat16, [NST, BN, D], sw)
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    IDX_row = IDX + r * s_it
    K_h = K + h.to(gl.int64) * s_kh
    V_h = V + h.to(gl.int64) * s_vh
    t0, j0 = _tile_idx(IDX_row, 0, n, offs_n, BN)
    ok = _issue(K_h, V_h, kbuf, vbuf, t0, j0, 0, n, num_slots, s_kt, s_vt, offs_d, D, OFFS32,
                NST, LEAN)
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
    q = gl.load(Q + r * s_qt + (h * group + offs_m)[:, None] * s_qh + offs_d[None, :],
                mask=(offs_m < group)[:, None] & (offs_d < D)[None, :], other=0.0)
    return kbuf, vbuf, offs_n, offs_d, n, IDX_row, K_h, V_h, ok, q


@gluon.jit
def _attn_gl(Q, K, V, IDX, LENS, OUT, qk_scale, num_slots, topk, group, s_qt, s_qh, s_kt, s_kh,
             s_vt, s_vh, s_it, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
             Q_REGS: gl.constexpr, OFFS32: gl.constexpr, NST: gl.constexpr,
             LEAN: gl.constexpr, PF: gl.constexpr, num_warps: gl.constexpr):
    """Q_REGS: Q held as the A operand in registers (else read from shared memory each tile).
    NST=2: each iteration waits for its tile, then issues the next one into the other stage (one
    barrier a tile: every thread has finished reading that stage in the previous iteration).
    NST=1: one stage (half the shared memory, so more programs an SM); the next tile is issued
    after this one's products, behind a second barrier; PF: its index entries are loaded
    before this tile's products, so the issue does not wait on them."""
    r = gl.program_id(0).to(gl.int64)
    h = gl.program_id(1)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps],
                                                  instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    b_op: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    kbuf, vbuf, offs_n, offs_d, n, IDX_row, K_h, V_h, ok, q = _row_start(
        Q, K, V, IDX, LENS, r, h, group, num_slots, topk, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh,
        s_it, D, BM, BN, OFFS32, NST, LEAN, num_warps)
    ntiles = gl.cdiv(n, BN)
    if Q_REGS:
        q_a = gl.convert_layout(q, a_op)
    else:
        qsm = gl.allocate_shared_memory(gl.bfloat16, [BM, D],
                                        gl.SwizzledSharedLayout(8, 1, 8, [1, 0]), q)
    acc = gl.zeros([BM, D], gl.float32, mma)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, mma))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, mma))
    for tile in range(ntiles):
        if PF:
            t_n, j_n = _tile_idx(IDX_row, tile + 1, n, offs_n, BN)
        okc = gl.convert_layout(ok, gl.SliceLayout(0, mma))
        cp.wait_group(0)
        gl.thread_barrier()
        if NST == 2:
            t_n, j_n = _tile_idx(IDX_row, tile + 1, n, offs_n, BN)
            ok = _issue(K_h, V_h, kbuf, vbuf, t_n, j_n, tile + 1, n, num_slots, s_kt, s_vt,
                        offs_d, D, OFFS32, NST, LEAN)
        st = tile % NST
        kt = kbuf.index(st).permute([1, 0]).load(b_op)
        if Q_REGS:
            s = mma_v2(q_a, kt, gl.zeros([BM, BN], gl.float32, mma))
        else:
            s = mma_v2(qsm.load(a_op), kt, gl.zeros([BM, BN], gl.float32, mma))
        s = gl.where(okc[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        pa = gl.convert_layout(p.to(gl.bfloat16), a_op)
        acc = mma_v2(pa, vbuf.index(st).load(b_op), acc * alpha[:, None])
        if NST == 1:
            if not PF:
                t_n, j_n = _tile_idx(IDX_row, tile + 1, n, offs_n, BN)
            gl.thread_barrier()
            ok = _issue(K_h, V_h, kbuf, vbuf, t_n, j_n, tile + 1, n, num_slots, s_kt, s_vt,
                        offs_d, D, OFFS32, NST, LEAN)
    cp.wait_group(0)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    om = gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
    od = gl.arange(0, D, layout=gl.SliceLayout(0, mma))
    optr = OUT + r * s_ot + (h * group + om)[:, None] * s_oh + od[None, :]
    gl.store(optr, o.to(gl.bfloat16), mask=(om < group)[:, None] & (od < D)[None, :])


@gluon.jit
def _attn_gl_t(Q, K, V, IDX, LENS, OUT, qk_scale, num_slots, topk, group, s_qt, s_qh, s_kt,
               s_kh, s_vt, s_vh, s_it, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr,
               BN: gl.constexpr, OFFS32: gl.constexpr, NST: gl.constexpr, WN: gl.constexpr,
               num_warps: gl.constexpr):
    """The transposed products: S^T = K Q^T and O^T = V^T P^T, so the lines sit on the MMA's
    n side (BM = 8 for groups of up to 8 heads: the accumulator is [D, 8], half of the 16-line
    one) and the warps split head_dim; K is the A operand from shared memory, V^T through a
    transposed view of it, Q^T the B operand in registers. WN: how many warps split the lines
    (2 for 16-line groups, each warp then owns 8 of them); the other num_warps // WN warps split
    the keys of S^T and head_dim of O^T. Ring and issue order as in ``_attn_gl``."""
    r = gl.program_id(0).to(gl.int64)
    h = gl.program_id(1)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0],
                                                  warps_per_cta=[num_warps // WN, WN],
                                                  instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    b_op: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    kbuf, vbuf, offs_n, offs_d, n, IDX_row, K_h, V_h, ok, q = _row_start(
        Q, K, V, IDX, LENS, r, h, group, num_slots, topk, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh,
        s_it, D, BM, BN, OFFS32, NST, False, num_warps)
    ntiles = gl.cdiv(n, BN)
    qt_b = gl.convert_layout(gl.permute(q, [1, 0]), b_op)
    acc = gl.zeros([D, BM], gl.float32, mma)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(0, mma))
    for tile in range(ntiles):
        okr = gl.convert_layout(ok, gl.SliceLayout(1, mma))
        cp.wait_group(0)
        gl.thread_barrier()
        if NST == 2:
            t_n, j_n = _tile_idx(IDX_row, tile + 1, n, offs_n, BN)
            ok = _issue(K_h, V_h, kbuf, vbuf, t_n, j_n, tile + 1, n, num_slots, s_kt, s_vt,
                        offs_d, D, OFFS32, NST, False)
        st = tile % NST
        s = mma_v2(kbuf.index(st).load(a_op), qt_b, gl.zeros([BN, BM], gl.float32, mma))
        p, alpha, m_i, l_i = _softmax_step_t(s, okr, m_i, l_i, qk_scale)
        pb = gl.convert_layout(p.to(gl.bfloat16), b_op)
        acc = mma_v2(vbuf.index(st).permute([1, 0]).load(a_op), pb, acc * alpha[None, :])
        if NST == 1:
            t_n, j_n = _tile_idx(IDX_row, tile + 1, n, offs_n, BN)
            gl.thread_barrier()
            ok = _issue(K_h, V_h, kbuf, vbuf, t_n, j_n, tile + 1, n, num_slots, s_kt, s_vt,
                        offs_d, D, OFFS32, NST, False)
    cp.wait_group(0)
    _store_t(OUT, acc, l_i, r, h, group, s_ot, s_oh, D, BM, mma)


@gluon.jit
def _attn_wg(Q, K, V, IDX, LENS, OUT, qk_scale, num_slots, topk, group, s_qt, s_qh, s_kt,
             s_kh, s_vt, s_vh, s_it, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr,
             BN: gl.constexpr, OFFS32: gl.constexpr, num_warps: gl.constexpr):
    """The transposed products on wgmma (one warpgroup, BN = 64 keys a tile): S^T = K Q^T with
    K and Q^T from shared memory, O^T = V^T P^T with V^T a transposed view of the V tile and P^T
    written to shared memory; the accumulator [D, BM] is 32 registers a thread at 16 lines.
    K and V of a tile are separate cp.async groups: the next K is issued as soon as S^T is
    done (overlapping the softmax and P V), the next V after P V."""
    r = gl.program_id(0).to(gl.int64)
    h = gl.program_id(1)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BM, 16])
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    sw: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    kbuf = gl.allocate_shared_memory(gl.bfloat16, [BN, D], sw)
    vbuf = gl.allocate_shared_memory(gl.bfloat16, [BN, D], sw)
    pbuf = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], sw)
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    IDX_row = IDX + r * s_it
    K_h = K + h.to(gl.int64) * s_kh
    V_h = V + h.to(gl.int64) * s_vh
    t0, j0 = _tile_idx(IDX_row, 0, n, offs_n, BN)
    ok = (t0 >= 0) & (t0 < num_slots) & (j0 < n)
    row = gl.where(ok, t0, 0) if OFFS32 else gl.where(ok, t0, 0).to(gl.int64)
    m2 = ok[:, None] & (offs_d < D)[None, :]
    cp.async_copy_global_to_shared(kbuf, K_h + (row * s_kt)[:, None] + offs_d[None, :], mask=m2)
    cp.commit_group()
    cp.async_copy_global_to_shared(vbuf, V_h + (row * s_vt)[:, None] + offs_d[None, :], mask=m2)
    cp.commit_group()
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
    q = gl.load(Q + r * s_qt + (h * group + offs_m)[:, None] * s_qh + offs_d[None, :],
                mask=(offs_m < group)[:, None] & (offs_d < D)[None, :], other=0.0)
    qbuf = gl.allocate_shared_memory(gl.bfloat16, [BM, D], sw, q)
    ntiles = gl.cdiv(n, BN)
    acc = gl.zeros([D, BM], gl.float32, mma)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(0, mma))
    for tile in range(ntiles):
        okr = gl.convert_layout(ok, gl.SliceLayout(1, mma))
        cp.wait_group(1)            # K of this tile (V may still be in flight)
        gl.thread_barrier()
        fence_async_shared()
        s = warpgroup_mma(kbuf, qbuf.permute((1, 0)), gl.zeros([BN, BM], gl.float32, mma),
                          use_acc=False)
        gl.thread_barrier()         # every warp is done with the K tile
        t_n, j_n = _tile_idx(IDX_row, tile + 1, n, offs_n, BN)
        ok = (t_n >= 0) & (t_n < num_slots) & (j_n < n)
        row = gl.where(ok, t_n, 0) if OFFS32 else gl.where(ok, t_n, 0).to(gl.int64)
        m2 = ok[:, None] & (offs_d < D)[None, :]
        cp.async_copy_global_to_shared(kbuf, K_h + (row * s_kt)[:, None] + offs_d[None, :],
                                       mask=m2)
        cp.commit_group()
        p, alpha, m_i, l_i = _softmax_step_t(s, okr, m_i, l_i, qk_scale)
        pbuf.store(gl.permute(p.to(gl.bfloat16), [1, 0]))
        cp.wait_group(1)            # V of this tile
        gl.thread_barrier()
        fence_async_shared()
        acc = warpgroup_mma(vbuf.permute((1, 0)), pbuf.permute((1, 0)), acc * alpha[None, :])
        gl.thread_barrier()         # every warp is done with the V tile and P
        cp.async_copy_global_to_shared(vbuf, V_h + (row * s_vt)[:, None] + offs_d[None, :],
                                       mask=m2)
        cp.commit_group()
    cp.wait_group(0)
    _store_t(OUT, acc, l_i, r, h, group, s_ot, s_oh, D, BM, mma)


@gluon.jit
def _wg1_issue(X_h, buf, IDX_row, tile, n, num_slots, s_xt, D: gl.constexpr, BN: gl.constexpr,
               SUB: gl.constexpr, num_warps: gl.constexpr):
    """cp.async of tile ``tile``'s rows of X into ``buf`` in chunks of SUB rows (each chunk
    loads its own index entries, so only SUB rows of addresses are live), one commit group."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    offs_c = gl.arange(0, SUB, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    for c in gl.static_range(BN // SUB):
        j = tile * BN + c * SUB + offs_c
        t = gl.load(IDX_row + j, mask=j < n, other=-1)
        ok = (t >= 0) & (t < num_slots) & (j < n)
        row = gl.where(ok, t, 0)
        cp.async_copy_global_to_shared(buf.slice(c * SUB, SUB, dim=0),
                                       X_h + (row * s_xt)[:, None] + offs_d[None, :],
                                       mask=ok[:, None] & (offs_d < D)[None, :])
    cp.commit_group()


@gluon.jit
def _attn_wg1(Q, K, V, IDX, LENS, OUT, qk_scale, num_slots, topk, group, s_qt, s_qh, s_kt,
              s_kh, s_vt, s_vh, s_it, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr,
              BN: gl.constexpr, SUB: gl.constexpr, OFFS32: gl.constexpr,
              num_warps: gl.constexpr):
    """``_attn_wg`` with one K/V buffer (session 11, prepared, not yet run): K of a tile lands,
    S^T = K Q^T, then V of the same tile is gathered into the buffer K just left (the softmax
    runs meanwhile), O^T += V^T P^T, then the next K. 32 KB for the tile instead of 64 (so
    shared memory would allow 5 programs an SM instead of 3), gathers in chunks of SUB rows
    (fewer live address registers; int32 row offsets, the caller proves they fit)."""
    r = gl.program_id(0).to(gl.int64)
    h = gl.program_id(1)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BM, 16])
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    sw: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    buf = gl.allocate_shared_memory(gl.bfloat16, [BN, D], sw)
    pbuf = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], sw)
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    IDX_row = IDX + r * s_it
    K_h = K + h.to(gl.int64) * s_kh
    V_h = V + h.to(gl.int64) * s_vh
    _wg1_issue(K_h, buf, IDX_row, 0, n, num_slots, s_kt, D, BN, SUB, num_warps)
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    q = gl.load(Q + r * s_qt + (h * group + offs_m)[:, None] * s_qh + offs_d[None, :],
                mask=(offs_m < group)[:, None] & (offs_d < D)[None, :], other=0.0)
    qbuf = gl.allocate_shared_memory(gl.bfloat16, [BM, D], sw, q)
    offs_k = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    acc = gl.zeros([D, BM], gl.float32, mma)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(0, mma))
    for tile in range(gl.cdiv(n, BN)):
        j = tile * BN + offs_k
        t = gl.load(IDX_row + j, mask=j < n, other=-1)
        okr = (t >= 0) & (t < num_slots) & (j < n)
        cp.wait_group(0)            # K of this tile
        gl.thread_barrier()
        fence_async_shared()
        s = warpgroup_mma(buf, qbuf.permute((1, 0)), gl.zeros([BN, BM], gl.float32, mma),
                          use_acc=False)
        gl.thread_barrier()         # every warp is done with K: V of the tile takes its place
        _wg1_issue(V_h, buf, IDX_row, tile, n, num_slots, s_vt, D, BN, SUB, num_warps)
        p, alpha, m_i, l_i = _softmax_step_t(s, okr, m_i, l_i, qk_scale)
        pbuf.store(gl.permute(p.to(gl.bfloat16), [1, 0]))
        cp.wait_group(0)            # V of this tile
        gl.thread_barrier()
        fence_async_shared()
        acc = warpgroup_mma(buf.permute((1, 0)), pbuf.permute((1, 0)), acc * alpha[None, :])
        gl.thread_barrier()         # every warp is done with V and P: the next K
        _wg1_issue(K_h, buf, IDX_row, tile + 1, n, num_slots, s_kt, D, BN, SUB, num_warps)
    cp.wait_group(0)
    _store_t(OUT, acc, l_i, r, h, group, s_ot, s_oh, D, BM, mma)


@gluon.jit
def _ws_producer(K, V, IDX, LENS, kbuf, vbuf, full, empty, r, h, num_slots, topk, s_kt, s_kh,
                 s_vt, s_vh, s_it, D: gl.constexpr, BN: gl.constexpr, NS: gl.constexpr,
                 OFFS32: gl.constexpr):
    """The gather warp: for each tile, waits until the consumer freed its ring stage, then
    issues the K and V rows by cp.async (zero-filled where invalid) and has the stage's full
    barrier arrive when its copies land (one arrival per producer thread)."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, 1], [1, 0])
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    IDX_row = IDX + r * s_it
    K_h = K + h.to(gl.int64) * s_kh
    V_h = V + h.to(gl.int64) * s_vh
    for tile in range(gl.cdiv(n, BN)):
        st = tile % NS
        mbarrier.wait(empty.index(st), ((tile // NS) & 1) ^ 1)
        t, j = _tile_idx(IDX_row, tile, n, offs_n, BN)
        ok = (t >= 0) & (t < num_slots) & (j < n)
        row = gl.where(ok, t, 0) if OFFS32 else gl.where(ok, t, 0).to(gl.int64)
        m2 = ok[:, None] & (offs_d < D)[None, :]
        cp.async_copy_global_to_shared(kbuf.index(st), K_h + (row * s_kt)[:, None]
                                       + offs_d[None, :], mask=m2)
        cp.async_copy_global_to_shared(vbuf.index(st), V_h + (row * s_vt)[:, None]
                                       + offs_d[None, :], mask=m2)
        cp.mbarrier_arrive(full.index(st), increment_count=False)


@gluon.jit
def _ws_consumer(Q, IDX, LENS, OUT, kbuf, vbuf, full, empty, r, h, qk_scale, num_slots, topk,
                 group, s_qt, s_qh, s_it, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr,
                 BN: gl.constexpr, NS: gl.constexpr, WN: gl.constexpr,
                 num_warps: gl.constexpr):
    """The math warps: the transposed products of ``_attn_gl_t`` on the ring stage the
    producer filled; the stage is handed back (empty barrier) once its K and V are in
    registers."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0],
                                                  warps_per_cta=[num_warps // WN, WN],
                                                  instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    b_op: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
    offs_k = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    IDX_row = IDX + r * s_it
    q = gl.load(Q + r * s_qt + (h * group + offs_m)[:, None] * s_qh + offs_d[None, :],
                mask=(offs_m < group)[:, None] & (offs_d < D)[None, :], other=0.0)
    qt_b = gl.convert_layout(gl.permute(q, [1, 0]), b_op)
    acc = gl.zeros([D, BM], gl.float32, mma)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(0, mma))
    for tile in range(gl.cdiv(n, BN)):
        st = tile % NS
        t, j = _tile_idx(IDX_row, tile, n, offs_k, BN)
        okr = (t >= 0) & (t < num_slots) & (j < n)
        mbarrier.wait(full.index(st), (tile // NS) & 1)
        kt = kbuf.index(st).load(a_op)
        vt = vbuf.index(st).permute([1, 0]).load(a_op)
        mbarrier.arrive(empty.index(st), count=1)
        s = mma_v2(kt, qt_b, gl.zeros([BN, BM], gl.float32, mma))
        p, alpha, m_i, l_i = _softmax_step_t(s, okr, m_i, l_i, qk_scale)
        pb = gl.convert_layout(p.to(gl.bfloat16), b_op)
        acc = mma_v2(vt, pb, acc * alpha[None, :])
    _store_t(OUT, acc, l_i, r, h, group, s_ot, s_oh, D, BM, mma)


@gluon.jit
def _attn_ws(Q, K, V, IDX, LENS, OUT, qk_scale, num_slots, topk, group, s_qt, s_qh, s_kt,
             s_kh, s_vt, s_vh, s_it, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr,
             BN: gl.constexpr, NS: gl.constexpr, WN: gl.constexpr, OFFS32: gl.constexpr,
             PREGS: gl.constexpr, num_warps: gl.constexpr):
    """Warp-specialized: one gather warp keeps an NS-stage ring of BN keys full (mbarriers,
    cp.async arrivals), the num_warps math warps consume it."""
    r = gl.program_id(0).to(gl.int64)
    h = gl.program_id(1)
    sw: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    kbuf = gl.allocate_shared_memory(gl.bfloat16, [NS, BN, D], sw)
    vbuf = gl.allocate_shared_memory(gl.bfloat16, [NS, BN, D], sw)
    full = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NS):
        mbarrier.init(full.index(i), count=32)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_ws_consumer, (Q, IDX, LENS, OUT, kbuf, vbuf, full, empty, r, h, qk_scale, num_slots,
                        topk, group, s_qt, s_qh, s_it, s_ot, s_oh, D, BM, BN, NS, WN,
                        num_warps)),
        (_ws_producer, (K, V, IDX, LENS, kbuf, vbuf, full, empty, r, h, num_slots, topk, s_kt,
                        s_kh, s_vt, s_vh, s_it, D, BN, NS, OFFS32))], [1], [PREGS])


@gluon.jit
def _attn_sd(Q, K, V, IDX, LENS, OUT, qk_scale, num_slots, topk, group, s_qt, s_qh, s_kt,
             s_kh, s_vt, s_vh, s_it, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr,
             BN: gl.constexpr, OFFS32: gl.constexpr, num_warps: gl.constexpr):
    """Split head_dim: warp w owns the slice D_w = [w * D / W, (w + 1) * D / W) of every row. It
    gathers that slice of the tile's K and V rows, computes the partial S^T = K_w Q_w^T (a
    batched mma_v2, batch = warps), the partials are summed across the warps (the compiler's
    reduction through shared memory), every warp runs the softmax on the full S^T and
    accumulates its slice O_w^T += V_w^T P^T. Registers a thread: the [D / W, BM] accumulator
    slice and Q_w; no product is computed twice. One cp.async stage."""
    r = gl.program_id(0).to(gl.int64)
    h = gl.program_id(1)
    W: gl.constexpr = num_warps
    DW: gl.constexpr = D // W
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1],
                                                  instr_shape=[1, 16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    b_op: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    s2: gl.constexpr = gl.SliceLayout(0, mma)
    TD: gl.constexpr = DW // 8
    ld: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32 // TD, TD], [W, 1, 1], [2, 1, 0])
    sw: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0])
    wl = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, ld)))
    nl = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, ld)))
    dl = gl.arange(0, DW, layout=gl.SliceLayout(0, gl.SliceLayout(1, ld)))
    col = (wl * DW)[:, None, None] + dl[None, None, :]            # [W, 1, DW]
    kbuf = gl.allocate_shared_memory(gl.bfloat16, [W, BN, DW], sw)
    vbuf = gl.allocate_shared_memory(gl.bfloat16, [W, BN, DW], sw)
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    IDX_row = IDX + r * s_it
    K_h = K + h.to(gl.int64) * s_kh
    V_h = V + h.to(gl.int64) * s_vh
    # Q^T slices as the B operand [W, DW, BM]
    ml = gl.arange(0, BM, layout=gl.SliceLayout(0, gl.SliceLayout(1, ld)))
    dq = gl.arange(0, DW, layout=gl.SliceLayout(0, gl.SliceLayout(2, ld)))
    qcol = (wl * DW)[:, None, None] + dq[None, :, None]           # [W, DW, 1]
    q = gl.load(Q + r * s_qt + (h * group + ml)[None, None, :] * s_qh + qcol,
                mask=(ml < group)[None, None, :] & (qcol >= 0), other=0.0)
    qt_b = gl.convert_layout(q, b_op)
    acc = gl.zeros([W, DW, BM], gl.float32, mma)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(0, s2))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(0, s2))
    for tile in range(gl.cdiv(n, BN)):
        j = tile * BN + nl
        t = gl.load(IDX_row + j, mask=j < n, other=-1)
        ok = (t >= 0) & (t < num_slots) & (j < n)
        row = gl.where(ok, t, 0) if OFFS32 else gl.where(ok, t, 0).to(gl.int64)
        m3 = ok[None, :, None] & (col >= 0)
        gl.thread_barrier()   # every warp is done with the previous tile
        cp.async_copy_global_to_shared(kbuf, K_h + (row * s_kt)[None, :, None] + col, mask=m3)
        cp.async_copy_global_to_shared(vbuf, V_h + (row * s_vt)[None, :, None] + col, mask=m3)
        cp.commit_group()
        okr = gl.convert_layout(ok, gl.SliceLayout(1, s2))
        cp.wait_group(0)
        gl.thread_barrier()
        sp = mma_v2(kbuf.load(a_op), qt_b, gl.zeros([W, BN, BM], gl.float32, mma))
        s = gl.sum(sp, 0)
        p, alpha, m_i, l_i = _softmax_step_t(s, okr, m_i, l_i, qk_scale)
        p3 = gl.convert_layout(gl.broadcast(gl.expand_dims(p.to(gl.bfloat16), 0),
                                            gl.full([W, 1, 1], 0, gl.bfloat16, mma))[0], b_op)
        acc = mma_v2(vbuf.permute([0, 2, 1]).load(a_op), p3,
                     acc * gl.expand_dims(gl.expand_dims(alpha, 0), 0))
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc / gl.expand_dims(gl.expand_dims(l_safe, 0), 0)
    wo = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, mma)))
    do = gl.arange(0, DW, layout=gl.SliceLayout(0, gl.SliceLayout(2, mma)))
    mo = gl.arange(0, BM, layout=gl.SliceLayout(0, gl.SliceLayout(1, mma)))
    ocol = (wo * DW)[:, None, None] + do[None, :, None]
    optr = OUT + r * s_ot + (h * group + mo)[None, None, :] * s_oh + ocol
    gl.store(optr, o.to(gl.bfloat16), mask=(mo < group)[None, None, :] & (ocol >= 0))


# The variants of each family, as run in sessions 10-11 (docs/BENCHMARKS.md, "Session 11"):
# plain (BN, warps, Q_REGS, stages, LEAN, PF)
_SHAPES = ((16, 1, 1, 1, 0, 0), (16, 2, 0, 1, 1, 1))
# transposed (BN, warps, stages, WN[, maxnreg]): WN = 2 splits 16 lines over two warps (groups
# over 8 heads only); at 16 keys and 2 warps 104 registers do not spill (9 programs an SM), 96
# spill 80 bytes (10 programs); all caps were slower
_TRANS = ((16, 2, 1, 1), (32, 2, 1, 1), (16, 4, 1, 1), (32, 4, 1, 1), (16, 2, 1, 2),
          (32, 2, 1, 2), (16, 4, 1, 2), (32, 4, 1, 2), (16, 2, 1, 1, 112), (16, 2, 1, 1, 104),
          (16, 2, 1, 1, 96))
# warp-specialized (BN, stages, math warps, WN, maxnreg): 2.4-2.7x slower than the family
_WS = ((32, 2, 4, 2, 128), (32, 3, 4, 2, 128), (16, 4, 4, 2, 128), (32, 2, 4, 1, 128))
# wgmma (BN keys a tile; one warpgroup): group 6 1.97-1.99 ms, group 12 0.95x of the table
_WG = (64,)
# wgmma with one K/V buffer (BN, SUB rows a gather chunk, maxnreg or 0): prepared in session 11,
# not yet run (cross-compiled for sm_90: group 12 106 registers and 43 KB, i.e. 4 programs an SM
# by registers, or capped at 96 with 8 bytes of spills, 5 programs; group 6 80 registers and
# 38 KB, 5 programs)
_WG1 = ((64, 16, 0), (64, 16, 96))
# split head_dim with a cross-warp sum of S^T (BN, warps): 2-7x slower than the family
_SD = ((16, 4), (32, 4), (16, 8))


def _launch(kernel: Any, q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any,
            **meta: Any) -> Any:
    """Launch a probe kernel: one program a (row, KV head), BM = the group padded to 8 or 16
    lines unless given, int32 row offsets where they fit."""
    g = q.shape[1] // k.shape[1]
    d = q.shape[2]
    meta.setdefault("BM", 8 if g <= 8 else 16)
    offs32 = max(k.stride(0), v.stride(0)) * (k.shape[0] - 1) + d < 2**31
    return kernel[(q.shape[0], k.shape[1])](
        q, k, v, idx, lens, out, d ** -0.5 * 1.4426950408889634, k.shape[0], idx.shape[1], g,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        idx.stride(0), out.stride(0), out.stride(1), D=d, OFFS32=offs32, **meta)


def launch_t(q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any, bn: int, w: int,
             nst: int, wn: int, maxnreg: int = 0) -> Any:
    return _launch(_attn_gl_t, q, k, v, idx, lens, out, BN=bn, NST=nst, WN=wn, num_warps=w,
                   **({"maxnreg": maxnreg} if maxnreg else {}))


def launch_wg(q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any, bn: int) -> Any:
    return _launch(_attn_wg, q, k, v, idx, lens, out, BN=bn, num_warps=4)


def launch_ws(q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any, bn: int, ns: int,
              w: int, wn: int, maxnreg: int, pregs: int = 40) -> Any:
    return _launch(_attn_ws, q, k, v, idx, lens, out, BN=bn, NS=ns, WN=wn, PREGS=pregs,
                   num_warps=w, maxnreg=maxnreg)


def launch_wg1(q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any, bn: int, sub: int,
               maxnreg: int) -> Any:
    # int32 row offsets only (the one-buffer kernel does not take int64 ones)
    assert max(k.stride(0), v.stride(0)) * (k.shape[0] - 1) + q.shape[2] < 2**31
    return _launch(_attn_wg1, q, k, v, idx, lens, out, BN=bn, SUB=sub, num_warps=4,
                   **({"maxnreg": maxnreg} if maxnreg else {}))


def launch_sd(q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any, bn: int, w: int) -> Any:
    return _launch(_attn_sd, q, k, v, idx, lens, out, BN=bn, num_warps=w)


def launch(q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any, bn: int, w: int,
           q_regs: int, nst: int, lean: int, pf: int) -> Any:
    return _launch(_attn_gl, q, k, v, idx, lens, out, BM=16, BN=bn, Q_REGS=q_regs, NST=nst,
                   LEAN=lean, PF=pf, num_warps=w)


def _candidates(g: int, families: set[str]) -> list[tuple[str, Any, tuple[Any, ...]]]:
    """(name, launcher, its geometry arguments) of the selected variant families for group g."""
    out: list[tuple[str, Any, tuple[Any, ...]]] = []
    if "plain" in families:
        for bn, w, qr, nst, lean, pf in _SHAPES:
            out.append((f"gluon {bn}x{w}w s{nst}{' qreg' if qr else ''}"
                        f"{' lean' if lean else ''}{' pf' if pf else ''}", launch,
                        (bn, w, qr, nst, lean, pf)))
    if "T" in families:
        out += [(f"gluon-T {t[0]}x{t[1]}w s{t[2]} wn{t[3]} r{(*t, 0)[4]}", launch_t, t)
                for t in _TRANS if not (t[3] > 1 and g <= 8)]  # 8 lines: one warp column
    if "WS" in families:
        out += [("gluon-WS {}x{}st {}w wn{} r{}".format(*t), launch_ws, t)
                for t in _WS if not (t[3] > 1 and g <= 8)]
    if "WG" in families:
        out += [(f"gluon-WG {bn}x4w", launch_wg, (bn,)) for bn in _WG]
    if "WG1" in families:
        out += [(f"gluon-WG1 {t[0]}x4w sub{t[1]} r{t[2]}", launch_wg1, t) for t in _WG1]
    if "SD" in families:
        out += [(f"gluon-SD {bn}x{w}w", launch_sd, (bn, w)) for bn, w in _SD]
    return out


def main() -> None:
    import argparse

    import torch

    from backends.sparse_prefill import triton_kernels as tk
    from backends.sparse_prefill.bench import BenchCase, make_inputs, probe_grid, probe_header
    from backends.sparse_prefill.reference import sparse_prefill_reference
    from plugins.generic import sparse_prefill_table_config
    from plugins.nvidia_hopper import H200_PREFILL_CONFIGS
    from registry._timing import interleaved_median_ms

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default="32768", help="KV lengths (comma list)")
    ap.add_argument("--groups", default="6,12", help="group sizes (comma list)")
    ap.add_argument("--variants", default="plain,T",
                    help="variant families: plain, T, WS, WG, WG1, SD (comma list)")
    args = ap.parse_args()
    families = set(args.variants.split(","))
    print(probe_header("graph replays, ms; err = max |out - fp32 reference|"))
    for kv, g in probe_grid(args.kv, args.groups):
        x = make_inputs(BenchCase(kind="prefill", group_size=g, kv_len=kv, total_q=8192))
        q, k, v, idx, kw = x["q"], x["k"], x["v"], x["indices"], x["kwargs"]
        ref = sparse_prefill_reference(q, k, v, idx, lengths=kw["lengths"],
                                       out_dtype=torch.float32)
        table = sparse_prefill_table_config(g, 8192)
        fam = H200_PREFILL_CONFIGS[("prefill", g)]
        fns: dict[str, Any] = {
            "table": partial(tk.sparse_prefill_triton, q, k, v, idx, config=table, **kw),
            "family": partial(tk.sparse_prefill_triton, q, k, v, idx, config=fam, **kw)}
        errs = {}
        for name, launcher, geo in _candidates(g, families):
            out = torch.full_like(q, float("nan"))
            try:
                launcher(q, k, v, idx, kw["lengths"], out, *geo)
                torch.cuda.synchronize()
            except Exception as exc:  # a shape that does not build is reported
                print(f"  {name}: {type(exc).__name__}: {str(exc)[:600]}")
                continue
            errs[name] = (out.float() - ref).abs().max().item()
            fns[name] = partial(launcher, q, k, v, idx, kw["lengths"], out, *geo)
        res = interleaved_median_ms(fns, warmup=3, iters=15, graphs=True)
        print(f"\nprefill g{g} KV {kv}, 8192 rows: table / 1.3 = {res['table'] / 1.3:.4f} ms")
        for name, ms in res.items():
            err = f"err {errs[name]:.2e}" if name in errs else ""
            print(f"  {name:30s} {ms:8.4f} ms  {res['table'] / ms:5.3f}x  {err}")


if __name__ == "__main__":
    main()
