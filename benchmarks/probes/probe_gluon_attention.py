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
  chunked gathers (session 12: 2.05 ms at best for group 12, capped at 96 registers).
* ``WG2`` (``_attn_wg2``): a ring of [64 keys, 64 head_dim] chunk buffers, each chunk issued
  ahead of its use across tiles, with the session-12 knobs (LATE, PART_L, HINTS, DIRECT_OK,
  DC, SCALEQ, LDLIN); its best form is the product's ``ENGINE="gluon_wgmma"`` kernel.
* ``WGP`` (``_attn_wgp`` + ``_wgp_combine``): ``WG2`` persistent, equal shares of all rows'
  tiles, rows cut between programs merged by a second kernel.
* ``SD`` (``_attn_sd``): split head_dim with a cross-warp sum of S^T (batched ``mma_v2``).

``--ordered`` / ``--bits`` also time every variant on slot-ordered indices (and the ordering
passes alone), ``--rows`` other row counts, ``--match`` a subset of the variants.

Each checked against the fp32 reference and timed next to the table geometry and the Triton
family (CUDA-graph replays, one window per case). Results: docs/notes/benchmarks-history.md,
"Session 11" and "Session 12".

    python benchmarks/probes/probe_gluon_attention.py [--kv 32768,8192] [--groups 6,12]
        [--variants plain,T,WS,WG,WG1,WG2,WGP,SD] [--ordered] [--bits 1,2,4] [--rows 8192]
"""
from __future__ import annotations

import re
import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
)

from backends.sparse_prefill.gluon_kernels import _softmax_scores, _store_t


@gluon.jit
def _softmax_step_t(s, okr, m_i, l_i, qk_scale):
    """The product's softmax step with one running sum a line (``_sparse_prefill_gl``'s)."""
    p, alpha, m_new = _softmax_scores(s, okr, m_i, qk_scale)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 0)


@gluon.jit
def _softmax_step_part(s, okr, m_i, l_p, qk_scale):
    """The product's softmax step with running sums per thread (``_sparse_prefill_wg``'s)."""
    p, alpha, m_new = _softmax_scores(s, okr, m_i, qk_scale)
    return p, alpha, m_new, l_p * alpha[None, :] + p


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
def _wg2_store(OUT, acc, l_i, r, h, group, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr,
               mma: gl.constexpr, HINTS: gl.constexpr):
    """``_store_t`` with HINTS & 1: the output is written evict-first (streamed past L2)."""
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[None, :]
    od = gl.arange(0, D, layout=gl.SliceLayout(1, mma))
    om = gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
    optr = OUT + r * s_ot + (h * group + om)[None, :] * s_oh + od[:, None]
    gl.store(optr, o.to(OUT.dtype.element_ty), mask=(om < group)[None, :] & (od >= 0)[:, None],
             eviction_policy="evict_first" if HINTS & 1 else "")


@gluon.jit
def _wg2_issue(K_h, V_h, off, ok, ring, offs_c, STEP: gl.constexpr, NS: gl.constexpr,
               DC: gl.constexpr, HINTS: gl.constexpr = 0):
    """cp.async of chunk ``STEP`` of a tile (0-3: K's head_dim chunk STEP, 4-7: V's chunk
    STEP - 4) into ring buffer STEP % NS, zero-filled where not ``ok`` ([BN, DC]); one commit
    group. ``off``: the tile's row offsets (int32, K and V share their row stride), so only
    4 registers a thread carry a tile's addresses."""
    NCH: gl.constexpr = 256 // DC
    if STEP < NCH:
        ptr = (K_h + off)[:, None] + offs_c[None, :] + STEP * DC
    else:
        ptr = (V_h + off)[:, None] + offs_c[None, :] + (STEP - NCH) * DC
    if HINTS & 2:  # K/V: keep in L2
        cp.async_copy_global_to_shared(ring.index(STEP % NS), ptr, mask=ok,
                                       eviction_policy="evict_last")
    else:
        cp.async_copy_global_to_shared(ring.index(STEP % NS), ptr, mask=ok)
    cp.commit_group()


@gluon.jit
def _wg2_step(K_h, V_h, off, ok, off_n, ok_n, ring, offs_c, STEP: gl.constexpr,
              NS: gl.constexpr, DC: gl.constexpr, HINTS: gl.constexpr = 0):
    """Step STEP of a tile: wait for its chunk (NS - 2 newer ones may stay in flight), make it
    visible to wgmma, then issue the chunk NS - 1 steps ahead (the next tile's when that
    passes step 7) into the buffer every warp finished with in the previous step."""
    NSTEP: gl.constexpr = 2 * (256 // DC)
    cp.wait_group(NS - 2)
    gl.thread_barrier()
    fence_async_shared()
    if STEP + NS - 1 < NSTEP:
        _wg2_issue(K_h, V_h, off, ok, ring, offs_c, STEP + NS - 1, NS, DC, HINTS)
    else:
        _wg2_issue(K_h, V_h, off_n, ok_n, ring, offs_c, STEP + NS - 1 - NSTEP, NS, DC, HINTS)


@gluon.jit
def _wg2_tile(IDX_row, tile, n, num_slots, offs_n, offs_c, s_kt, BN: gl.constexpr,
              HINTS: gl.constexpr = 0):
    """Tile ``tile``'s row offsets (slot 0 where invalid), the copy mask [BN, DC] and the
    entries' validity [BN]."""
    j = tile * BN + offs_n
    if HINTS & 4:  # indices: read once
        t = gl.load(IDX_row + j, mask=j < n, other=-1, eviction_policy="evict_first")
    else:
        t = gl.load(IDX_row + j, mask=j < n, other=-1)
    ok = (t >= 0) & (t < num_slots) & (j < n)
    return gl.where(ok, t, 0) * s_kt, ok[:, None] & (offs_c >= 0)[None, :], ok


@gluon.jit
def _attn_wg2(Q, K, V, IDX, LENS, OUT, qk_scale, num_slots, topk, group, s_qt, s_qh, s_kt,
              s_kh, s_vt, s_vh, s_it, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr,
              BN: gl.constexpr, NS: gl.constexpr, OFFS32: gl.constexpr, LATE: gl.constexpr,
              DIRECT_OK: gl.constexpr, PART_L: gl.constexpr, HINTS: gl.constexpr,
              DC: gl.constexpr, SCALEQ: gl.constexpr, LDLIN: gl.constexpr,
              num_warps: gl.constexpr):
    """wgmma on a ring of head_dim chunks (session 12): a tile of 64 keys moves through NS
    buffers of [64 keys, 64 head_dim] (8 KB each) as eight chunks, K's four then V's four, each
    its own cp.async group issued NS - 1 chunks ahead of its use (across tiles). S^T = K Q^T
    accumulates over K's chunks; O^T is four [64, BM] accumulators, chunk c += V_c^T P^T. So a
    program always has gathers in flight, in 8 * NS KB (NS = 2 or 4: the ring position is static
    in the unrolled tile). head_dim 256 only; int32 row offsets (the caller proves they fit)."""
    r = gl.program_id(0).to(gl.int64)
    h = gl.program_id(1)
    NCH: gl.constexpr = D // DC  # 4 chunks of 64 or 2 of 128
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BM, 16])
    ldq: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (DC // 8), DC // 8], [num_warps, 1],
                                         [1, 0])
    if LDLIN:  # a thread gathers the rows whose scores it holds (rows 16w + lane/4 + {0, 8})
        ld: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0], [0, 32]],
            lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[BN, DC])
    else:
        ld: gl.constexpr = ldq
    sw: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    ring = gl.allocate_shared_memory(gl.bfloat16, [NS, BN, DC], sw)
    qbuf = gl.allocate_shared_memory(gl.bfloat16, [NCH, BM, DC], sw)
    pbuf = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], sw)
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
    offs_c = gl.arange(0, DC, layout=gl.SliceLayout(0, ld))
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    IDX_row = IDX + r * s_it
    K_h = K + h.to(gl.int64) * s_kh
    V_h = V + h.to(gl.int64) * s_vh
    off, okm, ok = _wg2_tile(IDX_row, 0, n, num_slots, offs_n, offs_c, s_kt, BN, HINTS)
    for st in gl.static_range(NS - 1):
        _wg2_issue(K_h, V_h, off, okm, ring, offs_c, st, NS, DC, HINTS)
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, ldq))
    offs_cq = gl.arange(0, DC, layout=gl.SliceLayout(0, ldq))
    for c in gl.static_range(NCH):
        qc = gl.load(Q + r * s_qt + (h * group + offs_m)[:, None] * s_qh + c * DC
                     + offs_cq[None, :], mask=(offs_m < group)[:, None] & (offs_cq >= 0)[None, :],
                     other=0.0, eviction_policy="evict_first" if HINTS & 1 else "")
        if SCALEQ:  # the scores' scale folded into Q (rounded to bf16)
            qc = (qc.to(gl.float32) * qk_scale).to(gl.bfloat16)
        qbuf.index(c).store(qc)
    a0 = gl.zeros([DC, BM], gl.float32, mma)
    a1 = gl.zeros([DC, BM], gl.float32, mma)
    a2 = gl.zeros([DC, BM], gl.float32, mma)
    a3 = gl.zeros([DC, BM], gl.float32, mma)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(0, mma))
    l_p = gl.zeros([BN, BM], gl.float32, mma)
    offs_k = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    for tile in range(gl.cdiv(n, BN)):
        if LATE == 0:
            off_n, okm_n, ok_n = _wg2_tile(IDX_row, tile + 1, n, num_slots, offs_n, offs_c, s_kt,
                                           BN, HINTS)
        else:  # placeholders for the steps that issue this tile's chunks
            off_n = off
            okm_n = okm
            ok_n = ok
        if DIRECT_OK:  # the entries again, in the scores' layout (no shared-memory exchange)
            jr = tile * BN + offs_k
            tr = gl.load(IDX_row + jr, mask=jr < n, other=-1,
                         eviction_policy="evict_first" if HINTS & 4 else "")
            okr = (tr >= 0) & (tr < num_slots) & (jr < n)
        else:
            okr = gl.convert_layout(ok, gl.SliceLayout(1, mma))
        s = gl.zeros([BN, BM], gl.float32, mma)
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 0, NS, DC, HINTS)
        s = warpgroup_mma(ring.index(0 % NS), qbuf.index(0).permute((1, 0)), s, use_acc=False)
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 1, NS, DC, HINTS)
        s = warpgroup_mma(ring.index(1 % NS), qbuf.index(1).permute((1, 0)), s)
        if NCH == 4:
            _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 2, NS, DC, HINTS)
            s = warpgroup_mma(ring.index(2 % NS), qbuf.index(2).permute((1, 0)), s)
            _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 3, NS, DC, HINTS)
            s = warpgroup_mma(ring.index(3 % NS), qbuf.index(3).permute((1, 0)), s)
        if PART_L:  # per-thread partial sums over its own keys, reduced once at the end
            p, alpha, m_i, l_p = _softmax_step_part(s, okr, m_i, l_p,
                                                    1.0 if SCALEQ else qk_scale)
        else:
            p, alpha, m_i, l_i = _softmax_step_t(s, okr, m_i, l_i, qk_scale)
        pbuf.store(gl.permute(p.to(gl.bfloat16), [1, 0]))
        pt = pbuf.permute((1, 0))
        if LATE == 1:  # the next tile's entries load only now (fewer live registers)
            off_n, okm_n, ok_n = _wg2_tile(IDX_row, tile + 1, n, num_slots, offs_n, offs_c, s_kt,
                                           BN, HINTS)
        if NCH == 4:
            _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 4, NS, DC, HINTS)
            a0 = warpgroup_mma(ring.index(4 % NS).permute((1, 0)), pt, a0 * alpha[None, :])
            _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 5, NS, DC, HINTS)
            a1 = warpgroup_mma(ring.index(5 % NS).permute((1, 0)), pt, a1 * alpha[None, :])
            _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 6, NS, DC, HINTS)
            a2 = warpgroup_mma(ring.index(6 % NS).permute((1, 0)), pt, a2 * alpha[None, :])
            if LATE == 2:  # only before the step that issues the next tile's first chunk
                off_n, okm_n, ok_n = _wg2_tile(IDX_row, tile + 1, n, num_slots, offs_n, offs_c,
                                               s_kt, BN, HINTS)
            _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 7, NS, DC, HINTS)
            a3 = warpgroup_mma(ring.index(7 % NS).permute((1, 0)), pt, a3 * alpha[None, :])
        else:
            _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 2, NS, DC, HINTS)
            a0 = warpgroup_mma(ring.index(2 % NS).permute((1, 0)), pt, a0 * alpha[None, :])
            _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 3, NS, DC, HINTS)
            a1 = warpgroup_mma(ring.index(3 % NS).permute((1, 0)), pt, a1 * alpha[None, :])
        off = off_n
        okm = okm_n
        ok = ok_n
    cp.wait_group(0)
    if PART_L:
        l_i = gl.sum(l_p, 0)
    _wg2_store(OUT, a0, l_i, r, h, group, s_ot, s_oh, DC, BM, mma, HINTS)
    _wg2_store(OUT + DC, a1, l_i, r, h, group, s_ot, s_oh, DC, BM, mma, HINTS)
    if NCH == 4:
        _wg2_store(OUT + 2 * DC, a2, l_i, r, h, group, s_ot, s_oh, DC, BM, mma, HINTS)
        _wg2_store(OUT + 3 * DC, a3, l_i, r, h, group, s_ot, s_oh, DC, BM, mma, HINTS)


@gluon.jit
def _wgp_segment(Q, K_h, V_h, IDX, LENS, r, h, t0, t1, qk_scale, num_slots, topk, group, s_qt,
                 s_qh, s_kt, s_it, ring, qbuf, pbuf, D: gl.constexpr, BM: gl.constexpr,
                 BN: gl.constexpr, mma: gl.constexpr, ld: gl.constexpr, HINTS: gl.constexpr):
    """Tiles [t0, t1) of row ``r``, KV head ``h``, on ``_attn_wg2``'s schedule (NS = 2,
    64-wide chunks, the next tile's entries loaded after the softmax, per-thread partial sums):
    returns O^T's four unnormalized [64, BM] chunks, the running max and the sum (log2 domain).
    Drains its copies and ends on a barrier, so the caller may reuse the buffers."""
    NS: gl.constexpr = 2
    DC: gl.constexpr = 64
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
    offs_c = gl.arange(0, DC, layout=gl.SliceLayout(0, ld))
    # entries past the segment are masked too (the last tile's prefetch issues nothing)
    n = gl.minimum(gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk), t1 * BN)
    IDX_row = IDX + r * s_it
    off, okm, ok = _wg2_tile(IDX_row, t0, n, num_slots, offs_n, offs_c, s_kt, BN, HINTS)
    _wg2_issue(K_h, V_h, off, okm, ring, offs_c, 0, NS, DC, HINTS)
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
    for c in gl.static_range(4):
        qc = gl.load(Q + r * s_qt + (h * group + offs_m)[:, None] * s_qh + c * DC
                     + offs_c[None, :], mask=(offs_m < group)[:, None] & (offs_c >= 0)[None, :],
                     other=0.0, eviction_policy="evict_first" if HINTS & 1 else "")
        qbuf.index(c).store(qc)
    a0 = gl.zeros([DC, BM], gl.float32, mma)
    a1 = gl.zeros([DC, BM], gl.float32, mma)
    a2 = gl.zeros([DC, BM], gl.float32, mma)
    a3 = gl.zeros([DC, BM], gl.float32, mma)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
    l_p = gl.zeros([BN, BM], gl.float32, mma)
    for tile in range(t0, t1):
        off_n = off
        okm_n = okm
        okr = gl.convert_layout(ok, gl.SliceLayout(1, mma))
        s = gl.zeros([BN, BM], gl.float32, mma)
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 0, NS, DC, HINTS)
        s = warpgroup_mma(ring.index(0), qbuf.index(0).permute((1, 0)), s, use_acc=False)
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 1, NS, DC, HINTS)
        s = warpgroup_mma(ring.index(1), qbuf.index(1).permute((1, 0)), s)
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 2, NS, DC, HINTS)
        s = warpgroup_mma(ring.index(0), qbuf.index(2).permute((1, 0)), s)
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 3, NS, DC, HINTS)
        s = warpgroup_mma(ring.index(1), qbuf.index(3).permute((1, 0)), s)
        p, alpha, m_i, l_p = _softmax_step_part(s, okr, m_i, l_p, qk_scale)
        pbuf.store(gl.permute(p.to(gl.bfloat16), [1, 0]))
        pt = pbuf.permute((1, 0))
        off_n, okm_n, ok_n = _wg2_tile(IDX_row, tile + 1, n, num_slots, offs_n, offs_c, s_kt, BN,
                                       HINTS)
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 4, NS, DC, HINTS)
        a0 = warpgroup_mma(ring.index(0).permute((1, 0)), pt, a0 * alpha[None, :])
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 5, NS, DC, HINTS)
        a1 = warpgroup_mma(ring.index(1).permute((1, 0)), pt, a1 * alpha[None, :])
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 6, NS, DC, HINTS)
        a2 = warpgroup_mma(ring.index(0).permute((1, 0)), pt, a2 * alpha[None, :])
        _wg2_step(K_h, V_h, off, okm, off_n, okm_n, ring, offs_c, 7, NS, DC, HINTS)
        a3 = warpgroup_mma(ring.index(1).permute((1, 0)), pt, a3 * alpha[None, :])
        off = off_n
        okm = okm_n
        ok = ok_n
    cp.wait_group(0)
    gl.thread_barrier()
    return a0, a1, a2, a3, m_i, gl.sum(l_p, 0)


@gluon.jit
def _wgp_store(o_r, acc, l_i, h, group, s_oh, z, BM: gl.constexpr, mma: gl.constexpr,
               C0: gl.constexpr, HINTS: gl.constexpr):
    """A whole row's O^T chunk (head_dim C0..C0+63), normalized, into its output row ``o_r``.
    ``z`` is 0 but opaque to the compiler: the addresses are not hoisted out of the row loop
    (where they would hold registers through the main loop)."""
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[None, :]
    od = gl.arange(0, 64, layout=gl.SliceLayout(1, mma)) + z
    om = gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
    optr = o_r + (h * group + om)[None, :] * s_oh + (C0 + od)[:, None]
    gl.store(optr, o.to(o_r.dtype.element_ty), mask=(om < group)[None, :] & (od >= 0)[:, None],
             eviction_policy="evict_first" if HINTS & 1 else "")


@gluon.jit
def _wgp_partial(PO, PML, slot, acc, m_i, l_i, z, D: gl.constexpr, BM: gl.constexpr,
                 mma: gl.constexpr, C0: gl.constexpr):
    """A split row's unnormalized O^T chunk (head_dim C0..C0+63) into partial slot ``slot``
    ([BM, D] fp32), and (with chunk 0) its max and sum ([2, BM]); ``z`` as in _wgp_store."""
    od = gl.arange(0, 64, layout=gl.SliceLayout(1, mma)) + z
    om = gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
    gl.store(PO + slot * (BM * D) + om[None, :] * D + (C0 + od)[:, None], acc)
    if C0 == 0:
        ov = gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        gl.store(PML + slot * (2 * BM) + ov, m_i)
        gl.store(PML + slot * (2 * BM) + BM + ov, l_i)


@gluon.jit
def _attn_wgp(Q, K, V, IDX, LENS, CUM, OUT, PO, PML, qk_scale, num_slots, topk, group, total_q,
              nprog, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_it, s_ot, s_oh, D: gl.constexpr,
              BM: gl.constexpr, BN: gl.constexpr, HINTS: gl.constexpr, num_warps: gl.constexpr):
    """Persistent ``_attn_wg2`` (session 12): ``nprog`` programs a KV head, each resident for
    the whole call, take equal shares of all rows' 64-key tiles (``CUM``: inclusive prefix sum
    of the rows' tile counts, at least one a row), so they all finish together instead of the
    last wave draining at falling occupancy. A row cut between programs leaves unnormalized
    partials (slot 2p: the program's first segment when it starts mid-row; 2p + 1: its last
    when it ends mid-row) that ``_wgp_combine`` merges."""
    pid = gl.program_id(0)
    h = gl.program_id(1)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BM, 16])
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    sw: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    ring = gl.allocate_shared_memory(gl.bfloat16, [2, BN, 64], sw)
    qbuf = gl.allocate_shared_memory(gl.bfloat16, [4, BM, 64], sw)
    pbuf = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], sw)
    K_h = K + h.to(gl.int64) * s_kh
    V_h = V + h.to(gl.int64) * s_vh
    total = gl.load(CUM + total_q - 1).to(gl.int64)
    start = (pid * total) // nprog
    end = ((pid + 1) * total) // nprog
    lo = 0
    hi = total_q - 1
    while lo < hi:  # the first row whose tiles end past ``start``
        mid = (lo + hi) // 2
        if gl.load(CUM + mid) > start:
            hi = mid
        else:
            lo = mid + 1
    r = lo
    pos = start
    while pos < end:
        row_end = gl.load(CUM + r).to(gl.int64)
        row_begin = gl.load(CUM + gl.maximum(r - 1, 0)).to(gl.int64) * (r > 0).to(gl.int64)
        t0 = (pos - row_begin).to(gl.int32)
        t1 = (gl.minimum(end, row_end) - row_begin).to(gl.int32)
        a0, a1, a2, a3, m_i, l_i = _wgp_segment(
            Q, K_h, V_h, IDX, LENS, r.to(gl.int64), h, t0, t1, qk_scale, num_slots, topk,
            group, s_qt, s_qh, s_kt, s_it, ring, qbuf, pbuf, D, BM, BN, mma, ld, HINTS)
        whole = (t0 == 0) & (t1 == (row_end - row_begin).to(gl.int32))
        z = (row_end < 0).to(gl.int32)  # 0, opaque (see _wgp_store)
        if whole:
            o_r = OUT + r.to(gl.int64) * s_ot
            _wgp_store(o_r, a0, l_i, h, group, s_oh, z, BM, mma, 0, HINTS)
            _wgp_store(o_r, a1, l_i, h, group, s_oh, z, BM, mma, 64, HINTS)
            _wgp_store(o_r, a2, l_i, h, group, s_oh, z, BM, mma, 128, HINTS)
            _wgp_store(o_r, a3, l_i, h, group, s_oh, z, BM, mma, 192, HINTS)
        else:
            slot = ((2 * pid + (t0 == 0).to(gl.int32)) * gl.num_programs(1) + h).to(gl.int64)
            _wgp_partial(PO, PML, slot, a0, m_i, l_i, z, D, BM, mma, 0)
            _wgp_partial(PO, PML, slot, a1, m_i, l_i, z, D, BM, mma, 64)
            _wgp_partial(PO, PML, slot, a2, m_i, l_i, z, D, BM, mma, 128)
            _wgp_partial(PO, PML, slot, a3, m_i, l_i, z, D, BM, mma, 192)
        pos = gl.minimum(end, row_end)
        r += 1


@triton.jit
def _wgp_combine(CUM, PO, PML, OUT, total_q, nprog, group, s_ot, s_oh, D: tl.constexpr,
                 BM: tl.constexpr):
    """Merges the partials of row ``program_id(0)`` (KV head ``program_id(1)``) when
    ``_attn_wgp`` cut it between programs; rows kept whole return at once."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    nh = tl.num_programs(1)
    total = tl.load(CUM + total_q - 1).to(tl.int64)
    row_end = tl.load(CUM + r).to(tl.int64)
    row_begin = tl.load(CUM + tl.maximum(r - 1, 0)).to(tl.int64) * (r > 0).to(tl.int64)
    # the program holding tile x: the last p with p * total // nprog <= x
    p_first = ((row_begin + 1) * nprog - 1) // total
    p_last = (row_end * nprog - 1) // total
    if p_first != p_last:
        lines = tl.arange(0, BM)
        d = tl.arange(0, D)
        m = tl.full([BM], float("-inf"), tl.float32)
        lsum = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        for pp in range(p_first, p_last + 1):
            slot = (2 * pp + (pp == p_first).to(tl.int64)) * nh + h  # first: its tail
            mp = tl.load(PML + slot * (2 * BM) + lines)
            lp = tl.load(PML + slot * (2 * BM) + BM + lines)
            op = tl.load(PO + slot * (BM * D) + lines[:, None] * D + d[None, :])
            m_new = tl.maximum(m, mp)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            ca = tl.exp2(m - m_use)
            cb = tl.exp2(mp - m_use)
            acc = acc * ca[:, None] + op * cb[:, None]
            lsum = lsum * ca + lp * cb
            m = m_new
        o = acc / tl.where(lsum > 0.0, lsum, 1.0)[:, None]
        tl.store(OUT + r.to(tl.int64) * s_ot + (h * group + lines)[:, None] * s_oh + d[None, :],
                 o.to(OUT.dtype.element_ty), mask=(lines < group)[:, None] & (d < D)[None, :])


@triton.jit
def _split2(IDX, LENS, OUT, CNT, num_slots, topk, half, s_it, s_ot, BLOCK: tl.constexpr):
    """A one-bit SLOT_ORDER pass (session 12 probe): row ``program_id(0)``'s valid entries,
    those below slot ``half`` first, each side in its original order (one cumsum a block on
    two packed 16-bit counters), -1 past the kept count ``CNT[r]``."""
    r = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(LENS + r), 0), topk)
    lows = 0
    for c0 in range(0, n, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        t = tl.load(IDX + r * s_it + j, mask=j < n, other=-1)
        lows += tl.sum(((j < n) & (t >= 0) & (t < half)).to(tl.int32), 0)
    nlow = 0
    nhigh = 0
    for c0 in range(0, n, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        t = tl.load(IDX + r * s_it + j, mask=j < n, other=-1)
        ok = (j < n) & (t >= 0) & (t < num_slots)
        lo = ok & (t < half)
        packed = tl.cumsum(tl.where(lo, 1, 0) + tl.where(ok & (t >= half), 65536, 0), 0)
        pos = tl.where(lo, nlow + (packed & 0xFFFF) - 1, lows + nhigh + (packed >> 16) - 1)
        tl.store(OUT + r * s_ot + pos, t, mask=ok)
        tot = tl.sum(tl.where(lo, 1, 0) + tl.where(ok & (t >= half), 65536, 0), 0)
        nlow += tot & 0xFFFF
        nhigh += tot >> 16
    kept = nlow + nhigh
    tl.store(CNT + r, kept)
    for c0 in range((kept // BLOCK) * BLOCK, topk, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        tl.store(OUT + r * s_ot + j, tl.full([BLOCK], -1, tl.int32), mask=(j >= kept) & (j < topk))


def split2(idx: Any, lens: Any, num_slots: int, block: int, warps: int) -> Any:
    import torch

    out = torch.empty_like(idx)
    cnt = torch.empty((idx.shape[0],), device=idx.device, dtype=torch.int32)
    _split2[(idx.shape[0],)](idx, lens, out, cnt, num_slots, idx.shape[1], num_slots // 2,
                             idx.stride(0), out.stride(0), BLOCK=block, num_warps=warps)
    return out, cnt


def order_ahead(idx: Any, lens: Any, num_slots: int, bits: int) -> Any:
    """Each row's valid entries stably sorted by the top ``bits`` bits of their slot (torch,
    outside the timing), -1 after; the kept counts."""
    import torch

    j = torch.arange(idx.shape[1], device=idx.device)
    ok = (j[None, :] < lens[:, None]) & (idx >= 0) & (idx < num_slots)
    shift = max(0, (num_slots - 1).bit_length() - bits)
    key = torch.where(ok, (idx.clamp(min=0) >> shift).to(torch.int64), 1 << 40)
    order = torch.sort(key, dim=1, stable=True).indices
    out = torch.where(torch.gather(ok, 1, order), torch.gather(idx, 1, order), -1)
    return out.to(torch.int32).contiguous(), ok.sum(1).to(torch.int32)


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


# The variants of each family, as run in sessions 10-11 (docs/notes/benchmarks-history.md,
# "Session 11"):
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
_WG1 = ((64, 16, 0), (64, 16, 96), (64, 32, 0), (64, 64, 0), (64, 32, 96), (64, 64, 96),
        (64, 32, 100), (64, 32, 88))
# wgmma on a ring of head_dim chunks (NS buffers of 64 keys x 64 head_dim, maxnreg or 0)
_WG2 = ((2, 96, 1, 0, 1, 7),)
# the persistent kernel (programs an SM, maxnreg)
_WGP = ((5, 96), (4, 96), (4, 128), (6, 80))
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


def launch_wg2(q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any, ns: int,
               maxnreg: int, late: int, direct_ok: int = 0, part_l: int = 0,
               hints: int = 0, dc: int = 64, scaleq: int = 0, ldlin: int = 0) -> Any:
    assert q.shape[2] == 256  # four 64-wide chunks
    assert k.stride(0) == v.stride(0)  # K and V share the row offsets
    assert max(k.stride(0), v.stride(0)) * (k.shape[0] - 1) + q.shape[2] < 2**31
    return _launch(_attn_wg2, q, k, v, idx, lens, out, BN=64, NS=ns, LATE=late, DIRECT_OK=direct_ok,
                   PART_L=part_l, HINTS=hints, DC=dc, SCALEQ=scaleq,
                   LDLIN=ldlin, num_warps=4,
                   **({"maxnreg": maxnreg} if maxnreg else {}))


def launch_wgp(q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any, per_sm: int,
               maxnreg: int, hints: int = 7) -> Any:
    """The persistent kernel: ``per_sm`` programs an SM and KV head, then the combine."""
    import torch

    assert q.shape[2] == 256 and k.stride(0) == v.stride(0)
    assert k.stride(0) * (k.shape[0] - 1) + q.shape[2] < 2**31
    total_q, hkv, topk = q.shape[0], k.shape[1], idx.shape[1]
    g = q.shape[1] // hkv
    bm = 8 if g <= 8 else 16
    tiles = torch.clamp((lens.clamp(0, topk) + 63) // 64, min=1)
    cum = torch.cumsum(tiles, 0, dtype=torch.int32)
    nprog = per_sm * torch.cuda.get_device_properties(q.device).multi_processor_count
    po = torch.empty((nprog * 2 * hkv, bm, 256), device=q.device, dtype=torch.float32)
    pml = torch.empty((nprog * 2 * hkv, 2, bm), device=q.device, dtype=torch.float32)
    _attn_wgp[(nprog, hkv)](
        q, k, v, idx, lens, cum, out, po, pml, 256 ** -0.5 * 1.4426950408889634, k.shape[0],
        topk, g, total_q, nprog, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), idx.stride(0), out.stride(0), out.stride(1), D=256, BM=bm,
        BN=64, HINTS=hints, num_warps=4, **({"maxnreg": maxnreg} if maxnreg else {}))
    _wgp_combine[(total_q, hkv)](cum, po, pml, out, total_q, nprog, g, out.stride(0),
                                 out.stride(1), D=256, BM=bm)
    return out


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
    if "WG2" in families:
        out += [(f"gluon-WG2 64x4w ns{t[0]} r{t[1]}{' late' + str(t[2]) if t[2] else ''}"
                 f"{' dok' if (*t, 0)[3] else ''}{' pl' if (*t, 0, 0)[4] else ''}"
                 f"{' h' + str(t[5]) if len(t) > 5 else ''}"
                 f"{' dc' + str(t[6]) if len(t) > 6 else ''}"
                 f"{' sq' if len(t) > 7 and t[7] else ''}"
                 f"{' lin' if len(t) > 8 and t[8] else ''}", launch_wg2, t)
                for t in _WG2]
    if "WGP" in families:
        out += [(f"gluon-WGP {t[0]}/SM r{t[1]}", launch_wgp, t) for t in _WGP]
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
    from registry.tuning.timing import interleaved_median_ms

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default="32768", help="KV lengths (comma list)")
    ap.add_argument("--groups", default="6,12", help="group sizes (comma list)")
    ap.add_argument("--variants", default="plain,T",
                    help="variant families: plain, T, WS, WG, WG1, WG2, WGP, SD (comma list)")
    ap.add_argument("--ordered", action="store_true",
                    help="also time every variant on indices slot-ordered ahead of time "
                         "(SLOT_ORDER=1's pre-pass, outside the timing), the family with "
                         "SLOT_ORDER=1 (pass included) and the pass alone")
    ap.add_argument("--bits", default="", help="also time every variant on indices ordered ahead "
                    "by the top N bits of the slot (comma list, torch, outside the timing), and "
                    "the one-bit pass alone")
    ap.add_argument("--rows", default="8192", help="query rows (comma list)")
    ap.add_argument("--match", default="", help="only the variants whose name matches this "
                    "regular expression")
    args = ap.parse_args()
    families = set(args.variants.split(","))
    print(probe_header("graph replays, ms; err = max |out - fp32 reference|"))
    cases = [(kv, g, rows) for kv, g in probe_grid(args.kv, args.groups)
             for rows in (int(x) for x in args.rows.split(","))]
    for kv, g, rows in cases:
        x = make_inputs(BenchCase(kind="prefill", group_size=g, kv_len=kv, total_q=rows))
        q, k, v, idx, kw = x["q"], x["k"], x["v"], x["indices"], x["kwargs"]
        ref = sparse_prefill_reference(q, k, v, idx, lengths=kw["lengths"],
                                       out_dtype=torch.float32)
        table = sparse_prefill_table_config(g, rows)
        fam = H200_PREFILL_CONFIGS[("prefill", g)]
        fns: dict[str, Any] = {
            "table": partial(tk.sparse_prefill_triton, q, k, v, idx, config=table, **kw),
            "family": partial(tk.sparse_prefill_triton, q, k, v, idx, config=fam, **kw)}
        inputs = [("", idx, kw["lengths"])]
        if args.ordered:
            fns["family ord1"] = partial(tk.sparse_prefill_triton, q, k, v, idx,
                                         config={**fam, "SLOT_ORDER": 1}, **kw)
            fns["pass alone"] = partial(tk._order_rows, idx, kw["lengths"], k.shape[0])
            idx_o, cnt = tk._order_rows(idx, kw["lengths"], k.shape[0])
            fns["family on ordered"] = partial(tk.sparse_prefill_triton, q, k, v, idx_o,
                                               config=fam, **{**kw, "lengths": cnt})
            inputs.append((" ord", idx_o, cnt))
        for bits in [int(b) for b in args.bits.split(",") if b]:
            idx_b, cnt_b = order_ahead(idx, kw["lengths"], k.shape[0], bits)
            inputs.append((f" {bits}b", idx_b, cnt_b))
        if args.bits:
            o2, c2 = split2(idx, kw["lengths"], k.shape[0], 512, 4)
            ref2, rc2 = order_ahead(idx, kw["lengths"], k.shape[0], 1)
            same = bool((o2 == ref2).all() and (c2 == rc2).all())
            print(f"  split2 matches the 1-bit order: {same}")
            for blk, w in ((256, 2), (512, 4), (1024, 4), (1024, 8), (2048, 8)):
                fns[f"split2 {blk}x{w}"] = partial(split2, idx, kw["lengths"], k.shape[0], blk,
                                                   w)
        errs = {}
        for name, launcher, geo in _candidates(g, families):
            if args.match and not re.search(args.match, name):
                continue
            for tag, ix, ln in inputs:
                out = torch.full_like(q, float("nan"))
                try:
                    launcher(q, k, v, ix, ln, out, *geo)
                    torch.cuda.synchronize()
                except Exception as exc:  # a shape that does not build is reported
                    print(f"  {name}{tag}: {type(exc).__name__}: {str(exc)[:600]}")
                    continue
                errs[name + tag] = (out.float() - ref).abs().max().item()
                fns[name + tag] = partial(launcher, q, k, v, ix, ln, out, *geo)
        res = interleaved_median_ms(fns, warmup=3, iters=15, graphs=True)
        print(f"\nprefill g{g} KV {kv}, {rows} rows: table / 1.3 = {res['table'] / 1.3:.4f} ms")
        for name, ms in res.items():
            err = f"err {errs[name]:.2e}" if name in errs else ""
            print(f"  {name:30s} {ms:8.4f} ms  {res['table'] / ms:5.3f}x  {err}")


if __name__ == "__main__":
    main()
