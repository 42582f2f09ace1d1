"""Hand-written Gluon kernels for sparse_prefill (``ENGINE="gluon"`` and, on sm_90,
``ENGINE="gluon_wgmma"`` in the config).

Triton's compiler chooses how the Triton kernel (``triton_kernels.py``) gathers and multiplies;
this kernel fixes the schedule by hand (Gluon is Triton's explicit-layout dialect, experimental
in Triton 3.6):

* **Transposed products.** S^T = K Q^T and O^T = V^T P^T, so the gathered K/V tile is the MMA's
  M operand and the group's query heads sit on its n side, padded to ``BLOCK_M`` = 8 or 16 lines
  (``mma_v2``'s n = 8; the plain orientation pads a group of 6 to 16 lines). The fp32
  accumulator O^T is [head_dim, 8] for groups up to 8: half of the plain one.
* **The warps split head_dim** (``warps_per_cta = [num_warps, 1]``): each warp accumulates its
  share of O^T; S^T is small and each warp computes it whole (no exchange between warps).
* **A cp.async ring** of ``num_stages`` (1 or 2) stages of ``BLOCK_N`` keys in shared memory:
  the K and V rows of a tile's valid entries are gathered by ``cp.async`` (16 bytes a thread,
  zero-filled where invalid), one commit group a tile. With one stage the next tile is issued
  after this tile's products; with two, right after this tile has landed.
* Q^T stays in registers as the B operand for the whole row.

On the H200 at the seed's prefill shape (group 6, top-k 2051, head_dim 256, bf16, KV 16K-32K,
8192 rows) it is about 4% faster than the Triton family: at 128 registers and 20 KB of shared
memory a program (16 keys, 2 warps, 1 stage) eight programs share an SM, and the gather keeps
more of them busy (docs/notes/benchmarks-history.md, "Session 11"). For groups of 9-16 heads
the 16-line accumulator needs ~255 registers and the kernel is slower than the Triton family there.

``ENGINE="gluon_wgmma"`` (``_sparse_prefill_wg``) runs the same transposed products on Hopper's
wgmma, one warpgroup a (row, KV head), head_dim 256: a tile of 64 keys moves through a ring of
three [64 keys, 64 head_dim] shared buffers as eight cp.async chunks (K's four, then V's four),
each issued two steps ahead of its use and across tiles, so a program always has two gathers in
flight (the config's num_stages=2); S^T accumulates over K's chunks with Q^T in shared memory;
the running softmax sums stay per thread (one cross-warp reduction a tile fewer); O^T is four
[64, lines] accumulators (32 registers a thread at 16 lines). With 8 lines at 96 registers
(``MAXNREG``) and 30 KB five programs share an SM, with 16 lines at 128 registers and 35 KB four;
on the H200 at 8192 rows and KV 32K it is 6-7% faster than the Triton family for group 12 and
2-3% faster than the mma_v2 kernel for group 6 (docs/notes/benchmarks-history.md, "Session 13").

Scope (checked by :func:`check_gluon`): prefill rows (and chunk rows after
``CHUNK_MODE="pretranslate"``), float16/bfloat16, head_dim 64, 128 or 256 (wgmma: 256), a CUDA
GPU of compute capability 8.0 or newer (``mma_v2`` and ``cp.async``; wgmma: exactly 9.0), and
not under ``TRITON_INTERPRET=1`` (Gluon has no interpreter). Same contract as the Triton
kernel: negative or out-of-range indices and entries past ``lengths`` are skipped and never
read; a row with nothing valid gives zeros.
"""

from __future__ import annotations

import os
from typing import Any

# the head dims each engine takes: in config.py (pure Python), since validation needs them
from backends.sparse_prefill.config import GLUON_HEAD_DIMS, WGMMA_HEAD_DIM
from registry.errors import ConfigError, KernelUnavailableError

__all__ = ["GLUON_HEAD_DIMS", "WGMMA_HEAD_DIM", "check_gluon", "sparse_prefill_gluon"]

# ENGINE="gluon_wgmma": [64 keys, 64 head_dim] ring buffers and the chunks in flight (each issued
# WG_AHEAD steps before its use; at most WG_RING - 1). Measured on the H200
# (docs/notes/benchmarks-history.md, "Session 13"): 3 and 2 are 1.2-2.5% faster than 2 and 1 at
# 8192-16384 rows; 4 buffers spill
WG_RING = 3
WG_AHEAD = 2
_LOG2E = 1.4426950408889634

try:  # Gluon ships with Triton >= 3.5 (experimental); the module imports without it
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed Triton
    _IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = None
    # the cp.async gather: ``async_copy_global_to_shared`` in Triton 3.5-3.6, renamed
    # ``async_load`` later (the old name then raises)
    _cp_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
    # the CTA barrier: ``thread_barrier`` in Triton 3.6, ``barrier`` later
    _barrier = getattr(gl, "thread_barrier", None) or gl.barrier


if _IMPORT_ERROR is None:

    @gluon.jit
    def _tile_idx(IDX_row, tile, n, offs_n, BN: gl.constexpr):
        """Tile ``tile``'s index entries (-1 past ``n``) and their positions in the row."""
        j = tile * BN + offs_n
        return gl.load(IDX_row + j, mask=j < n, other=-1), j

    @gluon.jit
    def _issue(K_h, V_h, kbuf, vbuf, t, j, tile, n, num_slots, s_kt, s_vt, offs_d,
               NST: gl.constexpr, OFFS32: gl.constexpr):
        """cp.async of the K and V rows of entries ``t`` (tile ``tile``) into ring stage
        ``tile % NST``, zero-filled where the entry is invalid (negative, out of range or past
        ``n``), one commit group; returns which entries are valid."""
        ok = (t >= 0) & (t < num_slots) & (j < n)
        # OFFS32: the wrapper proved (num_slots - 1) * stride + head_dim < 2**31
        row = gl.where(ok, t, 0) if OFFS32 else gl.where(ok, t, 0).to(gl.int64)
        m = ok[:, None] & (offs_d >= 0)[None, :]
        _cp_load(kbuf.index(tile % NST), K_h + (row * s_kt)[:, None] + offs_d[None, :], mask=m)
        _cp_load(vbuf.index(tile % NST), V_h + (row * s_vt)[:, None] + offs_d[None, :], mask=m)
        cp.commit_group()
        return ok

    @gluon.jit
    def _softmax_scores(s, okr, m_i, qk_scale):
        """One online-softmax step on transposed scores ``s`` [keys, lines] (log2 domain after
        ``qk_scale``): invalid keys (``okr`` False) get -inf; returns (p, the rescale factor of
        the old accumulator and running sums, the new running max). A line with nothing valid
        so far keeps max -inf and p 0 (never NaN). The kernels keep their running sums their own
        way: ``_sparse_prefill_gl`` one per line (``l * alpha + sum(p)``), ``_sparse_prefill_wg``
        per thread in the scores' layout (``l_p * alpha + p``, summed over the keys once at the
        end, so a tile needs no cross-warp sum)."""
        s = gl.where(okr[:, None], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[None, :])
        return p, alpha, m_new

    @gluon.jit
    def _store_t(OUT, acc, l_i, r, h, group, s_ot, s_oh, keep, D: gl.constexpr,
                 BM: gl.constexpr, mma: gl.constexpr):
        """O = (O^T / l)^T into row ``r``'s lines of KV head ``h`` (the ``group`` real ones of
        ``BM``); a line with nothing valid (l = 0) stores zeros; nothing where ``keep`` is
        False."""
        l_safe = gl.where(l_i > 0.0, l_i, 1.0)
        o = acc / l_safe[None, :]
        od = gl.arange(0, D, layout=gl.SliceLayout(1, mma))
        om = gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        optr = OUT + r * s_ot + (h * group + om)[None, :] * s_oh + od[:, None]
        gl.store(optr, o.to(OUT.dtype.element_ty),
                 mask=((om < group) & keep)[None, :] & (od >= 0)[:, None])

    @gluon.jit
    def _sparse_prefill_gl(Q, K, V, IDX, LENS, OUT, FLAG, qk_scale, num_slots, topk, group,
                           s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_it, s_ot, s_oh,
                           D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                           NST: gl.constexpr, HAS_LENS: gl.constexpr, OFFS32: gl.constexpr,
                           SKIP_TILES: gl.constexpr, TILE_RP: gl.constexpr,
                           num_warps: gl.constexpr):
        """One program a (query row, KV head): the module doc's schedule (SKIP_TILES as the
        wgmma kernel's)."""
        r = gl.program_id(0).to(gl.int64)
        h = gl.program_id(1)
        keep = _wg_keep(FLAG, r, SKIP_TILES, TILE_RP)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0],
                                                      warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, 8])
        a_op: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
        b_op: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
        # 8 elements (16 bytes) a thread, a row's D / 8 threads side by side
        TD: gl.constexpr = D // 8 if D < 256 else 32
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TD, TD], [num_warps, 1], [1, 0])
        sw: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
        offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
        kbuf = gl.allocate_shared_memory(K.dtype.element_ty, [NST, BN, D], sw)
        vbuf = gl.allocate_shared_memory(K.dtype.element_ty, [NST, BN, D], sw)
        n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk) if HAS_LENS else topk
        n = gl.where(keep, n, 0)
        IDX_row = IDX + r * s_it
        K_h = K + h.to(gl.int64) * s_kh
        V_h = V + h.to(gl.int64) * s_vh
        t0, j0 = _tile_idx(IDX_row, 0, n, offs_n, BN)
        ok = _issue(K_h, V_h, kbuf, vbuf, t0, j0, 0, n, num_slots, s_kt, s_vt, offs_d, NST,
                    OFFS32)
        offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
        q = gl.load(Q + r * s_qt + (h * group + offs_m)[:, None] * s_qh + offs_d[None, :],
                    mask=(offs_m < group)[:, None] & (offs_d >= 0)[None, :], other=0.0)
        qt_b = gl.convert_layout(gl.permute(q, [1, 0]), b_op)
        acc = gl.zeros([D, BM], gl.float32, mma)
        m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
        l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(0, mma))
        for tile in range(gl.cdiv(n, BN)):
            okr = gl.convert_layout(ok, gl.SliceLayout(1, mma))
            if NST == 2:  # the next tile's entries load while this tile lands
                t_n, j_n = _tile_idx(IDX_row, tile + 1, n, offs_n, BN)
            cp.wait_group(0)
            _barrier()
            if NST == 2:  # the other stage was read in the previous iteration: refill it now
                ok = _issue(K_h, V_h, kbuf, vbuf, t_n, j_n, tile + 1, n, num_slots, s_kt, s_vt,
                            offs_d, NST, OFFS32)
            st = tile % NST
            s = mma_v2(kbuf.index(st).load(a_op), qt_b, gl.zeros([BN, BM], gl.float32, mma))
            p, alpha, m_i = _softmax_scores(s, okr, m_i, qk_scale)
            l_i = l_i * alpha + gl.sum(p, 0)
            pb = gl.convert_layout(p.to(K.dtype.element_ty), b_op)
            acc = mma_v2(vbuf.index(st).permute([1, 0]).load(a_op), pb, acc * alpha[None, :])
            if NST == 1:
                # the next tile's entries load before the barrier (their latency overlaps the
                # wait); every warp is done with the only stage before it is refilled
                t_n, j_n = _tile_idx(IDX_row, tile + 1, n, offs_n, BN)
                _barrier()
                ok = _issue(K_h, V_h, kbuf, vbuf, t_n, j_n, tile + 1, n, num_slots, s_kt, s_vt,
                            offs_d, NST, OFFS32)
        cp.wait_group(0)
        _store_t(OUT, acc, l_i, r, h, group, s_ot, s_oh, keep, D, BM, mma)


if _IMPORT_ERROR is None:

    @gluon.jit
    def _wg_keep(FLAG, r, SKIP_TILES: gl.constexpr, TILE_RP: gl.constexpr):
        """Whether a per-row program computes row ``r``: not when SKIP_TILES and its tile's
        ``FLAG`` is not 0 (the dense or union kernel stored the tile's rows)."""
        if SKIP_TILES:  # noqa: SIM108 (constexpr branch in a kernel)
            keep = gl.load(FLAG + r // TILE_RP) == 0
        else:
            keep = r >= 0
        return keep

    @gluon.jit
    def _wg_tile(t, j, n, num_slots, offs_c, s_kt, s_vt, OFFS32: gl.constexpr,
                 SAME_STRIDE: gl.constexpr):
        """A tile's K and V row offsets (slot 0 where invalid), the copy mask [BN, 64] and the
        entries' validity [BN], from its index entries ``t`` at positions ``j``."""
        ok = (t >= 0) & (t < num_slots) & (j < n)
        # OFFS32: the wrapper proved (num_slots - 1) * stride + head_dim < 2**31
        row = gl.where(ok, t, 0) if OFFS32 else gl.where(ok, t, 0).to(gl.int64)
        koff = row * s_kt
        voff = koff if SAME_STRIDE else row * s_vt
        return koff, voff, ok[:, None] & (offs_c >= 0)[None, :], ok

    @gluon.jit
    def _wg_entries(IDX_row, tile, n, offs_n, BN: gl.constexpr):
        """Tile ``tile``'s index entries (-1 past ``n``; read once: evict-first) and their
        positions in the row."""
        j = tile * BN + offs_n
        return gl.load(IDX_row + j, mask=j < n, other=-1, eviction_policy="evict_first"), j

    @gluon.jit
    def _wg_issue(K_h, V_h, koff, voff, okm, ring, buf, offs_c, STEP: gl.constexpr):
        """cp.async of chunk ``STEP`` of a tile (0-3: K's head_dim chunk STEP, 4-7: V's chunk
        STEP - 4; 64 columns each) into ring buffer ``buf``, zero-filled where ``okm`` is
        False; one commit group. K/V are kept in L2 (evict-last): every row gathers them."""
        if STEP < 4:
            ptr = (K_h + koff)[:, None] + offs_c[None, :] + STEP * 64
        else:
            ptr = (V_h + voff)[:, None] + offs_c[None, :] + (STEP - 4) * 64
        _cp_load(ring.index(buf), ptr, mask=okm, eviction_policy="evict_last")
        cp.commit_group()

    @gluon.jit
    def _wg_step(K_h, V_h, koff, voff, okm, koff_n, voff_n, okm_n, ring, g0, offs_c,
                 STEP: gl.constexpr, NB: gl.constexpr, LA: gl.constexpr):
        """Step STEP of a tile whose first chunk is the program's chunk ``g0``: wait for this
        step's chunk (the LA - 1 issued after it stay in flight), make it visible to wgmma
        (barrier, async fence), then issue the chunk LA steps ahead (the next tile's past step
        7) into the buffer every warp finished with in the previous step. Chunk g goes to
        buffer g % NB, so LA <= NB - 1."""
        cp.wait_group(LA - 1)
        _barrier()
        fence_async_shared()
        if STEP + LA < 8:
            _wg_issue(K_h, V_h, koff, voff, okm, ring, (g0 + STEP + LA) % NB, offs_c, STEP + LA)
        else:
            _wg_issue(K_h, V_h, koff_n, voff_n, okm_n, ring, (g0 + STEP + LA) % NB, offs_c,
                      STEP + LA - 8)

    @gluon.jit
    def _wg_qk(K_h, V_h, koff, voff, okm, koff_n, voff_n, okm_n, ring, g0, offs_c, qbuf, s,
               STEP: gl.constexpr, NB: gl.constexpr, LA: gl.constexpr):
        """Step STEP (0-3): its chunk of K, then S^T += K_c Q_c^T (the first step starts S^T)."""
        _wg_step(K_h, V_h, koff, voff, okm, koff_n, voff_n, okm_n, ring, g0, offs_c, STEP, NB,
                 LA)
        return warpgroup_mma(ring.index((g0 + STEP) % NB), qbuf.index(STEP).permute((1, 0)), s,
                             use_acc=STEP > 0)

    @gluon.jit
    def _wg_pv(K_h, V_h, koff, voff, okm, koff_n, voff_n, okm_n, ring, g0, offs_c, pt, acc,
               alpha, STEP: gl.constexpr, NB: gl.constexpr, LA: gl.constexpr):
        """Step STEP (4-7): its chunk of V, then O^T's chunk STEP - 4 = acc * alpha + V_c^T P^T."""
        _wg_step(K_h, V_h, koff, voff, okm, koff_n, voff_n, okm_n, ring, g0, offs_c, STEP, NB,
                 LA)
        return warpgroup_mma(ring.index((g0 + STEP) % NB).permute((1, 0)), pt,
                             acc * alpha[None, :])

    @gluon.jit
    def _wg_store(OUT, acc, l_i, r, h, group, s_ot, s_oh, keep, C0: gl.constexpr,
                  BM: gl.constexpr, mma: gl.constexpr):
        """O^T's head_dim chunk C0..C0+63, divided by the sums, into row ``r``'s ``group``
        lines of KV head ``h`` (evict-first: written once); zeros where nothing was valid.
        Nothing where ``keep`` is False (a row another path computed)."""
        l_safe = gl.where(l_i > 0.0, l_i, 1.0)
        o = acc / l_safe[None, :]
        od = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
        om = gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        optr = OUT + r * s_ot + (h * group + om)[None, :] * s_oh + (C0 + od)[:, None]
        gl.store(optr, o.to(OUT.dtype.element_ty),
                 mask=((om < group) & keep)[None, :] & (od >= 0)[:, None],
                 eviction_policy="evict_first")

    @gluon.jit
    def _sparse_prefill_wg(Q, K, V, IDX, LENS, OUT, FLAG, qk_scale, num_slots, topk, group,
                           s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_it, s_ot, s_oh,
                           BM: gl.constexpr, HAS_LENS: gl.constexpr, OFFS32: gl.constexpr,
                           SAME_STRIDE: gl.constexpr, NB: gl.constexpr, LA: gl.constexpr,
                           SKIP_TILES: gl.constexpr, TILE_RP: gl.constexpr,
                           num_warps: gl.constexpr):
        """ENGINE="gluon_wgmma": one warpgroup a (query row, KV head), head_dim 256. A tile of
        64 keys moves through a ring of NB [64 keys, 64 head_dim] shared buffers as eight
        cp.async chunks (K's four, then V's four), each issued LA steps ahead of its use and
        across tiles, so a program always has LA gathers in flight (8 KB each). S^T = K Q^T
        accumulates over K's chunks on wgmma (Q^T in shared memory), then the online softmax
        (the running sums stay per thread and are reduced once at the end), then O^T's four
        [64, BM] chunks += V_c^T P^T (P^T through shared memory). SKIP_TILES: rows of the
        tiles (``TILE_RP`` rows) whose ``FLAG`` is not 0 (a dense or union program stored
        them) stream nothing and store nothing."""
        BN: gl.constexpr = 64
        r = gl.program_id(0).to(gl.int64)
        h = gl.program_id(1)
        dt: gl.constexpr = K.dtype.element_ty
        keep = _wg_keep(FLAG, r, SKIP_TILES, TILE_RP)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0],
                                                      warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BM, 16])
        # 8 elements (16 bytes) a thread, 8 threads a 64-column row
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        sw: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                rank=2)
        ring = gl.allocate_shared_memory(dt, [NB, BN, 64], sw)
        qbuf = gl.allocate_shared_memory(dt, [4, BM, 64], sw)
        pbuf = gl.allocate_shared_memory(dt, [BM, BN], sw)
        offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
        offs_c = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
        n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk) if HAS_LENS else topk
        n = gl.where(keep, n, 0)
        IDX_row = IDX + r * s_it
        K_h = K + h.to(gl.int64) * s_kh
        V_h = V + h.to(gl.int64) * s_vh
        t, j = _wg_entries(IDX_row, 0, n, offs_n, BN)
        koff, voff, okm, ok = _wg_tile(t, j, n, num_slots, offs_c, s_kt, s_vt, OFFS32,
                                       SAME_STRIDE)
        for c in gl.static_range(LA):
            _wg_issue(K_h, V_h, koff, voff, okm, ring, c % NB, offs_c, c)
        offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
        for c in gl.static_range(4):  # the group's lines of Q, read once: evict-first
            qc = gl.load(Q + r * s_qt + (h * group + offs_m)[:, None] * s_qh + c * 64
                         + offs_c[None, :],
                         mask=(offs_m < group)[:, None] & (offs_c >= 0)[None, :], other=0.0,
                         eviction_policy="evict_first")
            qbuf.index(c).store(qc)
        a0 = gl.zeros([64, BM], gl.float32, mma)
        a1 = gl.zeros([64, BM], gl.float32, mma)
        a2 = gl.zeros([64, BM], gl.float32, mma)
        a3 = gl.zeros([64, BM], gl.float32, mma)
        m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
        l_p = gl.zeros([BN, BM], gl.float32, mma)
        for tile in range(gl.cdiv(n, BN)):
            g0 = (tile * 8) % NB  # the buffer of this tile's first chunk
            # the next tile's entries: loaded now, their offsets computed after the softmax
            # (needed from step 8 - LA on; fewer live registers than offsets and masks)
            t_n, j_n = _wg_entries(IDX_row, tile + 1, n, offs_n, BN)
            koff_n = koff  # placeholders until then
            voff_n = voff
            okm_n = okm
            okr = gl.convert_layout(ok, gl.SliceLayout(1, mma))
            s = gl.zeros([BN, BM], gl.float32, mma)
            for c in gl.static_range(4):  # S^T over K's four chunks
                s = _wg_qk(K_h, V_h, koff, voff, okm, koff_n, voff_n, okm_n, ring, g0, offs_c,
                           qbuf, s, c, NB, LA)
            # online softmax on S^T [keys, lines]; each thread keeps the sums of its own keys
            p, alpha, m_i = _softmax_scores(s, okr, m_i, qk_scale)
            l_p = l_p * alpha[None, :] + p
            pbuf.store(gl.permute(p.to(dt), [1, 0]))
            pt = pbuf.permute((1, 0))
            koff_n, voff_n, okm_n, ok_n = _wg_tile(t_n, j_n, n, num_slots, offs_c, s_kt, s_vt,
                                                   OFFS32, SAME_STRIDE)
            args = (K_h, V_h, koff, voff, okm, koff_n, voff_n, okm_n, ring, g0, offs_c, pt)
            a0 = _wg_pv(*args, a0, alpha, 4, NB, LA)
            a1 = _wg_pv(*args, a1, alpha, 5, NB, LA)
            a2 = _wg_pv(*args, a2, alpha, 6, NB, LA)
            a3 = _wg_pv(*args, a3, alpha, 7, NB, LA)
            koff = koff_n
            voff = voff_n
            okm = okm_n
            ok = ok_n
        cp.wait_group(0)
        l_i = gl.sum(l_p, 0)
        _wg_store(OUT, a0, l_i, r, h, group, s_ot, s_oh, keep, 0, BM, mma)
        _wg_store(OUT, a1, l_i, r, h, group, s_ot, s_oh, keep, 64, BM, mma)
        _wg_store(OUT, a2, l_i, r, h, group, s_ot, s_oh, keep, 128, BM, mma)
        _wg_store(OUT, a3, l_i, r, h, group, s_ot, s_oh, keep, 192, BM, mma)


def check_gluon(q: Any, engine: str = "gluon") -> None:
    """Raise an error naming the fix when ``ENGINE=engine`` ("gluon" or "gluon_wgmma") cannot
    run this call: :class:`KernelUnavailableError` when this machine cannot run it (no Gluon,
    the interpreter, not an NVIDIA GPU, a capability it lacks; the conformance kit reports that
    as not runnable here), :class:`ConfigError` when the call's inputs do not fit it."""
    import torch

    fix = "use ENGINE='triton' (the default)"
    e = f"ENGINE={engine!r}"
    if _IMPORT_ERROR is not None:
        raise KernelUnavailableError(f"{e} needs Triton's Gluon (Triton >= 3.6), which does "
                                     f"not import here ({_IMPORT_ERROR}): {fix}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise KernelUnavailableError(f"{e} does not run under TRITON_INTERPRET=1 (Gluon has no "
                                     f"interpreter): {fix}")
    if q.device.type != "cuda" or getattr(torch.version, "hip", None):
        raise KernelUnavailableError(f"{e} runs on NVIDIA GPUs only (got a {q.device.type} "
                                     f"tensor): {fix}")
    cap = torch.cuda.get_device_capability(q.device)
    if engine == "gluon_wgmma" and cap != (9, 0):
        raise KernelUnavailableError(f"{e} needs compute capability 9.0 (Hopper's wgmma); "
                                     f"this GPU is {cap[0]}.{cap[1]}: use ENGINE='gluon' "
                                     f"(sm_80+) or ENGINE='triton'")
    if cap < (8, 0):
        raise KernelUnavailableError(f"{e} needs compute capability >= 8.0 (mma_v2, "
                                     f"cp.async); this GPU is {cap[0]}.{cap[1]}: {fix}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ConfigError(f"{e} takes float16 or bfloat16 inputs (got {q.dtype}): {fix}")
    dims = (WGMMA_HEAD_DIM,) if engine == "gluon_wgmma" else GLUON_HEAD_DIMS
    if q.shape[2] not in dims:
        raise ConfigError(f"{e} takes head_dim in {dims} (got {q.shape[2]}): "
                          + ("use ENGINE='gluon' or ENGINE='triton'" if engine == "gluon_wgmma"
                             else fix))


def _check_aligned(k: Any, v: Any, engine: str) -> None:
    """cp.async moves 16 bytes: Triton must see 16-byte aligned rows (a pointer and strides it
    specializes as multiples of 16)."""
    for name, t in (("k", k), ("v", v)):
        if t.data_ptr() % 16 or t.stride(0) % 16 or t.stride(1) % 16:
            raise ConfigError(f"ENGINE={engine!r} gathers 16-byte aligned rows: {name} needs a "
                              f"16-byte aligned base and strides that are multiples of 16 "
                              f"elements (got data_ptr % 16 = {t.data_ptr() % 16}, strides "
                              f"{tuple(t.stride())}): pass {name}.contiguous() or use "
                              f"ENGINE='triton'")


def sparse_prefill_gluon(q: Any, k: Any, v: Any, idx: Any, lens: Any, has_lens: bool, out: Any,
                         scale: float, config: dict[str, Any], offs32: bool, flag: Any = None,
                         tile_rp: int = 1) -> Any:
    """Launch the ``ENGINE`` kernel of ``config`` ("gluon": the mma_v2 kernel; "gluon_wgmma":
    the wgmma kernel) on prefill rows (``idx`` slot ids); ``out`` is written in place.

    Reached only through ``sparse_prefill_triton``, which runs the op's input check
    (``backends.sparse_prefill.check_inputs``) first: the last axis of q, k, v and ``idx`` has
    unit stride, their other strides are passed to the kernels, and ``lens`` (1-D, read at unit
    stride) is contiguous (the wrapper copies a strided ``lengths`` view). ``flag`` (int32
    per tile of ``tile_rp`` rows; DENSE / UNION): the rows of tiles whose flag is not 0 are
    another path's and are left alone."""
    engine = config.get("ENGINE", "gluon")
    check_gluon(q, engine)
    _check_aligned(k, v, engine)
    total_q, hq, d = q.shape
    num_slots, hkv, _ = k.shape
    extra = {"maxnreg": config["MAXNREG"]} if config.get("MAXNREG") else {}
    skip = {"SKIP_TILES": flag is not None, "TILE_RP": tile_rp}
    flag = flag if flag is not None else idx  # dummy pointer, never read
    if engine == "gluon_wgmma":
        _sparse_prefill_wg[(total_q, hkv)](
            q, k, v, idx, lens, out, flag, scale * _LOG2E, num_slots, idx.shape[1], hq // hkv,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            idx.stride(0), out.stride(0), out.stride(1), BM=config["BLOCK_M"],
            HAS_LENS=has_lens, OFFS32=offs32, SAME_STRIDE=k.stride(0) == v.stride(0),
            NB=WG_RING, LA=WG_AHEAD, num_warps=4, **skip, **extra)
        return out
    _sparse_prefill_gl[(total_q, hkv)](
        q, k, v, idx, lens, out, flag, scale * _LOG2E, num_slots, idx.shape[1], hq // hkv,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        idx.stride(0), out.stride(0), out.stride(1), D=d, BM=config["BLOCK_M"],
        BN=config["BLOCK_N"], NST=config["num_stages"], HAS_LENS=has_lens, OFFS32=offs32,
        num_warps=config["num_warps"], **skip, **extra)
    return out
