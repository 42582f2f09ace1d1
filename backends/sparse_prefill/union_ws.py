"""The union tiles' attention on a warp-specialized Gluon kernel (``UNION_ENGINE="gluon_ws"``
and its variants, issue 26; Hopper, sm_90). Prepared in session 47 and compiled for sm_90 with
Triton 3.6 and 3.9; not yet run on a GPU (docs/notes/sparse_prefill.md, "Session 47").

The Triton union kernel (``tile_kernels._union_fwd``) spends about a third of its time waiting
for its gathered K/V rows: Triton gives them two buffers and issues the next step's copies
after this step's second MMA (docs/notes/sparse_prefill.md, "Session 44"). Here the gathers
move to their own warps:

* **producer** (a worker partition of 4 warps, few registers): per step of ``BLOCK_N`` union
  positions it loads their slots, then issues the K rows once K of two steps back is scored
  (``kempty``) and the V rows once V of two steps back is used (``vempty``), as cp.async
  copies (``[BLOCK_N, 64]`` head-dim chunks, zero-filled past the union) that arrive on
  ``kready`` / ``vready`` when they land;
* **consumer** (the default partition, 8 warps: two warpgroups over the tile's 128 query lines)
  waits on ``kready``, runs S = Q K^T on wgmma (Q in shared memory), reads its lines' 16-bit
  counts while that runs, releases K's stage, the count-weighted online softmax of
  ``_counted_step`` (the same rescale slack), then waits on ``vready``, O += P V with P from
  registers, and releases V's stage.

With two stages the copies of step i + 1 are in flight during all of step i, not issued at its
end. The consumer's schedule is the UNION_ENGINE value (``MODES``): "gluon_ws" as above;
"gluon_ws_overlap" runs a step's softmax under the previous step's PV MMAs (FA3's
intra-warpgroup overlap); "gluon_ws_2wg" runs two consumer partitions of 4 warps, 64 lines
each. Same contract as ``_union_fwd``: only tiles whose FLAG is 2, a line's weight of position
u is ``count * exp2(score)`` (-inf where its row's count is 0), padding lines and rows past the
end store nothing, and a program whose accumulator holds a NaN stores nothing and sets
``FLAG[tile] = 0`` (the gathering kernel, which runs after, computes those rows).

Scope (:func:`unsupported` says why not, and the Triton union kernel runs then, logged once):
a CUDA device of compute capability 9.0, K/V in float16 or bfloat16, head_dim 256 (the
seed's; four 64-wide chunks), union tiles of 128 lines whose rows' heads fill them
(``TILE_HEADS="pow2"``), 64 positions a step; not under ``TRITON_INTERPRET=1`` (Gluon has no
interpreter).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["BLOCK_M", "BLOCK_N", "MODES", "launch", "unsupported"]

BLOCK_M = 128
BLOCK_N = 64
#: ring stages of K and V (two: Q's 64 KB and 2 x 64 KB of K/V at head_dim 256)
STAGES = 2
#: the producer partition's warps and registers
PRODUCER_WARPS = 4
PRODUCER_REGS = 48
#: the second consumer partition's registers (``MODES["gluon_ws_2wg"]``)
CONSUMER_REGS = 232
#: UNION_ENGINE -> the kernel's consumer MODE: in order; with the softmax under the previous
#: step's PV MMAs; two consumer partitions of 64 lines
MODES = {"gluon_ws": 0, "gluon_ws_overlap": 1, "gluon_ws_2wg": 2}

try:  # Gluon ships with Triton >= 3.5 (experimental); the module imports without it
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed Triton
    _IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = None
    # ``async_copy_global_to_shared`` in Triton 3.5-3.6, ``async_load`` later
    _cp_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared


if _IMPORT_ERROR is None:

    @gluon.jit
    def _uws_consume(Q, OUT, FLAG, CNT_t, qbuf, kbuf, vbuf, kready, vready, kempty, vempty, t,
                     h, hh0, r0, total_q, group, n_u, nsteps, qk_scale, s_qt, s_qh, s_cr, s_ot,
                     s_oh, NC: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                     HP: gl.constexpr, NS: gl.constexpr, SLACK: gl.constexpr,
                     num_warps: gl.constexpr):
        """The consumer (module doc), each step in order: scores (the counts load while they
        run; K's stage released once they are done), softmax, O rescaled where a max moved,
        O += P V, V's stage released."""
        mma_s: gl.constexpr = _uws_mma(num_warps, BN)    # the scores
        mma_o: gl.constexpr = _uws_mma(num_warps, 64)    # O's head-dim chunks
        p_op: gl.constexpr = gl.DotOperandLayout(0, mma_o, 2)
        dt: gl.constexpr = Q.dtype.element_ty
        sn, s_ok, c_row, a0, a1, a2, a3 = _uws_start(
            Q, qbuf, h, hh0, r0, total_q, group, s_qt, s_qh, s_cr, NC, BM, BN, HP, num_warps,
            mma_s, mma_o)
        m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, mma_s))
        l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, mma_s))
        for i in range(nsteps):
            st = i % NS
            ph = (i // NS) & 1
            mbarrier.wait(kready.index(st), ph)
            fence_async_shared()   # the copies (generic proxy) before wgmma reads them
            s = _uws_scores(qbuf, kbuf, st, NC, BM, BN, mma_s)
            cnt = _uws_counts(CNT_t, c_row, s_ok, i * BN + sn, n_u)
            s = warpgroup_mma_wait(0, deps=[s])
            mbarrier.arrive(kempty.index(st), count=1)   # (every warp's MMAs done before it)
            p, m_i, moved, alpha = _uws_softmax(s, cnt, m_i, qk_scale, SLACK)
            if moved:
                a0, a1, a2, a3, l_i = _uws_rescale(a0, a1, a2, a3, l_i, alpha, mma_o)
            l_i += gl.sum(p, 1)
            pa = gl.convert_layout(p.to(dt), p_op)
            mbarrier.wait(vready.index(st), ph)
            fence_async_shared()
            a0, a1, a2, a3 = _uws_pv(pa, vbuf, st, a0, a1, a2, a3, NC)
            a0, a1, a2, a3 = warpgroup_mma_wait(0, deps=[a0, a1, a2, a3])
            mbarrier.arrive(vempty.index(st), count=1)
        _uws_store(OUT, FLAG, t, a0, a1, a2, a3, l_i, h, hh0, r0, total_q, group, s_ot, s_oh,
                   BM, HP, mma_o)

    @gluon.jit
    def _uws_produce(K_h, V_h, SL_t, kbuf, vbuf, kready, vready, kempty, vempty, n_u, nsteps,
                     s_kt, s_vt, NC: gl.constexpr, BN: gl.constexpr, NS: gl.constexpr,
                     OFFS32: gl.constexpr):
        """The producer: each step's slots (loaded before the waits: their latency hides),
        then its K rows into ring stage i % NS once K of step i - NS is scored (``kempty``),
        its V rows once V of step i - NS is used (``vempty``), each arriving on its ``ready``
        barrier when the copies land. K and V release apart, so K of step i + 1 can go out
        while V of step i - 1 is still read."""
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
        offs_c = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
        for i in range(nsteps):
            st = i % NS
            free = ((i // NS) & 1) ^ 1   # the first round passes at once
            u = i * BN + offs_n
            u_ok = u < n_u
            slot = gl.load(SL_t + u, mask=u_ok, other=0)
            if not OFFS32:
                slot = slot.to(gl.int64)
            m = u_ok[:, None] & (offs_c >= 0)[None, :]
            koff = (slot * s_kt)[:, None] + offs_c[None, :]
            voff = (slot * s_vt)[:, None] + offs_c[None, :]
            mbarrier.wait(kempty.index(st), free)
            for c in gl.static_range(NC):
                _cp_load(kbuf.index(st * NC + c), K_h + koff + c * 64, mask=m,
                         eviction_policy="evict_last")
            cp.mbarrier_arrive(kready.index(st), increment_count=False)
            mbarrier.wait(vempty.index(st), free)
            for c in gl.static_range(NC):
                _cp_load(vbuf.index(st * NC + c), V_h + voff + c * 64, mask=m,
                         eviction_policy="evict_last")
            cp.mbarrier_arrive(vready.index(st), increment_count=False)

    @gluon.jit
    def _uws_scores(qbuf, kbuf, st, NC: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                    mma_s: gl.constexpr):
        """S = Q K^T of ring stage ``st``: NC asynchronous wgmma groups (not waited)."""
        s = warpgroup_mma(qbuf.index(0), kbuf.index(st * NC).permute((1, 0)),
                          gl.zeros([BM, BN], gl.float32, mma_s), use_acc=False, is_async=True)
        for c in gl.static_range(1, NC):
            s = warpgroup_mma(qbuf.index(c), kbuf.index(st * NC + c).permute((1, 0)), s,
                              is_async=True)
        return s

    @gluon.constexpr_function
    def _uws_mma(num_warps, n):
        """The wgmma accumulator layout of ``num_warps`` warps (warpgroups along the lines)
        and instruction width ``n``."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                         instr_shape=[16, n, 16])

    @gluon.jit
    def _uws_start(Q, qbuf, h, hh0, r0, total_q, group, s_qt, s_qh, s_cr, NC: gl.constexpr,
                   BM: gl.constexpr, BN: gl.constexpr, HP: gl.constexpr,
                   num_warps: gl.constexpr, mma_s: gl.constexpr, mma_o: gl.constexpr):
        """A consumer's start: its Q lines into shared memory, ``_uws_lines``, and O's four
        zeroed chunks."""
        _uws_load_q(Q, qbuf, h, hh0, r0, total_q, group, s_qt, s_qh, NC, BM, HP, num_warps)
        sn, s_ok, c_row = _uws_lines(r0, hh0, total_q, group, s_cr, BM, BN, HP, mma_s)
        zero = gl.zeros([BM, 64], gl.float32, mma_o)
        return sn, s_ok, c_row, zero, zero, zero, zero

    @gluon.jit
    def _uws_lines(r0, hh0, total_q, group, s_cr, BM: gl.constexpr, BN: gl.constexpr,
                   HP: gl.constexpr, mma_s: gl.constexpr):
        """In the scores' layout: a step's position offsets, which lines are real (row r0 +
        m // HP before total_q, head hh0 + m % HP in the group) and each line's count row."""
        sm = gl.arange(0, BM, layout=gl.SliceLayout(1, mma_s))
        sn = gl.arange(0, BN, layout=gl.SliceLayout(0, mma_s))
        s_ok = ((r0 + sm // HP) < total_q) & ((hh0 + sm % HP) < group)
        return sn, s_ok, (sm // HP).to(gl.int64) * s_cr

    @gluon.jit
    def _uws_rescale(a0, a1, a2, a3, l_i, alpha, mma_o: gl.constexpr):
        """The accumulator's four chunks and the sums times ``alpha`` (to the new maxima)."""
        ao = gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
        return a0 * ao, a1 * ao, a2 * ao, a3 * ao, l_i * alpha

    @gluon.jit
    def _uws_counts(CNT_t, c_row, s_ok, u, n_u):
        """The lines' counts of union positions ``u`` (the 16-bit fields read as int16; 0 for
        padding lines and positions past the union)."""
        cnt = gl.load(CNT_t + c_row[:, None] + u[None, :],
                      mask=s_ok[:, None] & (u < n_u)[None, :], other=0)
        return cnt.to(gl.int32) & 0xFFFF

    @gluon.jit
    def _uws_softmax(s, cnt, m_i, qk_scale, SLACK: gl.constexpr):
        """``_counted_step``'s softmax on a step's scores: (p, the new running max, whether
        some line's max moved by more than SLACK, the factor that takes the accumulator and
        the sums to the new max)."""
        s = gl.where(cnt > 0, s * qk_scale, float("-inf"))
        m_blk = gl.max(s, 1)
        grow = m_blk > m_i + SLACK   # a line's first finite block always (m_i = -inf)
        moved = gl.max(grow.to(gl.int32), 0) > 0
        alpha = gl.exp2(gl.where(grow, m_i, 0.0) - gl.where(grow, m_blk, 0.0))
        m_new = gl.where(grow, m_blk, m_i)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_use[:, None]) * cnt.to(gl.float32)
        return p, m_new, moved, alpha

    @gluon.jit
    def _uws_load_q(Q, qbuf, h, hh0, r0, total_q, group, s_qt, s_qh, NC: gl.constexpr,
                    BM: gl.constexpr, HP: gl.constexpr, num_warps: gl.constexpr):
        """The tile's query lines into shared memory (line m: row r0 + m // HP, head
        hh0 + m % HP, as ``_tile_lines``; zeros for padding lines), fenced for wgmma."""
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        lm = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
        lc = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
        l_row = r0 + lm // HP
        l_head = hh0 + lm % HP
        l_ok = (l_row < total_q) & (l_head < group)
        q_ptr = (Q + l_row.to(gl.int64)[:, None] * s_qt + (h * group + l_head)[:, None] * s_qh
                 + lc[None, :])
        for c in gl.static_range(NC):   # read once: evict-first
            qbuf.index(c).store(gl.load(q_ptr + c * 64, mask=l_ok[:, None] & (lc >= 0)[None, :],
                                        other=0.0, eviction_policy="evict_first"))
        fence_async_shared()

    @gluon.jit
    def _uws_store(OUT, FLAG, t, a0, a1, a2, a3, l_i, h, hh0, r0, total_q, group, s_ot, s_oh,
                   BM: gl.constexpr, HP: gl.constexpr, mma_o: gl.constexpr):
        """O / l into the tile's real lines; nothing, and ``FLAG[t] = 0``, when the
        accumulator holds a NaN (``_hand_back``: a zero weight times a non-finite V value)."""
        nan = (gl.max(gl.max((a0 != a0).to(gl.int32), 1), 0)
               + gl.max(gl.max((a1 != a1).to(gl.int32), 1), 0)
               + gl.max(gl.max((a2 != a2).to(gl.int32), 1), 0)
               + gl.max(gl.max((a3 != a3).to(gl.int32), 1), 0)) > 0
        gl.store(FLAG + t, 0, mask=nan)
        l_safe = gl.where(l_i > 0.0, l_i, 1.0)
        inv = gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, mma_o))[:, None]
        om = gl.arange(0, BM, layout=gl.SliceLayout(1, mma_o))
        oc = gl.arange(0, 64, layout=gl.SliceLayout(0, mma_o))
        o_row = r0 + om // HP
        o_head = hh0 + om % HP
        o_ok = (o_row < total_q) & (o_head < group) & (nan == 0)
        o_ptr = (OUT + o_row.to(gl.int64)[:, None] * s_ot + (h * group + o_head)[:, None] * s_oh
                 + oc[None, :])
        om_ok = o_ok[:, None] & (oc >= 0)[None, :]
        dt: gl.constexpr = OUT.dtype.element_ty
        gl.store(o_ptr, (a0 * inv).to(dt), mask=om_ok)
        gl.store(o_ptr + 64, (a1 * inv).to(dt), mask=om_ok)
        gl.store(o_ptr + 128, (a2 * inv).to(dt), mask=om_ok)
        gl.store(o_ptr + 192, (a3 * inv).to(dt), mask=om_ok)

    @gluon.jit
    def _uws_pv(pa, vbuf, st, a0, a1, a2, a3, NC: gl.constexpr):
        """O += P V of ring stage ``st`` into the four head-dim chunks (NC asynchronous wgmma
        groups, not waited)."""
        a0 = warpgroup_mma(pa, vbuf.index(st * NC), a0, is_async=True)
        a1 = warpgroup_mma(pa, vbuf.index(st * NC + 1), a1, is_async=True)
        a2 = warpgroup_mma(pa, vbuf.index(st * NC + 2), a2, is_async=True)
        a3 = warpgroup_mma(pa, vbuf.index(st * NC + 3), a3, is_async=True)
        return a0, a1, a2, a3

    @gluon.jit
    def _uws_consume_overlap(Q, OUT, FLAG, CNT_t, qbuf, kbuf, vbuf, kready, vready, kempty,
                             vempty, t, h, hh0, r0, total_q, group, n_u, nsteps, qk_scale, s_qt,
                             s_qh, s_cr, s_ot, s_oh, NC: gl.constexpr, BM: gl.constexpr,
                             BN: gl.constexpr, HP: gl.constexpr, NS: gl.constexpr,
                             SLACK: gl.constexpr, num_warps: gl.constexpr):
        """The consumer with the softmax of step i under the PV MMAs of step i - 1 (FA3's
        intra-warpgroup overlap): scores of step i issued, then O += P_{i-1} V_{i-1}, the
        scores waited for (the PV groups left in flight), K's stage released, the softmax,
        then the PV waited for, V's stage released and O rescaled to the new maxima."""
        mma_s: gl.constexpr = _uws_mma(num_warps, BN)    # the scores
        mma_o: gl.constexpr = _uws_mma(num_warps, 64)    # O's head-dim chunks
        p_op: gl.constexpr = gl.DotOperandLayout(0, mma_o, 2)
        dt: gl.constexpr = Q.dtype.element_ty
        sn, s_ok, c_row, a0, a1, a2, a3 = _uws_start(
            Q, qbuf, h, hh0, r0, total_q, group, s_qt, s_qh, s_cr, NC, BM, BN, HP, num_warps,
            mma_s, mma_o)
        # step 0: its scores and softmax (the accumulator is still zero: nothing to rescale);
        # a step's P is carried to the next as the PV MMA's bf16 / fp16 operand
        mbarrier.wait(kready.index(0), 0)
        fence_async_shared()
        s = _uws_scores(qbuf, kbuf, 0, NC, BM, BN, mma_s)
        cnt = _uws_counts(CNT_t, c_row, s_ok, sn, n_u)
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(kempty.index(0), count=1)
        m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, mma_s))
        p, m_i, moved, alpha = _uws_softmax(s, cnt, m_i, qk_scale, SLACK)
        l_i = gl.sum(p, 1)
        pa = gl.convert_layout(p.to(dt), p_op)
        for i in range(1, nsteps):
            st = i % NS
            sp = (i - 1) % NS
            mbarrier.wait(kready.index(st), (i // NS) & 1)
            fence_async_shared()
            s = _uws_scores(qbuf, kbuf, st, NC, BM, BN, mma_s)
            mbarrier.wait(vready.index(sp), ((i - 1) // NS) & 1)
            fence_async_shared()
            a0, a1, a2, a3 = _uws_pv(pa, vbuf, sp, a0, a1, a2, a3, NC)
            s = warpgroup_mma_wait(NC, deps=[s])   # the scores; the NC PV groups in flight
            mbarrier.arrive(kempty.index(st), count=1)
            # the counts only now (fewer registers live beside the MMAs in flight)
            cnt = _uws_counts(CNT_t, c_row, s_ok, i * BN + sn, n_u)
            p, m_new, moved, alpha = _uws_softmax(s, cnt, m_i, qk_scale, SLACK)
            p_sum = gl.sum(p, 1)
            a0, a1, a2, a3 = warpgroup_mma_wait(0, deps=[a0, a1, a2, a3])
            mbarrier.arrive(vempty.index(sp), count=1)
            # P's operand registers only now: the PV MMAs read the previous ones until here (a
            # register an in-flight wgmma reads must not be written: ptxas would serialize)
            pa = gl.convert_layout(p.to(dt), p_op)
            if moved:
                a0, a1, a2, a3, l_i = _uws_rescale(a0, a1, a2, a3, l_i, alpha, mma_o)
            l_i += p_sum
            m_i = m_new
        sp = (nsteps - 1) % NS
        mbarrier.wait(vready.index(sp), ((nsteps - 1) // NS) & 1)
        fence_async_shared()
        a0, a1, a2, a3 = _uws_pv(pa, vbuf, sp, a0, a1, a2, a3, NC)
        a0, a1, a2, a3 = warpgroup_mma_wait(0, deps=[a0, a1, a2, a3])
        _uws_store(OUT, FLAG, t, a0, a1, a2, a3, l_i, h, hh0, r0, total_q, group, s_ot, s_oh,
                   BM, HP, mma_o)

    @gluon.jit
    def _union_ws(Q, K, V, FLAG, USZ, SLOTS, CNT, OUT, qk_scale, group, total_q, tile0, ntiles,
                  s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_lt, s_ct, s_cr, s_ot, s_oh,
                  NC: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, HP: gl.constexpr,
                  NS: gl.constexpr, REVERSE_ROWS: gl.constexpr, SLACK: gl.constexpr,
                  OFFS32: gl.constexpr, MODE: gl.constexpr, P_WARPS: gl.constexpr,
                  P_REGS: gl.constexpr, C_REGS: gl.constexpr, num_warps: gl.constexpr):
        """Tile ``tile0 + program_id(0)`` (scratch row ``program_id(0)``; REVERSE_ROWS: the
        last first) when its FLAG is 2, HP heads of KV head ``program_id(1) // ceil(group /
        HP)``: ``_union_fwd``'s grid and arguments (``CNT`` as int16, ``s_ct`` / ``s_cr`` in
        its elements). MODE (``MODES``): 0 one in-order consumer of 8 warps over the 128 lines;
        1 the same consumer with a step's softmax under the previous step's PV MMAs
        (``_uws_consume_overlap``); 2 two in-order consumers of 4 warps (64 lines each, the
        second a worker partition of C_REGS registers), whose steps drift apart so that one's
        softmax can run under the other's MMAs (FA3's two consumer warpgroups, without its
        explicit alternation)."""
        RP: gl.constexpr = BM // HP
        pid = gl.program_id(0)
        if REVERSE_ROWS:  # noqa: SIM108 (constexpr branch in a kernel)
            lt = ntiles - 1 - pid
        else:
            lt = pid
        t = tile0 + lt
        if gl.load(FLAG + t) != 2:   # another path's tile: nothing to do
            return
        chunks = gl.cdiv(group, HP)
        h = gl.program_id(1) // chunks
        hh0 = (gl.program_id(1) % chunks) * HP
        n_u = gl.load(USZ + t)
        nsteps = gl.maximum(gl.cdiv(n_u, BN), 1)
        dt: gl.constexpr = K.dtype.element_ty
        sw: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                rank=2)
        CM: gl.constexpr = BM if MODE != 2 else BM // 2   # a consumer's lines
        qbuf = gl.allocate_shared_memory(dt, [NC, CM, 64], sw)
        kbuf = gl.allocate_shared_memory(dt, [NS * NC, BN, 64], sw)
        vbuf = gl.allocate_shared_memory(dt, [NS * NC, BN, 64], sw)
        bl: gl.constexpr = mbarrier.MBarrierLayout()
        kready = gl.allocate_shared_memory(gl.int64, [NS, 1], bl)
        vready = gl.allocate_shared_memory(gl.int64, [NS, 1], bl)
        kempty = gl.allocate_shared_memory(gl.int64, [NS, 1], bl)
        vempty = gl.allocate_shared_memory(gl.int64, [NS, 1], bl)
        for st in gl.static_range(NS):
            # ready: every producer thread's copies; empty: each consumer partition's one arrive
            mbarrier.init(kready.index(st), count=P_WARPS * 32)
            mbarrier.init(vready.index(st), count=P_WARPS * 32)
            mbarrier.init(kempty.index(st), count=2 if MODE == 2 else 1)
            mbarrier.init(vempty.index(st), count=2 if MODE == 2 else 1)
        K_h = K + h.to(gl.int64) * s_kh
        V_h = V + h.to(gl.int64) * s_vh
        SL_t = SLOTS + lt.to(gl.int64) * s_lt
        CNT_t = CNT + lt.to(gl.int64) * s_ct
        # (the partitions' arguments spelled out in each call: a tuple held in a variable
        # loses its constexpr members)
        if MODE == 2:
            R2: gl.constexpr = CM // HP   # the second consumer's first row in the tile
            qbuf2 = gl.allocate_shared_memory(dt, [NC, CM, 64], sw)
            gl.warp_specialize(
                [(_uws_consume, (Q, OUT, FLAG, CNT_t, qbuf, kbuf, vbuf, kready, vready, kempty,
                                 vempty, t, h, hh0, t * RP, total_q, group, n_u, nsteps,
                                 qk_scale, s_qt, s_qh, s_cr, s_ot, s_oh, NC, CM, BN, HP, NS,
                                 SLACK, num_warps)),
                 (_uws_consume, (Q, OUT, FLAG, CNT_t + R2 * s_cr, qbuf2, kbuf, vbuf, kready,
                                 vready, kempty, vempty, t, h, hh0, t * RP + R2, total_q, group,
                                 n_u, nsteps, qk_scale, s_qt, s_qh, s_cr, s_ot, s_oh, NC, CM,
                                 BN, HP, NS, SLACK, 4)),
                 (_uws_produce, (K_h, V_h, SL_t, kbuf, vbuf, kready, vready, kempty, vempty,
                                 n_u, nsteps, s_kt, s_vt, NC, BN, NS, OFFS32))],
                [4, P_WARPS], [C_REGS, P_REGS])
        elif MODE == 1:
            gl.warp_specialize(
                [(_uws_consume_overlap, (Q, OUT, FLAG, CNT_t, qbuf, kbuf, vbuf, kready, vready,
                                         kempty, vempty, t, h, hh0, t * RP, total_q, group, n_u,
                                         nsteps, qk_scale, s_qt, s_qh, s_cr, s_ot, s_oh, NC, BM,
                                         BN, HP, NS, SLACK, num_warps)),
                 (_uws_produce, (K_h, V_h, SL_t, kbuf, vbuf, kready, vready, kempty, vempty,
                                 n_u, nsteps, s_kt, s_vt, NC, BN, NS, OFFS32))],
                [P_WARPS], [P_REGS])
        else:
            gl.warp_specialize(
                [(_uws_consume, (Q, OUT, FLAG, CNT_t, qbuf, kbuf, vbuf, kready, vready, kempty,
                                 vempty, t, h, hh0, t * RP, total_q, group, n_u, nsteps,
                                 qk_scale, s_qt, s_qh, s_cr, s_ot, s_oh, NC, BM, BN, HP, NS,
                                 SLACK, num_warps)),
                 (_uws_produce, (K_h, V_h, SL_t, kbuf, vbuf, kready, vready, kempty, vempty,
                                 n_u, nsteps, s_kt, s_vt, NC, BN, NS, OFFS32))],
                [P_WARPS], [P_REGS])


def unsupported(q: Any, k: Any, hp: int, rp: int, bm: int, bn: int) -> str | None:
    """Why the warp-specialized union kernel cannot run this call (None: it can)."""
    import torch

    if _IMPORT_ERROR is not None:
        return f"Gluon is not importable ({_IMPORT_ERROR})"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1: Gluon has no interpreter"
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device) != (9, 0):
        return "it is built for sm_90 (wgmma, setmaxnreg)"
    if k.dtype not in (torch.float16, torch.bfloat16):
        return f"K/V are {k.dtype}; it takes float16 or bfloat16"
    if q.shape[-1] != 256:
        return f"head_dim {q.shape[-1]}; it takes 256 (four 64-wide chunks)"
    if (bm, bn) != (BLOCK_M, BLOCK_N) or rp * hp != bm:
        return (f"union tiles of {bm} lines, {bn} positions a step, {rp} rows x {hp} heads; it "
                f"takes {BLOCK_M} lines filled by the rows' heads (TILE_HEADS='pow2') and "
                f"{BLOCK_N} positions")
    return None


def launch(q: Any, k: Any, v: Any, flag: Any, usz: Any, slots: Any, cnt: Any, out: Any,
           qk_scale: float, group: int, total_q: int, tile0: int, nt: int, hp: int,
           reverse: bool, slack: float, offs32: bool, mode: int = 0) -> None:
    """One launch over tiles ``tile0 .. tile0 + nt`` (scratch rows ``0 .. nt``), on the grid
    of ``_union_fwd``, in consumer ``mode`` (``MODES``); :func:`unsupported` must have said
    None."""
    import torch
    import triton

    hkv = k.shape[1]
    c16 = cnt.view(torch.int16)   # the 16-bit fields, slot position u at element u of a row
    _union_ws[(nt, hkv * triton.cdiv(group, hp))](
        q, k, v, flag, usz, slots, c16, out, qk_scale, group, total_q, tile0, nt,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        slots.stride(0), c16.stride(0), c16.stride(1), out.stride(0), out.stride(1),
        NC=q.shape[-1] // 64, BM=BLOCK_M, BN=BLOCK_N, HP=hp, NS=STAGES, REVERSE_ROWS=reverse,
        SLACK=slack, OFFS32=offs32, MODE=mode, P_WARPS=PRODUCER_WARPS, P_REGS=PRODUCER_REGS,
        C_REGS=CONSUMER_REGS, num_warps=4 if mode == 2 else 8)
