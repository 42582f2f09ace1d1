"""The sparse-prefill family measured on the H200 (the GPU this project measures on).

Gated the way the seed gates sm120: the exact device set the numbers come from (NVIDIA H200,
132 SMs), the Triton floor it was measured on (3.6), the measured workload (top-k 2051, head dim
256, bf16, the rank shapes below) and, per (kind, group), the lowest measured total_q from which
the family wins and is never more than 2% slower above (docs/BENCHMARKS.md, "sparse_prefill":
the total_q sweep). Chunk batches additionally need the measured rows per request and the grid
bound. The config depends on the KV length: from ``LONG_KV_FROM`` slots and
``LONG_KV_MIN_TOTAL_Q`` rows the family orders each row's slots first; prefill up to
``DENSE_MAX_KV`` slots with at least ``DENSE_MIN_TOTAL_Q`` rows computes the rows that select
densely in their span by streaming K/V blocks (DENSE); prefill from ``GLUON_MIN_KV`` to below
``LONG_KV_FROM`` slots on Triton 3.6 runs the Gluon kernels: the wgmma one
(ENGINE="gluon_wgmma") for groups 6 and 12 from ``WGMMA_MIN_TOTAL_Q`` rows (after DENSE,
except for ``WGMMA_OVER_DENSE``; chunk group 12 too, on pretranslated rows), else the mma_v2
one (ENGINE="gluon") for group 6 from ``GLUON_MIN_TOTAL_Q`` rows; chunk group 6 at
``UNION_KV`` slots from ``UNION_MIN_TOTAL_Q`` rows runs union tiles (UNION) over the one-warp
pretranslated family, and prefill group 6 at ``UNION_KV[0]`` to ``DENSE_MAX_KV`` slots
(``UNION_OVER_DENSE``) runs them beside its dense tiles (``family_config``).
Every other device is unaffected; ``nvidia_hopper.sparse_prefill_tuned:measure`` waives the
envelope on another sm_90 part (an H100 or H20) to measure it with ``kreg bench``.

``nvidia_hopper.indexer_topk_cluster``: the cluster radix select (a CUDA kernel,
``backends/indexer_topk/cluster.py``; one 8-CTA cluster a row, the row in shared memory, one
launch) for rows of at most 131,072 keys, on the parts it was measured on (H200 and H100 SXM,
132 SMs) up to ``CLUSTER_MAX_ROWS`` rows, where it beat the Triton kernels in all 35 measured
cells, 1.04-3.2x (seven distributions; docs/BENCHMARKS.md, "indexer_topk: the cluster kernel at
1-64 rows"); from 32 rows the Triton kernels win on most distributions. It needs ``nvcc``
once, to build the kernel (``cuda_toolchain``); ``nvidia_hopper.indexer_topk_cluster:measure``
waives the envelope.

``nvidia_hopper.indexer_topk_stream``: a one-read streaming select for large batches (a CUDA
kernel, ``backends/indexer_topk/stream.py``; one CTA a row, a sampled threshold, no workspace)
from ``STREAM_MIN_ROWS`` rows of at least ``STREAM_MIN_KEYS`` keys on the cluster kernel's parts,
where it beat the Triton kernels on six of seven distributions at 1024-4096 rows, 1.15-1.78x,
and on three of four at 128-512 (1.02-1.56x), and lost on all-zero rows, 1.05-1.32x their time
(docs/BENCHMARKS.md, "indexer_topk: the streaming kernel at 64-4096 rows"; the 128-512 A/B in
docs/notes/indexer_topk.md, "Session 41"); ``nvidia_hopper.indexer_topk_stream:measure`` waives
the envelope.
"""

from __future__ import annotations

from typing import Any

from backends.indexer_topk import EXACT, IndexerTopkWorkload
from backends.indexer_topk import cluster as _cluster
from backends.indexer_topk import stream as _stream
from backends.sparse_prefill import SparsePrefillWorkload
from backends.sparse_prefill.config import describe_path
from backends.sparse_prefill.conformance import Case, chunk_call, prefill_call
from backends.sparse_prefill.guarantees import kernel_contract
from registry import DeviceFacts, Implementation, hookimpl
from registry.requirements import (
    CAPABILITY,
    ENVELOPE,
    arch_in,
    device_in,
    field_at_least,
    field_at_most,
    field_eq,
    field_in,
    fields_in,
    grid_bound,
    predicate,
    triton_runtime,
    vendor_in,
    version_at_least,
    when,
)
from registry.versions import parse_version

PRIORITY = 100

H200 = ("NVIDIA H200", 132)

# (kind, group_size) -> config. Variant keys (backends/sparse_prefill/triton_kernels.py):
# SPLIT_QK=2 (two independent half-head_dim score chains) with SPLIT_V=2 (V gathered in the same
# halves, so K and V share each row's offset), OFFS32=1 (int32 row offsets where they fit),
# LEAN=1 (K of invalid entries read unmasked from slot 0, scores masked), REVERSE_ROWS=1 (long
# causal rows start first), MAXNREG (register cap: more resident programs), CHUNK_MODE
# (pretranslate: page-table translation in a pre-pass; staged: each program translates its row
# before its loop). Measured on the H200 at 8192 rows: docs/notes/sparse_prefill.md.
H200_PREFILL_CONFIGS: dict[tuple[str, int], dict[str, Any]] = {
    ("prefill", 6): {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2,
                     "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1, "OFFS32": 1, "REVERSE_ROWS": 1},
    ("chunk", 6): {"BLOCK_M": 8, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2,
                   "CHUNK_MODE": "staged", "SPLIT_QK": 2, "SPLIT_V": 2, "OFFS32": 1,
                   "REVERSE_ROWS": 1, "MAXNREG": 96},
    ("prefill", 12): {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2,
                      "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1, "OFFS32": 1, "REVERSE_ROWS": 1},
    ("chunk", 12): {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2,
                    "CHUNK_MODE": "pretranslate", "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1,
                    "OFFS32": 1, "REVERSE_ROWS": 1},
}

# (kind, group_size) -> the lowest measured total_q from which the family wins (KV 8K sweep).
MIN_TOTAL_Q: dict[tuple[str, int], int] = {
    ("chunk", 6): 256, ("chunk", 12): 1024, ("prefill", 6): 1024, ("prefill", 12): 1024,
}


# Chunk: rows per request measured to win (one request at the floor; 16 requests of 512 rows).
MIN_ROWS_PER_REQUEST: dict[int, int] = {6: 256, 12: 512}


def _rows_per_request(f: DeviceFacts, w: SparsePrefillWorkload) -> tuple[bool, str, str]:
    floor = MIN_ROWS_PER_REQUEST.get(w.group_size, 0)
    total, n = w.total_q, max(1, w.num_requests)
    return (total >= floor * n, f"{total / n:g} ({total} rows / {n} requests)",
            f">= {floor} on average for group {w.group_size}")


def _min_rows(f: DeviceFacts, w: SparsePrefillWorkload) -> tuple[bool, str, str]:
    key = (w.kind, w.group_size)
    floor = MIN_TOTAL_Q.get(key)
    if floor is None:
        return False, f"no measurement for {key}", f"(kind, group) in {sorted(MIN_TOTAL_Q)}"
    total = w.total_q
    return total >= floor, str(total), f">= {floor} for kind={key[0]}, group {key[1]}"


REQUIREMENTS = (
    # capability
    vendor_in("nvidia"),
    arch_in("sm_90"),
    version_at_least("triton", "3.6"),
    triton_runtime(),
    field_eq("topk", 2051),
    field_eq("head_dim", 256),
    when("kind", "prefill", fields_in(("group_size", "num_kv_heads"), [(6, 1), (12, 1)],
                                      name="rank_shape")),
    when("kind", "chunk", fields_in(("group_size", "num_kv_heads"),
                                    [(6, 1), (6, 2), (12, 1), (12, 2)], name="rank_shape")),
    # envelope
    device_in(H200),
    field_eq("dtype", "bfloat16", kind=ENVELOPE),
    predicate("total_q", ENVELOPE, _min_rows),
    when("kind", "chunk", predicate("rows_per_request", ENVELOPE, _rows_per_request)),
    when("kind", "chunk", grid_bound(2)),
)


# Long KV: from LONG_KV_FROM slots on (with at least LONG_KV_MIN_TOTAL_Q rows), the family
# orders each row's slots first (SLOT_ORDER=1: a pre-pass partitions every row's entries into 16
# slot ranges, so the rows running at the same time sweep the KV together and their gathers hit
# in L2 instead of HBM). Chunk group 6 then runs the one-warp pretranslate loop (its staged
# entries are positions until each program translates them, so they cannot be ordered).
# Measured at 8192 rows (docs/notes/sparse_prefill.md, v14): over the table at KV 64K / 128K,
# prefill 1.47x / 1.73-1.77x (1.33-1.37x / 1.27-1.29x unordered), chunk 1.67-1.69x / 1.86-1.89x;
# at KV 32K the pre-pass (0.18 ms) costs what it saves, at 8K more.
LONG_KV_FROM = 65536
H200_LONG_KV_CONFIGS: dict[tuple[str, int], dict[str, Any]] = {
    ("prefill", 6): {**H200_PREFILL_CONFIGS[("prefill", 6)], "SLOT_ORDER": 1},
    ("chunk", 6): {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2,
                   "CHUNK_MODE": "pretranslate", "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1,
                   "OFFS32": 1, "REVERSE_ROWS": 1, "SLOT_ORDER": 1},
    ("prefill", 12): {**H200_PREFILL_CONFIGS[("prefill", 12)], "SLOT_ORDER": 1},
    ("chunk", 12): {**H200_PREFILL_CONFIGS[("chunk", 12)], "SLOT_ORDER": 1},
}
# (kind, group_size) -> the fewest rows from which the long-KV config is used. The CUDA-graph
# sweep at KV 64K / 128K (256..8192 rows): it wins from 1024 rows (0.52-0.64x of the table's
# time) and loses at 512 (up to 1.16x; the one-warp chunk config at 256-512 rows up to 1.35x,
# where the staged group-6 config still wins).
LONG_KV_MIN_TOTAL_Q: dict[tuple[str, int], int] = {
    ("prefill", 6): 1024, ("prefill", 12): 1024, ("chunk", 6): 1024, ("chunk", 12): 1024,
}


# Short prefix-free KV: rows whose selections are dense in their slot span (a causal prompt's
# rows select most of what they see) are computed by DENSE tiles: the contiguous K/V blocks are
# streamed once per tile of rows and scored on the tensor cores, the other rows gather as
# before (DENSE=N: a tile of rows is dense when its slot span is at most N% of its mean valid
# entries). Measured at 8192 rows, KV 8K, graph replays (docs/notes/sparse_prefill.md, v15):
# group 6 at N=250 1.57-1.61x over the table (the family alone 1.29-1.31x; N=200 and all tiles
# dense were within 1%), group 12 at N=150 1.32x (N=200 1.33-1.34x at KV 8K but 0.84x of the
# family at KV 4K, where its rows past 4096 have span / entries = 2.0 and went dense; 250 1.26x,
# all dense 0.94x: 12 heads pad to 16 lines and double the dense MMA work); KV 2K / 4K: group 6
# 2.73x / 2.03x, group 12 1.83x / 1.33x. Not used below 8192 rows (at 1024-4096
# rows with a prefix the dense tiles lost up to 3x) or past KV 8K (nothing is dense there, and the
# statistics pass costs ~2%). A DENSE call holds an int32 scratch of ceil(kv_len / 2) words a row
# (128 MiB at 8192 x 8192; at most 256 MiB, rows are done in chunks).
DENSE_MAX_KV = 8192
DENSE_MIN_TOTAL_Q = 8192
H200_DENSE_CONFIGS: dict[tuple[str, int], dict[str, Any]] = {
    ("prefill", 6): {**H200_PREFILL_CONFIGS[("prefill", 6)], "DENSE": 250},
    ("prefill", 12): {**H200_PREFILL_CONFIGS[("prefill", 12)], "DENSE": 150},
}


# Union tiles (UNION=U, issue 26): a tile of DENSE_TILE's rows whose selections share most of
# their slots gathers the union once for all its query lines (chosen per tile on the GPU; the
# other tiles gather with the rest of the config). Chunk rows need CHUNK_MODE="pretranslate"
# (the union is over slot ids). The tuner's space has UNION=300 over every family config
# (backends/sparse_prefill/tuning.py); the policy takes the chunk group-6 one (offered as
# `config=nvidia_hopper.union.chunk_g6`: 128-line tiles of 16 rows, 64 slots a step) at KV 8192
# to 32768 from 8192 rows (UNION_POLICY, UNION_KV, UNION_MIN_TOTAL_Q). Measured in one window
# against the staged family it replaces (session 20, CUDA-graph replays at 8192 rows, the
# position-space pre-pass and the mark runs; docs/BENCHMARKS.md, "Session 20"): top-k-shaped
# rows 0.59x at KV 8K (0.997 against 1.690 ms) and 0.71x at 32K (1.416 against 1.986), the
# bench walk 0.98x / 1.00x (the gate keeps its tiles on the gathering kernel). Not taken elsewhere:
# chunk group 12 wins on top-k rows with 64-line tiles (0.93x at 8K) but loses on the walk
# (1.25x); prefill group 6 at 8K with union tiles alone wins on top-k rows (0.63x on an H100)
# but the walk then runs 23% slower without the dense tiles (below: both); prefill at 32K and
# prefill group 12 run the Gluon wgmma kernel, whose programs do not skip tiles another path
# took.
# KV 16K sits between the two measured lengths; other row counts were not measured. The chunk
# config's pre-pass is the one CUDA kernel (UNION_PREP="cuda", built with nvcc on first use; the
# Triton pre-pass where it cannot be had, the same answer): on an H100 (session 45, one window a
# cell, CUDA-graph replays, 8192 rows) 0.889x the Triton pre-pass's time on top-k rows and 0.948x
# on the walk at KV 8K, 0.887x / 0.987x at 32K (docs/notes/sparse_prefill.md, "Session 45").
# Prefill group 6 at KV 8192 (its dense tiles' cell, from 8192 rows: UNION_OVER_DENSE) runs
# union tiles beside the dense tiles, each path at its own tile shape (UNION_TILE 128x64x8x2),
# with the CUDA pre-pass: on an H100 (session 45, one window a cell, CUDA-graph replays, 8192
# rows) 0.741x the dense config's time on top-k rows (0.899 against 1.214 ms) and 1.009x on the
# walk (1.401 against 1.390), once the union kernel's programs of other tiles return at once
# (1.033x before). Its union pre-pass runs first and takes the dense tiles whose union is at most
# 60% of their span (UNION_DENSE=60, session 46): on an H100 (one window, CUDA-graph replays)
# 0.954x the config without it on top-k rows (0.828 against 0.867 ms) and 1.013x on the walk
# (1.414 against 1.397); 80% was 0.979x / 1.012x, 100% 0.906x / 1.058x (the walk's full-span
# tiles then leave the dense kernel). Not yet on an H200.
H200_UNION_CONFIGS: dict[tuple[str, int], dict[str, Any]] = {
    ("prefill", 6): {**H200_DENSE_CONFIGS[("prefill", 6)], "UNION": 300,
                     "UNION_TILE": "128x64x8x2", "UNION_PREP": "cuda", "UNION_DENSE": 60},
    ("prefill", 12): {**H200_PREFILL_CONFIGS[("prefill", 12)], "UNION": 300},
    ("chunk", 6): {**H200_PREFILL_CONFIGS[("prefill", 6)], "CHUNK_MODE": "pretranslate",
                   "UNION": 300, "DENSE_TILE": "128x64x8x2", "UNION_PREP": "cuda"},
    ("chunk", 12): {**H200_PREFILL_CONFIGS[("chunk", 12)], "UNION": 300},
}
UNION_POLICY = frozenset({("chunk", 6)})
UNION_OVER_DENSE = frozenset({("prefill", 6)})  # at KV UNION_KV[0] to DENSE_MAX_KV
UNION_KV = (8192, 32768)  # the measured KV lengths (inclusive)
UNION_MIN_TOTAL_Q = 8192


# From GLUON_MIN_KV to below LONG_KV_FROM slots (where the dense tiles do not apply), prefill group
# 6 from GLUON_MIN_TOTAL_Q rows: the hand-scheduled Gluon kernel (ENGINE="gluon",
# backends/sparse_prefill/gluon_kernels.py: transposed products so the 6 heads pad to 8 lines, two
# warps splitting head_dim, one 16-key cp.async stage; 128 registers and 20 KB a program, 8
# programs an SM). Measured with CUDA graphs at KV 8K / 16K / 32K and 32..8192 rows
# (docs/notes/benchmarks-history.md, "Session 11"): 1.8-4.4% faster than the Triton family
# from 2048 rows (1.29-1.31x over the table at 4096-8192 rows), 0.6-1.7% at 1024 (within the
# windows' spread, so not used there); below 1024 rows both lose to the table. Capping its
# registers to fit 9-10 programs an SM made it slower.
# Gluon is Triton's experimental dialect (its API changed after 3.6): the config is used only on
# the Triton release it was measured on (GLUON_TRITON); on any other the Triton family runs.
# Not for group 12: its 16 lines need ~255 registers in this kernel (at KV 32K and 8192 rows
# 1.07x over the table with one warp, 0.72x with two; the Triton family 1.24x). From 8192 rows
# the wgmma kernel below takes over for both groups.
GLUON_MIN_KV = 8192
GLUON_TRITON = (3, 6)
GLUON_MIN_TOTAL_Q: dict[tuple[str, int], int] = {("prefill", 6): 2048}
H200_GLUON_CONFIGS: dict[tuple[str, int], dict[str, Any]] = {
    ("prefill", 6): {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 2, "num_stages": 1,
                     "ENGINE": "gluon", "OFFS32": 1},
}


# From GLUON_MIN_KV to below LONG_KV_FROM slots and from WGMMA_MIN_TOTAL_Q rows, prefill groups 6
# and 12: the Gluon wgmma kernel (ENGINE="gluon_wgmma": one warpgroup, 64-key tiles through a
# ring of three 64-wide head_dim chunk buffers with two chunks in flight, S^T and O^T on wgmma,
# per-thread softmax sums). Group 6 at 96 registers (MAXNREG; 30 KB, 5 programs an SM), group 12
# at 128 (35 KB, 4 programs an SM: no spills, and 1024-4096 rows quantize better than at 5).
# Measured with CUDA graphs at KV 8K / 16K / 32K and 512..8192 rows
# (docs/notes/benchmarks-history.md, "Session 13"): group 12 is 5-8% faster than the Triton
# family at every row count from 1024
# (1.33x over the table at KV 32K and 8192 rows) and at KV 8K / 8192 rows faster than the dense
# tiles too (1.54 against 1.67 ms; WGMMA_OVER_DENSE); group 6 1-3% faster than the mma_v2 Gluon
# kernel at 8192 rows (1.34x) and slower at 1024-4096 (5 programs an SM quantize worse), so from
# 8192 rows, after the dense tiles (at KV 8K 1.38 against 1.48 ms). H200 (sm_90) only: wgmma
# does not exist elsewhere; same Triton pin as the other Gluon config.
# Chunk group 12 (session 24, issue 26): the same kernel on pretranslated rows, 0.87-0.92x the
# pretranslated Triton family on top-k rows and 0.92-0.94x on the walk at KV 8K / 16K / 32K and
# 2048 / 4096 / 8192 rows (docs/notes/sparse_prefill.md, "Session 24"); chunk group 6 keeps the
# union tiles (the wgmma kernel is 1.50x slower there on top-k rows).
WGMMA_MIN_TOTAL_Q: dict[tuple[str, int], int] = {("prefill", 6): 8192, ("prefill", 12): 1024,
                                                 ("chunk", 12): 2048}
WGMMA_OVER_DENSE = frozenset({("prefill", 12)})
H200_WGMMA_CONFIGS: dict[tuple[str, int], dict[str, Any]] = {
    (kind, g): {"BLOCK_M": 8 if g <= 8 else 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2,
                "ENGINE": "gluon_wgmma", "OFFS32": 1, "MAXNREG": 96 if g <= 8 else 128,
                **({"CHUNK_MODE": "pretranslate"} if kind == "chunk" else {})}
    for kind, g in WGMMA_MIN_TOTAL_Q
}


def gluon_triton(triton_version: str | None) -> bool:
    """Whether ``triton_version`` is the release the Gluon configs were measured on."""
    if not triton_version:
        return False
    try:
        return parse_version(triton_version)[:2] == GLUON_TRITON
    except ValueError:
        return False


def family_config(kind: str, group_size: int, kv_len: int | None,
                  total_q: int | None = None,
                  triton_version: str | None = None) -> dict[str, Any]:
    """The family's config for a measured (kind, group) at ``kv_len`` KV slots and ``total_q``
    rows (None: unknown; an unknown KV length gets the short-KV config, and dense tiles and the
    Gluon kernels need both known) under Triton ``triton_version`` (the Gluon kernels need
    :data:`GLUON_TRITON`; None: not used)."""
    key = (kind, group_size)
    if (kv_len is not None and kv_len >= LONG_KV_FROM and key in H200_LONG_KV_CONFIGS
            and (total_q is None or total_q >= LONG_KV_MIN_TOTAL_Q[key])):
        return dict(H200_LONG_KV_CONFIGS[key])
    mid_kv = kv_len is not None and GLUON_MIN_KV <= kv_len < LONG_KV_FROM
    wgmma = (mid_kv and key in H200_WGMMA_CONFIGS and total_q is not None
             and total_q >= WGMMA_MIN_TOTAL_Q[key] and gluon_triton(triton_version))
    if (kv_len is not None and kv_len <= DENSE_MAX_KV and key in H200_DENSE_CONFIGS
            and total_q is not None and total_q >= DENSE_MIN_TOTAL_Q
            and not (wgmma and key in WGMMA_OVER_DENSE)):
        if key in UNION_OVER_DENSE and kv_len >= UNION_KV[0] and total_q >= UNION_MIN_TOTAL_Q:
            return dict(H200_UNION_CONFIGS[key])
        return dict(H200_DENSE_CONFIGS[key])
    if wgmma:
        return dict(H200_WGMMA_CONFIGS[key])
    if (mid_kv and key in H200_GLUON_CONFIGS and total_q is not None
            and total_q >= GLUON_MIN_TOTAL_Q[key] and gluon_triton(triton_version)):
        return dict(H200_GLUON_CONFIGS[key])
    if (key in UNION_POLICY and kv_len is not None and UNION_KV[0] <= kv_len <= UNION_KV[1]
            and total_q is not None and total_q >= UNION_MIN_TOTAL_Q):
        return dict(H200_UNION_CONFIGS[key])
    return dict(H200_PREFILL_CONFIGS[key])


def _config(f: DeviceFacts, w: SparsePrefillWorkload) -> dict[str, Any]:
    return family_config(w.kind, w.group_size, w.kv_len,
                         w.total_q, f.triton_version)


def _invariant_config(f: DeviceFacts, w: SparsePrefillWorkload) -> dict[str, Any]:
    """While batch invariance is required: the family's config without the dense or union
    tiles (a tile's path depends on its neighbouring rows; every other config is row-local)."""
    cfg = family_config(w.kind, w.group_size, w.kv_len, w.total_q, f.triton_version)
    if not (cfg.get("DENSE") or cfg.get("UNION")):
        return cfg
    return dict(H200_PREFILL_CONFIGS[(w.kind, w.group_size)])


def _rows(topk: int, total_q: int) -> list[int]:
    """Rows crossing 16- and 64-entry tiles (37, 19, 5, 70 valid entries) and an empty one: the
    measured top-k without the interpreter's cost of full rows (``seed_full_row`` has one)."""
    return [37, 0, 19, 70, 5][:total_q]


#: The conformance kit's cases (``pytest --kreg-conformance nvidia_hopper``): the measured
#: workload (top-k 2051, head dim 256, each kind's rank shapes) at the kit's small sizes, judged
#: on the H200 profile and run here. The kit also asks ``family_config`` what it would choose
#: for each case's shape at larger kv_len / total_q, so the long-KV and dense configs execute too
#: (the Gluon ones are reported as not runnable on a CPU).
CONFORMANCE_CASES = (
    Case("seed_prefill_g6", "prefill at group 6 / 1 KV head: rows of 37, 0, 19, 70 and 5 valid "
         "entries", prefill_call(total_q=5, group=6, hkv=1, d=256, topk=2051, num_slots=96,
                                 lengths=_rows)),
    Case("seed_prefill_g12", "prefill at group 12 / 1 KV head",
         prefill_call(total_q=5, group=12, hkv=1, d=256, topk=2051, num_slots=96,
                      lengths=_rows)),
    Case("seed_chunk_g6x2", "chunk at group 6 / 2 KV heads after cached prefixes (page size 4)",
         chunk_call(q_rows=(2, 2), prefixes=(5, 9), page_size=4, group=6, hkv=2, d=256,
                    topk=2051, lengths=_rows)),
    Case("seed_chunk_g12x2", "chunk at group 12 / 2 KV heads, an unmapped trailing page",
         chunk_call(q_rows=(1, 3), prefixes=(9, 3), page_size=4, group=12, hkv=2, d=256,
                    topk=2051, unmapped=1, lengths=_rows)),
    Case("seed_full_row", "one prefill row of all 2051 entries, lengths omitted",
         prefill_call(total_q=1, group=6, hkv=1, d=256, topk=2051, num_slots=96)),
)


_TABLES = {"family": H200_PREFILL_CONFIGS, "long_kv": H200_LONG_KV_CONFIGS,
           "dense": H200_DENSE_CONFIGS,
           "union": {key: H200_UNION_CONFIGS[key]
                     for key in sorted(UNION_POLICY | UNION_OVER_DENSE)},
           "gluon": H200_GLUON_CONFIGS,
           "wgmma": H200_WGMMA_CONFIGS}


@hookimpl
def kreg_configs(op: str) -> dict[str, dict[str, Any]] | None:
    """Every config the family may choose, named ``<table>.<kind>_g<group>`` (the tuner's
    search space and the bench's ``config=`` providers)."""
    if op != "sparse_prefill":
        return None
    return {f"{table}.{kind}_g{g}": dict(cfg) for table, configs in _TABLES.items()
            for (kind, g), cfg in configs.items()}


#: The cluster kernel's envelope: the parts it was measured on and the rows up to which it beat
#: the Triton kernels (seven distributions; kernel v53, session 35, H100: at 1-16 rows all 35
#: cells faster, 1.04-3.2x; at 32 rows slower on four distributions, up to 1.33x their time, and
#: at 64 rows on six, up to 1.52x, so not taken there; session 32's probe of the first kernel was
#: 1.1-3.7x faster at 1-16 rows on the H200).
CLUSTER_DEVICES = (H200, ("NVIDIA H100 80GB HBM3", 132))
CLUSTER_MAX_ROWS = 16


def _cuda_toolchain(f: DeviceFacts, w: IndexerTopkWorkload) -> tuple[bool, str, str]:
    ok, seen = _cluster.toolchain()
    return ok, seen, "nvcc, to build the CUDA kernel once (CUDA_HOME/bin/nvcc or PATH)"


def _describe_cluster(config: Any) -> str:
    return (f"CUDA cluster radix select (one 8-CTA cluster a row, the row read once into shared "
            f"memory, one launch; built with nvcc into $KREG_HOME/cuda on first use), up to "
            f"{CLUSTER_MAX_ROWS} rows")


CLUSTER_REQUIREMENTS = (
    # capability
    vendor_in("nvidia"),
    arch_in("sm_90"),
    field_in("dtype", _cluster.DTYPES),
    field_at_most("max_keys", _cluster.MAX_KEYS),
    predicate("cuda_toolchain", CAPABILITY, _cuda_toolchain),
    # envelope
    device_in(*CLUSTER_DEVICES),
    field_at_most("num_rows", CLUSTER_MAX_ROWS, kind=ENVELOPE),
)


#: The streaming kernel's envelope (sessions 37, 41 and 42, the H100 SXM; the H200 is the same
#: GH100 with more memory bandwidth, which a one-read kernel gains from at least as much as the
#: Triton kernels, so it takes the cluster kernel's parts). Session 42's table (fp32, all seven
#: distributions at 64-4096 rows of 131,072 keys; bf16, four at 64-1024; docs/BENCHMARKS.md):
#: from 128 rows 0.58-0.96x the Triton kernels' time on six of seven distributions and bf16
#: 0.56-0.87x on all four, all-zero rows (every key a tie) 1.05-1.31x. At 64 rows 0.76-0.88x on
#: random, recent-window, low-bit and ReLU rows, 1.01x and 1.03x on four-value and ramp rows,
#: 1.53x on all-zero rows (48.7 against 31.8 us), bf16 0.72-0.88x on all four: faster on most
#: rows, and its slowest distribution (ReLU, 52.0 us) is faster than the Triton kernels'
#: (ReLU, 58.9), so it takes 64 rows too. Below 64 the Triton kernels (and the cluster kernel
#: up to 16 rows) stay: not re-measured with the stream's current build.
STREAM_DEVICES = CLUSTER_DEVICES
STREAM_MIN_ROWS = 64
#: The row lengths it was measured at (131,072 keys) start here; shorter rows stay on Triton.
STREAM_MIN_KEYS = 65536


def _stream_toolchain(f: DeviceFacts, w: IndexerTopkWorkload) -> tuple[bool, str, str]:
    ok, seen = _stream.toolchain()
    return ok, seen, "nvcc, to build the CUDA kernel once (CUDA_HOME/bin/nvcc or PATH)"


def _describe_stream(config: Any) -> str:
    where = f"from {STREAM_MIN_ROWS} rows of at least {STREAM_MIN_KEYS} keys"
    return (f"CUDA one-read streaming select (one CTA a row: a sampled threshold, the row read "
            f"once into a shared-memory buffer and bitmap, no workspace; built with nvcc into "
            f"$KREG_HOME/cuda on first use), {where}")


STREAM_REQUIREMENTS = (
    # capability
    vendor_in("nvidia"),
    arch_in("sm_90"),
    field_in("dtype", _stream.DTYPES),
    field_at_most("max_keys", _stream.MAX_KEYS),
    field_at_most("k", _stream.MAX_K),
    predicate("cuda_toolchain", CAPABILITY, _stream_toolchain),
    # envelope
    device_in(*STREAM_DEVICES),
    field_at_least("num_rows", STREAM_MIN_ROWS),
    field_at_least("max_keys", STREAM_MIN_KEYS),
)


@hookimpl
def kreg_implementations() -> list[Implementation]:
    return [
        Implementation(op="indexer_topk", name=_stream.NAME,
                       priority=PRIORITY, requirements=STREAM_REQUIREMENTS,
                       kernel="backends.indexer_topk.stream:indexer_topk_stream",
                       configurable=False, contract=EXACT,
                       describe_config=_describe_stream,
                       description="one-read streaming select (CUDA): one CTA a row, a sampled "
                                   "threshold, the row read once into shared memory, no "
                                   "workspace; exact"),
        Implementation(op="indexer_topk", name="nvidia_hopper.indexer_topk_cluster",
                       priority=PRIORITY, requirements=CLUSTER_REQUIREMENTS,
                       kernel="backends.indexer_topk.cluster:indexer_topk_cluster",
                       configurable=False, contract=EXACT,
                       describe_config=_describe_cluster,
                       description="cluster radix select (CUDA): one 8-CTA cluster a row, the "
                                   "row read once into shared memory, one launch; exact"),
        Implementation(op="sparse_prefill", name="nvidia_hopper.sparse_prefill_tuned",
                       priority=PRIORITY, requirements=REQUIREMENTS, config=_config,
                       kernel="backends.sparse_prefill.triton_kernels:sparse_prefill_triton",
                       contract=kernel_contract, invariant_config=_invariant_config,
                       describe_config=describe_path,
                       description="H200-measured family: split K/V gathers, int32 offsets, "
                                   "reversed rows; dense tiles for short prefill (KV <= 8K), "
                                   "union tiles for chunk group 6 at KV 8K, "
                                   "the Gluon kernels for prefill at KV 8K-64K (wgmma from "
                                   "8192 rows), slot-ordered rows from KV 64K",
                       conformance_profiles=("h200",),
                       conformance_cases="plugins.nvidia_hopper:CONFORMANCE_CASES"),
    ]
