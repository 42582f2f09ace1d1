"""Triton kernels for ``indexer_topk``: an exact sliced radix select, and their launch wrapper.

Keys. Every score becomes the order-preserving int32 key of :func:`reference.score_keys`
(float32 bits with the sign folded so signed int32 order is float order; ``-0.0`` first mapped
to ``+0.0``, so the two are equal and tie by position; every NaN -> ``INT32_MIN + 1``, below
``-inf``; ``INT32_MIN`` marks "no key" and is never a real key). fp16/bf16 widen to float32
exactly.

Two paths, both exact on every input, with no spin barrier and no co-residency assumption
(each stage is a separate launch; later launches read only what earlier ones wrote). Both begin
with ``_gmax_kernel`` grid ``(rows, slices)``, the one full read of the scores: each slice (a
run of about ``SLICE_KEYS`` keys, at most ``MAX_SLICES`` slices a row) writes the maximum key of
every group of ``GROUP`` consecutive keys (``gm``). The bound behind both: if ``k`` group maxima
are ``>= L``, they are ``k`` distinct keys of the row, so the row's k-th largest key ``T`` is
``>= L`` and every key of the top-k is ``>= L`` -- a proof, not an estimate; rows with fewer
than ``k`` groups get ``L = INT32_MIN`` (every valid key is a candidate). 1 launch in all when
max_keys <= k. Rows with ``length <= k`` take the fast path (positions ``0..length-1`` then
-1); the other stages return at once for them.

**Fused path** (``FUSED=1``; the default from 32 rows): 2 launches (3 with the rare tiers'
launch, ``_TIE_LAUNCH``, below). ``_gmax_kernel`` also writes the maxima of supergroups of
``GROUP * GROUP2`` keys. Then ``_row_kernel`` grid ``(rows, ROW_SPLIT)``: one program a row,
or (few rows) ``ROW_SPLIT`` programs a row that each do steps 2-3 on a contiguous part of the
row's groups into their own region of the buffer, the last of them to finish (an arrival
counter, no waiting) joining the regions for step 4:

1. ``L`` = a lower bound of the k-th largest supergroup maximum: a halving search over them in
   a register tile of ``BOUND_TILE`` that stops once at most ``k + BOUND_SLACK`` are ``>= L``
   (a row with fewer than k supergroups but k of half their size -- the middle rows of a
   causal batch -- gets those from ``_gmax_kernel`` instead; a row with fewer still searches
   its ``GROUP``-key maxima, and one with fewer than k groups has no bound).
2. The active groups (``GROUP``-key maximum ``>= L``) compacted, in order, over the row's group
   maxima ``COMPACT_TILE`` at a time (about 2,500 of 16,384 groups at 131,072 random keys; to
   an area of their own when the row is split, as another part may still be searching the
   maxima for its bound).
3. Only those groups read, ``PLACE_KEYS`` keys a step (as half groups read whole, 16-byte loads
   at GROUP 8, when max_keys is a multiple of GROUP; else each key masked by the row's length):
   their keys ``>= L`` placed in position order in the row's buffer of ``CAND_CAP`` (position,
   key) pairs.
4. Selection as in stage 3 below. A row whose bound sits in a tie (more than 3/4, and more
   than 1.5k, of the searched maxima are >= L: all-equal rows, a few repeated values, mostly
   zeros) skips steps 2-3 and takes the tie tier at once, by one program (part 0 of a split
   row); a row whose gather overflowed the buffer takes it afterwards when the searched level
   is still intact (the supergroup area, or the list in an area of its own), else the row
   tier.

**Four-launch path** (``FUSED=0``; the default below 32 rows, where many slice programs a row
beat one program's latency): 3 launches with one slice a row, 5 with several (the bound in a
launch of its own, ``_bound_kernel`` grid ``(rows,)``, then the count pass), each plus the rare
tiers' launch.

2. ``_place_kernel`` grid ``(rows, slices)``, run twice with several slices (``COUNT_ONLY``
   first, then the placement), once with one slice. With one slice the program first finds the
   row's bound ``L`` = the exact k-th largest group maximum (a halving search over the row's
   ``gm`` held in a register tile of ``BOUND_TILE``, or streamed from memory when larger); with
   several it reads the one ``_bound_kernel`` wrote (a lower bound loose by at most
   ``BOUND_SLACK`` groups, as the fused path's). The candidates (valid keys ``>= L``) of each
   slice are counted, then written in position order to the row's buffer at the slice's
   exclusive prefix of the counts; only groups whose maximum is ``>= L`` are read.
3. ``_select_kernel`` grid ``(rows,)``: ``T`` = the largest key with at least ``k`` candidates
   ``>= T`` (a halving search in ``[L, max]``), ``m = k - #(key > T)``. The output is the
   candidates with key ``> T``, plus the first ``m`` keys ``== T`` in position order, written
   in position order (running prefix sums). Three tiers: the candidates fit the register tile
   ``CAND_TILE``; they fit the buffer (a tighter bound when they are at most four tiles, else
   searched four-way and placed from memory in chunks); or there are more than ``CAND_CAP``
   (tie-heavy rows: all equal, a few repeated values) and the buffer is not trusted: the same
   search (four-way, three probes a pass) and placement run over the row itself, reading the
   groups whose maximum reaches the probe. Exact in every tier; the buffer is never silently
   truncated.

   **Tie tier** (issue 25; before the row tier whenever the level the bound was searched over
   holds exact int32 maxima): the level's entries ``> L`` are listed (fewer than k when the
   bound search ended in a tie, at most k + slack otherwise) and only their groups read: the
   keys ``> L`` go to the buffer in position order (count ``c``). ``c >= k`` (and fits): they
   are the candidates of the tiers above, with bound ``L + 1``. ``c < k``: ``T = L``; one pass
   over the row from its start takes, in position order, the keys ``> L`` and the first
   ``k - c`` keys ``== L``, and stops there; the keys ``> L`` after that point are copied from
   the buffer. So a tie costs a pass over the tied keys' positions up to the last one taken
   (2048 keys of an all-zero row), not a search pass over the row per probe. ``c`` above the
   buffer (rows whose scores grow with position: ``ramp``): first the **minimum bound**
   (:func:`_min_bound`): ``_gmax_kernel`` also wrote the minimum key of every supergroup
   (fused) or group (four-launch) of W keys, and ``ceil(k / W)`` of them ``>= t`` prove the
   k-th key ``>= t``, so the tier takes the keys ``>= t`` for the largest such t (about k on a
   ramp, where L admits half the row); where that is not above L (tie-heavy rows), the keys
   above L are counted in buckets and the range narrowed to the bucket of the k-th key until
   at most the buffer reaches it (:func:`_tie_tier`); the row tier remains only where no exact
   level survives.
   These rare tiers run in a launch of their own after stage 3 / the row kernel
   (:func:`_tie_kernel`, ``_TIE_LAUNCH``), so that the common kernels compile without them.

Config keys (dict of ints; keys left out come from :func:`resolve_config`: the
:func:`default_config` of the call's shape, of the path the config pins; the bare defaults are
:data:`DEFAULT_CONFIG`):

==============  ==========  =================================================================
key             default     meaning
==============  ==========  =================================================================
FUSED           by rows     1: the fused path (2 launches); 0: the four-launch path
SLICE_KEYS      by shape    gmax (and four-launch) keys per slice (rounded up to a multiple of
                            GROUP * GROUP_BLOCK)
MAX_SLICES      64          most slices per row (1..1024); fewer when max_keys is short
num_warps       4 or 8      warps of the streaming kernels (gmax; four-launch stage 2)
GROUP           8 / 32      keys per group maximum (power of two, 2..256): fused about 8k
                            groups a row (8 at 131072 keys), four-launch about 2k (32)
GROUP_BLOCK     by shape    groups per inner step of the streaming kernels (power of two)
GROUP2          4           fused: groups per supergroup (the bound's groups; about 2k a row)
SEARCH_WARPS    4 or 8      warps of the row program / bound pass / stage 3 (fused: 8 up to
                            256 rows)
BOUND_TILE      4096        register tile of the bound search; more groups stream from memory
BOUND_SLACK     k / 8       groups the loose bounds (fused; four-launch bound pass) may leave
                            above k (k / 32 for one row on the four-launch path)
COMPACT_TILE    2048 / 1024 fused: group maxima per compaction step (1024 above 256 rows)
PLACE_KEYS      2048 / 1024 fused: keys per placement step (and per selection-placement step)
CAND_TILE       4096        register tile of the selection (power of two)
CAND_CAP        16384       candidate buffer per row (power of two, >= k, >= CAND_TILE)
MAX_REGS        128 / 96    fused: registers per thread the row program may use (``maxnreg``;
                            0 = the compiler's choice): 128 fits four 4-warp programs an SM,
                            96 (from 2048 rows) five (NVIDIA; ignored on ROCm, whose Triton
                            backend has no such option)
ROW_SPLIT       by rows     fused: programs a row (1, 2, 4 or 8): each compacts and gathers a
                            part of the row, the last to finish selects (2 at 33-66 rows, 4 at
                            32: the row programs then fill the device; 1 from 67 rows)
GMAX_BITS       32          fused: 16 stores the group maxima as the keys' top 16 bits (half
                            their traffic; the bound still from exact int32 supergroup or
                            group maxima, the active test as conservative as the truncation;
                            the active list over them as uint16 entries with one program a
                            row and <= 65536 groups, else in an area of its own). Default 32
                            since issue 25: with 16, rows equal in their top 16 bits make
                            every group active (2x the random-row time, H200)
ONE_PASS        0           fused, one program a row, 32-bit maxima: 1 drops the gmax launch;
                            each row program writes its own row's maxima first (GROUP_BLOCK
                            groups a step), so the programs of an SM overlap one row's read
                            with another's selection and no launch boundary drains the
                            device. Default 1 from 30 rows an SM (H200 4096 x 131072: 0.93-
                            0.98x the two launches' time on every distribution; neutral to
                            2% behind at 1024-2048 rows)
==============  ==========  =================================================================

Removed keys (issue 25; :data:`config.REMOVED_KEYS`, rejected with a ConfigError naming them;
the code is at commit ea33f7d): ``SEARCH_BITS`` (2: four-way tile searches), ``SPARSE`` (0:
stage 2 read every key; 2: an active-group list), ``BOUND_PASS`` (0 / 1 forced the bound pass
off / on), ``PDL`` (programmatic dependent launches), ``GATHER_HALF`` (0 forced the masked
whole-group gather). What each did and why it went: docs/notes/indexer_topk.md, "Removed
knobs".

Scratch per row (:func:`scratch_bytes_per_row`), one int32 workspace tensor per call, no
memset. Fused: ``4 * ceil(max_keys / GROUP)`` (group maxima, then the active list) ``+ 4 *
ceil(max_keys / (GROUP * GROUP2))`` (supergroup maxima) ``+ 8 * CAND_CAP`` (candidates) ``+ 4 *
ceil(max_keys / (GROUP * GROUP2))`` (supergroup minima, where :func:`config.min_bound_tile`
says): at 131072 keys 229,376 bytes a row (44% of an fp32 row); ``GMAX_BITS=16`` stores 2
bytes a group maximum and no minima, the list over them (180,224 bytes), or with more than
65536 groups or ``ROW_SPLIT`` > 1 a 4-byte list a group of its own; ``ROW_SPLIT`` > 1 adds the
list and the parts' counts. Four-launch: ``8 * ceil(max_keys / GROUP)`` (group maxima, and the
tie tier's list area) ``+ 8 * CAND_CAP + 4 * (slices + 2)`` ``+ 4 * ceil(max_keys / GROUP)``
(group minima, where ``min_bound_tile`` says): 180,236 bytes at 131072 keys, GROUP 32, one
slice.

Public: :func:`indexer_topk_triton`, :func:`validate_config`, :func:`default_config`,
:func:`resolve_config`, :func:`scratch_bytes_per_row`, :func:`list_in_place`, :func:`plan`,
:data:`DEFAULT_CONFIG`. For the probes only (benchmarks/probes/profile_indexer.py, never
dispatch): :func:`_indexer_topk_stopped`, the fused path stopped after a phase.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

__all__ = ["DEFAULT_CONFIG", "default_config", "indexer_topk_triton", "list_in_place", "plan",
           "resolve_config", "scratch_bytes_per_row", "validate_config"]


from backends.indexer_topk.config import (
    DEFAULT_CONFIG,
    _next_pow2,
    check_inputs,
    default_config,
    list_in_place,
    min_bound_tile,
    plan,
    resolve_config,
    scratch_bytes_per_row,
    validate_config,
)

# ==== 1. Shared: keys and group maxima ======================================================
# Both paths: the order keys of the scores, the group maxima (``_gmax_kernel``, the one full
# read of the scores; also the supergroup levels the fused bound searches), the searches over
# maxima that give a row's bound (exact: ``_kth_search_*``; loose by a slack: ``_loose_kth*``)
# and the placement of a loaded tile's keys above a bound in position order.

# Values a step of the searches that stream from memory (rare paths: rows longer than the
# register tiles). Small on purpose: a 4096-value chunk inside the search loop made the fused
# row program 231 registers on sm_90 (Triton 3.6), half the programs an SM.
MEM_CH = tl.constexpr(1024)


@triton.jit
def _to_key(x):
    """float32 tile -> int32 order keys (NaN -> INT32_MIN + 1, -0.0 -> +0.0)."""
    b = x.to(tl.int32, bitcast=True)
    b = tl.where(b == -2147483648, 0, b)
    key = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
    return tl.where(x != x, -2147483647, key)


@triton.jit
def _row_len(lengths_ptr, row, n_keys):
    length = tl.load(lengths_ptr + row)
    return tl.minimum(tl.maximum(length, 0), n_keys)


@triton.jit
def _load_gm(ptr, idx, m, B16: tl.constexpr):
    """Group maxima at ``ptr + idx`` where ``m`` as int32, INT32_MIN elsewhere; B16: int16
    maxima (``key >> 16``) widened."""
    if B16:
        v = tl.where(m, tl.load(ptr + idx, mask=m, other=0).to(tl.int32), -2147483648)
    else:
        v = tl.load(ptr + idx, mask=m, other=-2147483648)
    return v


@triton.jit
def _half_level(length, k, n_groups2, GS: tl.constexpr, GS2: tl.constexpr):
    """Whether a row's supergroup maxima are of ``GS * GS2 / 2`` keys instead of ``GS * GS2``:
    a row too short for k full supergroups (a causal batch's middle rows) that has k of the
    half ones and room for them. The gmax kernel writes that level and the row program reads
    it, both deciding by this function. Never for GS2 < 4 (half of 2 is the groups themselves,
    which the row program reads directly)."""
    if GS2 >= 4:
        ng2 = (length + GS * GS2 - 1) // (GS * GS2)
        ngh = (length + GS * (GS2 // 2) - 1) // (GS * (GS2 // 2))
        half = (ng2 < k) & (ngh >= k) & (ngh <= n_groups2)
    else:
        half = length < 0
    return half


@triton.jit
def _level16(length, k, n_groups2, GS: tl.constexpr, GS2: tl.constexpr):
    """GMAX_BITS=16: (level, count) of the int32 maxima the gmax kernel writes at ``off_gm2``
    for a row and the row program searches for its bound: 0, of ``GS * GS2`` keys when the row
    has k of those; else 1, of half that size (as :func:`_half_level`); else 2, the group
    maxima themselves when the row has k groups and room for them (``n_groups2``); else 0
    with fewer than k (the bound then comes from the int16 maxima, see ``FALL16``, or none).
    Exact int32 values at every level, so the 16-bit truncation only widens the active test."""
    ng2 = (length + GS * GS2 - 1) // (GS * GS2)
    ng = (length + GS - 1) // GS
    level = tl.full([], 0, tl.int32)
    n2 = ng2
    if _half_level(length, k, n_groups2, GS, GS2):
        level = tl.full([], 1, tl.int32)
        n2 = (length + GS * (GS2 // 2) - 1) // (GS * (GS2 // 2))
    elif (ng2 < k) & (ng >= k) & (ng <= n_groups2):
        level = tl.full([], 2, tl.int32)
        n2 = ng
    return level, n2


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """Programmatic dependent launches (Hopper and later; the four-launch path, see
    :func:`_pdl_ok`), at a kernel's start. ``PDL & 1``: the kernel was launched as a dependent
    and may start before the previous kernel in the stream ends: wait until that kernel has
    completed and its writes are visible, before anything is read or written. ``PDL & 2``:
    then let the next kernel's programs be scheduled at once (they wait in their own
    ``_pdl_enter``), so that its launch overlaps this kernel instead of following it. The
    last kernel of a call never sets 2 (whatever the caller launches next is not ours)."""
    if PDL & 1:
        tl.extra.cuda.gdc_wait()
    if PDL & 2:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _gmax_kernel(scores_ptr, lengths_ptr, gm_ptr, n_keys, stride_s, n_groups, slice_len, k,
                 off_gm2, n_groups2, off_arr, off_min2=0,
                 GS: tl.constexpr = 1, GB: tl.constexpr = 1, GS2: tl.constexpr = 1,
                 ARRIVE: tl.constexpr = 0, B16: tl.constexpr = 0, MIN2: tl.constexpr = 0,
                 PDL: tl.constexpr = 0):
    """Group maxima of ``GS`` keys (and, with GS2 > 1, of ``GS * GS2`` keys at ``off_gm2``).
    ``ARRIVE``: also zero the row's arrival counter at ``off_arr`` (the row kernel's
    ``SPLIT``). ``B16`` (``GMAX_BITS=16``): the group maxima as int16, the top 16 bits of
    the keys (``key >> 16``, a floor), at int16 index ``row * n_groups``; the supergroup
    maxima stay exact int32, and a row without k of them gets its group maxima there too
    (:func:`_level16`). ``MIN2``: also the supergroup *minima* at ``off_min2`` (INT32_MIN for
    a supergroup with a key past the row's length), for the tie kernel's minimum bound (rows
    of full-size supergroups only; the others' area is left unwritten); with GS2 = 1 (the
    four-launch path) the group minima, ``n_groups`` a row."""
    _pdl_enter(PDL)
    row = tl.program_id(0)
    sl = tl.program_id(1)
    if ARRIVE:
        tl.store(gm_ptr + off_arr + row, 0, mask=sl == 0)
    length = _row_len(lengths_ptr, row, n_keys)
    if length > k:
        start = sl * slice_len
        end = tl.minimum(start + slice_len, length)
        gm = gm_ptr
        if B16:
            gm = gm_ptr.to(tl.pointer_type(tl.int16), bitcast=True)
            level, _ = _level16(length, k, n_groups2, GS, GS2)
        else:
            level = _half_level(length, k, n_groups2, GS, GS2)
        n_min = n_groups2 if GS2 > 1 else n_groups
        _gmax_span(scores_ptr + row.to(tl.int64) * stride_s, gm + row.to(tl.int64) * n_groups,
                   gm_ptr + off_gm2 + row.to(tl.int64) * n_groups2, start, end, level, GS, GB,
                   GS2, B16, gm_ptr + off_min2 + row.to(tl.int64) * n_min, MIN2)


@triton.jit
def _gmax_span(src, dst, dst2, start, end, half, GS: tl.constexpr, GB: tl.constexpr,
               GS2: tl.constexpr, B16: tl.constexpr = 0, dst3=None, MIN2: tl.constexpr = 0):
    """The group maxima of keys [start, end) of one row (start a multiple of GS * GB), and with
    GS2 > 1 the supergroup maxima (of half the size when ``half``). B16: ``dst`` is int16 and
    takes each maximum's top 16 bits; ``half`` is :func:`_level16`'s level (2: the int32 group
    maxima at ``dst2``). MIN2 (32-bit maxima, full-size supergroups): the supergroup minima at
    ``dst3`` too, or with GS2 = 1 (the four-launch path) the group minima (a masked key is
    INT32_MIN, so a (super)group with a key past ``end`` gets INT32_MIN)."""
    g_off = tl.arange(0, GB)
    j = tl.arange(0, GS)
    for c0 in range(start, end, GB * GS):
        pos = c0 + g_off[:, None] * GS + j[None, :]
        if c0 + GB * GS <= end:
            # A whole step: unmasked, so 16-byte loads (a mask against the runtime ``end``
            # made every load 4 bytes wide).
            key = _to_key(tl.load(src + pos).to(tl.float32))
        else:
            m = pos < end
            x = tl.load(src + pos, mask=m, other=0.0).to(tl.float32)
            key = tl.where(m, _to_key(x), -2147483648)
        g = tl.max(key, axis=1)
        gidx = c0 // GS + g_off
        if B16:
            tl.store(dst + gidx, (g >> 16).to(tl.int16), mask=gidx * GS < end)
        else:
            tl.store(dst + gidx, g, mask=gidx * GS < end)
        if GS2 == 1:  # noqa: SIM102 (constexpr tests, kept apart as in the fused branch)
            if MIN2:
                tl.store(dst3 + gidx, tl.min(key, axis=1), mask=gidx * GS < end)
        if GS2 > 1:
            if B16:
                if half == 2:
                    tl.store(dst2 + gidx, g, mask=gidx * GS < end)
                elif half == 1:
                    _store_level(dst2, g, c0, end, GS, GB, GS2 // 2)
                else:
                    _store_level(dst2, g, c0, end, GS, GB, GS2)
            elif half:
                _store_level(dst2, g, c0, end, GS, GB, GS2 // 2)
            else:
                _store_level(dst2, g, c0, end, GS, GB, GS2)
                if MIN2:
                    gn = tl.min(tl.reshape(tl.min(key, axis=1), [GB // GS2, GS2]), axis=1)
                    idx = c0 // (GS * GS2) + tl.arange(0, GB // GS2)
                    tl.store(dst3 + idx, gn, mask=idx * (GS * GS2) < end)


@triton.jit
def _store_level(dst, g, c0, end, GS: tl.constexpr, GB: tl.constexpr, L: tl.constexpr):
    """The maxima of each L consecutive group maxima ``g`` of the step at key ``c0``."""
    gl = tl.max(tl.reshape(g, [GB // L, L]), axis=1)
    idx = c0 // (GS * L) + tl.arange(0, GB // L)
    tl.store(dst + idx, gl, mask=idx * (GS * L) < end)


@triton.jit
def _kth_search_tile(x, k, lo, hi, cge, cgt):
    """Largest t in [lo, hi] with #(x >= t) >= k, for a 1-D int32 tile ``x``.

    Invariants: ``cge`` = #(x >= lo) >= k and ``cgt`` = #(x > hi) < k, both known to the
    caller (a count of the keys of the bracket is what each step narrows). Entries that are
    not keys hold INT32_MIN and never count (``lo`` is raised to INT32_MIN + 1, the least key,
    first). lo, hi: int64 or int32 scalars in int32 range; returns an int32 scalar.

    A step counts two probes in one int32 sum (their counts 16 bits apart: tiles of at most
    16,384 entries; larger tiles halve, one probe a step). The probes sit where linear
    interpolation of the bracket's counts puts the k-th key and just above it on even steps,
    and at the bracket's thirds on odd ones (so a step never does worse than a three-way
    split). A bracket whose k-th key is its largest (``need == 1``) or smallest (``need ==
    cin``) ends with one max (min) over its keys; a step that leaves the bracket's count
    unchanged (it only cut empty key space: ties, quantized scores) snaps the bracket to its
    keys' min and max. The probes' offsets below ``hi`` are float32 (a probe only has to lie
    in the bracket; it is clamped there), the bracket's width uint32: a short chain of scalar
    work a step. H200 (`benchmarks/probes/search_tile_probe.py`, 64 and 1056 programs, 4096-
    and 8192-entry tiles of 2,800 candidates): 0.71-0.87x the halving search's time on N(0, 1)
    and `recent` tails, 0.36-0.54x on 256-level quantized scores, 0.87-0.97x on `lowbits`."""
    lo = tl.maximum(lo.to(tl.int32), -2147483647)
    hi = hi.to(tl.int32)
    if x.shape[0] > 16384:
        while lo < hi:
            mid = hi - ((hi - lo).to(tl.uint32) >> 1).to(tl.int32)
            ge = tl.sum((x >= mid).to(tl.int32), axis=0) >= k
            lo = tl.where(ge, mid, lo)
            hi = tl.where(ge, hi, mid - 1)
    else:
        it = tl.full([], 0, tl.int32)
        prev = tl.full([], -1, tl.int32)
        cge = (tl.zeros([], tl.int32) + cge).to(tl.int32)
        cgt = (tl.zeros([], tl.int32) + cgt).to(tl.int32)
        while lo < hi:
            need = k - cgt
            cin = cge - cgt
            if (need == 1) | (need == cin) | (cin == prev):
                if need == 1:
                    lo = tl.max(tl.where((x >= lo) & (x <= hi), x, -2147483648), axis=0)
                    hi = lo
                elif need == cin:
                    lo = tl.min(tl.where((x >= lo) & (x <= hi), x, 2147483647), axis=0)
                    hi = lo
                else:
                    lo, hi = _snap(x, lo, hi)
                    prev = tl.full([], -1, tl.int32)
            else:
                prev = cin
                df = (hi - lo).to(tl.uint32).to(tl.float32)
                if it % 2 == 1:
                    oa = df * 0.6666667
                    ob = df * 0.3333333
                else:
                    r = df / cin.to(tl.float32)
                    oa = (need + 1).to(tl.float32) * r
                    ob = (need - 2).to(tl.float32) * r - 1.0
                lo, hi, cge, cgt = _probe_pair(x, k, lo, hi, cge, cgt, oa, ob, df)
                it += 1
    return lo


@triton.jit
def _snap(x, lo, hi):
    """The least and greatest key of ``x`` in ``[lo, hi]`` (a bracket that a step did not
    narrow: it holds a tie, or keys with empty key space between them)."""
    inb = (x >= lo) & (x <= hi)
    return (tl.min(tl.where(inb, x, 2147483647), axis=0),
            tl.max(tl.where(inb, x, -2147483648), axis=0))


@triton.jit
def _probe_pair(x, k, lo, hi, cge, cgt, oa, ob, df):
    """One step of the interpolation searches: probes ``hi - oa`` and ``hi - ob`` (offsets
    clamped to ``[0, df]``, the bracket's width; ``pa <= pb`` inside ``(lo, hi]``) counted in one
    int32 sum (16 bits apart: tiles of at most 16,384 entries), and the bracket ``[lo, hi]``
    with ``cge`` = #(x >= lo) and ``cgt`` = #(x > hi) narrowed to the part that holds the k-th
    largest. Returns (lo, hi, cge, cgt)."""
    oa = tl.minimum(tl.maximum(oa, 0.0), df).to(tl.uint32).to(tl.int32)
    ob = tl.minimum(tl.maximum(ob, 0.0), df).to(tl.uint32).to(tl.int32)
    pa = tl.maximum(hi - oa, lo + 1)
    pb = tl.maximum(hi - ob, pa)
    s = tl.sum((x >= pa).to(tl.int32) + ((x >= pb).to(tl.int32) << 16), axis=0)
    ca = s & 0xFFFF
    cb = s >> 16
    if cb >= k:
        lo = pb
        cge = cb
    elif ca >= k:
        lo = pa
        cge = ca
        hi = pb - 1
        cgt = cb
    else:
        hi = pa - 1
        cgt = ca
    return lo, hi, cge, cgt


@triton.jit
def _kth_search_mem(ptr, n, k, lo, hi, CH: tl.constexpr, FOUR: tl.constexpr):
    """As :func:`_kth_search_tile` over ``n`` int32 values in memory, CH at a time. FOUR: a
    four-way search instead (three probes that split [lo, hi] in four, counted in one pass:
    their counts packed 21 bits apart in one int64 sum, so at most 2**21 - 1 values), for the
    buffer tier, where a pass over memory costs more than the arithmetic."""
    offs = tl.arange(0, CH)
    if not FOUR:
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            t = mid.to(tl.int32)
            c = tl.full([], 0, tl.int32)
            for c0 in range(0, n, CH):
                v = tl.load(ptr + c0 + offs, mask=c0 + offs < n, other=-2147483648)
                c += tl.sum((v >= t).to(tl.int32), axis=0)
            ge = c >= k
            lo = tl.where(ge, mid, lo)
            hi = tl.where(ge, hi, mid - 1)
    else:
        while lo < hi:
            step = (hi - lo + 4) // 4
            p1 = tl.minimum(lo + step, hi + 1).to(tl.int32)
            p2 = tl.minimum(lo + 2 * step, hi + 1).to(tl.int32)
            p3 = tl.minimum(lo + 3 * step, hi + 1).to(tl.int32)
            tot = tl.full([], 0, tl.int64)
            for c0 in range(0, n, CH):
                v = tl.load(ptr + c0 + offs, mask=c0 + offs < n, other=-2147483648)
                tot += tl.sum((v >= p1).to(tl.int64) + ((v >= p2).to(tl.int64) << 21)
                              + ((v >= p3).to(tl.int64) << 42), axis=0)
            js = ((tot & 0x1FFFFF) >= k).to(tl.int64) \
                + (((tot >> 21) & 0x1FFFFF) >= k).to(tl.int64) + ((tot >> 42) >= k).to(tl.int64)
            lo = lo + js * step
            hi = tl.minimum(hi, lo + step - 1)
    return lo


@triton.jit
def _loose_kth_tile(x, k, lo, hi, cnt_lo, slack):
    """A lower bound of the k-th largest of the 1-D int32 tile ``x`` (INT32_MIN = no value),
    found as soon as at most ``k + slack`` values are >= it. Any ``lo`` with #(x >= lo) >= k
    bounds the k-th largest from below; the search only tightens it. ``cnt_lo`` = #(x >= lo)
    at the start; lo, hi: int64 scalars (min and max of x). Returns (lo, #(x >= lo)), int64.

    As :func:`_kth_search_tile`: two probes a step in one int32 sum, aimed by interpolation at
    counts a quarter and three quarters into the window ``[k, k + slack]`` on even steps, at
    the bracket's thirds on odd ones, and a step that leaves the bracket's count unchanged
    snaps it to its keys' min and max (a tie wider than the slack ends there). Tiles of more
    than 16,384 entries halve."""
    if x.shape[0] > 16384:
        while (lo < hi) & (cnt_lo > k + slack):
            mid = lo + (hi - lo + 1) // 2
            c = tl.sum((x >= mid.to(tl.int32)).to(tl.int32), axis=0).to(tl.int64)
            ge = c >= k
            lo = tl.where(ge, mid, lo)
            hi = tl.where(ge, hi, mid - 1)
            cnt_lo = tl.where(ge, c, cnt_lo)
        res = lo
        cnt = cnt_lo
    else:
        lo32 = tl.maximum(lo.to(tl.int32), -2147483647)
        hi32 = hi.to(tl.int32)
        cge = cnt_lo.to(tl.int32)
        cgt = tl.full([], 0, tl.int32)
        it = tl.full([], 0, tl.int32)
        prev = tl.full([], -1, tl.int32)
        while (lo32 < hi32) & (cge > k + slack):
            cin = cge - cgt
            if cin == prev:
                lo32, hi32 = _snap(x, lo32, hi32)
                prev = tl.full([], -1, tl.int32)
            else:
                prev = cin
                df = (hi32 - lo32).to(tl.uint32).to(tl.float32)
                if it % 2 == 1:
                    oa = df * 0.6666667
                    ob = df * 0.3333333
                else:
                    r = df / cin.to(tl.float32)
                    need = (k - cgt).to(tl.float32)
                    oa = (need + 0.75 * slack.to(tl.float32)) * r
                    ob = (need + 0.25 * slack.to(tl.float32)) * r
                lo32, hi32, cge, cgt = _probe_pair(x, k, lo32, hi32, cge, cgt, oa, ob, df)
                it += 1
        res = lo32.to(tl.int64)
        cnt = cge.to(tl.int64)
    return res, cnt


@triton.jit
def _loose_kth_mem(ptr, n, k, slack, CH: tl.constexpr, B16: tl.constexpr = 0):
    """:func:`_loose_kth_tile` over ``n`` int32 values in memory, CH at a time (int32; B16:
    int16 values, see :func:`_load_gm`)."""
    offs = tl.arange(0, CH)
    hi32 = tl.full([], -2147483648, tl.int32)
    lo32 = tl.full([], 2147483647, tl.int32)
    for c0 in range(0, n, CH):
        m = c0 + offs < n
        v = _load_gm(ptr + c0, offs, m, B16)
        hi32 = tl.maximum(hi32, tl.max(v, axis=0))
        lo32 = tl.minimum(lo32, tl.min(tl.where(m, v, 2147483647), axis=0))
    lo = lo32.to(tl.int64)
    hi = hi32.to(tl.int64)
    cnt_lo = n.to(tl.int64)
    while (lo < hi) & (cnt_lo > k + slack):
        mid = lo + (hi - lo + 1) // 2
        t = mid.to(tl.int32)
        c = tl.full([], 0, tl.int32)
        for c0 in range(0, n, CH):
            v = _load_gm(ptr + c0, offs, c0 + offs < n, B16)
            c += tl.sum((v >= t).to(tl.int32), axis=0)
        c64 = c.to(tl.int64)
        ge = c64 >= k
        lo = tl.where(ge, mid, lo)
        hi = tl.where(ge, hi, mid - 1)
        cnt_lo = tl.where(ge, c64, cnt_lo)
    return lo.to(tl.int32), cnt_lo


@triton.jit
def _loose_kth(ptr, n, k, slack, GT: tl.constexpr, B16: tl.constexpr = 0):
    """A lower bound of the k-th largest of ``n`` int32 values in memory, loose by at most
    ``slack``, and by at most half of ``n - k`` (with barely more than k values, a slack that
    stops the search at once leaves their minimum, an extreme order statistic: a row just
    past a level's k groups then had more candidates than the buffer and ran the row tier,
    ~1 ms; measured on a causal batch). Searched in a register tile of GT when they fit, else
    streamed MEM_CH at a time. B16: int16 values (:func:`_load_gm`), the bound in their
    domain."""
    slack = tl.minimum(slack, (n - k) // 2)
    if n <= GT:
        o = tl.arange(0, GT)
        m = o < n
        v = _load_gm(ptr, o, m, B16)
        hi = tl.max(v, axis=0).to(tl.int64)
        lo = tl.min(tl.where(m, v, 2147483647), axis=0).to(tl.int64)
        lb, cnt = _loose_kth_tile(v, k, lo, hi, n.to(tl.int64), slack)
        lb = lb.to(tl.int32)
    else:
        lb, cnt = _loose_kth_mem(ptr, n, k, slack, MEM_CH, B16)
    return lb, cnt


@triton.jit
def _place_loaded(x, pos, m, lb, run, cpos, ckey, cap, NT: tl.constexpr):
    """Place in position order, from ``run`` on, the keys >= lb of a loaded [groups, GS] tile
    of scores ``x`` at positions ``pos`` (valid where ``m``); returns the new count."""
    key = _to_key(x.to(tl.float32))
    ci = (m & (key >= lb)).to(tl.int32)
    # Position order is the tile's row-major order: a key's slot is the count of the groups
    # before its group plus its offset inside the group, both computed in the tile's own layout
    # (a scan of the flattened tile costs layout conversions through shared memory).
    before = tl.sum(tl.cumsum(ci, axis=0) - ci, axis=1)
    dst = run + before[:, None] + tl.cumsum(ci, axis=1) - ci
    wm = (ci != 0) & (dst < cap)
    tl.store(cpos + dst, pos, mask=wm)
    tl.store(ckey + dst, key, mask=wm)
    return run + tl.sum(tl.sum(ci, axis=1), axis=0)


# ==== 2. Four-launch path (FUSED=0) =========================================================
# Stage 2: the bound pass (several slices a row) and the slice programs that count and place
# the candidates; then stage 3, the selection, whose tiers the fused path reuses (below).


@triton.jit
def _row_bound(gm_ptr, row, length, n_groups, k, GS: tl.constexpr, GT: tl.constexpr,
               CHUNKED: tl.constexpr):
    """L: the exact k-th largest group maximum of the row (INT32_MIN with fewer than k groups)."""
    ng = (length + GS - 1) // GS
    src = gm_ptr + row.to(tl.int64) * n_groups
    offs = tl.arange(0, GT)
    res = tl.full([], -2147483648, tl.int64)
    if ng >= k:
        if CHUNKED:
            hi = tl.full([], -2147483648, tl.int32)
            lo = tl.full([], 2147483647, tl.int32)
            for c0 in range(0, ng, GT):
                m = c0 + offs < ng
                v = tl.load(src + c0 + offs, mask=m, other=-2147483648)
                hi = tl.maximum(hi, tl.max(v, axis=0))
                lo = tl.minimum(lo, tl.min(tl.where(m, v, 2147483647), axis=0))
            res = _kth_search_mem(src, ng, k, lo.to(tl.int64), hi.to(tl.int64), GT, 0)
        else:
            m = offs < ng
            v = tl.load(src + offs, mask=m, other=-2147483648)
            hi = tl.max(v, axis=0).to(tl.int64)
            lo = tl.min(tl.where(m, v, 2147483647), axis=0).to(tl.int64)
            res = _kth_search_tile(v, k, lo, hi, ng, 0).to(tl.int64)
    return res.to(tl.int32)


@triton.jit
def _bound_kernel(lengths_ptr, ws_ptr, n_keys, n_groups, k, off_bound, slack,
                  GS: tl.constexpr, GT: tl.constexpr, PDL: tl.constexpr = 0):
    """Several slices a row: the row's bound once, for the slice programs of the next
    launches to read (instead of each repeating the search in both passes): a
    lower bound of the k-th largest group maximum, loose by at most ``slack`` groups (fewer
    search steps than the exact value; every top-k key is still >= it)."""
    _pdl_enter(PDL)
    row = tl.program_id(0)
    length = _row_len(lengths_ptr, row, n_keys)
    if length > k:
        ng = (length + GS - 1) // GS
        src = ws_ptr + row.to(tl.int64) * n_groups
        lb = tl.full([], -2147483648, tl.int32)
        if ng >= k:
            lb, _ = _loose_kth(src, ng, k, slack, GT)
        tl.store(ws_ptr + off_bound + row, lb)


@triton.jit
def _place_tile(src, pos, m, lb, run, cpos, ckey, cap, COUNT_ONLY: tl.constexpr,
                NT: tl.constexpr):
    """Count (COUNT_ONLY) or place in position order the keys >= lb of one [groups, GS] tile."""
    x = tl.load(src + pos, mask=m, other=0.0)
    if COUNT_ONLY:
        ci = (m & (_to_key(x.to(tl.float32)) >= lb)).to(tl.int32)
        run += tl.sum(tl.sum(ci, axis=1), axis=0)
    else:
        run = _place_loaded(x, pos, m, lb, run, cpos, ckey, cap, NT)
    return run


@triton.jit
def _place_kernel(scores_ptr, lengths_ptr, ws_ptr, n_keys, stride_s, n_groups, slice_len,
                  n_slices, k, cap, off_bound, off_ncand, off_cnt, off_cpos, off_ckey,
                  GS: tl.constexpr, GB: tl.constexpr, SP: tl.constexpr, GT: tl.constexpr,
                  CHUNKED: tl.constexpr, COUNT_ONLY: tl.constexpr, SINGLE: tl.constexpr,
                  BOUND_IN: tl.constexpr, PDL: tl.constexpr = 0):
    """Four-launch stage 2, one program a (row, slice): the row's bound (the exact one from
    the group maxima with one slice; with several, the one ``_bound_kernel`` wrote), then the
    slice's keys >= it counted (COUNT_ONLY) or placed in position order at the slice's prefix
    of the counts, reading only the groups whose maximum reaches the bound."""
    _pdl_enter(PDL)
    row = tl.program_id(0)
    sl = tl.program_id(1)
    length = _row_len(lengths_ptr, row, n_keys)
    if length > k:
        if BOUND_IN:
            lb = tl.load(ws_ptr + off_bound + row)
        else:
            lb = _row_bound(ws_ptr, row, length, n_groups, k, GS, GT, CHUNKED)
        start = sl * slice_len
        end = tl.minimum(start + slice_len, length)
        src = scores_ptr + row.to(tl.int64) * stride_s
        gsrc = ws_ptr + row.to(tl.int64) * n_groups
        row_c = row.to(tl.int64) * cap
        cpos = ws_ptr + off_cpos + row_c
        ckey = ws_ptr + off_ckey + row_c
        cnt_row = ws_ptr + off_cnt + row.to(tl.int64) * n_slices
        base = tl.full([], 0, tl.int32)
        go = True
        if not COUNT_ONLY:
            if not BOUND_IN:  # noqa: SIM102 (constexpr, then a runtime test)
                if sl == 0:
                    tl.store(ws_ptr + off_bound + row, lb)
            if not SINGLE:
                si = tl.arange(0, SP)
                cnts = tl.load(cnt_row + si, mask=si < n_slices, other=0)
                base = tl.sum(tl.where(si < sl, cnts, 0), axis=0)
                total = tl.sum(cnts, axis=0)
                go = total <= cap
                if sl == 0:
                    tl.store(ws_ptr + off_ncand + row, total)
        g_off = tl.arange(0, GB)
        j = tl.arange(0, GS)
        run = base
        if go:
            for c0 in range(start, end, GB * GS):
                # Read only the groups whose maximum reaches the bound.
                gidx = c0 // GS + g_off
                gval = tl.load(gsrc + gidx, mask=gidx * GS < end, other=-2147483648)
                act = gval >= lb
                live = tl.sum(act.to(tl.int32), axis=0) > 0
                if live:
                    pos = c0 + g_off[:, None] * GS + j[None, :]
                    m = act[:, None] & (pos < end)
                    run = _place_tile(src, pos, m, lb, run, cpos, ckey, cap, COUNT_ONLY,
                                      GB * GS)
        if COUNT_ONLY:
            tl.store(cnt_row + sl, run)
        elif SINGLE:
            tl.store(ws_ptr + off_ncand + row, run)


# ---- stage 3: the selection over the buffered candidates, and the rare tiers (the tie tier,
# ---- the row tier) of rows whose candidates overflow the buffer. Also called by the fused
# ---- row program and by ``_tie_kernel`` (section 3) for both paths.

# Buckets a pass of the tie tier's refinement (rows with more keys above the bound than the
# buffer holds): 32 narrow a 32-bit range to one value in at most seven passes, usually one
# (a bucket of a ramp's keys holds ~1/32 of them: under the buffer). 256 cost ~100
# instructions a key (tl.histogram's ballots and popcounts; H200: ramp 4096 rows 3.1 ms).
TIE_NB = tl.constexpr(32)


@triton.jit
def _short_row(out, length, k, KB: tl.constexpr):
    """A row with at most k valid keys: positions 0..length-1, then -1."""
    ko = tl.arange(0, KB)
    for c0 in range(0, k, KB):
        i = c0 + ko
        tl.store(out + i, tl.where(i < length, i, -1), mask=i < k)


@triton.jit
def _place_selected(kp, pp, out, n, t, need, CH: tl.constexpr):
    """Write, in position order, the positions of the ``n`` buffered candidates with key > t
    and of the first ``need`` with key == t (CH at a time)."""
    offs = tl.arange(0, CH)
    run_sel = tl.full([], 0, tl.int32)
    run_eq = tl.full([], 0, tl.int32)
    for c0 in range(0, n, CH):
        cm = c0 + offs < n
        keys = tl.load(kp + c0 + offs, mask=cm, other=-2147483648)
        gt = keys > t
        eq = (keys == t).to(tl.int32)
        sel = gt | ((eq != 0) & ((run_eq + tl.cumsum(eq, axis=0) - eq) < need))
        si = sel.to(tl.int32)
        dst = run_sel + tl.cumsum(si, axis=0) - si
        p = tl.load(pp + c0 + offs, mask=sel, other=0)
        tl.store(out + dst, p, mask=sel)
        run_sel += tl.sum(si, axis=0)
        run_eq += tl.sum(eq, axis=0)


@triton.jit
def _count_gt_mem(ptr, n, t, CH: tl.constexpr):
    offs = tl.arange(0, CH)
    c = tl.full([], 0, tl.int32)
    for c0 in range(0, n, CH):
        v = tl.load(ptr + c0 + offs, mask=c0 + offs < n, other=-2147483648)
        c += tl.sum((v > t).to(tl.int32), axis=0)
    return c


@triton.jit
def _refine_cands(kp, pp, n, k, lb, CAP: tl.constexpr):
    """Candidates ``CAP < n <= 4 * CAP`` in the buffer: a tighter bound from the maxima of R
    consecutive candidates (R = 2 or 4, so that they fit a register tile of CAP), the exact
    k-th largest of those (k distinct keys reach it, so every top-k key does), and the buffer
    compacted in place, in order, to the candidates reaching it. Returns (n, bound): at most
    R * k candidates unless ties cross the bound, usually few enough for the tile. Skipped
    (unchanged) when the maxima are fewer than k."""
    o = tl.arange(0, CAP)
    mx = tl.full([CAP], -2147483648, tl.int32)
    if n <= 2 * CAP:
        nm = (n + 1) // 2
        for r in tl.static_range(2):
            mx = tl.maximum(mx, tl.load(kp + o * 2 + r, mask=o * 2 + r < n, other=-2147483648))
    else:
        nm = (n + 3) // 4
        for r in tl.static_range(4):
            mx = tl.maximum(mx, tl.load(kp + o * 4 + r, mask=o * 4 + r < n, other=-2147483648))
    if nm >= k:
        hi = tl.max(mx, axis=0).to(tl.int64)
        lo = tl.min(tl.where(o < nm, mx, 2147483647), axis=0).to(tl.int64)
        lb = tl.maximum(lb, _kth_search_tile(mx, k, lo, hi, nm, 0))
        offs = tl.arange(0, MEM_CH)
        kept = tl.full([], 0, tl.int32)
        for c0 in range(0, n, MEM_CH):
            m = c0 + offs < n
            v = tl.load(kp + c0 + offs, mask=m, other=-2147483648)
            p = tl.load(pp + c0 + offs, mask=m, other=0)
            ki = (m & (v >= lb)).to(tl.int32)
            dst = kept + tl.cumsum(ki, axis=0) - ki
            kept += tl.sum(ki, axis=0)
            tl.debug_barrier()   # every thread has read this chunk before any overwrite
            tl.store(kp + dst, v, mask=ki != 0)   # dst <= c0 + offs: read already
            tl.store(pp + dst, p, mask=ki != 0)
        tl.debug_barrier()
        n = kept
    return n, lb


@triton.jit
def _select_tile(kp, pp, out, n, lb, k, T: tl.constexpr, PCH: tl.constexpr):
    """Stage 3 of ``n <= T`` buffered candidates (keys >= ``lb``) in a register tile of T: T by
    :func:`_kth_search_tile`, then the keys > T and the first ``k - #(> T)`` keys == T written
    in position order (from the tile, or from memory PCH at a time when ``PCH < T``)."""
    offs = tl.arange(0, T)
    cm = offs < n
    keys = tl.load(kp + offs, mask=cm, other=-2147483648)
    hi = tl.max(keys, axis=0).to(tl.int64)
    t = _kth_search_tile(keys, k, lb, hi, n, 0)
    gt = keys > t
    need = k - tl.sum(gt.to(tl.int32), axis=0)
    if PCH >= T:
        eq = (keys == t).to(tl.int32)
        sel = gt | ((eq != 0) & ((tl.cumsum(eq, axis=0) - eq) < need))
        si = sel.to(tl.int32)
        dst = tl.cumsum(si, axis=0) - si
        p = tl.load(pp + offs, mask=sel, other=0)
        tl.store(out + dst, p, mask=sel)
    else:
        # Place from memory, PCH at a time (fewer live registers than the whole tile).
        _place_selected(kp, pp, out, n, t, need, PCH)


@triton.jit
def _select_buffered(kp, pp, out, n, lb, k, CAP: tl.constexpr, PCH: tl.constexpr,
                     DBL: tl.constexpr):
    """Stage 3 when the buffer (keys at ``kp``, positions at ``pp``, position order) holds all
    ``n`` candidates (keys >= ``lb``) of a row: in the register tile of CAP; up to twice that in
    a tile of 2 * CAP, searched as one (a `recent` row's ~4,200 candidates at 131,072 keys took
    a refinement and two searches before; tiles up to 16,384 entries); a few times more after a
    refinement; else searched and placed over the buffer. The double tile only in the fused
    row kernel, where the wrapper allows it (DBL: a register cap of at least 128; the 4-warp
    programs of 96 registers at 4096 rows would spill 280 bytes, sm_90 cross-compile; 128 at
    1024 rows spills none). Not in the four-launch selection nor the tie tier: there it cost a
    random-like row 3-4 us (H200, session 26) for 1.8 us on `recent`. The constexpr tests
    stand apart from the runtime one so that the double tile is not compiled where it is off."""
    if DBL & (2 * CAP <= 16384):
        if (n > CAP) & (n <= 2 * CAP):
            _select_tile(kp, pp, out, n, lb, k, 2 * CAP, PCH)
        else:
            _select_refined(kp, pp, out, n, lb, k, CAP, PCH)
    else:
        _select_refined(kp, pp, out, n, lb, k, CAP, PCH)


@triton.jit
def _select_refined(kp, pp, out, n, lb, k, CAP: tl.constexpr, PCH: tl.constexpr):
    """:func:`_select_buffered` without the double tile: the register tile of CAP (after a
    refinement when there are a few times more), else searched and placed over the buffer."""
    if (n > CAP) & (n <= 4 * CAP):
        # A few times too many for the tile (a row with fewer than k groups).
        n, lb = _refine_cands(kp, pp, n, k, lb, CAP)
    if n <= CAP:
        _select_tile(kp, pp, out, n, lb, k, CAP, PCH)
    else:
        # Search and place over the buffer, MEM_CH at a time (four-way: a register tile of
        # the buffer here would cost every row registers for a rare tier).
        mo = tl.arange(0, MEM_CH)
        hi32 = tl.full([], -2147483648, tl.int32)
        for c0 in range(0, n, MEM_CH):
            v = tl.load(kp + c0 + mo, mask=c0 + mo < n, other=-2147483648)
            hi32 = tl.maximum(hi32, tl.max(v, axis=0))
        t = _kth_search_mem(kp, n, k, lb.to(tl.int64), hi32.to(tl.int64), MEM_CH, 1)
        t = t.to(tl.int32)
        need = k - _count_gt_mem(kp, n, t, MEM_CH)
        _place_selected(kp, pp, out, n, t, need, min(PCH, CAP))


@triton.jit
def _active_groups(gsrc, c0, g_off, length, t, GS: tl.constexpr, USE_GM: tl.constexpr):
    """Groups of the step at ``c0`` that may hold a key >= t (all of them without USE_GM)."""
    gidx = c0 // GS + g_off
    if USE_GM:
        gval = tl.load(gsrc + gidx, mask=gidx * GS < length, other=-2147483648)
        act = gval >= t
    else:
        act = gidx * GS < length
    return act


@triton.jit
def _count3_ge_row(src, gsrc, length, t1, t2, t3, GS: tl.constexpr, GB: tl.constexpr,
                   USE_GM: tl.constexpr):
    """#(valid keys >= t) for t1 <= t2 <= t3 in one pass, reading groups whose maximum >= t1
    (every group without USE_GM)."""
    g_off = tl.arange(0, GB)
    j = tl.arange(0, GS)
    c1 = tl.full([], 0, tl.int32)
    c2 = tl.full([], 0, tl.int32)
    c3 = tl.full([], 0, tl.int32)
    for c0 in range(0, length, GB * GS):
        act = _active_groups(gsrc, c0, g_off, length, t1, GS, USE_GM)
        if tl.sum(act.to(tl.int32), axis=0) > 0:
            pos = c0 + g_off[:, None] * GS + j[None, :]
            m = act[:, None] & (pos < length)
            key = _to_key(tl.load(src + pos, mask=m, other=0.0).to(tl.float32))
            c1 += tl.sum(tl.sum((m & (key >= t1)).to(tl.int32), axis=1), axis=0)
            c2 += tl.sum(tl.sum((m & (key >= t2)).to(tl.int32), axis=1), axis=0)
            c3 += tl.sum(tl.sum((m & (key >= t3)).to(tl.int32), axis=1), axis=0)
    return c1, c2, c3


@triton.jit
def _count_ge_row(src, gsrc, length, t, GS: tl.constexpr, GB: tl.constexpr,
                  USE_GM: tl.constexpr):
    """#(valid keys >= t) of a row, reading only groups whose maximum is >= t (USE_GM)."""
    g_off = tl.arange(0, GB)
    j = tl.arange(0, GS)
    c = tl.full([], 0, tl.int32)
    for c0 in range(0, length, GB * GS):
        act = _active_groups(gsrc, c0, g_off, length, t, GS, USE_GM)
        if tl.sum(act.to(tl.int32), axis=0) > 0:
            pos = c0 + g_off[:, None] * GS + j[None, :]
            m = act[:, None] & (pos < length)
            key = _to_key(tl.load(src + pos, mask=m, other=0.0).to(tl.float32))
            c += tl.sum(tl.sum((m & (key >= t)).to(tl.int32), axis=1), axis=0)
    return c


@triton.jit(noinline=True)
def _row_tier(src, gsrc, out, length, lb, k, GS: tl.constexpr, GB: tl.constexpr,
              USE_GM: tl.constexpr):
    """The last resort (more keys above the bound than the buffer holds, and no exact level to
    tighten it): search and place over the row itself, three probes a pass (USE_GM: reading
    only the groups whose maximum at ``gsrc`` reaches the probe)."""
    ng = (length + GS - 1) // GS
    go = tl.arange(0, GB)
    hi32 = tl.full([], 0x7F800000, tl.int32)  # +inf's key: no real key is larger
    if USE_GM:
        hi32 = tl.full([], -2147483648, tl.int32)
        for g0 in range(0, ng, GB):
            gv = tl.load(gsrc + g0 + go, mask=g0 + go < ng, other=-2147483648)
            hi32 = tl.maximum(hi32, tl.max(gv, axis=0))
    lo64 = lb.to(tl.int64)
    hi64 = hi32.to(tl.int64)
    # Four-way search (three probes a pass over the row: the pass is memory-bound).
    while lo64 < hi64:
        step = (hi64 - lo64 + 4) // 4
        p1 = tl.minimum(lo64 + step, hi64 + 1).to(tl.int32)
        p2 = tl.minimum(lo64 + 2 * step, hi64 + 1).to(tl.int32)
        p3 = tl.minimum(lo64 + 3 * step, hi64 + 1).to(tl.int32)
        c1, c2, c3 = _count3_ge_row(src, gsrc, length, p1, p2, p3, GS, GB, USE_GM)
        js = (c1 >= k).to(tl.int64) + (c2 >= k).to(tl.int64) + (c3 >= k).to(tl.int64)
        lo64 = lo64 + js * step
        hi64 = tl.minimum(hi64, lo64 + step - 1)
    t = lo64.to(tl.int32)
    # t + 1 cannot overflow: the largest real key is +inf's (0x7F800000).
    need = k - _count_ge_row(src, gsrc, length, t + 1, GS, GB, USE_GM)
    j = tl.arange(0, GS)
    run_sel = tl.full([], 0, tl.int32)
    run_eq = tl.full([], 0, tl.int32)
    for c0 in range(0, length, GB * GS):
        act = _active_groups(gsrc, c0, go, length, t, GS, USE_GM)
        if tl.sum(act.to(tl.int32), axis=0) > 0:
            pos = c0 + go[:, None] * GS + j[None, :]
            m = act[:, None] & (pos < length)
            key = _to_key(tl.load(src + pos, mask=m, other=0.0).to(tl.float32))
            fm = tl.reshape(m, [GB * GS])
            fk = tl.reshape(key, [GB * GS])
            fp = tl.reshape(pos, [GB * GS])
            eq = (fm & (fk == t)).to(tl.int32)
            gt = fm & (fk > t)
            sel = gt | ((eq != 0) & ((run_eq + tl.cumsum(eq, axis=0) - eq) < need))
            si = sel.to(tl.int32)
            dst = run_sel + tl.cumsum(si, axis=0) - si
            tl.store(out + dst, fp, mask=sel)
            run_sel += tl.sum(si, axis=0)
            run_eq += tl.sum(eq, axis=0)


@triton.jit
def _tie_list(lvl, n_lvl, m, lb, glist, CT: tl.constexpr, L16: tl.constexpr):
    """Tie tier, step 1: the groups (of GS keys) of the level's entries above ``lb`` (each
    entry the maximum of ``m`` consecutive groups), in order, from ``glist`` on; returns their
    number and the largest listed entry (the largest key in those groups; INT32_MIN when none).
    Fewer than k entries lie above L when the bound search ended in a tie (L is then the exact
    k-th largest entry), at most k + slack otherwise. ``glist`` may be the level itself
    (m == 1): each store lands at or below an entry already read."""
    o = tl.arange(0, CT)
    n_f = tl.full([], 0, tl.int32)
    hi = tl.full([], -2147483648, tl.int32)
    for c0 in range(0, n_lvl, CT):
        v = tl.load(lvl + c0 + o, mask=c0 + o < n_lvl, other=-2147483648)
        fb = (c0 + o < n_lvl) & (v > lb)
        hi = tl.maximum(hi, tl.max(tl.where(fb, v, -2147483648), axis=0))
        f = fb.to(tl.int32)
        dst = (n_f + tl.cumsum(f, axis=0) - f) * m
        n_f += tl.sum(f, axis=0)
        tl.debug_barrier()
        for i in range(0, m):
            g = (c0 + o) * m + i
            if L16:
                tl.store(glist + dst + i, g.to(tl.int16), mask=f != 0)
            else:
                tl.store(glist + dst + i, g, mask=f != 0)
    tl.debug_barrier()
    return n_f * m, hi


@triton.jit
def _tie_pass(src, glist, length, lo, top, base, s, smask, n_list, cap, cpos, ckey, hist,
              GS: tl.constexpr, GB: tl.constexpr, HALF: tl.constexpr, L16: tl.constexpr,
              NB: tl.constexpr, PLACE: tl.constexpr):
    """Tie tier: one pass over the ``n_list`` listed groups (pipelined as
    :func:`_gather_cands`). PLACE: the keys >= ``lo`` placed in position order in the buffer
    while it has room (no placement after the step that overflows it: the count returned is
    then above ``cap`` but not the total). ``hist`` (runtime): the histogram of the keys in
    ``[lo, top]`` over NB buckets, bucket ``(key - base) >> s`` (``smask``: the bits that
    shift leaves, so that the shift is logical), returned (zeros without ``hist``)."""
    run = tl.full([], 0, tl.int32)
    h = tl.zeros([NB], dtype=tl.int32)
    N: tl.constexpr = GB * GS
    gi, v_next = _list_entries(glist, 0, n_list, GB, HALF, L16)
    x_next, pos_n = _list_scores(src, gi, v_next, length, GS, GB, HALF)
    gi_next, v_after = _list_entries(glist, GB, n_list, GB, HALF, L16)
    a0 = tl.full([], 0, tl.int32)
    # Without the histogram, the pass ends once the buffer has overflowed.
    while (a0 < n_list) & (hist | (run <= cap)):
        x = x_next
        pos = pos_n
        pm = v_next[:, None] & (pos < length)
        x_next, pos_n = _list_scores(src, gi_next, v_after, length, GS, GB, HALF)
        v_next = v_after
        gi_next, v_after = _list_entries(glist, a0 + 2 * GB, n_list, GB, HALF, L16)
        if PLACE:  # noqa: SIM102 (constexpr, then a runtime test)
            if run <= cap:
                run = _place_loaded(x, pos, pm, lo, run, cpos, ckey, cap, N)
        if hist:
            key = _to_key(x.to(tl.float32))
            inr = pm & (key >= lo) & (key <= top)
            b = tl.where(inr, ((key - base) >> s) & smask, 0)
            h += tl.histogram(tl.reshape(b, [N]), NB, mask=tl.reshape(inr, [N]))
        a0 += GB
    tl.debug_barrier()
    return run, h


@triton.jit
def _bucket_shift(lo, top, NB: tl.constexpr):
    """The shift s that maps ``[lo, top]`` (int64) into NB buckets of ``(key - lo) >> s``,
    and the mask of the bits a 32-bit arithmetic shift by s leaves (a logical shift)."""
    r = top - lo
    s = tl.full([], 0, tl.int32)
    while (r >> s.to(tl.int64)) >= NB:
        s += 1
    smask = ((tl.full([], 1, tl.int64) << (32 - s).to(tl.int64)) - 1).to(tl.int32)
    return s, smask


@triton.jit
def _pick_bucket(h, base, s, top, above, k, NB: tl.constexpr):
    """The bucket of histogram ``h`` (buckets ``base + (j << s)``, the last one ending at
    ``top``) that holds the k-th largest key, given ``above`` keys larger than ``top`` and at
    least k keys >= ``base``: returns its range ``[lo, hi]`` (int64), the number of keys >=
    lo (>= k) and the number above hi (< k)."""
    idx = tl.arange(0, NB)
    tot = tl.sum(h, axis=0)
    ge = above + tot - tl.cumsum(h, axis=0) + h       # keys >= bucket j's first value
    j = tl.sum((ge >= k).to(tl.int32), axis=0) - 1
    n_ge = tl.sum(tl.where(idx == j, ge, 0), axis=0)
    h_j = tl.sum(tl.where(idx == j, h, 0), axis=0)
    lo = base + (j.to(tl.int64) << s.to(tl.int64))
    hi = tl.minimum(top, lo + (tl.full([], 1, tl.int64) << s.to(tl.int64)) - 1)
    return lo, hi, n_ge, n_ge - h_j


@triton.jit(noinline=True)
def _tie_tier(src, out, length, lb, k, cap, kp, pp, lvl, n_lvl, m, glist, relist,
              GS: tl.constexpr, TGB: tl.constexpr, HALF: tl.constexpr, L16: tl.constexpr,
              CT: tl.constexpr, CAP: tl.constexpr, PCH: tl.constexpr, NB: tl.constexpr):
    """The tier for rows whose candidates (keys >= the bound L) overflowed the buffer, or
    whose bound sits in a tie: ``lvl`` holds ``n_lvl`` exact int32 maxima of ``m`` groups each
    (the level the bound was searched over). Its own function (not inlined), so that the
    common path compiles as without it.

    1. The groups of the level's entries > L are listed (:func:`_tie_list`; at most k + slack
       entries, fewer than k after a tie) and one pass over them places the keys > L in the
       buffer (count c), ending once the buffer overflows.
    2. c < k: T = L, and :func:`_eq_scan` takes the first ``k - c`` keys equal to L after the
       c larger ones. k <= c <= cap: an ordinary selection over them (bound L + 1).
    3. c > cap (rows whose scores grow with position: half the row above L): a pass counts
       the keys in ``(L, max]`` in NB buckets; the bucket
       holding the k-th largest key is the new range; while more than ``cap`` keys reach its
       first value and it holds several values, it is split again (NB buckets a pass over the
       keys in it: at most four passes for a 32-bit range, usually none). Then the keys >= its
       first value (at most cap) are placed and selected, or, the range being one value T
       with more than cap keys >= T, the keys > T are placed and :func:`_eq_scan` takes the
       rest of the k among the keys == T. ``relist`` (the level survives the listing: it is
       not the list itself): each later pass reads only the groups of the entries reaching
       the range (a few hundred keys for a ramp), else the first list again.
    Exact in every case; the buffer is never trusted past ``cap``."""
    n_list, hi = _tie_list(lvl, n_lvl, m, lb, glist, CT, L16)
    lo = lb.to(tl.int64) + 1
    top = hi.to(tl.int64)
    s, smask = _bucket_shift(lo, top, NB)
    run, _ = _tie_pass(src, glist, length, lb + 1, hi, lb + 1, s, smask, n_list, cap, pp, kp,
                       False, GS, TGB, HALF, L16, NB, 1)
    t = lb
    need = k - run
    n_gt = run
    eq_mode = run < k
    sel_lb = lb + 1
    if run > cap:
        # The histogram of every key above L (a pass of its own: counting costs ~30
        # instructions a key, too much for the rows that fit the buffer).
        _, h = _tie_pass(src, glist, length, lb + 1, hi, lb + 1, s, smask, n_list, cap, pp, kp,
                         True, GS, TGB, HALF, L16, NB, 0)
        lo, top, n_ge, above = _pick_bucket(h, lo, s, top, 0, k, NB)
        while (n_ge > cap) & (lo < top):
            if relist:
                n_list, _ = _tie_list(lvl, n_lvl, m, (lo - 1).to(tl.int32), glist, CT, L16)
            s, smask = _bucket_shift(lo, top, NB)
            _, h = _tie_pass(src, glist, length, lo.to(tl.int32), top.to(tl.int32),
                             lo.to(tl.int32), s, smask, n_list, cap, pp, kp, True, GS, TGB,
                             HALF, L16, NB, 0)
            lo, top, n_ge, above = _pick_bucket(h, lo, s, top, above, k, NB)
        # n_ge <= cap: the keys >= lo are the candidates; else lo == top == T, and the keys
        # > T (fewer than k) go to the buffer for _eq_scan.
        eq_mode = n_ge > cap
        first = tl.where(eq_mode, lo + 1, lo).to(tl.int32)
        if relist:
            n_list, _ = _tie_list(lvl, n_lvl, m, first - 1, glist, CT, L16)
        run, _ = _tie_pass(src, glist, length, first, first, first, s, smask, n_list, cap, pp,
                           kp, False, GS, TGB, HALF, L16, NB, 1)
        t = lo.to(tl.int32)
        need = k - run
        n_gt = run
        sel_lb = first
    if eq_mode:
        _eq_scan(src, out, length, t, need, n_gt, pp, 2048)
    else:
        _select_buffered(kp, pp, out, run, sel_lb, k, CAP, PCH, False)


@triton.jit
def _eq_scan(src, out, length, t, need, n_gt, pp, S: tl.constexpr):
    """Tie tier, T == L: the output is every key > t (``n_gt`` of them, their positions in
    order at ``pp``) and the first ``need`` keys == t. One pass over the row from its start in
    steps of S, writing both in position order, that stops once ``need`` keys == t are taken;
    then the keys > t after that point are copied from ``pp``."""
    offs = tl.arange(0, S)
    run_sel = tl.full([], 0, tl.int32)
    run_gt = tl.full([], 0, tl.int32)
    run_eq = tl.full([], 0, tl.int32)
    c0 = tl.full([], 0, tl.int32)
    while (run_eq < need) & (c0 < length):
        p = c0 + offs
        m = p < length
        key = tl.where(m, _to_key(tl.load(src + p, mask=m, other=0.0).to(tl.float32)),
                       -2147483648)
        gt = key > t
        eq = (key == t).to(tl.int32)
        sel = gt | ((eq != 0) & ((run_eq + tl.cumsum(eq, axis=0) - eq) < need))
        si = sel.to(tl.int32)
        tl.store(out + run_sel + tl.cumsum(si, axis=0) - si, p, mask=sel)
        run_sel += tl.sum(si, axis=0)
        run_gt += tl.sum(gt.to(tl.int32), axis=0)
        run_eq += tl.sum(eq, axis=0)
        c0 += S
    rest = n_gt - run_gt
    for c in range(0, rest, S):
        i = c + offs
        v = tl.load(pp + run_gt + i, mask=i < rest, other=0)
        tl.store(out + run_sel + i, v, mask=i < rest)


@triton.jit
def _select_cands(src, gsrc, kp, pp, out, length, lb, n, k, cap, lvl, n_lvl, m, tie_ok,
                  glist, relist, GS: tl.constexpr, GB: tl.constexpr, CAP: tl.constexpr,
                  USE_GM: tl.constexpr, PCH: tl.constexpr,
                  TGB: tl.constexpr, HALF: tl.constexpr, L16: tl.constexpr, CT: tl.constexpr):
    """Stage 3 of one row with more than k valid keys: ``n`` candidates (keys >= ``lb``) in the
    row's buffer (``kp``/``pp``, ``cap`` entries) in position order; ``n > cap``: the buffer
    overflowed (or was skipped: a tie at the bound) and is not trusted.

    Tie tier (``n > cap`` and ``tie_ok``: ``lvl`` holds ``n_lvl`` exact maxima of ``m`` groups
    each, the level the bound came from, unchanged since): the keys > L, read only from the
    groups of the level entries above L (:func:`_tie_list`, :func:`_gather_cands`), go to the
    buffer. With at least k of them (and no more than the buffer) they are the candidates of
    an ordinary selection (bound L + 1); with fewer, T = L and :func:`_eq_scan` takes the
    first ``k - #(> L)`` keys equal to L. Otherwise (or with more keys above L than the
    buffer) :func:`_row_tier`. USE_GM: the row's group maxima are at ``gsrc`` (row tier
    pruning). PCH: keys a step of the placement (``>= CAP``: placed from the register tile).
    TGB, HALF, L16: the tie gather's groups a step, half groups, uint16 list entries."""
    if n <= cap:
        _select_buffered(kp, pp, out, n, lb, k, CAP, PCH, False)
    elif tie_ok:
        _tie_tier(src, out, length, lb, k, cap, kp, pp, lvl, n_lvl, m, glist, relist, GS, TGB,
                  HALF, L16, CT, CAP, PCH, TIE_NB)
    else:
        _row_tier(src, gsrc, out, length, lb, k, GS, GB, USE_GM)


@triton.jit
def _select_kernel(scores_ptr, lengths_ptr, ws_ptr, out_ptr, n_keys, stride_s, n_groups, k,
                   cap, off_bound, off_ncand, off_cpos, off_ckey, off_list,
                   GS: tl.constexpr, GB: tl.constexpr, CAP: tl.constexpr, KB: tl.constexpr,
                   CT: tl.constexpr = 16, TIE_LAUNCH: tl.constexpr = 0, PDL: tl.constexpr = 0):
    """Four-launch stage 3; the tie tier lists the row's exact group maxima (GS keys each)
    into the area at ``off_list`` (``TIE_LAUNCH``: buffered rows only, the others left to
    :func:`_tie_kernel`)."""
    _pdl_enter(PDL)
    row = tl.program_id(0)
    length = _row_len(lengths_ptr, row, n_keys)
    out = out_ptr + row.to(tl.int64) * k
    if length <= k:
        _short_row(out, length, k, KB)
    else:
        lb = tl.load(ws_ptr + off_bound + row)
        n = tl.load(ws_ptr + off_ncand + row)
        src = scores_ptr + row.to(tl.int64) * stride_s
        gsrc = ws_ptr + row.to(tl.int64) * n_groups
        row_c = row.to(tl.int64) * cap
        if TIE_LAUNCH:
            if n <= cap:
                _select_buffered(ws_ptr + off_ckey + row_c, ws_ptr + off_cpos + row_c, out, n,
                                 lb, k, CAP, CAP, False)
        else:
            _select_cands(src, gsrc, ws_ptr + off_ckey + row_c, ws_ptr + off_cpos + row_c, out,
                          length, lb, n, k, cap, gsrc, (length + GS - 1) // GS, 1, length > k,
                          ws_ptr + off_list + row.to(tl.int64) * n_groups, True, GS, GB, CAP,
                          True, CAP, GB, 0, 0, CT)


# ==== 3. Fused path (FUSED=1) ===============================================================
# After ``_gmax_kernel``: one row program (``ROW_SPLIT`` a row) does bound, compaction, gather
# and selection (``_row_kernel``); ``_tie_kernel`` then runs the rare tiers of the rows that
# need them, for this path and the four-launch one (``_TIE_LAUNCH``).


@triton.jit
def _fused_bound(ws_ptr, gsrc, row, length, ng, k, slack, off_gm2, n_groups2,
                 GS: tl.constexpr, GS2: tl.constexpr, GT2: tl.constexpr, B16: tl.constexpr = 0,
                 FALL16: tl.constexpr = 1):
    """Phase 1 of :func:`_row_kernel`: the row's bound L, over the supergroup maxima when the
    row has k of them (of the half size when :func:`_half_level`), else over the group maxima
    when it has k of those, else none (every valid key is a candidate).

    B16: the level :func:`_level16` chose, int32 (the group maxima too where they fit); only
    ``FALL16`` (shapes where a row with k groups may have no such level, see ``_fall16``)
    compiles the search over the int16 maxima (``gsrc``): a bound H over those gives L = H << 16
    (k groups have ``max >> 16 >= H``, so k distinct keys are >= L). That search spilled the
    row program's registers at 96 (H200 SASS: 112 bytes of stack against 16 without it).

    Returns ``(L, tie)``: the bound, and whether it sits in a tie of the searched level's
    maxima (the row program then takes the tie tier at once)."""
    lb = tl.full([], -2147483648, tl.int32)
    cnt = tl.full([], 0, tl.int64)
    lvl, n_lvl, _w, exact, _sep = _level_info(ws_ptr, gsrc, row, length, ng, k, off_gm2,
                                              n_groups2, GS, GS2, B16)
    if exact:
        lb, cnt = _loose_kth(lvl, n_lvl, k, slack, GT2)
    elif B16:  # noqa: SIM102 (constexprs, then a runtime test: compiled only where needed)
        if FALL16:   # noqa: SIM102 (constexpr: the search is compiled only where needed)
            if ng >= k:
                lb, cnt = _loose_kth(gsrc, ng, k, slack, GT2, 1)
                lb = lb << 16
    # A tie at the bound: more than 3/4 of the searched maxima, and over 1.5k, are >= L (the
    # search can only stop that far above k + slack when L is the exact k-th largest and many
    # maxima equal it), so the bound cuts almost nothing (all-equal rows, a few repeated
    # values, mostly zeros).
    tie = exact & (cnt * 4 > n_lvl.to(tl.int64) * 3) & (cnt * 2 > 3 * k)
    return lb, tie


@triton.jit
def _level_info(ws_ptr, gsrc, row, length, ng, k, off_gm2, n_groups2, GS: tl.constexpr,
                GS2: tl.constexpr, B16: tl.constexpr):
    """The level :func:`_fused_bound` searches for a row: ``(lvl, n_lvl, w, exact, sep)``, its
    ``n_lvl`` int32 maxima of ``w`` keys each at ``lvl``, whether they are exact int32 maxima
    with at least k entries (so that the tie tier can list the entries above L), and whether
    they lie outside the group maxima (the supergroup area, never overwritten by the active
    list). Pure arithmetic: computed again at the selection rather than kept live through the
    gather (registers)."""
    if B16:
        n2 = tl.full([], 0, tl.int32)
        level = tl.full([], 0, tl.int32)
        if GS2 > 1:
            level, n2 = _level16(length, k, n_groups2, GS, GS2)
        lvl = ws_ptr + off_gm2 + row.to(tl.int64) * n_groups2
        w = tl.where(level == 0, GS * GS2, tl.where(level == 1, GS * (GS2 // 2), GS))
        n_lvl = n2
        sep = n2 >= k
    else:
        w = tl.full([], GS, tl.int32)
        sep = length < 0
        if GS2 > 1:
            ng2 = (length + GS * GS2 - 1) // (GS * GS2)
            w = tl.full([], GS * GS2, tl.int32)
            if _half_level(length, k, n_groups2, GS, GS2):
                ng2 = (length + GS * (GS2 // 2) - 1) // (GS * (GS2 // 2))
                w = tl.full([], GS * (GS2 // 2), tl.int32)
            lvl = ws_ptr + off_gm2 + row.to(tl.int64) * n_groups2
            n_lvl = ng2
            sep = ng2 >= k
            if ng2 < k:
                lvl = gsrc
                n_lvl = ng
                w = tl.full([], GS, tl.int32)
        else:
            lvl = gsrc
            n_lvl = ng
    return lvl, n_lvl, w, n_lvl >= k, sep


@triton.jit
def _level_kept(length, ng, k, n_groups2, GS: tl.constexpr, GS2: tl.constexpr,
                SPLIT: tl.constexpr, B16: tl.constexpr):
    """Whether a row's bound level (:func:`_level_info`) holds k exact maxima that the active
    list does not overwrite, so that the tie tier can run after an overflow."""
    if B16:
        n2 = tl.full([], 0, tl.int32)
        if GS2 > 1:
            _, n2 = _level16(length, k, n_groups2, GS, GS2)
        kept = n2 >= k
    elif SPLIT > 1:
        kept = ng >= k
    elif GS2 > 1:
        ng2 = (length + GS * GS2 - 1) // (GS * GS2)
        if _half_level(length, k, n_groups2, GS, GS2):
            ng2 = (length + GS * (GS2 // 2) - 1) // (GS * (GS2 // 2))
        kept = ng2 >= k
    else:
        kept = length < 0
    return kept


@triton.jit
def _compact_active(gsrc, glist, g0, ng, lb, CT: tl.constexpr, B16: tl.constexpr = 0):
    """Phase 2: the groups ``g0 + [0, ng)`` whose maximum (at ``gsrc``) reaches ``lb``, in
    order, their indices written from ``glist + g0`` on (CT at a time; ``glist`` may be
    ``gsrc``: the list then overwrites maxima already read); returns their number.

    A step's CT maxima are a [CT / 8, 8] tile declared non-contiguous, so that the compiler
    gives each thread a row of 8 (the layout the scattered list stores want): the position
    prefix is then an in-thread scan of the row plus one scan of the row totals (a flat scan
    made the compiler scan each of a thread's values across the warp separately).
    B16: the maxima are int16 (``max >> 16``); a group is active when ``max >> 16 >= lb >>
    16`` (a superset of ``max >= lb``: the gather tests the keys). B16 == 1: ``glist`` is
    another area (4-byte entries would overwrite 2-byte maxima not yet read); B16 == 2:
    ``glist`` is ``gsrc`` and the entries are uint16 (rows of at most 65536 groups)."""
    W: tl.constexpr = 8 if CT >= 8 else CT
    r = tl.arange(0, CT // W)
    j = tl.arange(0, W)
    oc = tl.max_contiguous(r[:, None] * W + j[None, :], [1, 1])
    n_act = tl.full([], 0, tl.int32)
    base = gsrc + g0
    # The 32-bit loads are written out (not through _load_gm, whose INT32_MIN fill the mask
    # makes redundant here) so that the default compiles to the SASS measured on the H200.
    if B16:
        thr = lb >> 16
        v_next = _load_gm(base, oc, oc < ng, B16)
    else:
        thr = lb
        v_next = tl.load(base + oc, mask=oc < ng, other=-2147483648)
    for c0 in range(0, ng, CT):
        m = c0 + oc < ng
        v = v_next
        # The next chunk's load is issued before this one's scan (one round trip a step; two
        # steps ahead measured 1% slower on the H200).
        if B16:
            v_next = _load_gm(base + c0 + CT, oc, c0 + CT + oc < ng, B16)
        else:
            v_next = tl.load(base + c0 + CT + oc, mask=c0 + CT + oc < ng, other=-2147483648)
        ai = (m & (v >= thr)).to(tl.int32)
        before = tl.sum(tl.cumsum(ai, axis=0) - ai, axis=1)
        adst = n_act + before[:, None] + tl.cumsum(ai, axis=1) - ai
        n_act += tl.sum(tl.sum(ai, axis=1), axis=0)
        tl.debug_barrier()
        if B16 == 2:
            # uint16 entries in place of the int16 maxima (the row has <= 65536 groups).
            tl.store(glist + g0 + adst, (g0 + c0 + oc).to(tl.int16), mask=ai != 0)
        else:
            tl.store(glist + g0 + adst, g0 + c0 + oc, mask=ai != 0)   # adst <= c0 + oc: read
    tl.debug_barrier()
    return n_act


@triton.jit
def _join_parts(cnt, cpos, ckey, capp, cap, SPLIT: tl.constexpr):
    """ROW_SPLIT: the last part of a row to finish moves the candidates of parts 1.. (each in
    its ``capp`` region of the row's buffer) down after those of the parts before, so that the
    buffer holds all of them in position order; returns their number, or ``cap + 1`` when a
    part had more than its region holds (the row tier then reads the row itself)."""
    total = tl.load(cnt, cache_modifier=".cg")
    over = total > capp
    offs = tl.arange(0, MEM_CH)
    for p in tl.static_range(1, SPLIT):
        n_p = tl.load(cnt + p, cache_modifier=".cg")
        over = over | (n_p > capp)
        if not over:
            for c0 in range(0, n_p, MEM_CH):
                m = c0 + offs < n_p
                src = p * capp + c0 + offs
                vp = tl.load(cpos + src, mask=m, other=0, cache_modifier=".cg")
                vk = tl.load(ckey + src, mask=m, other=0, cache_modifier=".cg")
                # The destination lies below the source and may overlap this chunk's source:
                # every thread's loads first.
                tl.debug_barrier()
                tl.store(cpos + total + c0 + offs, vp, mask=m)
                tl.store(ckey + total + c0 + offs, vk, mask=m)
                tl.debug_barrier()
        total += n_p
    if over:
        total = cap + 1
    return total


@triton.jit
def _list_entries(glist, a0, n_act, GB: tl.constexpr, HALF: tl.constexpr,
                  L16: tl.constexpr = 0):
    """The active groups' indices at list entries ``a0 + [0, GB)``, one per row of the gather
    tile (HALF: two rows an entry, its two half groups), and which rows are listed groups.
    L16: the entries are uint16 (``GMAX_BITS=16``, the list in place of the maxima)."""
    if HALF:
        r = tl.arange(0, 2 * GB)
        valid = a0 + r // 2 < n_act
        gi = tl.load(glist + a0 + r // 2, mask=valid, other=0)
    else:
        g = tl.arange(0, GB)
        valid = a0 + g < n_act
        gi = tl.load(glist + a0 + g, mask=valid, other=0)
    if L16:
        gi = gi.to(tl.int32) & 0xFFFF
    return gi, valid


@triton.jit
def _list_scores(src, gi, valid, length, GS: tl.constexpr, GB: tl.constexpr,
                 HALF: tl.constexpr):
    """The scores of the groups ``gi`` (:func:`_list_entries`) and their positions.

    HALF: a [2 GB, GS / 2] tile of half groups (row r: half r % 2 of entry r // 2), read whole
    (16-byte loads; max_keys is a multiple of GS, so no group extends past the row's storage;
    keys past ``length`` are masked by the caller). Else a [GB, GS] tile, each key masked by
    ``length``, its positions declared non-contiguous. Either way the compiler lays the tile
    out one (half) group a thread, the layout the placement's scans and scattered stores want,
    instead of converting it through shared memory (whole-group 16-byte loads in the default
    layout plus the conversions measured slower on the H200)."""
    if HALF:
        r = tl.arange(0, 2 * GB)
        jj = tl.arange(0, GS // 2)
        pos = (gi * 2 + r % 2)[:, None] * (GS // 2) + jj[None, :]
        x = tl.load(src + pos, mask=tl.broadcast_to(valid[:, None], [2 * GB, GS // 2]),
                    other=0.0)
    else:
        j = tl.arange(0, GS)
        pos = tl.max_contiguous(gi[:, None] * GS + j[None, :], [1, 1])
        x = tl.load(src + pos, mask=valid[:, None] & (pos < length), other=0.0)
    return x, pos


@triton.jit
def _gather_cands(src, glist, length, lb, n_act, cap, cpos, ckey, GS: tl.constexpr,
                  GB: tl.constexpr, HALF: tl.constexpr, L16: tl.constexpr = 0):
    """Phase 3: the keys >= ``lb`` of the ``n_act`` listed groups, placed in position order in
    the candidate buffer; returns their number (``cap + 1`` when the list alone exceeds cap).

    Software-pipelined: a step's scores are requested one step ahead and its list entries two
    steps ahead (H200: with HALF, the list two steps ahead instead of one gave 4096 rows 1.279
    -> 1.213 ms and 1024 rows 357 -> 336 us; three steps, or the scores two, no faster).
    L16: uint16 list entries (:func:`_list_entries`)."""
    run = tl.full([], 0, tl.int32)
    if n_act <= cap:
        gi, v_next = _list_entries(glist, 0, n_act, GB, HALF, L16)
        x_next, pos_n = _list_scores(src, gi, v_next, length, GS, GB, HALF)
        gi_next, v_after = _list_entries(glist, GB, n_act, GB, HALF, L16)
        for a0 in range(0, n_act, GB):
            x = x_next
            pos = pos_n
            pm = v_next[:, None] & (pos < length)
            # Request the next step's scores and the list entries of the one after it.
            x_next, pos_n = _list_scores(src, gi_next, v_after, length, GS, GB, HALF)
            v_next = v_after
            gi_next, v_after = _list_entries(glist, a0 + 2 * GB, n_act, GB, HALF, L16)
            run = _place_loaded(x, pos, pm, lb, run, cpos, ckey, cap, GB * GS)
    else:
        run = cap + 1   # >= n_act > cap candidates: the row tier
    tl.debug_barrier()
    return run


@triton.jit
def _row_kernel(scores_ptr, lengths_ptr, ws_ptr, out_ptr, n_keys, stride_s, n_groups, k, cap,
                slack, off_gm2, n_groups2, off_cpos, off_ckey, off_cnt, off_arr, off_list,
                GS: tl.constexpr, GS2: tl.constexpr, GB: tl.constexpr, GT2: tl.constexpr,
                CT: tl.constexpr, CAP: tl.constexpr, KB: tl.constexpr, PCH: tl.constexpr,
                SPLIT: tl.constexpr = 1, HALF: tl.constexpr = 0, STOP: tl.constexpr = 0,
                B16: tl.constexpr = 0, FALL16: tl.constexpr = 1, TIE_LAUNCH: tl.constexpr = 0,
                DT: tl.constexpr = 0,
                off_tie=0, off_min2=0, SELF: tl.constexpr = 0, SGB: tl.constexpr = 1,
                MIN2: tl.constexpr = 0, MB: tl.constexpr = 0):
    """FUSED=1: stages 2 and 3 of one row in one program, after ``_gmax_kernel``.

    ``SELF`` (``ONE_PASS=1``; one program a row, 32-bit maxima): no ``_gmax_kernel`` launch:
    the program first writes its row's group and supergroup maxima (and with ``MIN2`` the
    supergroup minima) itself, ``SGB`` groups a step, then a CTA barrier (its own global
    stores are then visible to all its threads), then the stages below.

    1. ``L``: a lower bound of the k-th largest maximum of the row's groups of ``GS * GS2``
       keys (loose by at most ``slack`` values; from the ``GS``-key maxima in memory when the
       row has fewer than k of the large groups, and none with fewer than k small groups).
       k distinct keys are >= L, so every top-k key is >= L.
    2. The active groups (``GS``-key maximum >= L), in order, compacted over the row's group
       maxima (not needed afterwards), CT at a time; then only those groups read: their keys
       >= L placed in position order in the candidate buffer.
    3. :func:`_select_cands` on the candidates (the row tier reads the whole row).
    Register tiles: GT2 (bound), CT (compaction), GB * GS (placement), CAP (selection).

    ``SPLIT`` > 1 (``ROW_SPLIT``; few rows, so that the row programs fill the device): SPLIT
    programs a row (grid axis 1), each finding the same bound, then compacting and gathering
    its own contiguous part of the row's groups into its own region of the candidate buffer
    (``cap / SPLIT`` entries); each writes its count and increments the row's arrival counter
    (zeroed by ``_gmax_kernel``); the program that arrives last joins the regions and runs the
    selection. No program waits for another (nothing needs them co-resident).
    ``B16`` (``GMAX_BITS=16``): the group maxima are int16 top bits (see ``_gmax_kernel``),
    so the bound over them and the active test are as conservative as the truncation; B16 == 1:
    the active list has an area of its own (at ``off_list``) even with one part; B16 == 2 (one
    part, at most 65536 groups a row): uint16 entries in place of the maxima, as with 32 bits.
    ``MB`` (> 0: the supergroup minima at ``off_min2``, a register tile of MB; the wrapper
    sets it with ``ROW_SPLIT`` > 1): before the compaction a row of full-size supergroups raises
    L by them (:func:`_min_bound`; on rows with too few minima at L, e.g. random ones, one count
    of them is all it does): a row whose scores grow with position (``ramp``) then gathers about
    k candidates here instead of compacting half its groups, overflowing and taking the tie
    kernel's one program a row.
    ``DT``: rows with up to twice CAP candidates selected in one register tile of 2 * CAP (no
    refinement; :func:`_select_buffered`), where the wrapper's register cap leaves room.
    ``STOP`` (probes only: :func:`_indexer_topk_stopped`, never a config or the product entry
    point): 1, 2 or 3 ends the program after phase 1 (the bound), 2 (compaction) or 3
    (gather), writing that phase's scalar to the row's first output entry, so that the time of
    each phase is the difference of two runs.
    """
    row = tl.program_id(0)
    part = tl.program_id(1)
    length = _row_len(lengths_ptr, row, n_keys)
    out = out_ptr + row.to(tl.int64) * k
    if length <= k:
        if part == 0:
            _short_row(out, length, k, KB)
    else:
        ng = (length + GS - 1) // GS
        if B16:
            gsrc = ws_ptr.to(tl.pointer_type(tl.int16), bitcast=True) + row.to(tl.int64) * n_groups
        else:
            gsrc = ws_ptr + row.to(tl.int64) * n_groups
        if SELF:
            n_min = n_groups2 if GS2 > 1 else n_groups
            _gmax_span(scores_ptr + row.to(tl.int64) * stride_s, gsrc,
                       ws_ptr + off_gm2 + row.to(tl.int64) * n_groups2, 0, length,
                       _half_level(length, k, n_groups2, GS, GS2), GS, SGB, GS2, 0,
                       ws_ptr + off_min2 + row.to(tl.int64) * n_min, MIN2)
            tl.debug_barrier()
        lb, tie = _fused_bound(ws_ptr, gsrc, row, length, ng, k, slack, off_gm2, n_groups2,
                               GS, GS2, GT2, B16, FALL16)
        if MB > 0:  # noqa: SIM102 (constexpr, then a runtime test)
            if tie == 0:
                _lv, n_l, w_l, _ex, sep_l = _level_info(ws_ptr, gsrc, row, length, ng, k,
                                                        off_gm2, n_groups2, GS, GS2, B16)
                if sep_l & (w_l == GS * GS2) & (n_l <= MB):
                    # _min_bound returns t - 1 (the tie tier takes keys > it); L takes >= t
                    mb = _min_bound(ws_ptr + off_min2 + row.to(tl.int64) * n_groups2, n_l, k,
                                    lb, GS * GS2, MB)
                    lb = tl.where(mb > lb, mb + 1, lb)
        if STOP == 1:
            tl.store(out + part, lb)
        else:
            # One part: the list overwrites the row's group maxima. Several: the other parts may
            # still be searching them for the bound (rows with fewer than k supergroups), so
            # the list goes to an area of its own.
            glist = gsrc
            if (SPLIT > 1) | (B16 == 1):
                glist = ws_ptr + off_list + row.to(tl.int64) * n_groups
            src = scores_ptr + row.to(tl.int64) * stride_s
            row_c = row.to(tl.int64) * cap
            cpos = ws_ptr + off_cpos + row_c
            ckey = ws_ptr + off_ckey + row_c
            # A tie at the bound (see _fused_bound): the tie tier at once, by one program a
            # row, instead of gathering an overflow.
            run = tl.full([], 0, tl.int32) + cap + 1
            last = part == 0
            if tie:
                last = part == 0
            else:
                per = (ng + SPLIT - 1) // SPLIT
                g0 = tl.minimum(part * per, ng)
                n_act = _compact_active(gsrc, glist, g0, tl.minimum(per, ng - g0), lb, CT, B16)
                if STOP == 2:
                    tl.store(out + part, n_act)
                    last = part < 0
                else:
                    capp = cap // SPLIT
                    # Groups that may hold more than twice the buffer (a row whose scores grow
                    # with position: every key of half the row above the bound): straight to
                    # the tie tier's refinement when the level survives, not an overflowing
                    # gather (any choice is exact; this one only picks the faster tier).
                    if (n_act * GS > 2 * capp) & _level_kept(length, ng, k, n_groups2, GS, GS2,
                                                             SPLIT, B16):
                        run = capp + 1
                    else:
                        run = _gather_cands(src, glist + g0, length, lb, n_act, capp,
                                            cpos + part * capp, ckey + part * capp, GS, GB,
                                            HALF, B16 == 2)
                    if STOP == 3:
                        tl.store(out + part, run)
                        last = part < 0
                    else:
                        last = part >= 0
                        if SPLIT > 1:
                            tl.store(ws_ptr + off_cnt + row * SPLIT + part, run)
                            tl.debug_barrier()   # the whole program's stores, then the arrival
                            arrived = tl.atomic_add(ws_ptr + off_arr + row, 1, sem="acq_rel")
                            last = arrived == SPLIT - 1
                            if last:
                                run = _join_parts(ws_ptr + off_cnt + row * SPLIT, cpos, ckey,
                                                  capp, cap, SPLIT)
            if TIE_LAUNCH:
                # The rare tiers in a launch of their own (_tie_kernel), so that this kernel
                # compiles as without them: a buffered row is selected here; else its count
                # (cap + 1 after an overflow, cap + 2 after a tie at the bound) and bound are
                # left for that launch.
                if last:
                    tl.store(ws_ptr + off_tie + 2 * row,
                             tl.where(run <= cap, 0, tl.where(tie, cap + 2, cap + 1)))
                    if run <= cap:
                        _select_buffered(ckey, cpos, out, run, lb, k, CAP, PCH, DT)
                    else:
                        tl.store(ws_ptr + off_tie + 2 * row + 1, lb)
            elif last:
                lvl, n_lvl, w, exact, sep = _level_info(ws_ptr, gsrc, row, length, ng, k,
                                                        off_gm2, n_groups2, GS, GS2, B16)
                # After an overflow, the tie tier needs the level intact: not the group maxima
                # when the active list went over them.
                tie_ok = tie | (exact & (sep | (SPLIT > 1) | (B16 == 1)))
                # Whether the level survives the tie tier's listing (it is not the list).
                relist = sep | (SPLIT > 1) | (B16 > 0)
                _select_cands(src, gsrc, ckey, cpos, out, length, lb, run, k, cap, lvl, n_lvl,
                              w // GS, tie_ok, glist, relist, GS, max(1, min(GB, 1024 // GS)),
                              CAP, False, PCH, GB, HALF, B16 == 2, CT)


@triton.jit
def _min_bound(mins, n, k, lb, W, MT: tl.constexpr):
    """A row's bound raised by its ``n`` (super)group minima (of ``W`` keys each) at ``mins``:
    a (super)group whose minimum is ``>= t`` holds W keys ``>= t``, so ``ceil(k / W)`` of them
    prove the k-th largest key ``>= t`` (a proof, as L's). Returns the bound for the tie tier
    (which takes the keys ``> lb``): ``t - 1`` for the largest such t when that is above
    ``lb``, else ``lb``. On rows whose scores grow with position the top k sit in the last
    supergroups and t is about the k-th key, where L (from maxima) admits half the row; on
    other rows t is low and the bound stays. ``n <= MT`` (one register tile). One count first:
    unless ``need`` minima are ``>= lb + 2`` no t can raise the bound (tie-heavy rows, whose
    minima sit at or below their tied bound, which the four-launch path cannot tell from an
    overflow), and the search is skipped; else it runs over ``[lb + 2, max]``."""
    need = (k + W - 1) // W
    x = tl.load(mins + tl.arange(0, MT), mask=tl.arange(0, MT) < n, other=-2147483648)
    lo = lb.to(tl.int64) + 2
    res = lb.to(tl.int64)
    c = tl.sum((x.to(tl.int64) >= lo).to(tl.int32), axis=0)
    if c >= need:
        res = _kth_search_tile(x, need, lo, tl.max(x, axis=0), c, 0).to(tl.int64) - 1
    return res.to(tl.int32)


@triton.jit
def _tie_kernel(scores_ptr, lengths_ptr, ws_ptr, out_ptr, n_keys, stride_s, n_groups, k, cap,
                off_gm2, n_groups2, off_cpos, off_ckey, off_list, off_tie, off_min2=0,
                GS: tl.constexpr = 1, GS2: tl.constexpr = 1, GB: tl.constexpr = 1,
                TGB: tl.constexpr = 1, CT: tl.constexpr = 1, CAP: tl.constexpr = 1,
                PCH: tl.constexpr = 1, SPLIT: tl.constexpr = 1, HALF: tl.constexpr = 0,
                B16: tl.constexpr = 0, FUSED: tl.constexpr = 0, MT: tl.constexpr = 0,
                PDL: tl.constexpr = 0):
    """The rare tiers of a row whose candidates did not fit the buffer, or whose bound sits in
    a tie, after the kernel that found that (``TIE_LAUNCH``): the fused row kernel (count
    code and bound at ``off_tie``: cap + 1 an overflow, cap + 2 a tie, the compaction skipped)
    or the four-launch placement (count and bound at ``off_tie`` and ``off_tie + rows``).
    Every other row returns at once. See :func:`_select_cands`. ``MT`` (> 0: the gmax kernel
    wrote minima at ``off_min2``): an overflowing row first raises its bound by them
    (:func:`_min_bound`): fused, a row of full-size supergroups by the supergroup minima;
    four-launch, any row by its group minima."""
    _pdl_enter(PDL)
    row = tl.program_id(0)
    length = _row_len(lengths_ptr, row, n_keys)
    if length > k:
        if FUSED:
            code = tl.load(ws_ptr + off_tie + 2 * row)
        else:
            code = tl.load(ws_ptr + off_tie + tl.num_programs(0) + row)
        if code > cap:
            src = scores_ptr + row.to(tl.int64) * stride_s
            row_c = row.to(tl.int64) * cap
            cpos = ws_ptr + off_cpos + row_c
            ckey = ws_ptr + off_ckey + row_c
            out = out_ptr + row.to(tl.int64) * k
            if FUSED:
                lb = tl.load(ws_ptr + off_tie + 2 * row + 1)
                ng = (length + GS - 1) // GS
                if B16:
                    gsrc = ws_ptr.to(tl.pointer_type(tl.int16), bitcast=True) \
                        + row.to(tl.int64) * n_groups
                else:
                    gsrc = ws_ptr + row.to(tl.int64) * n_groups
                glist = gsrc
                if (SPLIT > 1) | (B16 == 1):
                    glist = ws_ptr + off_list + row.to(tl.int64) * n_groups
                lvl, n_lvl, w, exact, sep = _level_info(ws_ptr, gsrc, row, length, ng, k,
                                                        off_gm2, n_groups2, GS, GS2, B16)
                tie_ok = (code == cap + 2) | (exact & (sep | (SPLIT > 1) | (B16 == 1)))
                relist = sep | (SPLIT > 1) | (B16 > 0)
                if MT > 0:  # noqa: SIM102 (constexpr, then a runtime test)
                    if (code == cap + 1) & sep & (w == GS * GS2) & (n_lvl <= MT):
                        lb = _min_bound(ws_ptr + off_min2 + row.to(tl.int64) * n_groups2,
                                        n_lvl, k, lb, GS * GS2, MT)
                _select_cands(src, gsrc, ckey, cpos, out, length, lb, code, k, cap, lvl, n_lvl,
                              w // GS, tie_ok, glist, relist, GS, GB, CAP, False, PCH, TGB,
                              HALF, B16 == 2, CT)
            else:
                lb = tl.load(ws_ptr + off_tie + row)
                gsrc = ws_ptr + row.to(tl.int64) * n_groups
                if MT > 0:
                    lb = _min_bound(ws_ptr + off_min2 + row.to(tl.int64) * n_groups,
                                    (length + GS - 1) // GS, k, lb, GS, MT)
                _select_cands(src, gsrc, ckey, cpos, out, length, lb, code, k, cap, gsrc,
                              (length + GS - 1) // GS, 1, length > k,
                              ws_ptr + off_list + row.to(tl.int64) * n_groups, True, GS, GB,
                              CAP, True, CAP, GB, 0, 0, CT)


# ==== 4. Wrapper ============================================================================
# Config resolution, workspace layout and the launches of each path; the product entry point
# ``indexer_topk_triton`` and the probes' ``_indexer_topk_stopped``.

# The rare tiers (tie tier, refinement, row tier) in a launch of their own after the row
# kernel / stage 3 (True), or inlined there (False). See :func:`_tie_kernel`.
_TIE_LAUNCH = True
#: The tie kernel's bound from minima (``_min_bound``; the gmax kernel writes them, 4 bytes a
#: supergroup (fused) or group (four-launch), where ``config.min_bound_tile`` says).
_MIN_BOUND = True
#: The four-launch path's kernels as programmatic dependent launches where the device has them
#: (:func:`_pdl_ok`): each next kernel's programs are scheduled while the one before runs.
_PDL = True
_PDL_DEVS: dict[int | None, bool] = {}


def _pdl_ok(dev: Any) -> bool:
    """Whether the four-launch path chains its kernels with programmatic dependent launches on
    ``dev``: ``_PDL``, and a CUDA device of compute capability 9 or later (not ROCm, not the
    interpreter). Only the speed depends on it: every kernel waits for the previous one's
    completion before it touches memory (:func:`_pdl_enter`)."""
    if not _PDL or dev.type != "cuda":
        return False
    ok = _PDL_DEVS.get(dev.index)
    if ok is None:
        import os

        import torch

        ok = _PDL_DEVS[dev.index] = (torch.version.hip is None
                                     and os.environ.get("TRITON_INTERPRET") != "1"
                                     and torch.cuda.get_device_capability(dev)[0] >= 9)
    return ok


def _pdl_opts(on: bool, mode: int) -> dict[str, Any]:
    """A kernel's launch options in a PDL chain (``on``): ``PDL = mode`` (1 wait, 2 trigger, 3
    both: :func:`_pdl_enter`), and the launch as a dependent where it waits; nothing when off."""
    if not on:
        return {}
    return {"PDL": mode, "launch_pdl": True} if mode & 1 else {"PDL": mode}


def _check_inputs(scores: Any, lengths: Any, k: Any) -> None:
    check_inputs(scores, lengths, k, kernel=True)


_PLANS: dict[tuple[Any, ...], tuple[dict[str, int], dict[str, int]]] = {}


def _resolve(config: dict[str, Any], k: int, n: int, rows: int,
             sm_count: int = 132) -> tuple[dict[str, int], dict[str, int]]:
    try:
        key = (tuple(sorted(config.items())), k, n, rows, sm_count)
        hit = _PLANS.get(key)
    except TypeError:
        key, hit = None, None
    if hit is not None:
        return hit
    validate_config(config, k, n)
    cfg = resolve_config(config, rows, n, k, sm_count)
    validate_config(cfg, k, n)
    p = plan(cfg, n)
    p["gt"] = min(cfg["BOUND_TILE"], _next_pow2(p["groups"]))
    p["kb"] = min(_next_pow2(k), 4096)
    p["sp"] = _next_pow2(p["slices"])
    if key is not None:
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[key] = (cfg, p)
    return cfg, p


_SMS: dict[Any, int] = {}


def _sm_count(dev: Any) -> int:
    """SMs (CUs on AMD) of the call's device, for the keys a config leaves to
    :func:`default_config` (a policy pinning only part of the geometry, such as the MI355X's
    slices, gets the rest sized for the device it runs on); 132, the H200 the rules were
    measured on, where there is no GPU (the interpreter)."""
    if dev.type != "cuda":
        return 132
    n = _SMS.get(dev.index)
    if n is None:
        import torch

        n = _SMS[dev.index] = int(torch.cuda.get_device_properties(dev).multi_processor_count)
    return n


# Tests set this to an int32 that every output and workspace entry starts as (no memset
# otherwise): a stage reading what no earlier stage wrote, or an output entry left unwritten,
# then shows in the result instead of depending on what the allocator returned.
_POISON: int | None = None


def _alloc(torch: Any, n: int, dev: Any) -> Any:
    t = torch.empty(n, dtype=torch.int32, device=dev)
    if _POISON is not None:
        t.fill_(_POISON)
    return t


def _regs(cfg: dict[str, int]) -> dict[str, int]:
    """The row program's register cap as a launch option (none: the compiler's choice). NVIDIA
    only: Triton's ROCm backend has no ``maxnreg`` and rejects the keyword."""
    import torch

    if not cfg["MAX_REGS"] or torch.version.hip is not None:
        return {}
    return {"maxnreg": cfg["MAX_REGS"]}


def _fall16(n: int, k: int, gs: int, gs2: int) -> bool:
    """GMAX_BITS=16: whether some row length up to ``n`` has k groups but no int32 level of
    :func:`_level16` (the row program then needs its int16 search). By group count ``g``
    (the levels' counts are ceil(g / GS2), ceil(g / (GS2 / 2)) and g): rows of ``g`` in
    [k, G] without k full supergroups (g <= (k - 1) GS2) and more groups than the level area
    holds (g > N2) must have the half level: (k - 1) GS2 / 2 < g <= N2 GS2 / 2, GS2 >= 4."""
    if gs2 < 2:
        return True
    groups, n2 = -(-n // gs), -(-n // (gs * gs2))
    lo, hi = max(k, n2 + 1), min(groups, (k - 1) * gs2)
    if lo > hi:
        return False
    if gs2 < 4:
        return True
    h = gs2 // 2
    return lo <= (k - 1) * h or hi > n2 * h


def indexer_topk_triton(scores: Any, lengths: Any, k: int = 2048, *,
                        config: dict[str, Any]) -> Any:
    """Exact per-row top-k positions (ascending, -1 padded), int32 ``[rows, k]``.

    Keys missing from ``config`` come from :func:`resolve_config` for this shape and the
    device's SM count (so a policy may pin only SLICE_KEYS / MAX_SLICES / num_warps, or only
    FUSED).

    Never synchronizes the device and never reads device memory on the host. Lengths above
    ``max_keys`` are clamped on the device (rejected on the host when lengths is a CPU tensor).
    Launches: 2 on the fused path (3 with the rare tiers' launch, ``_TIE_LAUNCH``); on the
    four-launch path 3 with one slice a row, 5 with several (the bound pass and the count
    pass), each plus the rare tiers' launch; 1 when max_keys <= k.
    """
    return _run(scores, lengths, k, config, 0)


def _indexer_topk_stopped(scores: Any, lengths: Any, k: int, *, config: dict[str, Any],
                          stop: int) -> Any:
    """Probes only (``benchmarks/probes/profile_indexer.py --phases``, the tests of a phase's
    result), never the product entry point: the fused path with its row program ended after
    phase ``stop`` (1 the bound, 2 the compaction, 3 the gather; see ``_row_kernel``'s STOP),
    so that each phase's time is the difference of two runs. The output is then not the top-k:
    each row's first entries (one a row program) hold that phase's scalar."""
    if stop not in (1, 2, 3):
        raise ValueError(f"_indexer_topk_stopped: stop must be 1, 2 or 3; got {stop!r}")
    return _run(scores, lengths, k, {**config, "FUSED": 1}, stop)


def _run(scores: Any, lengths: Any, k: int, config: dict[str, Any], stop: int) -> Any:
    import torch

    _check_inputs(scores, lengths, k)
    # The kernels index lengths[row] as if contiguous: a strided view (lengths[:, 0]) is copied.
    lengths = lengths.contiguous()
    rows, n = scores.shape
    cfg, p = _resolve(config, k, n, rows, _sm_count(scores.device))
    dev = scores.device
    out = _alloc(torch, rows * k, dev).view(rows, k)
    if rows == 0:
        return out
    gs, gb, cap = cfg["GROUP"], cfg["GROUP_BLOCK"], cfg["CAND_CAP"]
    slices, slice_len, groups = p["slices"], p["slice_len"], p["groups"]
    stride = scores.stride(0)
    sw = cfg["SEARCH_WARPS"]
    if n <= k:
        # Every row has <= k valid keys: only the fast path runs.
        _select_kernel[(rows,)](scores, lengths, out, out, n, stride, 1, k, cap, 0, 0, 0, 0, 0,
                                GS=gs, GB=gb, CAP=16, KB=p["kb"], num_warps=sw)
        return out
    nw = cfg["num_warps"]
    if cfg["FUSED"]:
        _fused(scores, lengths, out, k, cfg, p, stop)
        return out
    off_bound = rows * groups
    off_ncand = off_bound + rows
    off_cnt = off_ncand + rows
    off_cpos = off_cnt + rows * slices
    off_ckey = off_cpos + rows * cap
    chunked = groups > p["gt"]
    off_list = off_ckey + rows * cap
    # The list area: the tie tier's list of the row's groups above the bound; then the group
    # minima for the tie kernel's minimum bound (rows of at most MIN_TILE groups).
    mt = min_bound_tile(cfg, n) if _TIE_LAUNCH and _MIN_BOUND else 0
    off_min = off_list + rows * groups
    ws = _alloc(torch, off_min + (rows * groups if mt else 0), dev)
    # PDL: the first kernel lets the next start (2), the middle ones wait and let the next
    # start (3), the last one only waits (1)
    pdl = _pdl_ok(dev)
    _gmax_kernel[(rows, slices)](scores, lengths, ws, n, stride, groups, slice_len, k, 0, 1, 0,
                                 off_min, GS=gs, GB=gb, GS2=1, MIN2=int(mt > 0), num_warps=nw,
                                 **_pdl_opts(pdl, 2))
    # Several slices a row: the bound in a launch of its own, then the count pass; one slice:
    # the placement program finds the exact bound itself.
    bound_in = slices > 1
    if bound_in:
        _bound_kernel[(rows,)](lengths, ws, n, groups, k, off_bound, cfg["BOUND_SLACK"],
                               GS=gs, GT=p["gt"], num_warps=cfg["SEARCH_WARPS"],
                               **_pdl_opts(pdl, 3))
        _place_kernel[(rows, slices)](scores, lengths, ws, n, stride, groups, slice_len, slices,
                                      k, cap, off_bound, off_ncand, off_cnt, off_cpos, off_ckey,
                                      GS=gs, GB=gb, SP=p["sp"], GT=p["gt"], CHUNKED=chunked,
                                      COUNT_ONLY=True, SINGLE=False, BOUND_IN=bound_in,
                                      num_warps=nw, **_pdl_opts(pdl, 3))
    _place_kernel[(rows, slices)](scores, lengths, ws, n, stride, groups, slice_len, slices,
                                  k, cap, off_bound, off_ncand, off_cnt, off_cpos, off_ckey,
                                  GS=gs, GB=gb, SP=p["sp"], GT=p["gt"], CHUNKED=chunked,
                                  COUNT_ONLY=False, SINGLE=slices == 1, BOUND_IN=bound_in,
                                  num_warps=nw, **_pdl_opts(pdl, 3))
    _select_kernel[(rows,)](scores, lengths, ws, out, n, stride, groups, k, cap, off_bound,
                            off_ncand, off_cpos, off_ckey, off_list,
                            GS=gs, GB=max(1, min(gb, 1024 // gs)), CAP=cfg["CAND_TILE"],
                            KB=p["kb"], CT=min(1024, _next_pow2(groups)), num_warps=sw,
                            TIE_LAUNCH=int(_TIE_LAUNCH), **_pdl_opts(pdl, 3 if _TIE_LAUNCH else 1))
    if _TIE_LAUNCH:
        _tie_kernel[(rows,)](scores, lengths, ws, out, n, stride, groups, k, cap, 0, 1, off_cpos,
                             off_ckey, off_list, off_bound, off_min, GS=gs, GS2=1, MT=mt,
                             GB=max(1, min(gb, 1024 // gs)), TGB=max(1, min(gb, 1024 // gs)),
                             CT=min(1024, _next_pow2(groups)), CAP=cfg["CAND_TILE"],
                             PCH=cfg["CAND_TILE"], SPLIT=1, HALF=0, B16=0, FUSED=0,
                             num_warps=sw, **_pdl_opts(pdl, 1))
    return out


def _fused(scores: Any, lengths: Any, out: Any, k: int, cfg: dict[str, int],
           p: dict[str, int], stop: int) -> None:
    """The fused path: group maxima, then ``ROW_SPLIT`` programs a row for the rest (``stop``:
    see :func:`_indexer_topk_stopped`; 0 from the product entry point)."""
    import torch

    rows, n = scores.shape
    gs, gb, cap = cfg["GROUP"], cfg["GROUP_BLOCK"], cfg["CAND_CAP"]
    slices, slice_len, groups = p["slices"], p["slice_len"], p["groups"]
    gs2, split, bt = cfg["GROUP2"], cfg["ROW_SPLIT"], cfg["BOUND_TILE"]
    groups2 = -(-n // (gs * gs2))
    stride = scores.stride(0)
    b16 = int(cfg["GMAX_BITS"] == 16)
    in_place = list_in_place(cfg, n)
    off_gm2 = rows * groups if not b16 else -(-rows * groups // 2)   # int16 maxima: half
    off_cpos = off_gm2 + (rows * groups2 if gs2 > 1 else 0)
    off_ckey = off_cpos + rows * cap
    off_cnt = off_ckey + rows * cap
    off_arr = off_cnt + (rows * split if split > 1 else 0)
    off_list = off_arr + (rows if split > 1 else 0)
    off_tie = off_list + (0 if in_place else rows * groups)
    tie_launch = int(_TIE_LAUNCH and stop == 0)
    # supergroup minima for the tie kernel's minimum bound (32-bit maxima, supergroups that
    # fit one register tile)
    mt = min_bound_tile(cfg, n) if tie_launch and _MIN_BOUND else 0
    off_min2 = off_tie + (2 * rows if tie_launch else 0)
    size = off_min2 + (rows * groups2 if mt else 0)
    ws = _alloc(torch, size, scores.device)
    one = int(cfg["ONE_PASS"])
    if not one:
        _gmax_kernel[(rows, slices)](scores, lengths, ws, n, stride, groups, slice_len, k,
                                    off_gm2, groups2, off_arr, off_min2, GS=gs, GB=gb, GS2=gs2,
                                    ARRIVE=int(split > 1), B16=b16, MIN2=int(mt > 0),
                                    num_warps=cfg["num_warps"])
    _row_kernel[(rows, split)](scores, lengths, ws, out, n, stride, groups, k, cap,
                               cfg["BOUND_SLACK"], off_gm2, groups2 if gs2 > 1 else groups,
                               off_cpos, off_ckey, off_cnt, off_arr, off_list, SPLIT=split,
                               GS=gs, GS2=gs2, HALF=int(n % gs == 0),
                               GB=max(1, cfg["PLACE_KEYS"] // gs),
                               GT2=min(bt, _next_pow2(groups2 if gs2 > 1 else groups)),
                               CT=min(cfg["COMPACT_TILE"], _next_pow2(groups)),
                               CAP=cfg["CAND_TILE"], KB=p["kb"],
                               PCH=min(cfg["CAND_TILE"], cfg["PLACE_KEYS"]), STOP=stop,
                               B16=2 if b16 and in_place else b16,
                               FALL16=int(b16 and _fall16(n, k, gs, gs2)),
                               TIE_LAUNCH=tie_launch, off_tie=off_tie, off_min2=off_min2,
                               SELF=one, SGB=gb if one else 1, MIN2=int(mt > 0) if one else 0,
                               MB=mt if split > 1 else 0,
                               DT=int(cfg["MAX_REGS"] == 0 or cfg["MAX_REGS"] >= 128),
                               num_warps=cfg["SEARCH_WARPS"], **_regs(cfg))
    if tie_launch:
        pk = max(1, cfg["PLACE_KEYS"] // gs)
        _tie_kernel[(rows,)](scores, lengths, ws, out, n, stride, groups, k, cap, off_gm2,
                             groups2 if gs2 > 1 else groups, off_cpos, off_ckey, off_list,
                             off_tie, off_min2, GS=gs, GS2=gs2, GB=max(1, min(pk, 1024 // gs)),
                             TGB=pk, MT=mt,
                             CT=min(cfg["COMPACT_TILE"], _next_pow2(groups)),
                             CAP=cfg["CAND_TILE"],
                             PCH=min(cfg["CAND_TILE"], cfg["PLACE_KEYS"]), SPLIT=split,
                             HALF=int(n % gs == 0),
                             B16=2 if b16 and in_place else b16, FUSED=1,
                             num_warps=cfg["SEARCH_WARPS"])
