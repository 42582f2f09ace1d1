"""sparse_prefill configs: the keys, their defaults, validation and the DENSE-tile parsing (pure
Python: no Triton, no torch).

Kept apart from the kernels (``triton_kernels.py``, ``gluon_kernels.py``) so that the tuner,
policy and validation can check a config without importing Triton; ``triton_kernels``
re-imports every name here (``from backends.sparse_prefill.triton_kernels import
validate_config, DEFAULT_VARIANT`` keeps working).

Config keys (``config`` dict; ints or strings only; the keys issue 26 removed are rejected by
name, :data:`REMOVED_KEYS`):

==============  =========  ==================================================================
key             default    meaning
==============  =========  ==================================================================
BLOCK_M         required   query-head tile (power of two, >= group_size)
BLOCK_N         required   selected slots per inner step (power of two, >= 16)
num_warps       required   warps per program
num_stages      required   software-pipelining depth of the inner loop
CHUNK_MODE      "fused"    chunk kind only. "fused": the page-table translation happens inside
                           the attention loop. "pretranslate": a small kernel first writes the
                           slot of every entry (-1 when invalid) and the prefill kernel runs on
                           it (one dependent gather less in the hot loop; an int32
                           [total_q, topk] scratch tensor). "staged": like pretranslate, but
                           each program translates its own row into the scratch before its
                           loop (one launch; the row's slots are written and re-read while
                           they sit in L2, and one program's translation overlaps the other
                           resident programs' gathers).
REVERSE_ROWS    0          1: program i handles row total_q - 1 - i, so long rows of a causal
                           ramp start first (less tail imbalance).
SPLIT_QK        1          2: QK^T as two independent half-head_dim MMA chains (K gathered as two
                           halves); head dims below 32 fall back to 1.
SPLIT_V         1          2: V is gathered as two head_dim halves in the same layout as the K
                           halves (so each thread gathers K and V from the same rows and
                           computes each row's offset once) and O is accumulated as two halves.
                           Needs SPLIT_QK=2.
LEAN            0          1: K rows of invalid entries are read from slot 0 unmasked (their
                           scores are set to -inf after the product, so what slot 0 holds
                           never matters); V stays masked (a zero weight times a NaN would not
                           be zero). Fewer instructions per gathered row.
OFFS32          0          1: row offsets in int32 where the wrapper proves they fit
                           (``(num_slots - 1) * stride + D_PAD <= 2**31``; int64 otherwise).
SLOT_ORDER      0          1: before the attention kernel, a pre-pass reorders each row's
                           valid entries by slot, on the top 4 bits of the slot id (a stable
                           partition into 16 slot ranges; one pass of the index array), drops
                           invalid entries and runs the kernel on the kept count. The result
                           is the same multiset of entries (softmax does not depend on their
                           order), but the programs running at the same time
                           then sweep the KV cache together instead of each touching all of it:
                           when the KV is larger than the L2 cache most gathers hit in L2.
                           Costs an int32 [total_q, topk] scratch tensor and the pass (it
                           reads the indices twice and writes them once; 0.18 ms at 8192 x
                           2051 on an H200). Prefill, and chunk with
                           CHUNK_MODE="pretranslate" (the translated slots are ordered).
DENSE           0          N > 0: rows whose selections are dense in their slot span are
                           computed by walking the KV blocks instead of gathering entries. The
                           rows are taken in tiles of ``RP = BM // HP`` (DENSE_TILE's BM and
                           HP: by default group_size rounded up to a power of two, i.e. one
                           program takes the whole group). A tile is dense when the
                           slots between the least and the greatest one its rows select number
                           at most N percent of its rows' mean count of valid entries (e.g. a
                           causal prompt's first rows, which select all they see). For those
                           tiles a pre-pass counts every row's valid entries per slot (16-bit
                           multiplicities, two a word, in an int32 scratch of ceil(num_slots /
                           2) words a row, bounded by ``_DENSE_SCRATCH_BYTES``: rows are done in
                           chunks), then one program per tile streams the contiguous K/V blocks
                           of the span (TMA descriptors for 16-bit K/V whose strides allow it)
                           once for its RP x HP query lines and scores them on the tensor
                           cores; a line's weight of slot s is ``count * exp(score)`` (0 where
                           unselected). The gathering kernel, with the rest of the config, does
                           the other tiles. Unselected slots inside a dense tile's span are read,
                           and a zero weight times a non-finite V value there would be NaN: a
                           dense program whose accumulator holds any NaN stores nothing and
                           hands its tile back to the gathering kernel (which runs after and
                           follows the op's non-finite rules), so such a value never reaches a
                           row that does not select it (tests/kernels/
                           test_sparse_prefill_contract.py). Prefill, and chunk with
                           CHUNK_MODE="pretranslate"; not with SLOT_ORDER; top-k <= 65535.
UNION           0          U > 0: rows that share most of their selections are computed on the
                           union of what their tile (DENSE_TILE's RP rows, as DENSE) selects. A
                           pre-pass marks the tile's selected slots in a bitmap over its span
                           and counts them: a tile goes union when the union has at most U
                           percent of its rows' mean count of valid entries (e.g. 300: 16 rows
                           whose union is at most 3x top-k), decided on the GPU (a gate first
                           marks the first row and checks the last against it, and skips the
                           exact count where the estimate is over twice the threshold); then
                           the pass writes the union's slots ascending (prefix sums of the
                           bitmap's popcounts) and each row's 16-bit multiplicity at every union
                           position (a slot listed twice counts twice; -1, out-of-range and
                           past-length entries are not counted), and one program per tile (and
                           HP heads) gathers the union's K/V rows by slot once for its RP x HP
                           query lines on the tensor cores, the dense kernel's arithmetic (weight
                           count x exp(score)). Tiles whose union is larger fall back to the
                           gathering kernel (with the rest of the config); with DENSE too, dense
                           tiles are DENSE's and union is tried on the others; a NaN in a union
                           program's accumulator hands the tile back, as DENSE. Scratch: int32
                           bitmaps and prefixes of ceil(num_slots / 32) words, ceil(top-k x U /
                           100) slots and RP x that / 2 count words a tile, bounded by
                           ``_UNION_SCRATCH_BYTES`` (tiles are done in chunks). Prefill, and
                           chunk with CHUNK_MODE="pretranslate"; not with SLOT_ORDER; top-k <=
                           65535; not batch-invariant (a tile's path depends on its rows).
                           Chunk without DENSE: the pre-pass runs over the rows' token
                           positions (the translate kernel writes them beside the slots;
                           bitmaps over pages x page size), a tile whose rows span two
                           requests is gathered, and the union is written as slots through
                           the request's page table.
UNION_PREP      "triton"   UNION's pre-pass: "triton", the four Triton kernels above (gate, mark,
                           size, count: bitmaps, prefixes and counts in global memory, built by
                           global atomics); "cuda", one CUDA kernel a tile
                           (``cuda/union_prep.cu``: the same rules and outputs, the tile's
                           bitmap, prefixes and its rows' counts in shared memory), built with
                           nvcc on first use; sm_90 only, and where it cannot be had (no nvcc,
                           another device, an id range whose bitmap does not fit the shared
                           memory) the Triton kernels run, logged once. On an H100 (session
                           41, prefill g6 KV 8K) 115 us against the Triton kernels' 233 on
                           top-k rows, 46 against 134 on the walk (union tiles 0.632x the
                           h200 family's time with it, 0.731x with the Triton pre-pass). It
                           now counts a tile's rows in groups: 125 us on top-k rows, 51 on the
                           walk in session 44's window (0.643x; the row at a time 132 / 56).
                           Without DENSE it takes its tiles' row statistics from their ids
                           (no _row_stats launch: 0.98-0.99x, session 45). The H200 family's
                           union configs take it (chunk g6, session 45, H100: 0.889x the
                           Triton pre-pass's time on top-k rows, 0.948x on the walk at KV 8K;
                           prefill g6 at KV 8K, beside the dense tiles).
UNION_ENGINE    "triton"   the union tiles' attention kernel: "triton" (``_union_fwd``: K/V rows
                           gathered by pointer loads, Triton's two buffers, the next step's
                           copies issued after this step's second MMA); "gluon_ws", a
                           warp-specialized Gluon kernel (``union_ws.py``: four producer warps
                           gather K/V by cp.async into a two-stage ring on mbarriers while two
                           consumer warpgroups run the MMAs and the softmax), sm_90, 16-bit
                           K/V, head_dim 256 and 128-line tiles of 64 positions a step filled
                           by the rows' heads; elsewhere the Triton kernel runs, logged once.
                           "gluon_ws_overlap": the same with a step's softmax under the
                           previous step's PV MMAs (FA3's intra-warpgroup overlap);
                           "gluon_ws_2wg": two consumer partitions of 64 lines each, one's
                           softmax free to run under the other's MMAs. Prepared in session 47,
                           not yet run on a GPU: no policy or tuner candidate takes them.
UNION_DENSE     0          with DENSE and UNION both on, B > 0 lets the union path take DENSE's
                           tiles too: the union pre-pass runs first and decides every tile, and
                           a tile DENSE's rule takes goes union when its exact union has at
                           most B percent of its span's slots (and UNION's own threshold
                           holds), else stays dense (a gate that fails leaves it dense; a tile
                           whose largest row alone has more than B percent of the span's
                           slots in valid entries is never gated: its union cannot pass). On
                           top-k rows a causal ramp's dense tiles have a union ~1.15x their
                           rows' entries but a span up to DENSE% of them, and the dense kernel
                           streams the whole span; on the walk their union is close to the
                           span and they stay dense. The dense kernels then read the pre-pass's
                           FLAG instead of deciding. 0: DENSE keeps its tiles and the union is
                           tried on the others (the pre-pass runs after the dense kernels).
                           Prefill g6 KV 8K, H100 (session 46): 60 took 0.954x the time
                           without it on top-k rows, 1.013x on the walk (80: 0.979x / 1.012x;
                           100: 0.906x / 1.058x); the H200 family's prefill g6 union config
                           takes 60.
DENSE_TILE      "128x32x8x3"  the row-tile kernels' (DENSE's and UNION's) ``BMxBNxWxS``:
                           query lines per program (a power of two >= 16 and >= the group
                           rounded up to a power of two, HP: a program takes every head of
                           its rows, padded lines masked), slots per step, warps, stages. (The
                           ``xHP`` suffix, fewer heads a program, was removed: issue 26, last
                           in commit 8cccc1c.)
TILE_HEADS      "pow2"     the query heads of a row-tile line set (DENSE's and UNION's, HP):
                           "pow2", the group rounded up to a power of two (a tile holds RP =
                           BM // HP rows; group 6: 8 lines a row, 2 of them masked, 16 rows in
                           128 lines); "group", the group's heads exactly (RP = BM // group,
                           the last BM % group lines masked; group 6: 21 rows in 126 of 128
                           lines), fewer tiles for the same rows: a union tile's union barely
                           grows with its rows at high overlap, so the union kernel's MMA work
                           and gathers drop with the tile count (22% at prefill g6 KV 8K,
                           ``benchmarks/probes/union_sizes.py``). A line then takes its row's
                           counts through two one-hot MMAs (the power-of-two tiles broadcast
                           a row's counts over its heads). Only with DENSE or UNION. Measured
                           slower (H100, prefill g6 KV 8K: the union path 1.63x on top-k
                           rows, 1.17x on the walk; session 43): no policy sets it and kreg
                           tune does not offer it.
UNION_TILE      ""         the union kernel's own ``BMxBNxWxS`` ("" = DENSE_TILE's): with DENSE
                           on too its BM must be DENSE_TILE's (both paths take the same tiles
                           of rows), so that each path runs at its own best slots a step,
                           warps and stages (the dense tiles' best is 128x32x8x3, the union
                           tiles' 128x64x8x2 for group 6: "Session 18").
MAXNREG         0          registers per thread cap passed to the compiler (``maxnreg``; 0 =
                           the compiler's choice). The kernel is latency bound: a program waits
                           for its gathered tile, so throughput follows the number of programs
                           resident per SM, which registers and shared memory bound. Ignored by
                           the interpreter and on backends without the option.
ENGINE          "triton"   "gluon": the hand-scheduled Gluon kernel (``gluon_kernels.py``):
                           transposed products on mma_v2, warps splitting head_dim, a cp.async
                           ring. BLOCK_M is its query lines (8 or 16), BLOCK_N keys a stage
                           (16, 32 or 64), num_warps 1, 2 or 4, num_stages 1 or 2 ring stages;
                           head_dim 64 / 128 / 256, NVIDIA sm_80+.
                           "gluon_wgmma": the transposed products on Hopper's wgmma, one
                           warpgroup, 64-key tiles as 64-wide head_dim chunks through a ring of
                           three buffers, two chunks in flight; geometry BLOCK_M (8 or 16) x 64
                           x 4 x 2 (num_stages: the chunks in flight), head_dim 256,
                           NVIDIA sm_90 only. Both take OFFS32, SLOT_ORDER, MAXNREG, (chunk)
                           CHUNK_MODE="pretranslate", and DENSE / UNION (their tiles first, the
                           per-row Gluon kernel skipping them); float16 / bfloat16; not under
                           the interpreter.
==============  =========  ==================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from registry.errors import ConfigError

__all__ = ["DEFAULT_VARIANT", "GLUON_HEAD_DIMS", "REMOVED_KEYS", "REQUIRED_KEYS",
           "WGMMA_HEAD_DIM", "describe_path", "validate_config"]

REQUIRED_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
DEFAULT_VARIANT: dict[str, Any] = {"CHUNK_MODE": "fused", "REVERSE_ROWS": 0, "MAXNREG": 0,
                                   "SPLIT_QK": 1, "SPLIT_V": 1, "LEAN": 0, "OFFS32": 0,
                                   "SLOT_ORDER": 0, "DENSE": 0, "DENSE_TILE": "128x32x8x3",
                                   "UNION": 0, "UNION_PREP": "triton", "UNION_TILE": "",
                                   "UNION_DENSE": 0, "UNION_ENGINE": "triton",
                                   "TILE_HEADS": "pow2", "ENGINE": "triton"}
_CHOICES: dict[str, tuple[Any, ...]] = {"CHUNK_MODE": ("fused", "pretranslate", "staged"),
                                        "REVERSE_ROWS": (0, 1), "SPLIT_QK": (1, 2),
                                        "SPLIT_V": (1, 2), "LEAN": (0, 1), "OFFS32": (0, 1),
                                        "SLOT_ORDER": (0, 1),
                                        "UNION_PREP": ("triton", "cuda"),
                                        "UNION_ENGINE": ("triton", "gluon_ws",
                                                         "gluon_ws_overlap", "gluon_ws_2wg"),
                                        "TILE_HEADS": ("pow2", "group"),
                                        "ENGINE": ("triton", "gluon", "gluon_wgmma")}
# Keys (and one value) removed by issue 26's clean-up: no policy, default, tuner or table
# selected them, docs/notes/sparse_prefill.md records them as losing, and every shipped config
# compiles to the same sm_90 SASS without them (benchmarks/probes/xcompile_sparse.py); the
# knobs are at commit 6fb4bac. What the kernel always does now, and the fix. A config naming
# one, at any value, is rejected, so that a stale config never silently means something else.
REMOVED_KEYS: dict[str, tuple[str, str]] = {
    "LAYOUT": ("S = Q K^T is [BLOCK_M, BLOCK_N] (the former LAYOUT='rows', the default; "
               "'keys' ran 4.1-5.1 ms against the table's 2.4-2.8)", "drop the key"),
    "EVEN_TILES": ("every tile is masked by the row's length (the former EVEN_TILES=0, the "
                   "default; 1 was slower, 3.57 against 3.10 ms)", "drop the key"),
    "PREFETCH": ("each step loads its indices, then K and V, then computes (the former "
                 "PREFETCH=0, the default; the register prefetch spilled: 3.6-77 ms)",
                 "drop the key"),
    "LAZY_RESCALE": ("the accumulator is rescaled at every step (the former LAZY_RESCALE=0, "
                     "the default; 1 was 6% slower on one warp, neutral on four)",
                     "drop the key"),
}
#: Values removed from keys that stay: (key, value) -> (why, the fix).
REMOVED_VALUES: dict[tuple[str, Any], tuple[str, str]] = {
    ("SLOT_ORDER", 2): ("two ordering passes (256 slot ranges) were no better than one (16 "
                        "ranges are within 1% of a full sort) and cost a second pass",
                        "use SLOT_ORDER=1"),
}
# the keys the Gluon engines take besides the geometry (gluon_kernels.py); the others must stay
# at their defaults
_GLUON_KEYS = frozenset({"ENGINE", "OFFS32", "SLOT_ORDER", "CHUNK_MODE", "MAXNREG", "DENSE",
                         "UNION", "UNION_PREP", "UNION_TILE", "UNION_DENSE", "UNION_ENGINE",
                         "DENSE_TILE", "TILE_HEADS"})
_MAX_HEAD_DIM = 256
#: DENSE's and UNION's thresholds at most (percent): the kernels multiply them in int64 by a
#: tile's valid entries (RP x topk, topk <= 65535), far from int64's limit at this bound; 10**6
#: already takes every tile.
_MAX_PERCENT = 10**9
GLUON_HEAD_DIMS = (64, 128, 256)  # ENGINE="gluon"
WGMMA_HEAD_DIM = 256  # ENGINE="gluon_wgmma": four 64-wide chunks


def _next_pow2(x: int) -> int:
    """The least power of two >= x (x >= 1), as ``triton.next_power_of_2``."""
    return 1 << max(0, int(x) - 1).bit_length()


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def validate_config(config: dict[str, Any], group_size: int, head_dim: int) -> None:
    """Raise :class:`ConfigError` if ``config`` cannot run a group of ``group_size`` heads."""
    if not isinstance(config, dict):
        raise ConfigError(f"config={config!r}: expected a dict with keys "
                          f"{', '.join(REQUIRED_KEYS)}")
    for key in REQUIRED_KEYS:
        if key not in config:
            raise ConfigError(f"config is missing {key}: a sparse_prefill config needs "
                              f"{', '.join(REQUIRED_KEYS)} (got {sorted(config)})")
        val = config[key]
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ConfigError(f"{key}={val!r}: expected a positive int")
    removed = [key for key in REMOVED_KEYS if key in config]
    removed_values = [(key, config[key]) for key, val in REMOVED_VALUES if config.get(key) == val]
    if removed or removed_values:
        what = f"key {removed[0]} (={config[removed[0]]!r})" if removed else \
            f"value {removed_values[0][0]}={removed_values[0][1]!r}"
        now, remedy = REMOVED_KEYS[removed[0]] if removed else REMOVED_VALUES[removed_values[0]]
        raise ConfigError(f"sparse_prefill config {what} was removed (issue 26; last in commit "
                          f"6fb4bac): {now}; {remedy}")
    for key in config:
        if key not in REQUIRED_KEYS and key not in DEFAULT_VARIANT:
            raise ConfigError(f"config key {key!r} is unknown: sparse_prefill configs take "
                              f"{', '.join(REQUIRED_KEYS + tuple(DEFAULT_VARIANT))}")
    mr = config.get("MAXNREG", 0)
    if not isinstance(mr, int) or isinstance(mr, bool) or (mr != 0 and not 24 <= mr <= 255):
        raise ConfigError(f"MAXNREG={mr!r}: expected 0 (compiler default) or an int in 24..255")
    for key, choices in _CHOICES.items():
        if key in config and config[key] not in choices:
            raise ConfigError(f"{key}={config[key]!r}: expected one of {choices}")
    var = _variant(config)
    if var["SPLIT_V"] == 2 and var["SPLIT_QK"] != 2:
        raise ConfigError("SPLIT_V=2 gathers V in the layout of the SPLIT_QK=2 K halves: it "
                          "needs SPLIT_QK=2")
    # the row-tile paths' thresholds (percent), their tile geometry, no slot reordering
    for key, what in (("DENSE", "a span threshold in percent of the mean valid entries per "
                                "row"),
                      ("UNION", "a union-size threshold in percent of the mean valid entries "
                                "per row of a tile")):
        pct = var[key]
        if not isinstance(pct, int) or isinstance(pct, bool) or not 0 <= pct <= _MAX_PERCENT:
            raise ConfigError(f"{key}={pct!r}: expected 0 (off) or {what}, at most "
                              f"{_MAX_PERCENT} (e.g. 300)")
        if pct:
            spec, tile_key = union_tile(var) if key == "UNION" else (var["DENSE_TILE"],
                                                                     "DENSE_TILE")
            _dense_tile_geometry(spec, group_size, tile_key, var["TILE_HEADS"])
            if var["SLOT_ORDER"]:
                raise ConfigError(f"{key} and SLOT_ORDER both reorganize the rows' entries: set "
                                  f"SLOT_ORDER=0 or {key}=0")
    ud = var["UNION_DENSE"]
    if not isinstance(ud, int) or isinstance(ud, bool) or not 0 <= ud <= _MAX_PERCENT:
        raise ConfigError(f"UNION_DENSE={ud!r}: expected 0 (off) or the percent of a dense "
                          f"tile's span its union may have to go union, at most {_MAX_PERCENT} "
                          f"(e.g. 80)")
    if ud and not (var["DENSE"] and var["UNION"]):
        raise ConfigError(f"UNION_DENSE={ud} hands DENSE's tiles to the union path, so it needs "
                          f"DENSE and UNION both on (got DENSE={var['DENSE']}, "
                          f"UNION={var['UNION']}): set both, or drop UNION_DENSE")
    if var["UNION_ENGINE"] != "triton" and not var["UNION"]:
        raise ConfigError(f"UNION_ENGINE={var['UNION_ENGINE']!r} runs the union tiles, and this "
                          f"config has none (UNION=0): set UNION, or drop UNION_ENGINE")
    if var["TILE_HEADS"] != "pow2" and not (var["DENSE"] or var["UNION"]):
        raise ConfigError(f"TILE_HEADS={var['TILE_HEADS']!r} shapes the DENSE and UNION row "
                          f"tiles, and this config has neither: set DENSE or UNION, or drop "
                          f"TILE_HEADS")
    if var["DENSE"] and var["UNION"] and var["UNION_TILE"]:
        dbm = _dense_tile_geometry(var["DENSE_TILE"], group_size, "DENSE_TILE",
                                   var["TILE_HEADS"])[0]
        ubm, ubn, unw, uns = _dense_tile_geometry(var["UNION_TILE"], group_size, "UNION_TILE",
                                                  var["TILE_HEADS"])
        if ubm != dbm:
            raise ConfigError(f"UNION_TILE={var['UNION_TILE']!r}: its BM={ubm} must equal "
                              f"DENSE_TILE's BM={dbm} when DENSE is on too (both paths take the "
                              f"same tiles of rows, RP = BM // heads); use "
                              f"'{dbm}x{ubn}x{unw}x{uns}'")
    bm, bn, nw = config["BLOCK_M"], config["BLOCK_N"], config["num_warps"]
    if var["ENGINE"] != "triton":
        _validate_gluon(config, var, group_size, head_dim)
        return
    if bm < group_size:
        fix = max(16, _next_pow2(group_size))
        raise ConfigError(f"BLOCK_M={bm} is below group_size={group_size}: one program tiles all "
                          f"query heads of a KV group, so BLOCK_M must be >= {group_size} "
                          f"(use {fix})")
    if not _is_pow2(bm):
        raise ConfigError(f"BLOCK_M={bm} is not a power of two: use "
                          f"{_next_pow2(bm)}")
    if not _is_pow2(bn) or bn < 16:
        raise ConfigError(f"BLOCK_N={bn}: expected a power of two >= 16 (it is the reduction "
                          f"dim of the PV product); use {max(16, _next_pow2(bn))}")
    if not _is_pow2(nw) or nw > 32:
        raise ConfigError(f"num_warps={nw}: expected a power of two <= 32")
    if head_dim < 1 or head_dim > _MAX_HEAD_DIM:
        raise ConfigError(f"head_dim={head_dim}: the sparse_prefill kernels support 1..256")


def _validate_gluon(config: dict[str, Any], var: dict[str, Any], group_size: int,
                    head_dim: int) -> None:
    """The Gluon engines' geometry. ENGINE="gluon": BLOCK_M query lines (8 or 16, the MMA's n
    side), BLOCK_N keys a ring stage, num_warps splitting head_dim, num_stages ring stages.
    ENGINE="gluon_wgmma": BLOCK_M lines (8 or 16, wgmma's n), 64 keys a tile on one warpgroup,
    head_dim chunks through a three-buffer ring with two in flight (the geometry 8|16 x 64 x 4
    x 2), head_dim 256."""
    e = f"ENGINE={var['ENGINE']!r}"
    other = sorted(k for k in config if k in DEFAULT_VARIANT and k not in _GLUON_KEYS
                   and config[k] != DEFAULT_VARIANT[k])
    if other:
        raise ConfigError(f"{e} does not take {', '.join(other)} (it takes the geometry, "
                          f"OFFS32, SLOT_ORDER, MAXNREG, CHUNK_MODE='pretranslate', DENSE, "
                          f"UNION, UNION_PREP, UNION_TILE, DENSE_TILE and TILE_HEADS): drop "
                          f"them, or use ENGINE='triton'")
    if var["CHUNK_MODE"] == "staged":
        raise ConfigError(f"{e} runs on slot ids: chunk rows need CHUNK_MODE='pretranslate' "
                          f"(got 'staged')")
    bm, bn, nw, ns = (config[k] for k in REQUIRED_KEYS)
    if bm not in (8, 16) or bm < group_size:
        raise ConfigError(f"{e}: BLOCK_M={bm} must be 8 or 16 query lines and at least "
                          f"group_size={group_size} (use {8 if group_size <= 8 else 16}; groups "
                          f"over 16 need ENGINE='triton')")
    if var["ENGINE"] == "gluon_wgmma":
        if (bn, nw, ns) != (64, 4, 2):
            raise ConfigError(f"{e}: the wgmma kernel runs 64 keys a tile on one warpgroup "
                              f"with two head_dim chunks in flight: BLOCK_N=64, num_warps=4, "
                              f"num_stages=2 (got {bn}, {nw}, {ns})")
        if head_dim != WGMMA_HEAD_DIM:
            raise ConfigError(f"{e} takes head_dim {WGMMA_HEAD_DIM} only (got {head_dim}): "
                              f"use ENGINE='gluon' or ENGINE='triton'")
        return
    if bn not in (16, 32, 64):
        raise ConfigError(f"{e}: BLOCK_N={bn} must be 16, 32 or 64 keys a stage")
    if nw not in (1, 2, 4):
        raise ConfigError(f"{e}: num_warps={nw} must be 1, 2 or 4 (they split head_dim)")
    if ns not in (1, 2):
        raise ConfigError(f"{e}: num_stages={ns} must be 1 or 2 ring stages")
    if head_dim not in GLUON_HEAD_DIMS:
        raise ConfigError(f"{e} takes head_dim in {GLUON_HEAD_DIMS} (got {head_dim}): use "
                          f"ENGINE='triton'")


def _dense_tile_geometry(spec: Any, group_size: int, key: str = "DENSE_TILE",
                         tile_heads: str = "pow2") -> tuple[int, int, int, int]:
    """A row tile's ``BMxBNxWxS`` (DENSE_TILE's, or UNION_TILE's named by ``key``) ->
    (BLOCK_M, BLOCK_N, num_warps, num_stages), checked (``tile_heads``: TILE_HEADS)."""
    parts = spec.lower().split("x") if isinstance(spec, str) else []
    if len(parts) == 5 and all(p.isdigit() for p in parts):
        raise ConfigError(
            f"{key}={spec!r}: the HP suffix (query heads a program) was removed (issue 26; "
            f"last in commit 8cccc1c): a program takes every head of its rows (one to four heads a "
            f"program lost 0-8% on the H200); use {'x'.join(parts[:4])!r}")
    if len(parts) != 4 or not all(p.isdigit() for p in parts) or \
            not all(int(p) > 0 for p in parts):
        raise ConfigError(f"{key}={spec!r}: expected 'BMxBNxWxS' like '128x32x8x3'")
    bm, bn, nw, ns = map(int, parts)
    hp = _dense_heads(group_size, tile_heads)
    if not _is_pow2(bm) or bm < max(16, hp):
        raise ConfigError(f"{key}={spec!r}: BM={bm} must be a power of two >= "
                          f"{max(16, hp)} (the MMA's M side, holding whole rows of {hp} "
                          f"heads for group {group_size})")
    if not _is_pow2(bn) or bn < 16:
        raise ConfigError(f"{key}={spec!r}: BN={bn} must be a power of two >= 16")
    if not _is_pow2(nw) or nw > 32:
        raise ConfigError(f"{key}={spec!r}: warps={nw} must be a power of two <= 32")
    return bm, bn, nw, ns


def union_tile(var: Mapping[str, Any]) -> tuple[str, str]:
    """(the union tiles' ``BMxBNxWxS``, the key that set it): UNION_TILE, else DENSE_TILE."""
    return (var["UNION_TILE"], "UNION_TILE") if var["UNION_TILE"] else \
        (var["DENSE_TILE"], "DENSE_TILE")


def _dense_heads(group_size: int, tile_heads: str = "pow2") -> int:
    """Query heads of one row of a row-tile program's lines (HP; a program takes every head of
    its rows): the whole group rounded up to a power of two (TILE_HEADS="pow2", padded lines
    masked) or the group itself ("group")."""
    return int(group_size) if tile_heads == "group" else int(_next_pow2(group_size))


def tile_rows(var: Mapping[str, Any], group_size: int, key: str = "UNION") -> tuple[int, int]:
    """(HP, RP) of a config's row tiles (``key``: whose geometry, DENSE's or UNION's; both
    have DENSE_TILE's BM when DENSE is on): a tile is RP = BM // HP consecutive rows."""
    spec, tile_key = union_tile(var) if key == "UNION" else (var["DENSE_TILE"], "DENSE_TILE")
    hp = _dense_heads(group_size, var["TILE_HEADS"])
    return hp, _dense_tile_geometry(spec, group_size, tile_key, var["TILE_HEADS"])[0] // hp


def _variant(config: dict[str, Any]) -> dict[str, Any]:
    out = dict(DEFAULT_VARIANT)
    out.update({k: config[k] for k in DEFAULT_VARIANT if k in config})
    return out


def describe_path(config: Mapping[str, Any] | None) -> str:
    """Which kernels a config runs, in words (``kreg explain``'s ``path:`` note): the row-tile
    paths (DENSE, UNION, decided per tile on the GPU) before the per-row kernel, and that one's
    engine and pre-passes."""
    if not config:
        return "no config"
    var = _variant(dict(config))
    tiles = var["DENSE_TILE"]
    parts = []
    if var["DENSE"]:
        parts.append(f"dense-span tiles where a tile's span is <= {var['DENSE']}% of its rows' "
                     f"mean valid entries (DENSE_TILE {tiles})")
    if var["UNION"]:
        over = ""
        if var["CHUNK_MODE"] == "pretranslate" and not var["DENSE"]:
            over = ("; chunk rows: the union counted over their token positions, a tile "
                    "spanning two requests gathered")
        if var["UNION_PREP"] == "cuda":
            over += ("; pre-pass: one CUDA kernel a tile (built with nvcc on first use; the "
                     "Triton pre-pass where it cannot be had)")
        if var["UNION_ENGINE"] != "triton":
            lap = {"gluon_ws_overlap": ", each step's softmax under the previous step's PV "
                                       "MMAs",
                   "gluon_ws_2wg": ", two consumer warpgroups of 64 lines"}.get(
                       var["UNION_ENGINE"], "")
            over += (f"; attention: the warp-specialized Gluon kernel{lap} (sm_90, 16-bit K/V, "
                     f"head_dim 256; the Triton union kernel elsewhere)")
        if var["UNION_DENSE"] and var["DENSE"]:
            over += (f"; tried first on the dense tiles too: one whose union is <= "
                     f"{var['UNION_DENSE']}% of its span goes union (UNION_DENSE; one whose "
                     f"largest row alone is past that stays dense ungated)")
        spec, tile_key = union_tile(var)
        parts.append(f"union tiles where a tile's union of selected slots is <= "
                     f"{var['UNION']}% of its rows' mean valid entries ({tile_key} {spec}; "
                     f"chosen per tile on the GPU{over})")
    if parts and var["TILE_HEADS"] == "group":
        parts[-1] += " (tiles of the group's heads exactly, TILE_HEADS='group')"
    engine = {"triton": "the Triton per-row gathering kernel", "gluon": "the Gluon mma_v2 "
              "per-row kernel", "gluon_wgmma": "the Gluon wgmma per-row kernel"}[var["ENGINE"]]
    rest = "the other tiles' rows" if parts else "every row"
    pre = []
    if config.get("CHUNK_MODE", "fused") != "fused":
        pre.append(f"CHUNK_MODE={var['CHUNK_MODE']}")
    if var["SLOT_ORDER"]:
        pre.append(f"slot-ordered rows (SLOT_ORDER={var['SLOT_ORDER']})")
    tail = f" ({', '.join(pre)})" if pre else ""
    return "; ".join([*parts, f"{engine} for {rest}{tail}"])
