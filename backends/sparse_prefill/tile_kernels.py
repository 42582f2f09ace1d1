"""Row-tile paths of ``sparse_prefill``: dense span and union (Triton kernels and their host
side), imported by ``triton_kernels.py``.

Both take the rows in tiles of ``RP = BM // HP`` consecutive rows (DENSE_TILE's geometry, see
``config.py``) and run a tile's ``RP x HP`` query lines on the tensor cores at once, so a K/V row
that several rows of a tile select is loaded once for all of them:

* **dense span** (DENSE=N): the tile's rows select most of the slots between their least and
  greatest one (span <= N% of their mean valid entries); one program streams the span's
  contiguous K/V blocks (TMA boxes) with per-row 16-bit multiplicities.
* **union** (UNION=U): the tile's rows share most of their slots (the union of what they select
  has at most U% of their mean valid entries); a pre-pass marks the selected slots in a bitmap
  over the tile's span, counts them (exact union size), and for the tiles that go union writes
  the union's slots compacted in ascending order (prefix sums of the bitmap's popcounts) and
  every row's 16-bit multiplicity at each union position; one program gathers the union's K/V
  rows by slot (pointer loads) once for its lines.

The choice (dense / union / per-row gathering) is made on the GPU per tile, by the pre-passes
(``_dense_tile``; ``_union_prep`` writes ``FLAG[tile]``: 0 gather, 1 dense, 2 union), never on
the host, so a call stays CUDA-graph capturable; the gathering kernel skips the tiles taken
here. In both kernels a line's weight of a slot is ``count * exp(score)``, 0 where the count
is 0 (-1, out-of-range and past-length entries are never
counted). A zero weight times a non-finite V value (a slot in the span or the union that the
line does not count) would be NaN, so a program whose accumulator holds any NaN stores nothing
and hands its tile back (``FLAG[tile] = 0``): the gathering kernel, which runs after, then
computes those rows by the op's non-finite rules (a NaN that a row does select sends its tile
back too; rare inputs pay twice, every other call nothing in the loops).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import triton
import triton.language as tl

from backends.sparse_prefill import union_ws
from backends.sparse_prefill.config import _dense_tile_geometry, tile_rows, union_tile
from registry.errors import ConfigError

__all__ = ["ChunkIds", "row_stats", "row_tiles", "union_prep_triton"]

_DENSE_SCRATCH_BYTES = 256 << 20  # DENSE's count scratch at most (rows are done in chunks)
_DENSE_COUNT_BLOCK = 512  # entries (and count words) a DENSE counting program handles per step
_UNION_SCRATCH_BYTES = 256 << 20  # UNION's bitmaps, slots and counts at most (tile chunks)
_UNION_BLOCK = 512  # entries a union pre-pass program handles per step
_UNION_WORDS = 64  # bitmap words (of 32 slots) a union pre-pass program handles per step
_UNION_WARPS = 4
#: The mark pass ORs runs of entries in one bitmap word before one atomic (``RUNS``) when a
#: row's entries average at least this many a word of the span (``topk * 32 / ids``): the
#: H200 A/B of session 20 measured the runs 0.93x at KV 8K (8 a word) and 1.03x at 32K (2).
_MARK_RUN_ENTRIES = 4


class ChunkIds(NamedTuple):
    """Chunk rows' union ids (UNION without DENSE on ``CHUNK_MODE="pretranslate"``): the union
    of a tile is taken over its rows' token positions, not their KV slots. An indexer emits a
    row's positions ascending, so a warp's bitmap and count atomics fall in a few words; the
    slots a shuffled page table maps them to scatter over the whole cache. Positions name the
    same K/V row only within a request, so a tile whose rows span two requests is gathered;
    ``_union_size`` translates the union's positions to slots through the page table.

    ``ids``: int32 [total_q, topk], an entry's position where it is valid (the translated slot
    is not -1), else -1; ``row_req``: int32 [total_q], each row's request; ``page_table``,
    ``page_size``: the call's; ``num_ids``: a bound on the positions (pages x page size)."""

    ids: Any
    row_req: Any
    page_table: Any
    page_size: int
    num_ids: int


#: Tests set a list here: every call with UNION appends its ``FLAG`` tensor (per tile: 0 the
#: gathering kernel, 1 dense, 2 union), so a test can assert which tiles took which path.
TILE_PATHS: list[Any] | None = None


def _check_counts(key: str, topk: int) -> None:
    if topk > 0xFFFF:
        raise ConfigError(f"{key} counts a slot's multiplicity in 16 bits, so top-k <= 65535 "
                          f"(got {topk}): use {key}=0")


def _rescale_slack(dtype: Any, topk: int) -> float:
    """``_counted_step``'s ``SLACK``: how far (log2 units) a line's block maximum may pass its
    running maximum before the accumulator is rescaled. The weights fed to the second MMA are
    then at most ``2**SLACK`` times a count (<= top-k), which must stay finite in the K/V dtype:
    8 (a factor of 256) for bf16 and fp32; for fp16 (largest finite 65504) the most that keeps
    ``topk * 2**SLACK`` in range."""
    import torch

    if dtype != torch.float16:
        return 8.0
    if topk > 65504:
        raise ConfigError(f"DENSE and UNION weight a slot by its multiplicity, up to top-k = "
                          f"{topk}, which fp16 cannot hold (largest finite 65504): use bf16 K/V, "
                          f"or DENSE=0 and UNION=0")
    slack = 0
    while slack < 8 and topk << (slack + 1) <= 65504:
        slack += 1
    return float(slack)


# --------------------------------------------------------------------------------------------
# kernels: statistics and the dense span
# --------------------------------------------------------------------------------------------


@triton.jit
def _hand_back(FLAG, tile, acc, mine):
    """Whether a row-tile program that computed ``tile`` (``mine``) stores it: not when its
    accumulator holds a NaN, which may be a zero weight times a non-finite V value of a slot a
    line does not count; then ``FLAG[tile] = 0`` gives the tile's rows to the gathering kernel
    (every program of a tile that hands back writes the same 0)."""
    nan = tl.max(tl.max((acc != acc).to(tl.int32), 1), 0) > 0
    tl.store(FLAG + tile, 0, mask=mine & nan)
    return mine & (nan == 0)


@triton.jit
def _counted_step(q, k, v, c, m_i, l_i, acc, qk_scale, DOT_PREC: tl.constexpr,
                  SLACK: tl.constexpr):
    """One block of a row tile's slots (dense span or union): a line's weight of a slot is
    ``count * exp2(score - m)``, 0 where its row's count is 0, with ``m`` the line's running
    maximum; the online-softmax update of ``(m_i, l_i, acc)``. ``m`` moves (and the
    accumulator is rescaled) only when some line's block maximum passes it by more than
    ``SLACK`` (``_rescale_slack``): the result ``acc / l`` is the same for any ``m`` (both
    carry the same factor), and the loop mostly skips the rescale's multiply of the whole
    accumulator."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    s = tl.where(c > 0, s * qk_scale, float("-inf"))
    m_blk = tl.max(s, 1)
    grow = m_blk > m_i + SLACK  # a line's first finite block always (m_i = -inf)
    if tl.max(grow.to(tl.int32), 0) > 0:
        alpha = tl.exp2(tl.where(grow, m_i, 0.0) - tl.where(grow, m_blk, 0.0))  # 1 if not grow
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = tl.where(grow, m_blk, m_i)
    m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
    p = tl.exp2(s - m_use[:, None]) * c.to(tl.float32)
    l_i += tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
    return m_i, l_i, acc


@triton.jit
def _row_stats(IDX, LENS, LO, HI, NV, num_slots, topk, s_it, HAS_LENS: tl.constexpr,
               BLOCK: tl.constexpr):
    """DENSE: the least and greatest valid slot of row ``program_id(0)`` (``num_slots`` / -1
    when it has none) and its number of valid entries."""
    r = tl.program_id(0).to(tl.int64)
    if HAS_LENS:  # noqa: SIM108 (constexpr branch in a kernel)
        n = tl.minimum(tl.maximum(tl.load(LENS + r), 0), topk)
    else:
        n = topk
    lo = num_slots + 0 * n
    hi = -1 + 0 * n
    nv = 0 * n
    for c0 in range(0, n, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        t = tl.load(IDX + r * s_it + j, mask=j < n, other=-1)
        ok = (t >= 0) & (t < num_slots)
        lo = tl.minimum(lo, tl.min(tl.where(ok, t, num_slots), 0))
        hi = tl.maximum(hi, tl.max(tl.where(ok, t, -1), 0))
        nv += tl.sum(ok.to(tl.int32), 0)
    tl.store(LO + r, lo)
    tl.store(HI + r, hi)
    tl.store(NV + r, nv)


@triton.jit
def _tile_rows(tile, total_q, RP: tl.constexpr, RP_P: tl.constexpr):
    """The rows ``tile * RP + i`` of a tile, i < RP_P (RP rounded up to a power of two: RP is
    not one with TILE_HEADS="group"), and which of them are real (i < RP, row < total_q)."""
    i = tl.arange(0, RP_P)
    rr = tile * RP + i
    if RP == RP_P:  # noqa: SIM108 (constexpr branch in a kernel)
        ok = rr < total_q
    else:
        ok = (i < RP) & (rr < total_q)
    return rr, ok


@triton.jit
def _row_onehot(m_ok, HP: tl.constexpr, BLOCK_M: tl.constexpr, RP_P: tl.constexpr):
    """[BLOCK_M, RP_P] float16: 1 where line m's row is the tile's row j (``m // HP == j``, a
    real line). Tiles whose RP rows do not broadcast to their BLOCK_M lines (TILE_HEADS="group")
    take their lines' counts from their rows' with it (``_line_counts``)."""
    hit = (tl.arange(0, BLOCK_M) // HP)[:, None] == tl.arange(0, RP_P)[None, :]
    return (hit & m_ok[:, None]).to(tl.float16)


@triton.jit
def _line_counts(onehot, cr):
    """The lines' counts [BLOCK_M, BLOCK_N] (float32) from the tile rows' ``cr`` [RP_P,
    BLOCK_N] (16-bit, rows past RP zero): two MMAs of the one-hot with the counts' low and high
    bytes (each exact in float16, one term a sum), in the scores' layout: no per-line loads."""
    lo = tl.dot(onehot, (cr & 0xFF).to(tl.float16))
    hi = tl.dot(onehot, (cr >> 8).to(tl.float16))
    return lo + 256.0 * hi


@triton.jit
def _word_counts(w, n, onehot, RP: tl.constexpr, HP: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """The lines' counts [BLOCK_M, BLOCK_N] from the tile rows' count words ``w`` [RP_P,
    BLOCK_N] at positions ``n`` (two 16-bit fields a word): each row's broadcast over its HP
    lines where RP rows fill the BLOCK_M lines, else by the one-hot MMAs (``onehot`` is only
    read then)."""
    cr = (w >> ((n[None, :] & 1) * 16)) & 0xFFFF  # [RP_P, BLOCK_N]
    if RP * HP == BLOCK_M:
        c = tl.reshape(tl.broadcast_to(cr[:, None, :], (RP, HP, BLOCK_N)), (BLOCK_M, BLOCK_N))
    else:
        c = _line_counts(onehot, cr)
    return c


@triton.jit
def _dense_tile(LO, HI, NV, tile, total_q, dense_span, RP: tl.constexpr, RP_P: tl.constexpr):
    """Whether DENSE handles the rows ``tile * RP ..`` (scalar): the slots between the least and
    the greatest one they select number at most ``dense_span`` percent of their mean count of
    valid entries. Every kernel of a DENSE call decides a tile with this one function."""
    rr, ok = _tile_rows(tile, total_q, RP, RP_P)
    lo = tl.min(tl.load(LO + rr, mask=ok, other=2**31 - 1), 0)
    hi = tl.max(tl.load(HI + rr, mask=ok, other=-1), 0)
    nv = tl.sum(tl.load(NV + rr, mask=ok, other=0).to(tl.int64), 0)
    span = tl.maximum(hi - lo + 1, 0).to(tl.int64)
    return span * RP * 100 <= nv * dense_span


@triton.jit
def _count_slots(IDX, LENS, LO, HI, NV, CNT, FLAG, num_slots, topk, row0, total_q, dense_span,
                 s_it, s_ct, HAS_LENS: tl.constexpr, RP: tl.constexpr, RP_P: tl.constexpr,
                 BLOCK: tl.constexpr, FLAG_SET: tl.constexpr):
    """DENSE: for row ``row0 + program_id(0)`` of a dense tile, the multiplicity of every slot of
    the row's own span ``[LO, HI]`` in 16-bit fields (slot s: ``CNT[i, s >> 1] >> (16 * (s &
    1)) & 0xFFFF``). Only those words are zeroed and counted; the dense kernel never reads the
    row's words outside its span, and rows of sparse tiles are left alone. The tile is dense by
    ``_dense_tile`` (its FLAG written here), or with FLAG_SET (UNION_DENSE: the union pre-pass
    ran first and decided every tile) where its FLAG is 1."""
    i = tl.program_id(0)
    r = row0 + i
    if FLAG_SET:
        dense = tl.load(FLAG + r // RP) == 1
    else:
        dense = _dense_tile(LO, HI, NV, r // RP, total_q, dense_span, RP, RP_P)
        tl.store(FLAG + r // RP, tl.where(dense, 1, 0), mask=(r % RP) == 0)  # the first row
    if dense:
        r64 = r.to(tl.int64)
        if HAS_LENS:  # noqa: SIM108 (constexpr branch in a kernel)
            n = tl.minimum(tl.maximum(tl.load(LENS + r64), 0), topk)
        else:
            n = topk
        lo = tl.load(LO + r64)
        hi = tl.load(HI + r64)
        IDX_row = IDX + r64 * s_it
        CNT_row = CNT + i.to(tl.int64) * s_ct
        for w0 in range(lo >> 1, (hi >> 1) + 1, BLOCK):
            w = w0 + tl.arange(0, BLOCK)
            tl.store(CNT_row + w, tl.zeros([BLOCK], dtype=tl.int32), mask=w <= (hi >> 1))
        tl.debug_barrier()  # the zeros are in place before any thread of the program counts
        for c0 in range(0, n, BLOCK):
            j = c0 + tl.arange(0, BLOCK)
            t = tl.load(IDX_row + j, mask=j < n, other=-1)
            ok = (t >= 0) & (t < num_slots)
            ts = tl.where(ok, t, 0)
            tl.atomic_add(CNT_row + (ts >> 1), (1 << ((ts & 1) * 16)).to(tl.int32), mask=ok,
                          sem="relaxed")


@triton.jit
def _tile_lines(tile, nrows, group, RP: tl.constexpr, HP: tl.constexpr, BLOCK_M: tl.constexpr):
    """A row-tile program's query lines (``_dense_fwd``'s and ``_union_fwd``'s): its KV head
    ``h`` (``program_id(1)``; ``ceil(group / HP)`` is 1, HP being the group or the group
    rounded up), and for line m the row ``ri`` (within the chunk of ``nrows``) and head ``hh``
    (within the group) it computes, ``m // HP`` and ``m % HP``, and whether it is a real line
    (lines from ``RP * HP`` on are padding when HP is not a power of two)."""
    chunks = tl.cdiv(group, HP)
    h = tl.program_id(1) // chunks
    offs_m = tl.arange(0, BLOCK_M)
    ri = tile * RP + offs_m // HP
    hh = (tl.program_id(1) % chunks) * HP + offs_m % HP
    if RP * HP == BLOCK_M:
        ok = (hh < group) & (ri < nrows)
    else:
        ok = (hh < group) & (ri < nrows) & (offs_m < RP * HP)
    return h, ri, hh, ok


@triton.jit
def _dense_fwd(Q, K, V, KD, VD, CNT, LO, HI, NV, FLAG, OUT, qk_scale, num_slots, group, total_q,
               row0, nrows, dense_span, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ct, s_ot, s_oh,
               HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, HP: tl.constexpr, RP_P: tl.constexpr,
               REVERSE_ROWS: tl.constexpr, DESC: tl.constexpr, DOT_PREC: tl.constexpr,
               SLACK: tl.constexpr, FLAG_SET: tl.constexpr):
    """DENSE: the ``RP = BLOCK_M // HP`` rows of one tile (of the chunk ``row0 .. row0 +
    nrows``) and the query heads of KV head ``program_id(1) // ceil(group / HP)``: HP is the
    group, or the group rounded up to a power of two (``config._dense_heads``), so ``ceil(group
    / HP)`` is 1 and line m is row ``m // HP``, head ``m % HP`` (lines of heads past the group,
    and lines from ``RP * HP`` on, are masked). RP_P: RP rounded up to a power of two.
    Streams the KV blocks between the least and the greatest slot the rows select, through TMA
    descriptors ``KD``/``VD`` when ``DESC`` (else pointer loads); a line's weight of slot s is
    ``count * exp2(score)``, 0 where the count is 0 (``_counted_step``; and V's
    NaN in the accumulator hands the tile back: ``FLAG[tile] = 0``, nothing stored). Tiles that
    ``_dense_tile`` leaves to the other paths (FLAG_SET, UNION_DENSE: tiles whose FLAG is not
    1) return at once."""
    RP: tl.constexpr = BLOCK_M // HP
    pid = tl.program_id(0)
    ntiles = tl.cdiv(nrows, RP)
    if REVERSE_ROWS:  # noqa: SIM108 (constexpr branch in a kernel)
        tile = ntiles - 1 - pid
    else:
        tile = pid
    h, ri, hh, m_ok = _tile_lines(tile, nrows, group, RP, HP, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    d_mask = offs_d < HEAD_DIM
    rr, r_ok = _tile_rows(tile, nrows, RP, RP_P)
    if FLAG_SET:
        dense = tl.load(FLAG + (row0 + tile * RP) // RP) == 1
    else:
        dense = _dense_tile(LO, HI, NV, (row0 + tile * RP) // RP, total_q, dense_span, RP, RP_P)
    if dense == 0:  # another path's tile: no Q read, no masked step
        return
    r64 = (row0 + ri).to(tl.int64)
    heads = h * group + hh
    q = tl.load(Q + r64[:, None] * s_qt + heads[:, None] * s_qh + offs_d[None, :],
                mask=m_ok[:, None] & d_mask[None, :], other=0.0)
    rr64 = (row0 + rr).to(tl.int64)
    lo_r = tl.load(LO + rr64, mask=r_ok, other=num_slots)
    hi_r = tl.load(HI + rr64, mask=r_ok, other=-1)
    lo = tl.min(lo_r, 0)
    hi = tl.where(dense, tl.max(hi_r, 0), -1)
    CNT_r = CNT + tl.where(r_ok, rr, 0).to(tl.int64) * s_ct
    onehot = m_ok  # read only where RP rows do not broadcast to BLOCK_M lines
    if RP * HP != BLOCK_M:
        onehot = _row_onehot(m_ok, HP, BLOCK_M, RP_P)
    K_h = K + h.to(tl.int64) * s_kh
    V_h = V + h.to(tl.int64) * s_vh
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    start = (lo // BLOCK_N) * BLOCK_N
    kb = K_h + start.to(tl.int64) * s_kt
    vb = V_h + start.to(tl.int64) * s_vt
    # at least one step (masked to nothing for a tile that is not dense): a loop that may run
    # zero times leaves ptxas a path that defines the accumulators outside the wgmma pipeline,
    # and it then serializes every wgmma of the loop (C7515, "non wgmma instructions defining
    # accumulator registers")
    for it in range(0, tl.maximum(tl.cdiv(hi + 1 - start, BLOCK_N), 1)):
        s0 = start + it * BLOCK_N
        n = s0 + offs_n
        inr = tl.where(dense, (n[None, :] >= lo_r[:, None]) &
                       (n[None, :] <= hi_r[:, None]), False)
        w = tl.load(CNT_r[:, None] + (n[None, :] >> 1), mask=inr, other=0)
        c = _word_counts(w, n, onehot, RP, HP, BLOCK_M, BLOCK_N)
        c = tl.where(m_ok[:, None], c, 0)
        if DESC:
            k = KD.load([s0, h, 0]).reshape(BLOCK_N, D_PAD)
            v = VD.load([s0, h, 0]).reshape(BLOCK_N, D_PAD)
        else:
            kv_mask = (n < num_slots)[:, None] & d_mask[None, :]
            k = tl.load(kb + offs_n[:, None] * s_kt + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(vb + offs_n[:, None] * s_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        m_i, l_i, acc = _counted_step(q, k, v, c, m_i, l_i, acc, qk_scale, DOT_PREC, SLACK)
        kb += BLOCK_N * s_kt
        vb += BLOCK_N * s_vt
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o_ptr = OUT + r64[:, None] * s_ot + heads[:, None] * s_oh + offs_d[None, :]
    keep = _hand_back(FLAG, (row0 + tile * RP) // RP, acc, dense)
    tl.store(o_ptr, (acc / l_safe[:, None]).to(OUT.dtype.element_ty),
             mask=tl.where(keep, m_ok[:, None] & d_mask[None, :], False))



# --------------------------------------------------------------------------------------------
# kernels: the union
# --------------------------------------------------------------------------------------------


@triton.jit
def _popc(x):
    """Set bits of the low 32 bits of each int64 of ``x`` (the others must be 0)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24) & 0xFF


@triton.jit
def _row_len(LENS, r, ok, topk, HAS_LENS: tl.constexpr):
    """Entries of row ``r`` (0 where not ``ok``)."""
    if HAS_LENS:  # noqa: SIM108 (constexpr branch in a kernel)
        n = tl.minimum(tl.maximum(tl.load(LENS + r, mask=ok, other=0), 0), topk)
    else:
        n = topk
    return tl.where(ok, n, 0)


@triton.jit
def _seg_or(h1, b1, h2, b2):
    """Segmented-scan combine: OR the bits back to the segment's head (``h`` marks heads)."""
    return h1 | h2, tl.where(h2 != 0, b2, b1 | b2)


@triton.jit
def _word_of(IDX_row, j, n, num_slots):
    """Bitmap word of entry ``j`` of a row (-1 where the entry is not a valid slot)."""
    s = tl.load(IDX_row + j, mask=(j >= 0) & (j < n), other=-1)
    return tl.where((s >= 0) & (s < num_slots), s >> 5, -1), s


@triton.jit
def _mark_row(IDX_row, BITS_t, n, num_slots, BLOCK: tl.constexpr, RUNS: tl.constexpr):
    """Set the bit of every valid slot of one row's ``n`` entries (atomic or). RUNS: entries
    whose slots share a word next to each other (a row an indexer emits ascending, dense in
    its span) OR their bits together first (a segmented scan over the runs of equal words),
    and only a run's last entry writes: one atomic per word and block, not one per entry on a
    few hot words (three loads an entry instead of one: it pays only where runs are long)."""
    for c0 in range(0, n, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        w, s = _word_of(IDX_row, j, n, num_slots)
        ok = w >= 0
        bit = tl.where(ok, (tl.full([BLOCK], 1, tl.int64) << (s & 31)).to(tl.int32), 0)
        if RUNS:
            w_prev, _ = _word_of(IDX_row, j - 1, n, num_slots)
            w_next, _ = _word_of(IDX_row, j + 1, n, num_slots)
            head = ((w != w_prev) | (j == c0)).to(tl.int32)
            _, run = tl.associative_scan((head, bit), 0, _seg_or)
            last = (w != w_next) | (j == c0 + BLOCK - 1)
            tl.atomic_or(BITS_t + tl.where(ok, w, 0), run, mask=ok & last, sem="relaxed")
        else:
            tl.atomic_or(BITS_t + tl.where(ok, w, 0), bit, mask=ok, sem="relaxed")


@triton.jit
def _union_gate(IDX, LENS, LO, HI, NV, BITS, GATE, FLAG, USZ, ROWREQ, num_slots, topk, tile0,
                total_q, dense_span, union_pct, union_dense, s_it, s_bt, HAS_LENS: tl.constexpr,
                HAS_DENSE: tl.constexpr, RP: tl.constexpr, RP_P: tl.constexpr,
                BLOCK: tl.constexpr, WB: tl.constexpr, BY_REQ: tl.constexpr,
                RUNS: tl.constexpr):
    """UNION's first pre-pass, tile ``tile0 + program_id(0)`` (rows ``tile * RP ..``), scratch
    row ``program_id(0)``. A tile DENSE takes is left alone (its FLAG is DENSE's); a tile
    without valid entries goes union with U = 0 (zeros out). Otherwise: zero the bitmap words
    over the tile's span, mark the first row's slots, and count how many valid entries of the
    tile's last row hit them (o). The estimate ``n_first + (rows - 1) * (n_last - o)`` of the
    union (rows whose picks beyond a shared core are independent add about what the last row
    adds each) gates the exact count: ``GATE = 1`` when it is at most twice the threshold, so
    tiles that share little (the bench walk) cost two rows, not RP. The estimate only decides
    whether the exact union is counted; the exact union decides the path. BY_REQ (ids are
    chunk positions, ``ChunkIds``): a tile whose first and last rows are in different requests
    is gathered. ``union_dense`` > 0 (UNION_DENSE): DENSE's tiles are tried too (not one
    whose largest row has more valid entries than ``union_dense`` % of the span: that row's
    slots alone would fail the rule), and every tile's FLAG is written here or in
    ``_union_size`` (a dense tile not gated: 1)."""
    lt = tl.program_id(0)
    t = tile0 + lt
    rr, r_ok = _tile_rows(t, total_q, RP, RP_P)
    lo = tl.min(tl.load(LO + rr, mask=r_ok, other=2**31 - 1), 0)
    hi = tl.max(tl.load(HI + rr, mask=r_ok, other=-1), 0)
    nv_r = tl.load(NV + rr, mask=r_ok, other=0).to(tl.int64)
    nv = tl.sum(nv_r, 0)
    if HAS_DENSE:  # noqa: SIM108 (constexpr branch in a kernel)
        dense = _dense_tile(LO, HI, NV, t, total_q, dense_span, RP, RP_P)
    else:
        dense = hi < -1  # False
    span = tl.maximum(hi - lo + 1, 0).to(tl.int64)
    try_dense = (union_dense > 0) & (tl.max(nv_r, 0) * 100 <= span * union_dense)
    go = (hi >= lo) & ((dense == 0) | try_dense)
    gate = go & False
    if BY_REQ:
        r_last = tl.minimum(t * RP + RP, total_q) - 1
        mixed = tl.load(ROWREQ + t * RP) != tl.load(ROWREQ + r_last)
    else:
        mixed = go & False
    BITS_t = BITS + lt.to(tl.int64) * s_bt
    if go & (mixed == 0):
        w_lo = lo >> 5
        w_hi = hi >> 5
        for w0 in range(w_lo, w_hi + 1, WB):
            w = w0 + tl.arange(0, WB)
            tl.store(BITS_t + w, tl.zeros([WB], dtype=tl.int32), mask=w <= w_hi)
        tl.debug_barrier()  # zeros in place before any thread sets a bit
        r0 = t * RP
        n0 = _row_len(LENS, r0, r0 < total_q, topk, HAS_LENS)
        _mark_row(IDX + r0.to(tl.int64) * s_it, BITS_t, n0, num_slots, BLOCK, RUNS)
        tl.debug_barrier()  # the first row's bits set before the last row reads them
        rows = tl.minimum(total_q - t * RP, RP)
        r1 = t * RP + rows - 1
        n1 = _row_len(LENS, r1, r1 < total_q, topk, HAS_LENS)
        IDX_r1 = IDX + r1.to(tl.int64) * s_it
        nv1 = 0 * n1
        hit = 0 * n1
        for c0 in range(0, n1, BLOCK):
            j = c0 + tl.arange(0, BLOCK)
            s = tl.load(IDX_r1 + j, mask=j < n1, other=-1)
            ok = (s >= 0) & (s < num_slots)
            ss = tl.where(ok, s, 0)
            wd = tl.load(BITS_t + (ss >> 5), mask=ok, other=0, cache_modifier=".cg")
            on = ((wd >> (ss & 31)) & 1) != 0
            nv1 += tl.sum(ok.to(tl.int32), 0)
            hit += tl.sum((ok & on).to(tl.int32), 0)
        nv0 = tl.load(NV + r0)
        est = nv0.to(tl.int64) + (rows - 1).to(tl.int64) * tl.maximum(nv1 - hit, 0).to(tl.int64)
        gate = est * RP * 100 <= 2 * nv * union_pct
    tl.store(GATE + lt, gate.to(tl.int32))
    # decided here: tiles not gated (0), empty tiles (2 with U = 0), with UNION_DENSE DENSE's
    # tiles not gated (1); the others in _union_size
    tl.store(FLAG + t, tl.where(dense, 1, tl.where(go, 0, 2)),
             mask=((dense == 0) | (union_dense > 0)) & (gate == 0))
    tl.store(USZ + t, 0, mask=gate == 0)


@triton.jit
def _union_mark(IDX, LENS, BITS, GATE, num_slots, topk, tile0, total_q, s_it, s_bt,
                HAS_LENS: tl.constexpr, RP: tl.constexpr, BLOCK: tl.constexpr,
                RUNS: tl.constexpr):
    """UNION: row ``program_id(0) % RP`` (not the first, which the gate marked) of the gated
    tile ``tile0 + program_id(0) // RP`` sets its slots' bits."""
    lt = tl.program_id(0) // RP
    i = tl.program_id(0) % RP
    r = (tile0 + lt) * RP + i
    if (tl.load(GATE + lt) != 0) & (i > 0) & (r < total_q):
        n = _row_len(LENS, r, r < total_q, topk, HAS_LENS)
        _mark_row(IDX + r.to(tl.int64) * s_it, BITS + lt.to(tl.int64) * s_bt, n, num_slots,
                  BLOCK, RUNS)


@triton.jit
def _union_size(LO, HI, NV, BITS, WPRE, SLOTS, CNT, GATE, FLAG, USZ, ROWREQ, PT, tile0,
                total_q, dense_span, union_pct, union_dense, page_size, s_bt, s_lt, s_ct, s_cr,
                s_pb, HAS_DENSE: tl.constexpr, RP: tl.constexpr, RP_P: tl.constexpr,
                BLOCK: tl.constexpr, WB: tl.constexpr, BY_REQ: tl.constexpr):
    """UNION, a gated tile: count the set bits over its span (the exact union size U). The
    tile goes union (``FLAG = 2``, ``USZ = U``) when ``U * RP * 100 <= (valid entries of its
    rows) * union_pct`` (and, for a tile DENSE's rule takes, gated only with UNION_DENSE,
    ``U * 100 <= span * union_dense``), else to the gathering kernel (0; DENSE's tile: 1);
    then ``WPRE`` gets each word's exclusive prefix of set bits, ``SLOTS`` the union's slots
    ascending (position = prefix + set bits below in the word), and the tile's ``CNT`` rows
    are zeroed. BY_REQ: the ids are
    the tile's request's token positions (``ChunkIds``), written to ``SLOTS`` as their slots
    through the request's page table row."""
    lt = tl.program_id(0)
    t = tile0 + lt
    if tl.load(GATE + lt) != 0:
        rr, r_ok = _tile_rows(t, total_q, RP, RP_P)
        lo = tl.min(tl.load(LO + rr, mask=r_ok, other=2**31 - 1), 0)
        hi = tl.max(tl.load(HI + rr, mask=r_ok, other=-1), 0)
        nv = tl.sum(tl.load(NV + rr, mask=r_ok, other=0).to(tl.int64), 0)
        BITS_t = BITS + lt.to(tl.int64) * s_bt
        WPRE_t = WPRE + lt.to(tl.int64) * s_bt
        w_lo = lo >> 5
        w_hi = hi >> 5
        cnt = tl.zeros([WB], dtype=tl.int64)
        for w0 in range(w_lo, w_hi + 1, WB):
            w = w0 + tl.arange(0, WB)
            wd = tl.load(BITS_t + w, mask=w <= w_hi, other=0)
            cnt += _popc(wd.to(tl.int64) & 0xFFFFFFFF)
        u = tl.sum(cnt, 0).to(tl.int32)
        union = u.to(tl.int64) * RP * 100 <= nv * union_pct
        if HAS_DENSE:
            dense = _dense_tile(LO, HI, NV, t, total_q, dense_span, RP, RP_P)
            span = tl.maximum(hi - lo + 1, 0).to(tl.int64)
            union = union & ((dense == 0) | (u.to(tl.int64) * 100 <= span * union_dense))
        else:
            dense = union & False
        tl.store(FLAG + t, tl.where(union, 2, tl.where(dense, 1, 0)))
        tl.store(USZ + t, tl.where(union, u, 0))
        if union:
            base = 0 * u
            b = tl.arange(0, 32)
            for w0 in range(w_lo, w_hi + 1, WB):
                w = w0 + tl.arange(0, WB)
                wm = w <= w_hi
                wd = tl.load(BITS_t + w, mask=wm, other=0).to(tl.int64) & 0xFFFFFFFF
                pc = _popc(wd).to(tl.int32)
                ex = tl.cumsum(pc, 0) - pc + base
                tl.store(WPRE_t + w, ex, mask=wm)
                sel = ((wd[:, None] >> b[None, :]) & 1) != 0
                below = wd[:, None] & ((tl.full([1, 32], 1, tl.int64) << b[None, :]) - 1)
                rank = ex[:, None] + _popc(below).to(tl.int32)
                ids = w[:, None] * 32 + b[None, :]
                if BY_REQ:
                    # a set bit is a valid position: its page is mapped (_translate_chunk)
                    pt_row = PT + tl.load(ROWREQ + t * RP).to(tl.int64) * s_pb
                    page = tl.load(pt_row + ids // page_size, mask=sel & wm[:, None], other=0)
                    ids = page * page_size + ids % page_size
                tl.store(SLOTS + lt.to(tl.int64) * s_lt + rank, ids, mask=sel & wm[:, None])
                base += tl.sum(pc, 0)
            CNT_t = CNT + lt.to(tl.int64) * s_ct
            half = (u + 1) >> 1
            for i in range(0, RP):
                for c0 in range(0, half, BLOCK):
                    c = c0 + tl.arange(0, BLOCK)
                    tl.store(CNT_t + i * s_cr + c, tl.zeros([BLOCK], dtype=tl.int32),
                             mask=c < half)


@triton.jit
def _union_count(IDX, LENS, BITS, WPRE, CNT, FLAG, num_slots, topk, tile0, total_q, s_it,
                 s_bt, s_ct, s_cr, HAS_LENS: tl.constexpr, RP: tl.constexpr,
                 BLOCK: tl.constexpr):
    """UNION: row ``program_id(0) % RP`` of tile ``tile0 + program_id(0) // RP``, when the tile
    goes union: its multiplicity at every union position (16-bit fields, two a word: position
    u is ``CNT[.., row, u >> 1] >> (16 * (u & 1)) & 0xFFFF``; position = the word's prefix +
    the set bits below the slot's in its word)."""
    lt = tl.program_id(0) // RP
    i = tl.program_id(0) % RP
    r = (tile0 + lt) * RP + i
    if (tl.load(FLAG + tile0 + lt) == 2) & (r < total_q):
        n = _row_len(LENS, r, r < total_q, topk, HAS_LENS)
        IDX_row = IDX + r.to(tl.int64) * s_it
        BITS_t = BITS + lt.to(tl.int64) * s_bt
        WPRE_t = WPRE + lt.to(tl.int64) * s_bt
        CNT_row = CNT + lt.to(tl.int64) * s_ct + i * s_cr
        for c0 in range(0, n, BLOCK):
            j = c0 + tl.arange(0, BLOCK)
            s = tl.load(IDX_row + j, mask=j < n, other=-1)
            ok = (s >= 0) & (s < num_slots)
            ss = tl.where(ok, s, 0)
            wd = tl.load(BITS_t + (ss >> 5), mask=ok, other=0)
            pre = tl.load(WPRE_t + (ss >> 5), mask=ok, other=0)
            below = (wd.to(tl.int64) & 0xFFFFFFFF) & \
                ((tl.full([BLOCK], 1, tl.int64) << (ss & 31)) - 1)
            pos = pre + _popc(below).to(tl.int32)
            tl.atomic_add(CNT_row + (pos >> 1), (1 << ((pos & 1) * 16)).to(tl.int32), mask=ok,
                          sem="relaxed")


@triton.jit
def _union_fwd(Q, K, V, FLAG, USZ, SLOTS, CNT, OUT, qk_scale, group, total_q, tile0, ntiles,
               s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_lt, s_ct, s_cr, s_ot, s_oh,
               HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, HP: tl.constexpr, RP_P: tl.constexpr,
               REVERSE_ROWS: tl.constexpr, DOT_PREC: tl.constexpr, SLACK: tl.constexpr,
               OFFS32: tl.constexpr):
    """UNION: tile ``tile0 + program_id(0)`` (scratch row ``program_id(0)``) when its ``FLAG``
    is 2, ``HP`` heads of KV head ``program_id(1) // ceil(group / HP)`` (lines as
    ``_dense_fwd``'s: line m is row ``m // HP``, head ``m % HP``). Gathers the union's K/V rows
    ``SLOTS[.., u]`` BLOCK_N positions a step (pointer loads) and scores them for every line at
    once; a line's weight of position u is ``count * exp2(score)`` with its row's count
    ``CNT[.., row, u]`` (-inf where 0), the dense kernel's arithmetic. Other tiles' programs
    return at once (the walk's gated tiles cost a launch, no Q read or masked step). OFFS32:
    the gathered rows' element offsets (``slot * stride + d``) in int32, which the wrapper
    sets only where ``_offsets_fit_int32`` holds; int64 otherwise."""
    RP: tl.constexpr = BLOCK_M // HP
    pid = tl.program_id(0)
    if REVERSE_ROWS:  # noqa: SIM108 (constexpr branch in a kernel)
        lt = ntiles - 1 - pid
    else:
        lt = pid
    t = tile0 + lt
    if tl.load(FLAG + t) != 2:  # another path's tile: no Q read, no MMA
        return
    h, ri, hh, m_ok = _tile_lines(t, total_q, group, RP, HP, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    d_mask = offs_d < HEAD_DIM
    n_u = tl.load(USZ + t)
    r64 = ri.to(tl.int64)
    heads = h * group + hh
    q = tl.load(Q + r64[:, None] * s_qt + heads[:, None] * s_qh + offs_d[None, :],
                mask=m_ok[:, None] & d_mask[None, :], other=0.0)
    SL_t = SLOTS + lt.to(tl.int64) * s_lt
    CNT_t = CNT + lt.to(tl.int64) * s_ct
    rows = tl.arange(0, RP_P)
    onehot = m_ok  # read only where RP rows do not broadcast to BLOCK_M lines
    if RP * HP != BLOCK_M:
        onehot = _row_onehot(m_ok, HP, BLOCK_M, RP_P)
    K_h = K + h.to(tl.int64) * s_kh
    V_h = V + h.to(tl.int64) * s_vh
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # at least one step (all masked for an empty union, U = 0), as in _dense_fwd: a loop that
    # may run zero times makes ptxas serialize every wgmma of the loop (C7515)
    for u0 in range(0, tl.maximum(n_u, 1), BLOCK_N):
        u = u0 + offs_n
        u_ok = u < n_u
        slot = tl.load(SL_t + u, mask=u_ok, other=0)
        if not OFFS32:
            slot = slot.to(tl.int64)
        kv_mask = u_ok[:, None] & d_mask[None, :]
        k = tl.load(K_h + (slot[:, None] * s_kt + offs_d[None, :]), mask=kv_mask, other=0.0)
        v = tl.load(V_h + (slot[:, None] * s_vt + offs_d[None, :]), mask=kv_mask, other=0.0)
        if RP == RP_P:  # noqa: SIM108 (constexpr branch in a kernel)
            cmask = u_ok[None, :]
        else:
            cmask = (rows < RP)[:, None] & u_ok[None, :]
        w = tl.load(CNT_t + rows[:, None] * s_cr + (u[None, :] >> 1), mask=cmask, other=0)
        c = _word_counts(w, u, onehot, RP, HP, BLOCK_M, BLOCK_N)
        c = tl.where(m_ok[:, None], c, 0)
        m_i, l_i, acc = _counted_step(q, k, v, c, m_i, l_i, acc, qk_scale, DOT_PREC, SLACK)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o_ptr = OUT + r64[:, None] * s_ot + heads[:, None] * s_oh + offs_d[None, :]
    keep = _hand_back(FLAG, t, acc, True)
    tl.store(o_ptr, (acc / l_safe[:, None]).to(OUT.dtype.element_ty),
             mask=tl.where(keep, m_ok[:, None] & d_mask[None, :], False))


# --------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------


def mark_runs(topk: int, num_ids: int) -> bool:
    """Whether the union's mark pass ORs runs of one word's entries before its atomic: rows of
    ``topk`` entries average at least ``_MARK_RUN_ENTRIES`` a word over ``num_ids`` ids (a
    shape rule, so the same for every call of a shape and free of any host read)."""
    return topk * 32 >= _MARK_RUN_ENTRIES * num_ids


def row_stats(idx: Any, lens: Any, has_lens: bool, num_slots: int) -> tuple[Any, Any, Any]:
    """(LO, HI, NV): every row's least and greatest valid slot and its valid entries."""
    import torch

    total_q, topk = idx.shape
    lo = torch.empty((total_q,), device=idx.device, dtype=torch.int32)
    hi, nv = torch.empty_like(lo), torch.empty_like(lo)
    _row_stats[(total_q,)](idx, lens, lo, hi, nv, num_slots, topk, idx.stride(0),
                           HAS_LENS=has_lens, BLOCK=_DENSE_COUNT_BLOCK, num_warps=4)
    return lo, hi, nv


def _desc_ok(t: Any) -> bool:
    """Whether TMA can load ``t`` ([num_slots, heads, head_dim], 16-bit): 16-byte aligned base
    and strides, unit last stride."""
    import torch

    es = t.element_size()
    return (t.dtype in (torch.bfloat16, torch.float16) and t.stride(-1) == 1
            and t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1]))


def _tile_shape(q: Any, k: Any, idx: Any, var: dict[str, Any], key: str
                ) -> tuple[int, int, tuple[int, int, int, int], int, int, float]:
    """(group, topk, DENSE_TILE's (BM, BN, warps, stages), HP, RP, the rescale slack) of a
    ``key`` (DENSE or UNION) call, after the top-k checks of its 16-bit counts and weights."""
    group, topk = q.shape[1] // k.shape[1], idx.shape[1]
    _check_counts(key, topk)
    spec, tile_key = union_tile(var) if key == "UNION" else (var["DENSE_TILE"], "DENSE_TILE")
    geom = _dense_tile_geometry(spec, group, tile_key, var["TILE_HEADS"])
    hp, rp = tile_rows(var, group, key)
    return group, topk, geom, hp, rp, _rescale_slack(k.dtype, topk)


def _fwd_rows(rp: int, hp: int, bm: int) -> int:
    """The row-tile kernels' RP_P: RP itself where RP rows broadcast to the BM lines (RP * HP
    = BM), else RP rounded up to a power of two of at least 16 (the one-hot MMA's K side)."""
    return rp if rp * hp == bm else max(16, triton.next_power_of_2(rp))


def _dense(q: Any, k: Any, v: Any, idx: Any, lens: Any, has_lens: bool, out: Any,
           qk_scale: float, var: dict[str, Any], dot_prec: Any, d_pad: int,
           stats: tuple[Any, Any, Any] | None = None, flag: Any = None) -> tuple[Any, ...]:
    """DENSE's part of a call: row statistics (unless given), then per chunk of rows the
    counts and the dense kernel on the dense tiles. Returns (LO, HI, NV, RP, span, FLAG): FLAG
    per tile 1 where the dense kernel stored the tile's rows, else 0 (the gathering kernel's).
    ``flag`` given (UNION_DENSE: the union pre-pass decided every tile first): the dense tiles
    are those whose FLAG is 1, and only a hand-back changes it (to 0)."""
    import torch

    total_q, _, d = q.shape
    num_slots, hkv, _ = k.shape
    group, topk, (bm, bn, nw, ns), hp, rp, slack = _tile_shape(q, k, idx, var, "DENSE")
    span = int(var["DENSE"])
    dev = q.device
    lo, hi, nv = stats if stats is not None else row_stats(idx, lens, has_lens, num_slots)
    flag_set = flag is not None
    if flag is None:
        flag = torch.empty((-(-total_q // rp),), device=dev, dtype=torch.int32)
    words = (num_slots + 1) // 2
    chunk_rows = max(rp, (_DENSE_SCRATCH_BYTES // (4 * words)) // rp * rp)
    chunk_rows = min(chunk_rows, -(-total_q // rp) * rp)
    cnt = torch.empty((chunk_rows, words), device=dev, dtype=torch.int32)
    desc = _desc_ok(k) and _desc_ok(v)
    if desc:
        from triton.tools.tensor_descriptor import TensorDescriptor

        kd = TensorDescriptor(k, list(k.shape), list(k.stride()), [bn, 1, d_pad])
        vd = TensorDescriptor(v, list(v.shape), list(v.stride()), [bn, 1, d_pad])
    else:
        kd, vd = k, v
    for row0 in range(0, total_q, chunk_rows):
        nrows = min(chunk_rows, total_q - row0)
        _count_slots[(nrows,)](idx, lens, lo, hi, nv, cnt, flag, num_slots, topk, row0, total_q,
                               span,
                               idx.stride(0), cnt.stride(0), HAS_LENS=has_lens, RP=rp,
                               RP_P=triton.next_power_of_2(rp), BLOCK=_DENSE_COUNT_BLOCK,
                               FLAG_SET=flag_set, num_warps=4)
        _dense_fwd[(triton.cdiv(nrows, rp), hkv * triton.cdiv(group, hp))](
            q, k, v, kd, vd, cnt, lo, hi, nv, flag, out, qk_scale, num_slots, group, total_q, row0,
            nrows, span, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), cnt.stride(0), out.stride(0), out.stride(1),
            HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=bm, BLOCK_N=bn, HP=hp,
            RP_P=_fwd_rows(rp, hp, bm), REVERSE_ROWS=bool(var["REVERSE_ROWS"]), DESC=desc,
            DOT_PREC=dot_prec, SLACK=slack, FLAG_SET=flag_set,
            num_warps=nw, num_stages=ns)  # MAXNREG: the gathering kernel's only
    return lo, hi, nv, rp, span, flag



def union_prep_triton(idx: Any, lens: Any, has_lens: bool, stats: tuple[Any, Any, Any],
                      flag: Any, dense_span: int, pct: int, rp: int, umax: int, num_ids: int,
                      by_req: tuple[Any, Any, int, int] | None = None, *, tile0: int = 0,
                      ntiles: int | None = None, out: tuple[Any, Any, Any] | None = None,
                      scratch: tuple[Any, Any, Any] | None = None, union_dense: int = 0
                      ) -> tuple[Any, Any, Any, Any]:
    """UNION's pre-pass by the four Triton kernels (gate, mark, size, count) for tiles
    ``tile0 .. tile0 + ntiles`` (default: all): ``(FLAG, USZ, slots, counts)``, the last two
    ``[ntiles, umax]`` and ``[ntiles, RP, umax / 2]`` (``out`` gives USZ, slots, counts;
    ``scratch`` the bitmaps, prefixes and gates of a chunk). ``flag``: DENSE's per tile (it
    keeps its tiles; ``dense_span`` 0 without DENSE; with ``union_dense`` > 0, UNION_DENSE,
    every tile's FLAG is written here, DENSE's tiles tried too). ``by_req``: (rows' requests,
    page table, page size, page-table row stride) when ``idx`` holds chunk positions. The
    one-kernel CUDA pre-pass (``union_prep.py``) writes the same outputs."""
    import torch

    total_q, topk = idx.shape
    dev = idx.device
    nt = -(-total_q // rp) - tile0 if ntiles is None else ntiles
    if out is None:
        usz = torch.empty_like(flag)
        slots = torch.empty((nt, umax), device=dev, dtype=torch.int32)
        cnt = torch.empty((nt, rp, umax // 2), device=dev, dtype=torch.int32)
    else:
        usz, slots, cnt = out
    if scratch is None:
        words = (num_ids + 31) // 32
        bits = torch.empty((nt, words), device=dev, dtype=torch.int32)
        scratch = (bits, torch.empty_like(bits), torch.empty((nt,), device=dev,
                                                             dtype=torch.int32))
    bits, wpre, gate = scratch
    lo, hi, nv = stats
    if by_req is not None:
        row_req, pt, page_size, s_pb = by_req
    else:
        row_req = pt = idx  # dummy pointers, never read
        page_size, s_pb = 1, 0
    runs = mark_runs(topk, num_ids)
    kw = dict(HAS_LENS=has_lens, RP=rp, BLOCK=_UNION_BLOCK, num_warps=_UNION_WARPS)
    _union_gate[(nt,)](idx, lens, lo, hi, nv, bits, gate, flag, usz, row_req, num_ids, topk,
                       tile0, total_q, dense_span, pct, union_dense, idx.stride(0),
                       bits.stride(0),
                       HAS_DENSE=dense_span > 0, RP_P=triton.next_power_of_2(rp),
                       WB=_UNION_WORDS, BY_REQ=by_req is not None, RUNS=runs, **kw)
    _union_mark[(nt * rp,)](idx, lens, bits, gate, num_ids, topk, tile0, total_q,
                            idx.stride(0), bits.stride(0), RUNS=runs, **kw)
    _union_size[(nt,)](lo, hi, nv, bits, wpre, slots, cnt, gate, flag, usz, row_req, pt,
                       tile0, total_q, dense_span, pct, union_dense, page_size,
                       bits.stride(0), slots.stride(0), cnt.stride(0), cnt.stride(1), s_pb,
                       HAS_DENSE=dense_span > 0, RP=rp,
                       RP_P=triton.next_power_of_2(rp), BLOCK=_UNION_BLOCK, WB=_UNION_WORDS,
                       BY_REQ=by_req is not None, num_warps=_UNION_WARPS)
    _union_count[(nt * rp,)](idx, lens, bits, wpre, cnt, flag, num_ids, topk, tile0,
                             total_q, idx.stride(0), bits.stride(0), cnt.stride(0),
                             cnt.stride(1), **kw)
    return flag, usz, slots, cnt


def _cuda_prep(var: dict[str, Any], idx: Any, num_ids: int, umax: int) -> bool:
    """Whether this call's union pre-pass is the one-kernel CUDA one (UNION_PREP="cuda" where
    it can be had; otherwise the Triton kernels, logged once a reason)."""
    if var["UNION_PREP"] != "cuda":
        return False
    from backends.sparse_prefill import union_prep

    ok, why = union_prep.available(idx.device, num_ids, umax)
    if not ok and why not in _PREP_LOGGED:
        import logging

        _PREP_LOGGED.add(why)
        logging.getLogger("kreg").warning("sparse_prefill UNION_PREP='cuda': the Triton "
                                          "pre-pass runs instead (%s)", why)
    import torch

    return ok and idx.dtype == torch.int32 and idx.stride(1) == 1


_PREP_LOGGED: set[str] = set()


def _ws_engine(var: dict[str, Any], q: Any, k: Any, hp: int, rp: int, bm: int, bn: int) -> bool:
    """Whether this call's union tiles run on the warp-specialized Gluon kernel
    (UNION_ENGINE="gluon_ws*" where it can run; otherwise the Triton one, logged once a
    reason)."""
    if var["UNION_ENGINE"] == "triton":
        return False
    why = union_ws.unsupported(q, k, hp, rp, bm, bn)
    if why is not None and why not in _WS_LOGGED:
        import logging

        _WS_LOGGED.add(why)
        logging.getLogger("kreg").warning("sparse_prefill UNION_ENGINE=%r: the Triton union "
                                          "kernel runs instead (%s)", var["UNION_ENGINE"], why)
    return why is None


_WS_LOGGED: set[str] = set()


def _union(q: Any, k: Any, v: Any, idx: Any, lens: Any, has_lens: bool, out: Any,
           qk_scale: float, var: dict[str, Any], dot_prec: Any, d_pad: int,
           stats: tuple[Any, Any, Any] | None, dense_span: int, flag: Any = None,
           chunk_ids: ChunkIds | None = None, union_dense: int = 0
           ) -> tuple[Any, tuple[Any, Any, Any] | None]:
    """UNION's part of a call (after DENSE's, whose ``flag`` it takes and whose tiles it leaves
    alone): per chunk of tiles the pre-pass (the Triton kernels, or with UNION_PREP="cuda" the
    one CUDA kernel) and the union kernel. The union is over ``idx``'s slot ids, or over
    ``chunk_ids``' positions (then ``stats`` are theirs). ``stats`` None (no DENSE tiles): the
    CUDA pre-pass takes each tile's statistics from its ids; the Triton one has them computed
    here first. ``union_dense`` > 0 (UNION_DENSE): run before the dense kernels, the pre-pass
    decides every tile, DENSE's included (``flag`` None; ``stats`` None: the CUDA pre-pass
    writes the rows' statistics for the dense kernels, the Triton one has them computed).
    Returns (``FLAG``, int32 per tile: 0 gather, 1 dense, 2 union, for the dense kernels with
    UNION_DENSE and the gathering kernel's skip; the rows' statistics, None where nothing
    computed them)."""
    import torch

    # here, not at the top: triton_kernels imports this module
    from backends.sparse_prefill.triton_kernels import _offsets_fit_int32

    total_q, _, d = q.shape
    num_slots, hkv, _ = k.shape
    group, topk, (bm, bn, nw, ns), hp, rp, slack = _tile_shape(q, k, idx, var, "UNION")
    pct = int(var["UNION"])
    dev = q.device
    by_req = None
    if chunk_ids is not None:
        idx, num_ids = chunk_ids.ids, chunk_ids.num_ids
        pt = chunk_ids.page_table
        by_req = (chunk_ids.row_req, pt, chunk_ids.page_size, pt.stride(0))
    else:
        num_ids = num_slots
    ntiles = -(-total_q // rp)
    if flag is None:
        flag = torch.empty((ntiles,), device=dev, dtype=torch.int32)
    usz = torch.empty_like(flag)
    words = (num_ids + 31) // 32
    # a union tile has U * RP * 100 <= (valid entries) * pct <= RP * topk * pct, and U distinct
    # ids: U <= umax
    umax = max(2, min(num_ids, -(-topk * pct // 100)))
    umax += umax & 1
    cuda_prep = _cuda_prep(var, idx, num_ids, umax)
    per_tile = 4 * ((0 if cuda_prep else 2 * words) + umax + rp * (umax // 2))
    chunk = max(1, min(ntiles, _UNION_SCRATCH_BYTES // per_tile))
    offs32 = bool(var["OFFS32"]) and _offsets_fit_int32(num_slots, k.stride(0), v.stride(0),
                                                        d_pad)
    slots = torch.empty((chunk, umax), device=dev, dtype=torch.int32)
    cnt = torch.empty((chunk, rp, umax // 2), device=dev, dtype=torch.int32)
    scratch = None
    ws = _ws_engine(var, q, k, hp, rp, bm, bn)
    # UNION_DENSE without statistics: the CUDA pre-pass counts them and writes them here
    stats_out = None
    if cuda_prep and stats is None and union_dense:
        stats_out = tuple(torch.empty((total_q,), device=dev, dtype=torch.int32)
                          for _ in range(3))
    for tile0 in range(0, ntiles, chunk):
        nt = min(chunk, ntiles - tile0)
        done = False
        if cuda_prep:
            from backends.sparse_prefill import union_prep

            done = union_prep.run(idx, lens if has_lens else None, stats, flag, usz, slots, cnt,
                                  by_req, num_ids=num_ids, tile0=tile0, ntiles=nt, rp=rp,
                                  dense_span=dense_span, pct=pct, umax=umax,
                                  union_dense=union_dense, stats_out=stats_out)
        if not done:
            if stats is None:
                stats = row_stats(idx, lens, has_lens, num_ids)
            if scratch is None:
                bits = torch.empty((chunk, words), device=dev, dtype=torch.int32)
                scratch = (bits, torch.empty_like(bits),
                           torch.empty((chunk,), device=dev, dtype=torch.int32))
            union_prep_triton(idx, lens, has_lens, stats, flag, dense_span, pct, rp, umax,
                              num_ids, by_req, tile0=tile0, ntiles=nt, out=(usz, slots, cnt),
                              scratch=scratch, union_dense=union_dense)
        if ws:
            union_ws.launch(q, k, v, flag, usz, slots, cnt, out, qk_scale, group, total_q,
                            tile0, nt, hp, bool(var["REVERSE_ROWS"]), slack, offs32,
                            mode=union_ws.MODES[var["UNION_ENGINE"]])
            continue
        _union_fwd[(nt, hkv * triton.cdiv(group, hp))](
            q, k, v, flag, usz, slots, cnt, out, qk_scale, group, total_q, tile0, nt,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            slots.stride(0), cnt.stride(0), cnt.stride(1), out.stride(0), out.stride(1),
            HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=bm, BLOCK_N=bn, HP=hp, RP_P=_fwd_rows(rp, hp, bm),
            REVERSE_ROWS=bool(var["REVERSE_ROWS"]), DOT_PREC=dot_prec,
            SLACK=slack, OFFS32=offs32, num_warps=nw, num_stages=ns)
    return flag, stats if stats is not None else stats_out


def row_tiles(q: Any, k: Any, v: Any, idx: Any, lens: Any, has_lens: bool, out: Any,
              qk_scale: float, var: dict[str, Any], dot_prec: Any, d_pad: int,
              chunk_ids: ChunkIds | None = None) -> tuple[Any, int]:
    """The row-tile part of a DENSE and/or UNION call (``idx`` holds slot ids): statistics,
    the dense tiles, the union tiles (over ``chunk_ids``' positions when given: UNION without
    DENSE on chunk rows); with UNION_DENSE the union tiles first, their pre-pass deciding the
    dense ones too. Returns (FLAG, RP): the gathering kernel does the rows of the tiles
    whose FLAG is 0."""
    if chunk_ids is not None and var["DENSE"]:
        raise ValueError("DENSE tiles run on slot statistics: no chunk ids with DENSE")
    stats, flag, span = None, None, 0   # without DENSE, the union pre-pass's to compute
    if var["DENSE"] and var["UNION"] and var["UNION_DENSE"]:
        # UNION_DENSE: the union pre-pass decides every tile first (DENSE's too), then the dense
        # kernels run on the tiles it left dense (FLAG 1), on the rows' statistics the pre-pass
        # counted (or _row_stats, which the Triton pre-pass needs first)
        flag, stats = _union(q, k, v, idx, lens, has_lens, out, qk_scale, var, dot_prec, d_pad,
                             None, int(var["DENSE"]), None, None,
                             union_dense=int(var["UNION_DENSE"]))
        _dense(q, k, v, idx, lens, has_lens, out, qk_scale, var, dot_prec, d_pad, stats, flag)
    else:
        if var["DENSE"]:
            stats = row_stats(idx, lens, has_lens, k.shape[0])
            *_, rp, span, flag = _dense(q, k, v, idx, lens, has_lens, out, qk_scale, var,
                                        dot_prec, d_pad, stats)
        if var["UNION"]:
            flag, _ = _union(q, k, v, idx, lens, has_lens, out, qk_scale, var, dot_prec, d_pad,
                             stats, span, flag, chunk_ids)
    _, rp = tile_rows(var, q.shape[1] // k.shape[1], "DENSE" if var["DENSE"] else "UNION")
    if TILE_PATHS is not None:
        TILE_PATHS.append(flag)
    return flag, rp
