"""Triton kernels for ``sparse_prefill`` (vendor-neutral) and their launch wrappers.

One program handles one query row and one KV head; its ``BLOCK_M`` rows tile the query heads of
that KV group (so ``BLOCK_M >= group_size``). It streams the row's selected KV slots ``BLOCK_N``
at a time: gathers K, scores, online softmax in fp32 (exp2 with log2(e) folded into the scale),
gathers V, accumulates. Head dims up to 256 (non powers of two are padded and masked). Invalid
entries (past ``lengths[r]``, negative, out of range, not visible, unmapped page) are never read:
their loads are masked.

Config keys: the table is in ``backends/sparse_prefill/config.py`` (pure Python: the keys, their
defaults, :func:`validate_config` and the DENSE-tile parsing, re-imported here).

Public: :func:`sparse_prefill_triton`, :func:`error_bound`, :func:`validate_config`,
:data:`DEFAULT_VARIANT`.
"""

from __future__ import annotations

import os
from typing import Any

import triton
import triton.language as tl

from backends.sparse_prefill import check_inputs

# the config keys, validation and DENSE-tile parsing (pure Python), importable from here too
from backends.sparse_prefill.config import (  # noqa: F401 (re-exported: importable from here)
    _CHOICES,
    _GLUON_KEYS,
    _MAX_HEAD_DIM,
    DEFAULT_VARIANT,
    REQUIRED_KEYS,
    _dense_heads,
    _dense_tile_geometry,
    _is_pow2,
    _validate_gluon,
    _variant,
    validate_config,
)
from backends.sparse_prefill.tile_kernels import ChunkIds, row_tiles
from registry.errors import ConfigError, WorkloadError

# The configs are policy: the table lives in plugins/generic.py, the measured families in
# plugins/nvidia_sm120.py and plugins/nvidia_hopper.py.
__all__ = ["DEFAULT_VARIANT", "error_bound", "sparse_prefill_triton", "validate_config"]

_LOG2E = 1.4426950408889634
_STAGE_BLOCK = 512  # entries a staged (CHUNK_MODE="staged") program translates per step
_ORDER_BLOCK = 128  # entries an ordering (SLOT_ORDER) program handles per step (< 2**16)
_ORDER_WARPS = 2  # 128 x 2: 0.18 ms at 8192 x 2051 on the H200 (256 x 2: 0.31, 1024 x 4: 0.55)
_ORDER_DIGIT = 4  # bits of the slot id one ordering pass partitions on (16 ranges)


def error_bound(dtype: Any) -> float:
    """Max-abs error bound of the kernels' output against the fp32 (or fp64) reference.

    bf16: 2e-2 (the seed's bound). fp16: 4e-3 (P is rounded to fp16 for the PV product, unit
    roundoff 4.9e-4, times |v| of a few units, plus the fp16 output rounding). fp32: 1e-4 (fp32
    products with ``input_precision="ieee"``; only summation order differs). fp64: 1e-9.
    """
    name = str(dtype).replace("torch.", "")
    bounds = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-4, "float64": 1e-9}
    if name not in bounds:
        raise WorkloadError(f"dtype={name}: sparse_prefill supports bfloat16, float16, float32"
                            " (float64 only in the reference)")
    return bounds[name]



# --------------------------------------------------------------------------------------------
# kernels, by execution path
# --------------------------------------------------------------------------------------------


# ---- shared: a row's request, its index entries and their slots, K/V row loads


@triton.jit
def _row_request(CU, r, num_req):
    """Largest b in [0, num_req) with cu_seqlens_q[b] <= r (binary search)."""
    lo = r * 0
    hi = lo + num_req - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        c = tl.load(CU + mid)
        go_up = c <= r
        lo = tl.where(go_up, mid, lo)
        hi = tl.where(go_up, hi, mid - 1)
    return lo


@triton.jit
def _load_idx(IDX_row, j, n):
    """Raw index entries ``j`` of one row; -1 past the row's length (never read)."""
    return tl.load(IDX_row + j, mask=j < n, other=-1)


@triton.jit
def _translate(t, PT_row, pos, num_slots, page_size, max_pages, CHUNK: tl.constexpr):
    """Slots (int64) and validity of raw entries ``t`` (chunk: through the page table)."""
    ok = t >= 0
    if CHUNK:
        ok = ok & (t <= pos)
        page_no = tl.where(ok, t, 0) // page_size
        ok = ok & (page_no < max_pages)
        page = tl.load(PT_row + page_no, mask=ok, other=-1)
        slot = page.to(tl.int64) * page_size + (tl.where(ok, t, 0) % page_size)
        ok = ok & (page >= 0) & (slot < num_slots)
    else:
        slot = t.to(tl.int64)
        ok = ok & (t < num_slots)
    return slot, ok


@triton.jit
def _tile_slots(IDX_row, PT_row, j, n, pos, num_slots, page_size, max_pages,
                CHUNK: tl.constexpr):
    t = _load_idx(IDX_row, j, n)
    return _translate(t, PT_row, pos, num_slots, page_size, max_pages, CHUNK)


@triton.jit
def _load_rows(X_h, slot, ok, s_xt, offs_d, d_mask, HEAD_DIM: tl.constexpr,
               D_PAD: tl.constexpr):
    """Gather rows ``slot`` of one head of K or V: [BLOCK_N, D_PAD], zeros where invalid."""
    if HEAD_DIM == D_PAD:  # noqa: SIM108 (constexpr branch in a kernel)
        mask = ok[:, None]
    else:
        mask = ok[:, None] & d_mask[None, :]
    return tl.load(X_h + slot[:, None] * s_xt + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def _row_offsets(slot, ok, s_xt, LEAN: tl.constexpr, OFFS32: tl.constexpr):
    """Element offsets of the gathered rows. LEAN: invalid entries read row 0 (callers mask
    what they must); OFFS32: 32-bit arithmetic (the wrapper proved it cannot overflow)."""
    if LEAN:
        slot = tl.where(ok, slot, 0)
    if OFFS32:  # noqa: SIM108 (constexpr branch in a kernel)
        off = slot.to(tl.int32) * s_xt
    else:
        off = slot * s_xt
    return off


@triton.jit
def _load_at(X_h, off, mask_rows, offs, d_mask, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
             MASKED: tl.constexpr):
    """Rows at element offsets ``off`` of one head (columns ``offs``); zeros where masked."""
    ptr = X_h + off[:, None] + offs[None, :]
    if MASKED:
        if HEAD_DIM == D_PAD:
            x = tl.load(ptr, mask=mask_rows[:, None], other=0.0)
        else:
            x = tl.load(ptr, mask=mask_rows[:, None] & d_mask[None, :], other=0.0)
    else:
        if HEAD_DIM == D_PAD:  # noqa: SIM108 (constexpr branch in a kernel)
            x = tl.load(ptr)
        else:
            x = tl.load(ptr, mask=d_mask[None, :], other=0.0)
    return x


# ---- the gathering path: one program per (row, KV head) streams the row's slots


@triton.jit
def _attend_tile_v2(q, q2, m_i, l_i, acc, acc2, K_h, V_h, IDX_row, PT_row, start, n, pos,
                    num_slots, page_size, max_pages, s_kt, s_vt, offs_h, h_mask, offs_h2,
                    h_mask2, qk_scale, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                    D_PAD: tl.constexpr, CHUNK: tl.constexpr,
                    LEAN: tl.constexpr, OFFS32: tl.constexpr, KV_SAME_STRIDE: tl.constexpr,
                    DOT_PREC: tl.constexpr):
    """One tile with K and V both gathered as head_dim halves (SPLIT_V=2, rows layout): every
    half-tile has the same layout, so each thread reads K and V from the same rows and each
    row's offset is computed once (once for both tensors when their strides are equal)."""
    j = start + tl.arange(0, BLOCK_N)
    slot, ok = _tile_slots(IDX_row, PT_row, j, n, pos, num_slots, page_size, max_pages,
                           CHUNK)
    off_k = _row_offsets(slot, ok, s_kt, LEAN, OFFS32)
    if KV_SAME_STRIDE:  # noqa: SIM108 (constexpr branch in a kernel)
        off_v = off_k
    else:
        off_v = _row_offsets(slot, ok, s_vt, LEAN, OFFS32)
    k1 = _load_at(K_h, off_k, ok, offs_h, h_mask, HEAD_DIM, D_PAD, not LEAN)
    k2 = _load_at(K_h, off_k, ok, offs_h2, h_mask2, HEAD_DIM, D_PAD, not LEAN)
    v1 = _load_at(V_h, off_v, ok, offs_h, h_mask, HEAD_DIM, D_PAD, True)
    v2 = _load_at(V_h, off_v, ok, offs_h2, h_mask2, HEAD_DIM, D_PAD, True)
    s = _qk(q, k1, DOT_PREC) + _qk(q2, k2, DOT_PREC)
    s = s * qk_scale
    s = tl.where(ok[None, :], s, float("-inf"))
    m_tile = tl.max(s, 1)
    m_new = tl.maximum(m_i, m_tile)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    pv = p.to(v1.dtype)
    acc = tl.dot(pv, v1, acc * alpha[:, None], input_precision=DOT_PREC)
    acc2 = tl.dot(pv, v2, acc2 * alpha[:, None], input_precision=DOT_PREC)
    return m_new, l_i, acc, acc2


@triton.jit
def _kept(mask, keep, SKIP: tl.constexpr):
    """``mask`` where the program keeps its output (SKIP: ``keep`` is a scalar decision)."""
    if SKIP:
        mask = tl.where(keep, mask, False)
    return mask



@triton.jit
def _qk(q, k, DOT_PREC: tl.constexpr):
    return tl.dot(q, tl.trans(k), input_precision=DOT_PREC)  # [BM, BN]


@triton.jit
def _softmax_update(s, ok, m_i, l_i, acc, qk_scale):
    """Online-softmax update from raw scores (exp2; log2(e) is in qk_scale)."""
    s = s * qk_scale
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, m_new, l_i, acc


@triton.jit
def _pv(p, v, acc, DOT_PREC: tl.constexpr):
    return tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)  # [BM, D]


@triton.jit
def _attend_tile(q, q2, m_i, l_i, acc, K_h, V_h, IDX_row, PT_row, start, n, pos, num_slots,
                 page_size, max_pages, s_kt, s_vt, offs_d, d_mask, offs_h, h_mask, offs_h2,
                 h_mask2, qk_scale, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 D_PAD: tl.constexpr, CHUNK: tl.constexpr,
                 SPLIT_QK: tl.constexpr, DOT_PREC: tl.constexpr, LEAN: tl.constexpr,
                 OFFS32: tl.constexpr):
    """One tile of the gathering loop: index, gather K and V, score, accumulate.

    SPLIT_QK=2 computes QK^T as two independent half-head_dim products (q/q2 and the two K
    halves ``offs_h``/``offs_h2``), halving the dependent MMA chain of the score.
    """
    j = start + tl.arange(0, BLOCK_N)
    slot, ok = _tile_slots(IDX_row, PT_row, j, n, pos, num_slots, page_size, max_pages,
                           CHUNK)
    if LEAN or OFFS32:
        off_k = _row_offsets(slot, ok, s_kt, LEAN, OFFS32)
        off_v = _row_offsets(slot, ok, s_vt, False, OFFS32)
        if SPLIT_QK == 2:
            k1 = _load_at(K_h, off_k, ok, offs_h, h_mask, HEAD_DIM, D_PAD, not LEAN)
            k2 = _load_at(K_h, off_k, ok, offs_h2, h_mask2, HEAD_DIM, D_PAD, not LEAN)
            s = _qk(q, k1, DOT_PREC) + _qk(q2, k2, DOT_PREC)
        else:
            k = _load_at(K_h, off_k, ok, offs_d, d_mask, HEAD_DIM, D_PAD, not LEAN)
            s = _qk(q, k, DOT_PREC)
        v = _load_at(V_h, off_v, ok, offs_d, d_mask, HEAD_DIM, D_PAD, True)
    elif SPLIT_QK == 2:
        k1 = _load_rows(K_h, slot, ok, s_kt, offs_h, h_mask, HEAD_DIM, D_PAD)
        k2 = _load_rows(K_h, slot, ok, s_kt, offs_h2, h_mask2, HEAD_DIM, D_PAD)
        v = _load_rows(V_h, slot, ok, s_vt, offs_d, d_mask, HEAD_DIM, D_PAD)
        s = _qk(q, k1, DOT_PREC) + _qk(q2, k2, DOT_PREC)
    else:
        k = _load_rows(K_h, slot, ok, s_kt, offs_d, d_mask, HEAD_DIM, D_PAD)
        v = _load_rows(V_h, slot, ok, s_vt, offs_d, d_mask, HEAD_DIM, D_PAD)
        s = _qk(q, k, DOT_PREC)
    p, m_i, l_i, acc = _softmax_update(s, ok, m_i, l_i, acc, qk_scale)
    acc = _pv(p, v, acc, DOT_PREC)
    return m_i, l_i, acc


@triton.jit
def _sparse_prefill_fwd(Q, K, V, IDX, LENS, OUT, CU, PREFIX, PT, SCR, FLAG,
                        qk_scale, total_q, num_slots, topk, group, page_size, max_pages, num_req,
                        s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_it, s_ot, s_oh, s_pb, s_st, s_sh,
                        HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, HAS_LENS: tl.constexpr,
                        REVERSE_ROWS: tl.constexpr, SPLIT_QK: tl.constexpr,
                        DOT_PREC: tl.constexpr, STAGE: tl.constexpr, STAGE_BLOCK: tl.constexpr,
                        SPLIT_V: tl.constexpr, LEAN: tl.constexpr, OFFS32: tl.constexpr,
                        KV_SAME_STRIDE: tl.constexpr, SKIP_TILES: tl.constexpr,
                        TILE_RP: tl.constexpr):
    """STAGE (chunk rows, with CHUNK=False for the loop): the program first writes its row's
    slots (-1 where invalid) to its own ``SCR[r, h]`` and then streams them like prefill
    indices. SKIP_TILES (DENSE, UNION): rows of the tiles (of ``TILE_RP`` rows) whose ``FLAG``
    is not 0 (the dense or the union kernel stored them) stream nothing and store nothing."""
    pid = tl.program_id(0)
    if REVERSE_ROWS:  # noqa: SIM108 (constexpr branch in a kernel)
        r = total_q - 1 - pid
    else:
        r = pid
    h = tl.program_id(1)
    r64 = r.to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    m_mask = offs_m < group
    d_mask = offs_d < HEAD_DIM
    heads = h * group + offs_m
    if SPLIT_QK == 2:
        offs_h = tl.arange(0, D_PAD // 2)
        offs_h2 = offs_h + D_PAD // 2
        h_mask = offs_h < HEAD_DIM
        h_mask2 = offs_h2 < HEAD_DIM
        q = tl.load(Q + r64 * s_qt + heads[:, None] * s_qh + offs_h[None, :],
                    mask=m_mask[:, None] & h_mask[None, :], other=0.0)
        q2 = tl.load(Q + r64 * s_qt + heads[:, None] * s_qh + offs_h2[None, :],
                     mask=m_mask[:, None] & h_mask2[None, :], other=0.0)
    else:
        offs_h = offs_d
        offs_h2 = offs_d
        h_mask = d_mask
        h_mask2 = d_mask
        q = tl.load(Q + r64 * s_qt + heads[:, None] * s_qh + offs_d[None, :],
                    mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        q2 = q
    if HAS_LENS:  # noqa: SIM108 (constexpr branch in a kernel)
        n = tl.minimum(tl.maximum(tl.load(LENS + r), 0), topk)
    else:
        n = topk
    if SKIP_TILES:
        keep = tl.load(FLAG + r // TILE_RP) == 0
        n = tl.where(keep, n, 0)
    else:
        keep = True
    if CHUNK or STAGE:
        b = _row_request(CU, r, num_req)
        pos = tl.load(PREFIX + b) + (r - tl.load(CU + b))
        PT_row = PT + b.to(tl.int64) * s_pb
    else:
        pos = 0
        PT_row = PT
    IDX_row = IDX + r64 * s_it
    if STAGE:
        # Translate the whole row once (its entries' loads are independent of each other, so
        # the page-table level costs one round trip per STAGE_BLOCK entries), then stream the
        # slots; the barrier makes every thread's slot stores visible to the whole program.
        SCR_row = SCR + r64 * s_st + h * s_sh
        for start in range(0, n, STAGE_BLOCK):
            j = start + tl.arange(0, STAGE_BLOCK)
            slot, ok = _tile_slots(IDX_row, PT_row, j, n, pos, num_slots, page_size, max_pages,
                                   True)
            tl.store(SCR_row + j, tl.where(ok, slot, -1).to(tl.int32), mask=j < n)
        tl.debug_barrier()
        IDX_row = SCR_row
    K_h = K + h.to(tl.int64) * s_kh
    V_h = V + h.to(tl.int64) * s_vh
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if SPLIT_V == 2:
        acc = tl.zeros([BLOCK_M, D_PAD // 2], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, D_PAD // 2], dtype=tl.float32)
        for start in range(0, n, BLOCK_N):
            m_i, l_i, acc, acc2 = _attend_tile_v2(
                q, q2, m_i, l_i, acc, acc2, K_h, V_h, IDX_row, PT_row, start, n, pos, num_slots,
                page_size, max_pages, s_kt, s_vt, offs_h, h_mask, offs_h2, h_mask2, qk_scale,
                BLOCK_N, HEAD_DIM, D_PAD, CHUNK, LEAN, OFFS32, KV_SAME_STRIDE, DOT_PREC)
    else:
        for start in range(0, n, BLOCK_N):
            m_i, l_i, acc = _attend_tile(q, q2, m_i, l_i, acc, K_h, V_h, IDX_row, PT_row, start, n,
                                         pos, num_slots, page_size, max_pages, s_kt, s_vt,
                                         offs_d, d_mask, offs_h, h_mask, offs_h2, h_mask2,
                                         qk_scale, BLOCK_N, HEAD_DIM, D_PAD, CHUNK, SPLIT_QK,
                                         DOT_PREC, LEAN, OFFS32)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    O_row = OUT + r64 * s_ot
    if SPLIT_V == 2:
        o_ptr = O_row + heads[:, None] * s_oh + offs_h[None, :]
        tl.store(o_ptr, (acc / l_safe[:, None]).to(OUT.dtype.element_ty),
                 mask=_kept(m_mask[:, None] & h_mask[None, :], keep, SKIP_TILES))
        o_ptr = O_row + heads[:, None] * s_oh + offs_h2[None, :]
        tl.store(o_ptr, (acc2 / l_safe[:, None]).to(OUT.dtype.element_ty),
                 mask=_kept(m_mask[:, None] & h_mask2[None, :], keep, SKIP_TILES))
    else:
        o = acc / l_safe[:, None]
        o_ptr = O_row + heads[:, None] * s_oh + offs_d[None, :]
        tl.store(o_ptr, o.to(OUT.dtype.element_ty),
                 mask=_kept(m_mask[:, None] & d_mask[None, :], keep, SKIP_TILES))


# ---- pre-passes: chunk translation (CHUNK_MODE='pretranslate'), slot ordering (SLOT_ORDER)


@triton.jit
def _translate_chunk(IDX, LENS, SLOTS, POS, ROWREQ, CU, PREFIX, PT, num_slots, topk, page_size,
                     max_pages, num_req, s_it, s_st, s_pb, HAS_LENS: tl.constexpr,
                     BLOCK: tl.constexpr, WRITE_POS: tl.constexpr):
    """SLOTS[r, j] = KV slot of chunk entry (r, j), or -1 when the entry is invalid. WRITE_POS
    (the union tiles' ids, ``tile_kernels.ChunkIds``): also ``POS[r, j]`` = the entry's token
    position where it is valid, else -1, and ``ROWREQ[r]`` = the row's request."""
    r = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if HAS_LENS:  # noqa: SIM108 (constexpr branch in a kernel)
        n = tl.minimum(tl.maximum(tl.load(LENS + r), 0), topk)
    else:
        n = topk
    b = _row_request(CU, r, num_req)
    pos = tl.load(PREFIX + b) + (r - tl.load(CU + b))
    slot, ok = _tile_slots(IDX + r.to(tl.int64) * s_it, PT + b.to(tl.int64) * s_pb, j, n, pos,
                           num_slots, page_size, max_pages, True)
    tl.store(SLOTS + r.to(tl.int64) * s_st + j, tl.where(ok, slot, -1).to(tl.int32),
             mask=j < topk)
    if WRITE_POS:
        t = _load_idx(IDX + r.to(tl.int64) * s_it, j, n)
        tl.store(POS + r.to(tl.int64) * s_st + j, tl.where(ok, t, -1).to(tl.int32),
                 mask=j < topk)
        tl.store(ROWREQ + r, b, mask=tl.program_id(1) == 0)


@triton.jit
def _order_slots(IDX, LENS, OUT, CNT, num_slots, topk, shift, s_it, s_ot,
                 HAS_LENS: tl.constexpr, BLOCK: tl.constexpr):
    """Stable partition of one row's entries by the digit ``(slot >> shift) & 15`` (SLOT_ORDER).

    Negative, out-of-range and past-``lengths`` entries are dropped and the number kept is
    written to ``CNT[r]``; ``OUT[r, CNT[r]:]`` is set to -1.
    Pass 1 counts the row's digits; pass 2 sends each entry to its digit's next free position:
    its rank among equal digits comes from prefix sums of packed counters (four 8-bit fields per
    int32 word when ``BLOCK`` < 256, else two 16-bit fields; ``BLOCK`` < 2**16, so a field
    never carries)."""
    r = tl.program_id(0).to(tl.int64)
    if HAS_LENS:  # noqa: SIM108 (constexpr branch in a kernel)
        n = tl.minimum(tl.maximum(tl.load(LENS + r), 0), topk)
    else:
        n = topk
    cnt = tl.zeros([16], dtype=tl.int32)
    for c0 in range(0, n, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        t = tl.load(IDX + r * s_it + j, mask=j < n, other=-1)
        ok = (j < n) & (t >= 0) & (t < num_slots)
        d = (tl.where(ok, t, 0) >> shift) & 15
        cnt += tl.histogram(d, 16, mask=ok)
    base = tl.cumsum(cnt, 0) - cnt  # first position of each digit's entries
    for c0 in range(0, n, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        t = tl.load(IDX + r * s_it + j, mask=j < n, other=-1)
        ok = (j < n) & (t >= 0) & (t < num_slots)
        d = (tl.where(ok, t, 0) >> shift) & 15
        if BLOCK < 256:  # four 8-bit fields a word, four words
            sh = 8 * (d & 3)
            word = d >> 2
        else:  # two 16-bit fields a word, eight words
            sh = 16 * (d & 1)
            word = d >> 1
        one = tl.where(ok, 1 << sh, 0)
        rank = tl.zeros([BLOCK], dtype=tl.int32)
        for w in tl.static_range(4 if BLOCK < 256 else 8):
            mine = word == w
            inc = tl.cumsum(tl.where(mine, one, 0), 0)
            rank += tl.where(mine, (inc >> sh) & (0xFF if BLOCK < 256 else 0xFFFF), 0)
        tl.store(OUT + r * s_ot + tl.gather(base, d, 0) + rank - 1, t, mask=ok)
        base += tl.histogram(d, 16, mask=ok)
    kept = tl.sum(cnt, 0)
    tl.store(CNT + r, kept)
    for c0 in range((kept // BLOCK) * BLOCK, topk, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        tl.store(OUT + r * s_ot + j, tl.full([BLOCK], -1, dtype=tl.int32),
                 mask=(j >= kept) & (j < topk))


# --------------------------------------------------------------------------------------------
# wrapper
# --------------------------------------------------------------------------------------------


def _fail(msg: str) -> None:
    raise WorkloadError(msg)


def _check_inputs(q: Any, k: Any, v: Any, indices: Any, kind: str, lengths: Any, sm_scale: Any,
                  cu_seqlens_q: Any, prefix_lens: Any, page_table: Any, page_size: Any,
                  max_q: Any) -> None:
    """The op's input rules (:func:`backends.sparse_prefill.check_inputs`, shared by every
    implementation), then what these kernels need beyond them: 16/32-bit floats, head_dim up
    to 256, int32 slot ids. Host metadata only."""
    import torch

    check_inputs(q, k, v, indices, kind=kind, lengths=lengths, sm_scale=sm_scale,
                 cu_seqlens_q=cu_seqlens_q, prefix_lens=prefix_lens, page_table=page_table,
                 page_size=page_size, max_q=max_q)
    if q.dtype is torch.float64:
        _fail(f"sparse_prefill: q.dtype={q.dtype}: the Triton kernels take bfloat16, float16 or "
              "float32 (float64 runs in the reference only)")
    d = q.shape[2]
    if d > _MAX_HEAD_DIM:
        _fail(f"sparse_prefill: head_dim={d}: the Triton kernels support 1..{_MAX_HEAD_DIM} "
              "(use the reference)")
    if k.shape[0] >= 2**31 - 1:
        _fail(f"sparse_prefill: num_slots={k.shape[0]}: must be < 2**31 - 1 (slot ids are int32)")


def _order_rows(idx: Any, lens: Any, num_slots: int, block: int = _ORDER_BLOCK,
                num_warps: int = _ORDER_WARPS) -> tuple[Any, Any]:
    """SLOT_ORDER's pre-pass: (entries ordered by the top 4 bits of their slot, kept count per
    row), a stable partition into 16 slot ranges (as good as a full sort, docs/notes)."""
    import torch

    total_q, topk = idx.shape
    cnt = torch.empty((total_q,), device=idx.device, dtype=torch.int32)
    nbits = max(1, (num_slots - 1).bit_length())
    shift = max(0, nbits - _ORDER_DIGIT)
    has_lens = lens is not None
    out = torch.empty((total_q, topk), device=idx.device, dtype=torch.int32)
    _order_slots[(total_q,)](idx, lens if has_lens else cnt, out, cnt, num_slots, topk, shift,
                             idx.stride(0), out.stride(0), HAS_LENS=has_lens, BLOCK=block,
                             num_warps=num_warps)
    return out, cnt


def _offsets_fit_int32(num_slots: int, s_kt: int, s_vt: int, d_pad: int) -> bool:
    """Whether every gathered element's offset from its head's base, ``slot * stride + d`` with
    ``d < d_pad``, fits an int32 (OFFS32's 32-bit row offsets; int64 otherwise)."""
    return (num_slots - 1) * max(s_kt, s_vt) + d_pad - 1 <= 2**31 - 1


def _launch_extras(var: dict[str, Any], q: Any) -> dict[str, Any]:
    """Backend-specific launch options (maxnreg on CUDA only; not under the interpreter)."""
    if not var["MAXNREG"] or os.environ.get("TRITON_INTERPRET") == "1":
        return {}
    import torch

    if q.device.type != "cuda" or getattr(torch.version, "hip", None):
        return {}
    return {"maxnreg": int(var["MAXNREG"])}


def sparse_prefill_triton(q: Any, k: Any, v: Any, indices: Any, *, config: dict[str, Any],
                          kind: str = "prefill", lengths: Any = None,
                          sm_scale: float | None = None, cu_seqlens_q: Any = None,
                          prefix_lens: Any = None, page_table: Any = None, page_size: int = 1,
                          max_q: int | None = None) -> Any:
    """Sparse GQA prefill attention (the op contract: :mod:`backends.sparse_prefill`; the
    inputs are checked by its :func:`~backends.sparse_prefill.check_inputs`, the NaN/inf rules
    are the reference's).

    ``max_q`` is accepted for workload selection and ignored here. Never reads device memory on
    the host and never synchronizes. The Gluon engines (``ENGINE``) are reached through here.
    """
    import torch

    _check_inputs(q, k, v, indices, kind, lengths, sm_scale, cu_seqlens_q, prefix_lens,
                  page_table, page_size, max_q)
    # The kernels read 1-D int tensors at unit stride: a strided view (``lengths[::2]``) is
    # copied here, once a call (a few bytes a row; capture-safe). 2-D and 3-D tensors pass
    # their strides (the last axis is unit stride by the op's rules).
    if lengths is not None and lengths.stride(0) != 1:
        lengths = lengths.contiguous()
    if kind == "chunk":
        if cu_seqlens_q.stride(0) != 1:
            cu_seqlens_q = cu_seqlens_q.contiguous()
        if prefix_lens.stride(0) != 1:
            prefix_lens = prefix_lens.contiguous()
    total_q, hq, d = q.shape
    num_slots, hkv, _ = k.shape
    group = hq // hkv
    topk = indices.shape[1]
    validate_config(config, group, d)
    var = _variant(config)
    out = torch.empty((total_q, hq, d), device=q.device, dtype=q.dtype)
    if total_q == 0:
        return out
    if num_slots == 0 or topk == 0:
        return out.zero_()
    scale = float(sm_scale) if sm_scale is not None else d ** -0.5
    d_pad = max(16, triton.next_power_of_2(d))
    # fp32 inputs: exact fp32 products; 16-bit inputs: the backend default (the option only
    # matters for fp32, and not every backend accepts every value)
    dot_prec = "ieee" if q.dtype == torch.float32 else None
    has_lens = lengths is not None
    lens = lengths if has_lens else indices  # dummy pointer when absent
    chunk = kind == "chunk"
    idx = indices
    chunk_ids = None
    if chunk:
        nreq = cu_seqlens_q.shape[0] - 1
        max_pages = page_table.shape[1]
        pt, cu, prefix, s_pb = page_table, cu_seqlens_q, prefix_lens, page_table.stride(0)
        if var["CHUNK_MODE"] == "pretranslate":
            slots = torch.empty((total_q, topk), device=q.device, dtype=torch.int32)
            # union tiles without dense ones run over the rows' token positions (ascending as
            # an indexer emits them), not the slots a shuffled page table scatters
            by_pos = bool(var["UNION"]) and not var["DENSE"]
            if by_pos:
                pos_ids = torch.empty_like(slots)
                row_req = torch.empty((total_q,), device=q.device, dtype=torch.int32)
                chunk_ids = ChunkIds(pos_ids, row_req, pt, page_size, max_pages * page_size)
            else:
                pos_ids = row_req = slots  # dummy pointers, never written
            tb = 256
            _translate_chunk[(total_q, triton.cdiv(topk, tb))](
                indices, lens, slots, pos_ids, row_req, cu, prefix, pt, num_slots, topk,
                page_size, max_pages, nreq, indices.stride(0), slots.stride(0), s_pb,
                HAS_LENS=has_lens, BLOCK=tb, WRITE_POS=by_pos, num_warps=4)
            idx, chunk = slots, False
    else:
        nreq, max_pages, s_pb = 1, 0, 0
        pt = cu = prefix = indices  # dummy pointers, never read
    flag = None
    if var["DENSE"] or var["UNION"]:
        if chunk:
            key, what = ("DENSE", "walks") if var["DENSE"] else ("UNION", "gathers")
            raise ConfigError(f"{key}={var[key]} {what} KV slots, but chunk entries are token "
                              f"positions until translated (CHUNK_MODE={var['CHUNK_MODE']!r}): "
                              f"use CHUNK_MODE='pretranslate' or {key}=0")
        flag, tile_rp = row_tiles(q, k, v, idx, lens, has_lens, out, scale * _LOG2E, var,
                                  dot_prec, d_pad, chunk_ids)
    else:
        tile_rp = 1
    if var["SLOT_ORDER"]:
        if chunk:
            raise ConfigError(f"SLOT_ORDER={var['SLOT_ORDER']} orders KV slots, but chunk "
                              f"entries are token positions until translated "
                              f"(CHUNK_MODE={var['CHUNK_MODE']!r}): use "
                              f"CHUNK_MODE='pretranslate' or SLOT_ORDER=0")
        idx, lens = _order_rows(idx, lens if has_lens else None, num_slots)
        has_lens = True
    if var["ENGINE"] != "triton":
        from backends.sparse_prefill.gluon_kernels import sparse_prefill_gluon

        if chunk:
            raise ConfigError(f"ENGINE={var['ENGINE']!r} runs on slot ids: chunk rows need "
                              f"CHUNK_MODE='pretranslate' (got {var['CHUNK_MODE']!r})")
        offs32 = bool(var["OFFS32"]) and _offsets_fit_int32(num_slots, k.stride(0),
                                                            v.stride(0), d)
        return sparse_prefill_gluon(q, k, v, idx, lens, has_lens, out, scale, config, offs32,
                                    flag, tile_rp)
    split_qk = 2 if (var["SPLIT_QK"] == 2 and d_pad >= 32) else 1
    split_v = 2 if (var["SPLIT_V"] == 2 and split_qk == 2) else 1
    offs32 = bool(var["OFFS32"]) and _offsets_fit_int32(num_slots, k.stride(0), v.stride(0),
                                                        d_pad)
    stage = chunk and var["CHUNK_MODE"] == "staged"
    if stage:
        # one row of slots per (row, KV head) program: no two programs write the same entry
        scr = torch.empty((total_q, hkv, topk), device=q.device, dtype=torch.int32)
        s_st, s_sh, chunk = scr.stride(0), scr.stride(1), False
    else:
        scr, s_st, s_sh = idx, 0, 0  # dummy pointer, never written
    _sparse_prefill_fwd[(total_q, hkv)](
        q, k, v, idx, lens, out, cu, prefix, pt, scr, flag if flag is not None else idx,
        scale * _LOG2E, total_q, num_slots, topk, group, page_size, max_pages, nreq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        idx.stride(0), out.stride(0), out.stride(1), s_pb, s_st, s_sh,
        HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
        CHUNK=chunk, HAS_LENS=has_lens, REVERSE_ROWS=bool(var["REVERSE_ROWS"]),
        SPLIT_QK=split_qk, DOT_PREC=dot_prec, STAGE=stage, STAGE_BLOCK=_STAGE_BLOCK,
        SPLIT_V=split_v, LEAN=bool(var["LEAN"]), OFFS32=offs32,
        KV_SAME_STRIDE=k.stride(0) == v.stride(0), SKIP_TILES=flag is not None,
        TILE_RP=tile_rp,
        num_warps=config["num_warps"], num_stages=config["num_stages"], **_launch_extras(var, q))
    return out
