"""sparse_prefill Triton kernels against the float64 reference.

Without a GPU these run under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET)
at tiny sizes in float32/float16 (the interpreter's bf16 dot is broken). ``@pytest.mark.gpu``
tests run bf16 at the seed's shapes (fewer rows) against the fp32 reference at 2e-2.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from backends.sparse_prefill.reference import sparse_prefill_reference  # noqa: E402
from backends.sparse_prefill.triton_kernels import (  # noqa: E402
    error_bound,
    sparse_prefill_triton,
    validate_config,
)
from plugins.generic import sparse_prefill_table_config as table_config  # noqa: E402
from plugins.nvidia_hopper import H200_PREFILL_CONFIGS as H200_CONFIGS  # noqa: E402
from registry.errors import ConfigError, WorkloadError  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BASE = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}


def _prefill_case(seed, *, total_q=5, group=6, hkv=1, d=40, num_slots=60, topk=37,
                  dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hq = group * hkv
    q = torch.randn((total_q, hq, d), generator=g).to(dtype)
    k = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    v = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    idx = torch.randint(-4, num_slots + 4, (total_q, topk), generator=g, dtype=torch.int32)
    idx[0, 1:6] = idx[0, 0]  # duplicates
    idx[-1] = -1  # all-invalid row -> zeros
    lengths = torch.randint(1, topk + 1, (total_q,), generator=g, dtype=torch.int32)
    lengths[0] = topk
    if total_q > 2:
        lengths[1] = 0  # empty row -> zeros
    return q, k, v, idx, lengths


def _chunk_case(seed, *, reqs=(3, 4), prefixes=(5, 2), group=6, hkv=1, d=32, page_size=1,
                topk=41, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    total_q = sum(reqs)
    hq = group * hkv
    ctx = max(p + r for p, r in zip(prefixes, reqs, strict=True))
    max_pages = -(-ctx // page_size) + 1
    num_slots = len(reqs) * max_pages * page_size - 3  # the last page is partly out of range
    q = torch.randn((total_q, hq, d), generator=g).to(dtype)
    k = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    v = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    perm = torch.randperm(len(reqs) * max_pages, generator=g).to(torch.int32)
    pt = perm.reshape(len(reqs), max_pages).clone()
    pt[0, 1] = -1  # unmapped page
    idx = torch.randint(-3, ctx + 3, (total_q, topk), generator=g, dtype=torch.int32)
    idx[0, :3] = 0  # duplicates of position 0
    lengths = torch.randint(0, topk + 1, (total_q,), generator=g, dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(reqs).cumsum(0).tolist()], dtype=torch.int32)
    kw = dict(kind="chunk", lengths=lengths, cu_seqlens_q=cu,
              prefix_lens=torch.tensor(prefixes, dtype=torch.int32), page_table=pt,
              page_size=page_size, max_q=max(reqs))
    return q, k, v, idx, kw


def _to(dev, *ts):
    return [t.to(dev) if isinstance(t, torch.Tensor) else t for t in ts]


def _check(q, k, v, idx, cfg, **kw):
    q, k, v, idx = _to(DEV, q, k, v, idx)
    kw = {n: (t.to(DEV) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    out = sparse_prefill_triton(q, k, v, idx, config=cfg, **kw)
    ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert torch.isfinite(out).all(), "unwritten or NaN output elements"
    err = (out.double() - ref).abs().max().item()
    assert err <= error_bound(q.dtype), f"max abs err {err} > {error_bound(q.dtype)}"
    return out, ref


# ------------------------------------------------------------------ prefill kernel (CPU)


@pytest.mark.parametrize("group,hkv,d,topk,cfg", [
    (6, 1, 40, 37, BASE),
    (6, 1, 64, 70, {**BASE, "BLOCK_M": 8, "BLOCK_N": 32}),
    (12, 1, 32, 37, {**BASE, "REVERSE_ROWS": 1}),
    (2, 2, 48, 37, {**BASE, "BLOCK_M": 2}),
    (1, 3, 24, 50, {**BASE, "BLOCK_M": 1}),
    (4, 2, 40, 40, {**BASE, "MAXNREG": 96}),
    (6, 1, 40, 37, {**BASE, "SPLIT_QK": 2, "SPLIT_V": 2}),
    (6, 1, 64, 70, {**BASE, "BLOCK_M": 8, "BLOCK_N": 32, "SPLIT_QK": 2, "SPLIT_V": 2,
                    "LEAN": 1, "OFFS32": 1}),
    (12, 2, 16, 45, {**BASE, "LEAN": 1}),
    (6, 2, 24, 37, {**BASE, "BLOCK_M": 8, "LEAN": 1, "OFFS32": 1}),
    (6, 1, 40, 37, {**BASE, "BLOCK_M": 8, "OFFS32": 1, "SPLIT_QK": 2}),
    (6, 1, 40, 37, {**BASE, "BLOCK_M": 8, "OFFS32": 1, "SPLIT_QK": 2, "SPLIT_V": 2}),
    (6, 2, 40, 37, {**BASE, "BLOCK_M": 8, "SPLIT_QK": 2, "SPLIT_V": 2}),
    (12, 1, 32, 70, {**BASE, "num_warps": 1, "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1,
                     "OFFS32": 1, "REVERSE_ROWS": 1}),
    (6, 1, 40, 37, {**BASE, "SLOT_ORDER": 1}),
    (12, 2, 32, 70, {**BASE, "num_warps": 1, "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1,
                     "OFFS32": 1, "REVERSE_ROWS": 1, "SLOT_ORDER": 1}),
])
def test_prefill_float32(group, hkv, d, topk, cfg):
    q, k, v, idx, lengths = _prefill_case(group * 10 + hkv, group=group, hkv=hkv, d=d, topk=topk)
    out, _ = _check(q, k, v, idx, cfg, lengths=lengths)
    assert torch.all(out[-1] == 0) and torch.all(out[1] == 0)


@pytest.mark.parametrize("extra", [{"LEAN": 1, "OFFS32": 1}, {"OFFS32": 1},
                                   {"LEAN": 1, "OFFS32": 1, "SPLIT_QK": 2, "SPLIT_V": 2},
                                   {"SPLIT_QK": 2, "SPLIT_V": 2, "OFFS32": 1}])
@pytest.mark.parametrize("fits", [True, False])
# the interpreter's numpy warns on the NaN scores of the masked K rows, which LEAN computes
# and then discards by design
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_lean_never_lets_slot_zero_leak(extra, fits, monkeypatch):
    # LEAN reads K row 0 for invalid entries: fill slot 0 of K and V with NaN and Inf, keep it
    # out of every row's valid entries, and every output must still match the reference
    # (empty and all-invalid rows zeros); ``fits`` False takes the int64 offsets
    import backends.sparse_prefill.triton_kernels as tk

    monkeypatch.setattr(tk, "_offsets_fit_int32", lambda *a: fits)
    q, k, v, idx, lengths = _prefill_case(21, total_q=6, group=6, hkv=2, d=40, topk=37)
    idx = torch.where(idx == 0, torch.ones_like(idx), idx)
    k[0, 0, ::2], k[0, 1, 1::2] = float("nan"), float("inf")
    v[0, 0, ::3], v[0, 1, :] = float("nan"), float("-inf")
    out, _ = _check(q, k, v, idx, {**BASE, "BLOCK_M": 8, **extra}, lengths=lengths)
    assert torch.all(out[-1] == 0) and torch.all(out[1] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_split_v_loop_follows_a_jumping_max(dtype):
    # scores jump by ~92 (log2 units) after the first tiles, then drift up: every step must
    # rescale against the new max (else p = 2**92 overflows fp16 to inf; LAZY_RESCALE, which
    # skipped small rescales, was removed in issue 26, and this case stays for the loop itself)
    total_q, d, topk, n_slots = 3, 32, 64, 80  # d >= 32: SPLIT_QK=2, so SPLIT_V=2 applies
    g = torch.Generator().manual_seed(5)
    q = (0.5 + 0.1 * torch.rand((total_q, 6, d), generator=g)).to(dtype)
    k = 0.1 * torch.randn((n_slots, 1, d), generator=g)
    k[30:] += 8.0 + torch.linspace(0, 0.3, n_slots - 30)[:, None, None]  # jump, then drift
    v = torch.randn((n_slots, 1, d), generator=g).to(dtype)
    idx = torch.arange(topk, dtype=torch.int32).repeat(total_q, 1)  # ascending: low first
    idx[1, ::5] = -1
    cfg = {**BASE, "BLOCK_M": 8, "SPLIT_QK": 2, "SPLIT_V": 2}
    _check(q, k.to(dtype), v, idx, cfg, sm_scale=1.0)


def test_offsets_fit_int32_boundary():
    from backends.sparse_prefill.triton_kernels import _offsets_fit_int32

    # the largest offset is (num_slots - 1) * stride + d_pad - 1 <= 2**31 - 1
    assert _offsets_fit_int32(2**23, 256, 256, 256)
    assert not _offsets_fit_int32(2**23 + 1, 256, 256, 256)
    assert not _offsets_fit_int32(2**23, 256, 512, 256)  # the larger stride decides
    assert _offsets_fit_int32(1, 2**40, 2**40, 256)  # one slot: no row offset at all


def test_prefill_float16_default_lengths_and_scale():
    q, k, v, idx, _ = _prefill_case(3, group=6, hkv=1, d=64, topk=40, dtype=torch.float16)
    _check(q, k, v, idx, BASE)
    _check(q, k, v, idx, {**BASE, "BLOCK_N": 32}, sm_scale=0.2)


def test_prefill_table_geometry_and_h200_configs_run():
    q, k, v, idx, lengths = _prefill_case(4, total_q=3, group=12, hkv=1, d=32, topk=37)
    _check(q, k, v, idx, table_config(12, 3), lengths=lengths)
    for (kind, group), cfg in sorted(H200_CONFIGS.items()):
        if kind == "prefill" and group == 12:
            _check(q, k, v, idx, cfg, lengths=lengths)


def test_lengths_beyond_topk_and_negative_are_clamped():
    q, k, v, idx, lengths = _prefill_case(5, total_q=4, d=16)
    lengths = torch.tensor([100, -5, 3, 37], dtype=torch.int32)
    out, _ = _check(q, k, v, idx, BASE, lengths=lengths)
    assert torch.all(out[1] == 0)


# ------------------------------------------------------------------ chunk kernel (CPU)


@pytest.mark.parametrize("group,hkv,page_size,mode,extra", [
    (6, 1, 1, "fused", {}),
    (6, 1, 4, "pretranslate", {"BLOCK_M": 8}),
    (12, 1, 1, "pretranslate", {}),
    (6, 1, 4, "staged", {"BLOCK_M": 8, "SPLIT_QK": 2, "REVERSE_ROWS": 1}),
    (6, 2, 2, "staged", {"BLOCK_M": 8, "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1, "OFFS32": 1}),
    (12, 1, 3, "pretranslate", {"LEAN": 1}),
    (6, 2, 3, "fused", {"BLOCK_M": 8, "LEAN": 1, "OFFS32": 1, "SPLIT_QK": 2, "SPLIT_V": 2}),
    (4, 1, 2, "fused", {"BLOCK_M": 4, "LEAN": 1, "OFFS32": 1}),
    (12, 2, 3, "staged", {}),
    (2, 2, 1, "fused", {"BLOCK_M": 2}),
    (12, 1, 3, "pretranslate", {"SLOT_ORDER": 1}),
    (6, 2, 2, "pretranslate", {"BLOCK_M": 8, "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1,
                               "SLOT_ORDER": 1}),
])
def test_chunk_float32(group, hkv, page_size, mode, extra):
    q, k, v, idx, kw = _chunk_case(group + page_size, group=group, hkv=hkv, page_size=page_size)
    _check(q, k, v, idx, {**BASE, "CHUNK_MODE": mode, **extra}, **kw)


def test_chunk_ragged_many_requests_float16():
    q, k, v, idx, kw = _chunk_case(9, reqs=(1, 2, 3, 1), prefixes=(0, 7, 3, 10), group=4,
                                   hkv=2, page_size=2, dtype=torch.float16)
    for mode in ("fused", "pretranslate", "staged"):
        _check(q, k, v, idx, {**BASE, "CHUNK_MODE": mode, "REVERSE_ROWS": 1}, **kw)


def test_chunk_staged_translates_rows_longer_than_one_stage_block():
    # three staging steps of 512 entries (the last partial), two KV heads (each program has its
    # own scratch row), against the fused path and the reference
    q, k, v, idx, kw = _chunk_case(13, reqs=(2, 1), prefixes=(1500, 700), group=2, hkv=2,
                                   d=16, page_size=3, topk=1100)
    kw["lengths"][0] = 1100
    cfg = {**BASE, "BLOCK_M": 2, "BLOCK_N": 64, "CHUNK_MODE": "staged"}
    out, _ = _check(q, k, v, idx, cfg, **kw)
    fused, _ = _check(q, k, v, idx, {**cfg, "CHUNK_MODE": "fused"}, **kw)
    assert (out - fused).abs().max().item() <= 1e-5


def test_chunk_causal_mask_hides_future_positions():
    # every entry points at a position past the row's own: all rows yield zeros
    q, k, v, idx, kw = _chunk_case(11, reqs=(2, 2), prefixes=(3, 1), d=16)
    p = torch.tensor([3, 4, 1, 2])
    idx = (p[:, None] + 1 + torch.arange(idx.shape[1])[None, :]).to(torch.int32)
    kw["lengths"] = None
    out, _ = _check(q, k, v, idx, BASE, **kw)
    assert torch.all(out == 0)


# ------------------------------------------------------------------ slot ordering (CPU)


def _ordered_like_a_stable_sort(idx, lens, num_slots, passes, out, cnt):
    """``out``/``cnt`` against the definition: each row's valid entries (in range, inside
    ``lengths``), stably sorted on the top ``4 * passes`` bits of the slot; -1 after them."""
    topk = idx.shape[1]
    n = torch.full((idx.shape[0],), topk) if lens is None else lens.long().clamp(0, topk)
    ok = (torch.arange(topk)[None, :] < n[:, None]) & (idx >= 0) & (idx < num_slots)
    shift = max(0, max(1, (num_slots - 1).bit_length()) - 4 * passes)
    for r in range(idx.shape[0]):
        kept = idx[r][ok[r]]
        want = kept[torch.sort(kept >> shift, stable=True).indices]
        assert cnt[r].item() == kept.numel()
        assert torch.equal(out[r, :kept.numel()], want), r
        assert torch.all(out[r, kept.numel():] == -1), r


@pytest.mark.parametrize("num_slots,topk,block,warps", [
    (1000, 300, 128, 1),     # 8-bit counters, three blocks a row
    (131072, 700, 256, 2),   # 16-bit counters
    (5, 37, 64, 1),          # fewer slots than ranges
    (1, 129, 128, 2),        # a single slot: everything in range 0
    (70000, 260, 1024, 4),   # a row shorter than a block
])
def test_order_rows_is_a_stable_partition_by_slot(num_slots, topk, block, warps):
    from backends.sparse_prefill.triton_kernels import _order_rows

    g = torch.Generator().manual_seed(num_slots + topk)
    idx = torch.randint(-3, num_slots + 3, (6, topk), generator=g, dtype=torch.int32)
    idx[0, : topk // 2] = num_slots // 2  # ties: equal slots keep their order
    idx[1] = -1                           # nothing valid
    idx[2, ::3] = 2**31 - 1               # far out of range
    lens = torch.tensor([topk, topk, topk - 5, 0, -4, topk + 9], dtype=torch.int32)
    for ln in (lens, None):
        out, cnt = _order_rows(idx, ln, num_slots, block=block, num_warps=warps)
        _ordered_like_a_stable_sort(idx, ln, num_slots, 1, out, cnt)


def test_slot_order_gives_the_unordered_result():
    # the same entries in another order: equal up to float32 summation order
    q, k, v, idx, lengths = _prefill_case(21, total_q=6, d=32, num_slots=200, topk=90)
    plain, _ = _check(q, k, v, idx, BASE, lengths=lengths)
    got, _ = _check(q, k, v, idx, {**BASE, "SLOT_ORDER": 1}, lengths=lengths)
    assert (got - plain).abs().max().item() <= 1e-5


@pytest.mark.parametrize("mode", ["fused", "staged"])
def test_slot_order_needs_translated_chunk_entries(mode):
    q, k, v, idx, kw = _chunk_case(3)
    with pytest.raises(ConfigError, match=r"SLOT_ORDER=1 orders KV slots.*'pretranslate'"):
        sparse_prefill_triton(q, k, v, idx, config={**BASE, "CHUNK_MODE": mode,
                                                    "SLOT_ORDER": 1}, **kw)


# ------------------------------------------------------------------ configs and errors


# ------------------------------------------------------------------ DENSE (CPU)


def _ramp_case(seed, *, total_q, group, hkv=1, d=32, num_slots=64, topk=24, reach=3,
               dtype=torch.float16):
    """Causal-like rows: row r selects ``topk`` entries among its first ``min(num_slots, 4 + reach
    * r)`` slots (early rows are dense in their span, later ones sparse), plus the hazards:
    duplicates, invalid entries, short and empty rows, an all-invalid row."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((total_q, group * hkv, d), generator=g).to(dtype)
    k = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    v = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    idx = torch.empty((total_q, topk), dtype=torch.int32)
    for r in range(total_q):
        vis = min(num_slots, 4 + reach * r)
        idx[r] = torch.randint(0, vis, (topk,), generator=g, dtype=torch.int32)
    idx[0, :5] = idx[0, 5]  # duplicates
    bad = torch.rand((total_q, topk), generator=g) < 0.1
    idx[bad] = torch.where(torch.rand(int(bad.sum()), generator=g) < 0.5, -3,
                           num_slots + 5).to(torch.int32)
    idx[total_q // 2] = -1  # all invalid -> zeros
    lengths = torch.randint(topk // 2, topk + 1, (total_q,), generator=g, dtype=torch.int32)
    lengths[1] = 0  # empty row
    return q, k, v, idx, lengths


def _dense_tiles(idx, lengths, num_slots, rp, span_pct):
    """The tiles DENSE computes densely (the kernels' rule, in Python)."""
    out = []
    for t0 in range(0, idx.shape[0], rp):
        slots, nv = [], 0
        for r in range(t0, min(t0 + rp, idx.shape[0])):
            row = idx[r, :max(0, min(int(lengths[r]), idx.shape[1]))]
            ok = row[(row >= 0) & (row < num_slots)]
            slots += ok.tolist()
            nv += len(ok)
        span = (max(slots) - min(slots) + 1) if slots else 0
        out.append(span * rp * 100 <= nv * span_pct)
    return out


FAM6 = {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2, "SPLIT_QK": 2,
        "SPLIT_V": 2, "LEAN": 1, "OFFS32": 1, "REVERSE_ROWS": 1}


@pytest.mark.parametrize("group,hkv,dtype,tile,span", [
    (6, 1, torch.float16, "16x16x4x2", 10**6),  # every tile dense (TMA descriptors)
    (6, 1, torch.float16, "16x32x4x2", 250),  # dense and gathered tiles in one call
    (12, 2, torch.float32, "32x16x4x2", 200),  # pointer loads (fp32), 2 KV heads
    (3, 2, torch.float16, "16x16x2x2", 400),  # group below the tile: padded heads
])
@pytest.mark.parametrize("heads", ["pow2", "group"])
def test_dense_tiles_match_the_reference(group, hkv, dtype, tile, span, heads):
    """TILE_HEADS="group": a row's lines are the group's heads exactly (group 6 in 16 lines:
    2 rows and 4 padding lines, in 32: 5 rows; group 12 in 32: 2 rows in 24 lines; group 3 in
    16: 5 rows), a line's counts from its row's by the one-hot MMAs."""
    q, k, v, idx, lengths = _ramp_case(5, total_q=24, group=group, hkv=hkv, dtype=dtype)
    rp = int(tile.split("x")[0]) // (group if heads == "group" else triton.next_power_of_2(group))
    tiles = _dense_tiles(idx, lengths, k.shape[0], rp, span)
    if span < 10**6:
        assert any(tiles) and not all(tiles), tiles  # the case exercises both paths
    cfg = {**FAM6, "BLOCK_M": max(8, triton.next_power_of_2(group)), "DENSE": span,
           "DENSE_TILE": tile, "TILE_HEADS": heads}
    _check(q, k, v, idx, cfg, lengths=lengths)


def test_dense_kernel_writes_exactly_its_tiles_and_the_gathers_the_rest():
    # The two halves of a DENSE call on a poisoned output: after the dense part only the dense
    # tiles' rows are written (and right); the whole call writes every row once, right.
    from backends.sparse_prefill import tile_kernels
    from backends.sparse_prefill import triton_kernels as tk

    q, k, v, idx, lengths = _ramp_case(6, total_q=20, group=6, dtype=torch.float16)
    var = {**tk.DEFAULT_VARIANT, **FAM6, "DENSE": 250, "DENSE_TILE": "16x16x4x2"}
    tiles = _dense_tiles(idx, lengths, k.shape[0], 2, 250)
    assert any(tiles) and not all(tiles)
    ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx, lengths=lengths)
    out = torch.full_like(q, float("nan"))
    tile_kernels._dense(q, k, v, idx, lengths, True, out, q.shape[2] ** -0.5 * tk._LOG2E, var,
                        None, 32)
    for t, dense in enumerate(tiles):
        rows = slice(2 * t, 2 * t + 2)
        if dense:
            assert (out[rows].double() - ref[rows]).abs().max() <= error_bound(q.dtype)
        else:
            assert out[rows].isnan().all(), f"tile {t} is the gathering kernel's"
    _check(q, k, v, idx, {**FAM6, "DENSE": 250, "DENSE_TILE": "16x16x4x2"}, lengths=lengths)


def test_dense_rows_in_chunks_of_the_scratch_budget(monkeypatch):
    # a scratch budget of a few rows: the counts are done chunk by chunk, same result
    from backends.sparse_prefill import tile_kernels

    q, k, v, idx, lengths = _ramp_case(7, total_q=22, group=6, num_slots=50)
    monkeypatch.setattr(tile_kernels, "_DENSE_SCRATCH_BYTES", 4 * 25 * 5)  # 5 rows of 25 words -> 4
    _check(q, k, v, idx, {**FAM6, "DENSE": 10**6, "DENSE_TILE": "16x16x4x2"}, lengths=lengths)


def test_dense_never_reads_slots_outside_every_span():
    # NaN in the slots no row of the call selects, outside every tile's span: never read
    q, k, v, idx, lengths = _ramp_case(8, total_q=12, group=6, num_slots=80, reach=2)
    k[60:], v[60:] = float("nan"), float("nan")
    idx[idx >= 60] = -1
    _check(q, k, v, idx, {**FAM6, "DENSE": 10**6, "DENSE_TILE": "16x16x4x2"}, lengths=lengths)


def test_dense_chunk_needs_translated_entries_and_runs_pretranslated():
    q, k, v, idx, kw = _chunk_case(9, dtype=torch.float16)
    dense = {**BASE, "DENSE": 10**6, "DENSE_TILE": "16x16x4x2"}
    for mode in ("fused", "staged"):
        with pytest.raises(ConfigError, match=r"DENSE=1000000 walks KV slots.*'pretranslate'"):
            sparse_prefill_triton(q, k, v, idx, config={**dense, "CHUNK_MODE": mode}, **kw)
    _check(q, k, v, idx, {**dense, "CHUNK_MODE": "pretranslate"}, **kw)


def test_dense_top_k_past_16_bit_counts_is_config_error():
    q, k, v, _, _ = _prefill_case(1, total_q=2, d=16)
    idx = torch.zeros((2, 65536), dtype=torch.int32)
    with pytest.raises(ConfigError, match="top-k <= 65535"):
        sparse_prefill_triton(q, k, v, idx, config={**BASE, "DENSE": 200})


def test_block_m_below_group_is_config_error():
    with pytest.raises(ConfigError, match=r"BLOCK_M=8 is below group_size=12.*use 16"):
        validate_config({**BASE, "BLOCK_M": 8}, 12, 256)
    q, k, v, idx, _ = _prefill_case(1, group=12, d=16)
    with pytest.raises(ConfigError):
        sparse_prefill_triton(q, k, v, idx, config={**BASE, "BLOCK_M": 8})


@pytest.mark.parametrize("cfg,match", [
    ({"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4}, "missing num_stages"),
    ({**BASE, "BLOCK_N": 8}, "BLOCK_N=8"),
    ({**BASE, "BLOCK_M": 24}, "power of two"),
    ({**BASE, "LAYOUT": "cols"}, "LAYOUT .* was removed .* drop the key"),
    ({**BASE, "FOO": 1}, "unknown"),
    ({**BASE, "EVEN_TILES": 1}, "EVEN_TILES .* was removed"),
    ({**BASE, "PREFETCH": 0}, "PREFETCH .* was removed"),
    ({**BASE, "LAZY_RESCALE": 1, "SPLIT_QK": 2}, "LAZY_RESCALE .* was removed"),
    ({**BASE, "SLOT_ORDER": 2}, "SLOT_ORDER=2 was removed .* use SLOT_ORDER=1"),
    ({**BASE, "MAXNREG": 7}, "MAXNREG"),
    ({**BASE, "num_warps": 3}, "num_warps"),
    ({**BASE, "SPLIT_V": 2}, "SPLIT_V=2 .* needs SPLIT_QK=2"),
    ({**BASE, "SPLIT_V": 3}, "SPLIT_V"),
    ({**BASE, "SLOT_ORDER": 3}, "SLOT_ORDER"),
    ({**BASE, "DENSE": -1}, "DENSE=-1: expected 0"),
    ({**BASE, "DENSE": True}, "DENSE=True"),
    ({**BASE, "DENSE": 10**12}, "DENSE=1000000000000: .* at most 1000000000"),
    ({**BASE, "UNION": 10**12}, "UNION=1000000000000: .* at most 1000000000"),
    ({**BASE, "DENSE": 200, "SLOT_ORDER": 1}, "DENSE and SLOT_ORDER"),
    ({**BASE, "DENSE": 200, "DENSE_TILE": "128x32x8"}, "expected 'BMxBNxWxS'"),
    ({**BASE, "DENSE": 200, "DENSE_TILE": "96x32x8x3"}, "BM=96 must be a power of two"),
    ({**BASE, "DENSE": 200, "DENSE_TILE": "8x32x8x3"}, "BM=8 must be a power of two >= 16"),
    ({**BASE, "DENSE": 200, "DENSE_TILE": "128x8x8x3"}, "BN=8"),
    ({**BASE, "DENSE": 200, "DENSE_TILE": "128x32x6x3"}, "warps=6"),
    ({**BASE, "DENSE": 200, "DENSE_TILE": "128x32x8x3x3"}, "HP suffix .* was removed"),
])
def test_bad_configs(cfg, match):
    with pytest.raises(ConfigError, match=match):
        validate_config(cfg, 6, 64)


def test_all_shipped_configs_validate():
    # Every config a policy can hand the kernel is valid for its group (validate_config raises).
    from plugins.nvidia_hopper import (
        H200_DENSE_CONFIGS,
        H200_GLUON_CONFIGS,
        H200_LONG_KV_CONFIGS,
        H200_WGMMA_CONFIGS,
    )
    from plugins.nvidia_sm120 import SM120_PREFILL_CONFIGS

    for table in (H200_CONFIGS, H200_LONG_KV_CONFIGS, H200_DENSE_CONFIGS, H200_GLUON_CONFIGS,
                  H200_WGMMA_CONFIGS):
        for (_, group), cfg in table.items():
            validate_config(cfg, group, 256)
    for group, cfg in SM120_PREFILL_CONFIGS.items():
        validate_config(cfg, group, 256)
    for group in (1, 6, 12, 16, 17):
        for tq in (1, 32, 64, 128, 512, 8192):
            validate_config(table_config(group, tq), group, 256)
    with pytest.raises(ConfigError, match="BLOCK_M=8 is below group_size=12"):
        validate_config(SM120_PREFILL_CONFIGS[6], 12, 256)


def test_error_bounds():
    assert error_bound(torch.bfloat16) == 2e-2
    assert error_bound("float16") <= 5e-3
    assert error_bound(torch.float32) <= 1e-4
    with pytest.raises(WorkloadError):
        error_bound(torch.int8)


def _bad_calls():
    q, k, v, idx, lengths = _prefill_case(2, group=6, d=16)
    yield "q.shape", lambda: sparse_prefill_triton(q[0], k, v, idx, config=BASE)
    yield "v.shape", lambda: sparse_prefill_triton(q, k, v[:3], idx, config=BASE)
    yield "dtypes", lambda: sparse_prefill_triton(q, k.double(), v, idx, config=BASE)
    yield "indices.dtype", lambda: sparse_prefill_triton(q, k, v, idx.long(), config=BASE)
    yield "indices.shape", lambda: sparse_prefill_triton(q, k, v, idx[:2], config=BASE)
    yield "lengths.shape", lambda: sparse_prefill_triton(q, k, v, idx, lengths=lengths[:2],
                                                         config=BASE)
    yield "num_q_heads=6 is not a multiple", lambda: sparse_prefill_triton(
        q, k.expand(-1, 4, -1), v.expand(-1, 4, -1), idx, config=BASE)
    yield "head_dim=300", lambda: sparse_prefill_triton(
        torch.zeros(2, 6, 300), torch.zeros(4, 1, 300), torch.zeros(4, 1, 300),
        torch.zeros(2, 3, dtype=torch.int32), config=BASE)
    yield "page_table is required", lambda: sparse_prefill_triton(
        q, k, v, idx, kind="chunk", cu_seqlens_q=torch.tensor([0, 5], dtype=torch.int32),
        prefix_lens=torch.tensor([0], dtype=torch.int32), config=BASE)
    yield "page_size=0", lambda: sparse_prefill_triton(
        q, k, v, idx, kind="chunk", cu_seqlens_q=torch.tensor([0, 5], dtype=torch.int32),
        prefix_lens=torch.tensor([0], dtype=torch.int32),
        page_table=torch.zeros(1, 4, dtype=torch.int32), page_size=0, config=BASE)
    yield "kind='decode'", lambda: sparse_prefill_triton(q, k, v, idx, kind="decode",
                                                         config=BASE)
    yield "stride", lambda: sparse_prefill_triton(q.transpose(0, 2).contiguous().transpose(0, 2),
                                                  k, v, idx, config=BASE)


@pytest.mark.parametrize("name", [n for n, _ in _bad_calls()])
def test_workload_errors(name):
    fn = dict(_bad_calls())[name]
    with pytest.raises(WorkloadError, match=name.replace("(", r"\(")):
        fn()


def test_empty_batch_and_empty_topk():
    q, k, v, idx, _ = _prefill_case(3, group=6, d=16)
    out = sparse_prefill_triton(q[:0], k, v, idx[:0], config=BASE)
    assert out.shape == (0, 6, 16)
    out = sparse_prefill_triton(q, k, v, idx[:, :0], config=BASE)
    assert torch.all(out == 0)


# ------------------------------------------------------------------ GPU (bf16, seed shapes)


def _seed_inputs(kind, group, hkv=1, total_q=2560, kv=8192, req_lens=None, page_size=1):
    from backends.sparse_prefill.bench import BenchCase, make_inputs

    case = BenchCase(kind=kind, group_size=group, kv_heads=hkv, kv_len=kv, total_q=total_q,
                     req_lens=req_lens, page_size=page_size)
    return make_inputs(case, "cuda")


def _gpu_check(inp, cfg, idx=None):
    idx = inp["indices"] if idx is None else idx
    ref = sparse_prefill_reference(inp["q"], inp["k"], inp["v"], idx, out_dtype=torch.float32,
                                   **inp["kwargs"])
    poison = torch.full_like(inp["q"], float("nan"))
    del poison  # the caching allocator hands this NaN block to the kernel's output
    out = sparse_prefill_triton(inp["q"], inp["k"], inp["v"], idx, config=cfg, **inp["kwargs"])
    assert torch.isfinite(out).all()
    err = (out.float() - ref).abs().max().item()
    assert err <= 2e-2, f"{cfg}: max abs err {err}"


def _gpu_configs(kind, group):
    """Table geometries, the measured H200 config, and any in KREG_SP_EXTRA_GEOMETRIES
    (comma-separated ``BMxBNxWxS[:opt]`` strings, see bench.py; for checking candidates)."""
    import os

    from backends.sparse_prefill.bench import parse_geometry

    cfgs = [table_config(group, 8192), table_config(group, 256)]
    if (kind, group) in H200_CONFIGS:
        cfgs.append(H200_CONFIGS[(kind, group)])
    from plugins.nvidia_hopper import H200_DENSE_CONFIGS

    if (kind, group) in H200_DENSE_CONFIGS:  # dense and gathered tiles of the 2560-row ramp
        cfgs.append(H200_DENSE_CONFIGS[(kind, group)])
    for spec in filter(None, os.environ.get("KREG_SP_EXTRA_GEOMETRIES", "").split(",")):
        cfg = parse_geometry(spec)
        if cfg["BLOCK_M"] >= group:
            cfgs.append(cfg)
    return cfgs


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["prefill", "chunk"])
@pytest.mark.parametrize("group,hkv", [(6, 1), (12, 1), (12, 2)])
def test_gpu_seed_shapes(kind, group, hkv):
    # 2560 rows at prefix 0: rows past 2050 stream the full 2051-slot budget
    inp = _seed_inputs(kind, group, hkv)
    for cfg in _gpu_configs(kind, group):
        _gpu_check(inp, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("group", [6, 12])
def test_gpu_chunk_steady_state_ragged_paged(group):
    # prefix 2050 (every slot visible), then a ragged batch on 16-token pages with bad entries
    inp = _seed_inputs("chunk", group, total_q=512, kv=2562)
    for cfg in _gpu_configs("chunk", group):
        _gpu_check(inp, cfg)
    inp = _seed_inputs("chunk", group, total_q=1024, kv=4099, req_lens=(1, 511, 2, 510),
                       page_size=16)
    idx = inp["indices"].clone()
    idx[::7, ::5] = -3
    idx[::11, 1::9] = 1 << 20
    for cfg in _gpu_configs("chunk", group):
        for mode in ("fused", "pretranslate", "staged"):
            _gpu_check(inp, {**cfg, "CHUNK_MODE": mode}, idx)


# ------------------------------------------------------------------ bench library (CPU)


def test_bench_module_imports_without_torch():
    import subprocess
    import sys

    code = ("import sys; import backends.sparse_prefill.bench as b; "
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('torch', 'triton')))")
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_bench_geometry_round_trip():
    from backends.sparse_prefill.bench import format_geometry, parse_geometry

    for spec in ("16x16x1x2", "8x32x4x2:pre:rev:split2:r96", "16x64x4x3:stage",
                 "8x16x1x2:rev:split2:v2:lean:o32:ord1", "16x16x1x2:ord1",
                 "8x16x1x2:rev:dense250", "16x16x1x2:dense200:dt128x64x8x2",
                 "8x16x2x1:gl:o32", "16x32x4x2:gl:pre:ord1", "16x64x4x2:wg:o32:r96",
                 "8x16x1x2:uc:dense250:union300:ut128x64x8x2:ud80"):
        cfg = parse_geometry(spec)
        assert parse_geometry(format_geometry(cfg)) == cfg
    assert parse_geometry("16x64x4x2:wg:o32:r96")["ENGINE"] == "gluon_wgmma"
    from plugins.nvidia_hopper import H200_DENSE_CONFIGS, H200_GLUON_CONFIGS, H200_WGMMA_CONFIGS

    for cfg in (*H200_CONFIGS.values(), *H200_DENSE_CONFIGS.values(),
                *H200_GLUON_CONFIGS.values(), *H200_WGMMA_CONFIGS.values()):
        assert parse_geometry(format_geometry(cfg)) == cfg
    assert parse_geometry("8x16x1x2:dense250")["DENSE"] == 250
    assert parse_geometry("8x16x1x2:dense250:union300:ud80")["UNION_DENSE"] == 80


def test_bench_inputs_follow_the_affine_walk():
    from backends.sparse_prefill.bench import BenchCase, make_inputs
    from backends.sparse_prefill.reference import resolve_slots

    inp = make_inputs(BenchCase(kind="chunk", group_size=6, kv_len=50, total_q=12,
                                req_lens=(5, 7), topk=20, head_dim=16, dtype="float32",
                                page_size=4), "cpu")
    kw = inp["kwargs"]
    _, valid = resolve_slots(inp["indices"], kind="chunk", lengths=kw["lengths"],
                                num_slots=inp["k"].shape[0], cu_seqlens_q=kw["cu_seqlens_q"],
                                prefix_lens=kw["prefix_lens"], page_table=kw["page_table"],
                                page_size=4)
    # every entry below lengths is a distinct visible position, so every one is valid
    n = kw["lengths"].long()
    assert torch.equal(valid.sum(1), n)
    for r in range(12):
        row = inp["indices"][r, : n[r]]
        assert row.unique().numel() == n[r]


def test_bench_command_cpu_smoke():
    from click.testing import CliRunner

    from backends.sparse_prefill.bench import bench_command

    res = CliRunner().invoke(bench_command, [
        "--kind", "prefill", "--group-size", "6", "--kv-len", "40", "--total-q", "3",
        "--topk", "20", "--head-dim", "16", "--dtype", "float32", "--iters", "1",
        "--warmup", "0", "--providers", "table,h200,geometry=8x16x2x2:split2,reference",
        "--graphs"])   # without a GPU --graphs times plain calls
    assert res.exit_code == 0, res.output
    from backends.sparse_prefill.bench import format_geometry

    family = format_geometry(H200_CONFIGS[("prefill", 6)])  # the h200 provider's geometry
    assert family in res.output and "torch reference" in res.output
    # the table's first line names what it ran on, and says the graphs were not used here
    head = next(ln for ln in res.output.splitlines() if ln.startswith("#"))
    assert head.startswith("# sparse_prefill on ") and f"torch {torch.__version__}" in head
    assert ("plain launches" if DEV == "cpu" else "CUDA-graph replays") in head, head
    bad = CliRunner().invoke(bench_command, [
        "--providers", "geometry=16x16", "--baseline", "reference", "--total-q", "3",
        "--kv-len", "40", "--topk", "20", "--head-dim", "16", "--dtype", "float32"])
    assert bad.exit_code != 0 and "BMxBNxWxS" in bad.output


def test_tuner_space_has_every_family_config_and_no_chunk_mode_for_prefill():
    # the tuner times the H200 family (both kinds' configs) at every point; a prefill point gets
    # them without CHUNK_MODE, which prefill rows ignore (labels say what actually runs)
    from backends.sparse_prefill import tuning
    from backends.sparse_prefill.bench import BenchCase

    for kind in ("prefill", "chunk"):
        case = BenchCase(kind=kind, group_size=6, total_q=8192)
        case.extra["space"] = "tiny"
        cands = {lab: cfg for lab, cfg, _ in tuning.candidates(case, None) if cfg is not None}
        fam = {k: v for k, v in H200_CONFIGS[(kind, 6)].items()
               if kind == "chunk" or k != "CHUNK_MODE"}
        assert fam in cands.values()
        if kind == "prefill":
            assert not any("CHUNK_MODE" in cfg for cfg in cands.values())
            assert not any(":pre" in lab or ":stage" in lab for lab in cands)
        else:
            assert any(cfg.get("CHUNK_MODE") == "staged" for cfg in cands.values())


def test_tuner_space_has_the_dense_family_for_prefill_and_pretranslated_chunk_only():
    from backends.sparse_prefill import tuning
    from backends.sparse_prefill.bench import BenchCase
    from plugins.nvidia_hopper import H200_DENSE_CONFIGS

    for kind in ("prefill", "chunk"):
        case = BenchCase(kind=kind, group_size=12, total_q=8192, kv_len=8192)
        case.extra["space"] = "tiny"
        cands = [cfg for _, cfg, _ in tuning.candidates(case, None) if cfg is not None]
        if kind == "prefill":
            assert H200_DENSE_CONFIGS[("prefill", 12)] in cands
        else:
            assert all(cfg.get("CHUNK_MODE") == "pretranslate" for cfg in cands
                       if cfg.get("DENSE"))


def test_tuner_space_has_the_long_kv_family_where_it_can_run():
    from backends.sparse_prefill import tuning
    from backends.sparse_prefill.bench import BenchCase
    from plugins.nvidia_hopper import H200_LONG_KV_CONFIGS

    for kind in ("prefill", "chunk"):
        for group in (6, 12):
            case = BenchCase(kind=kind, group_size=group, total_q=8192, kv_len=131072)
            case.extra["space"] = "tiny"
            cands = [cfg for _, cfg, _ in tuning.candidates(case, None) if cfg is not None]
            want = {k: v for k, v in H200_LONG_KV_CONFIGS[(kind, group)].items()
                    if kind == "chunk" or k != "CHUNK_MODE"}
            assert want in cands
            if kind == "chunk":  # only the pretranslate mode orders slots
                assert all(cfg.get("CHUNK_MODE") == "pretranslate" for cfg in cands
                           if cfg.get("SLOT_ORDER"))


def test_tuner_space_has_the_gluon_family_for_prefill_on_nvidia_only():
    from backends.sparse_prefill import tuning
    from backends.sparse_prefill.bench import BenchCase
    from plugins.nvidia_hopper import H200_GLUON_CONFIGS
    from registry import profiles

    gl = H200_GLUON_CONFIGS[("prefill", 6)]
    for kind in ("prefill", "chunk"):
        case = BenchCase(kind=kind, group_size=6, total_q=8192, kv_len=32768)
        case.extra["space"] = "tiny"
        cands = {lab: (cfg, why) for lab, cfg, why in tuning.candidates(case, None)}
        gls = [cfg for cfg, _ in cands.values() if cfg and cfg.get("ENGINE") == "gluon"]
        # chunk entries are positions: the Gluon kernel takes them pretranslated only
        assert gls == ([gl] if kind == "prefill" else [])
    case = BenchCase(kind="prefill", group_size=6, total_q=8192, kv_len=32768)
    case.extra["space"] = "tiny"
    for dev, runs in (("h200", True), ("mi300x", False), ("rtx-5090", True)):
        out = {lab: (cfg, why) for lab, cfg, why in tuning.candidates(case, profiles()[dev])}
        (cfg, why), = [v for lab, v in out.items() if ":gl" in lab]
        assert (cfg is not None) == runs, (dev, why)
        if not runs:
            assert "NVIDIA sm_80+ only" in why


def test_tuner_space_has_the_wgmma_configs_for_prefill_on_sm90_only():
    from backends.sparse_prefill import tuning
    from backends.sparse_prefill.bench import BenchCase
    from plugins.nvidia_hopper import H200_WGMMA_CONFIGS
    from registry import profiles

    for group in (6, 12):
        wg = H200_WGMMA_CONFIGS[("prefill", group)]
        for kind in ("prefill", "chunk"):
            case = BenchCase(kind=kind, group_size=group, total_q=8192, kv_len=32768)
            case.extra["space"] = "tiny"
            cands = [cfg for _, cfg, _ in tuning.candidates(case, None)
                     if cfg and cfg.get("ENGINE") == "gluon_wgmma"]
            # the config for this group (the other group's BLOCK_M is refused or too narrow
            # for group 12); chunk entries are positions: never without pretranslation
            assert (wg in cands) == (kind == "prefill") and all(c["BLOCK_M"] >= group
                                                                  for c in cands)
        case = BenchCase(kind="prefill", group_size=group, total_q=8192, kv_len=32768)
        case.extra["space"] = "tiny"
        for dev, runs in (("h200", True), ("mi300x", False), ("rtx-5090", False)):
            out = [(cfg, why) for lab, cfg, why in tuning.candidates(case, profiles()[dev])
                   if ":wg" in lab and f"{wg['BLOCK_M']}x64x4x2" in lab]
            (cfg, why), = out
            assert (cfg is not None) == runs, (dev, why)
            if not runs:
                assert "ENGINE='gluon_wgmma' runs on NVIDIA sm_90 only" in why
