"""sparse_prefill's union path (UNION=U, issue #26): tiles of consecutive rows that share most of
their selections gather the union of their slots once (backends/sparse_prefill/tile_kernels.py).

CPU: the Triton interpreter, float32 and float16 at tiny sizes, against the float64 reference,
on outputs and scratch poisoned first (NaN floats, a large int). The path each tile took is read
from the pre-pass's ``FLAG`` (``tile_kernels.TILE_PATHS``) and held to the rule in Python, so a
broken choice fails even where the output would still be right. ``@pytest.mark.gpu``: bf16 at
the seed's head dim through ``registry.dispatch`` on top-k shaped selections, the launched
config read from ``registry.record()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from backends.sparse_prefill import tile_kernels  # noqa: E402
from backends.sparse_prefill.compare import compare  # noqa: E402
from backends.sparse_prefill.reference import sparse_prefill_reference  # noqa: E402
from backends.sparse_prefill.triton_kernels import (  # noqa: E402
    error_bound,
    sparse_prefill_triton,
    validate_config,
)
from registry.errors import ConfigError  # noqa: E402

from kernel_helpers import poison_empty  # noqa: E402

NAN, INF = float("nan"), float("inf")
GATHER, DENSE, UNION = 0, 1, 2
BASE = {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2, "SPLIT_QK": 2,
        "SPLIT_V": 2, "LEAN": 1, "OFFS32": 1, "REVERSE_ROWS": 1}
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:All-NaN slice encountered:RuntimeWarning")


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """torch.empty / empty_like come back poisoned (kernel_helpers.poison_empty), and the
    union calls' FLAG tensors are collected (yielded list)."""
    poison_empty(monkeypatch)
    paths: list[Any] = []
    monkeypatch.setattr(tile_kernels, "TILE_PATHS", paths)
    yield paths


def _shared_case(seed: int, *, total_q: int = 16, group: int = 6, hkv: int = 1, d: int = 16,
                 num_slots: int = 96, topk: int = 20, block: int = 4, pool: int = 24,
                 spread: tuple[int, ...] = (1,), dtype: Any = torch.float32
                 ) -> tuple[Any, Any, Any, Any, Any]:
    """Rows in blocks of ``block``: a block's rows pick their entries from one pool of ``pool``
    slots (they share most of them), except the blocks in ``spread``, whose rows pick from the
    whole cache (little sharing). Plus the hazards: duplicates, -1, out-of-range and int32-max
    entries, entries past ``lengths`` that point at NaN K/V, an empty row, an all-invalid row,
    non-finite K/V at slots no row selects."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((total_q, group * hkv, d), generator=g).to(dtype)
    k = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    v = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    idx = torch.empty((total_q, topk), dtype=torch.int32)
    pools = {}
    for r in range(total_q):
        b = r // block
        if b in spread:
            choice = torch.randperm(num_slots - 8, generator=g)[:topk]
        else:
            if b not in pools:
                pools[b] = torch.randperm(num_slots - 8, generator=g)[:pool]
            choice = pools[b][torch.randperm(pool, generator=g)[:topk]]
        idx[r] = choice.to(torch.int32)
    lengths = torch.randint(topk - 6, topk + 1, (total_q,), generator=g, dtype=torch.int32)
    if total_q >= 8:
        idx[0, 1:4] = idx[0, 0]  # a slot listed four times counts four times
        idx[2, ::5] = -1
        idx[3, 2] = num_slots + 3
        idx[4, 3] = 2**31 - 1
        idx[5, 1] = -7
        lengths[1] = 0  # empty row
        idx[total_q - 3] = -1  # nothing valid: zeros
        # past-length entries point at the last slot, which nothing selects: NaN there
        lengths[6] = min(int(lengths[6]), topk - 2)
        idx[6, int(lengths[6]):] = num_slots - 1
    used = set()
    for r in range(total_q):
        n = int(lengths[r])
        used.update(int(s) for s in idx[r, :max(0, n)] if 0 <= int(s) < num_slots)
    free = [s for s in range(num_slots) if s not in used]
    assert num_slots - 1 in free and len(free) > 3
    k[num_slots - 1], v[num_slots - 1] = NAN, NAN
    k[free[0]], v[free[0], :, 1] = INF, NAN  # an unselected slot, maybe inside a tile's span
    return q, k, v, idx, lengths


def _tile_paths(idx: Any, lengths: Any, num_slots: int, rp: int, union: int,
                dense: int = 0, gates: list[bool] | None = None,
                union_dense: int = 0) -> list[int]:
    """The path of every tile (the kernels' rule, in Python): DENSE when on and the span is at
    most ``dense`` % of the mean valid entries; else UNION when the gate's estimate (the first
    row's valid entries plus rows - 1 times the last row's entries outside the first row's
    slots) is at most twice the threshold and the exact union of the tile's valid slots is at
    most ``union`` % of the mean valid entries; else the gathering kernel. ``union_dense``
    (UNION_DENSE): a tile DENSE takes that has valid entries goes UNION when it passes the
    same gate and union rule and its union is at most ``union_dense`` % of its span, else
    stays DENSE (ungated when its largest row's valid entries, duplicates counted, are past
    ``union_dense`` % of the span). ``gates`` gets the gate's verdict of each tile that is
    neither dense nor empty."""
    def valid(r: int) -> list[int]:
        n = idx.shape[1] if lengths is None else max(0, min(int(lengths[r]), idx.shape[1]))
        return [int(s) for s in idx[r, :n] if 0 <= int(s) < num_slots]

    out = []
    for t0 in range(0, idx.shape[0], rp):
        rows = range(t0, min(t0 + rp, idx.shape[0]))
        slots = [s for r in rows for s in valid(r)]
        nv = len(slots)
        span = (max(slots) - min(slots) + 1) if slots else 0
        is_dense = bool(dense) and span * rp * 100 <= nv * dense
        widest = max(len(valid(r)) for r in rows)
        if is_dense and not (union_dense and slots and widest * 100 <= span * union_dense):
            out.append(DENSE)
            continue
        if not slots:
            out.append(UNION)  # nothing valid: zeros
            continue
        first, last = valid(rows[0]), valid(rows[-1])
        est = len(first) + (len(rows) - 1) * max(0, len(last) - sum(s in set(first)
                                                                    for s in last))
        gate = est * rp * 100 <= 2 * nv * union
        if gates is not None and not is_dense:
            gates.append(gate)
        u = len(set(slots))
        ok = gate and u * rp * 100 <= nv * union
        if is_dense:
            out.append(UNION if ok and u * 100 <= span * union_dense else DENSE)
        else:
            out.append(UNION if ok else GATHER)
    return out


def _rp(tile: str, group: int, heads: str = "pow2") -> int:
    """Rows a tile: BM over a row's lines, the group rounded up to a power of two
    (TILE_HEADS="pow2") or the group itself ("group")."""
    return int(tile.split("x")[0]) // (group if heads == "group" else
                                       triton.next_power_of_2(group))


def _run(q: Any, k: Any, v: Any, idx: Any, cfg: dict[str, Any], **kw: Any) -> tuple[Any, Any]:
    out = sparse_prefill_triton(q, k, v, idx, config=cfg, **kw)
    ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert compare(out, ref) is None, compare(out, ref)
    assert torch.isfinite(out).all(), "unwritten or leaked non-finite output elements"
    err = (out.double() - ref).abs().max().item()
    assert err <= error_bound(q.dtype), f"max abs err {err} > {error_bound(q.dtype)}"
    return out, ref


# ------------------------------------------------------------------ prefill (CPU)


@pytest.mark.parametrize("group,hkv,dtype,tile,pct", [
    (6, 1, torch.float32, "32x16x4x2", 250),  # RP 4: shared blocks union, the spread one not
    (6, 1, torch.float16, "32x16x4x2", 250),
    (12, 2, torch.float16, "32x16x2x2", 150),  # RP 2, two KV heads
    (3, 2, torch.float16, "16x32x2x2", 200),  # group below the tile: padded heads
])
@pytest.mark.parametrize("tile_key", ["DENSE_TILE", "UNION_TILE"])
@pytest.mark.parametrize("heads", ["pow2", "group"])
def test_union_tiles_match_the_reference_and_the_rule(group: int, hkv: int, dtype: Any,
                                                      tile: str, pct: int, tile_key: str,
                                                      heads: str, poisoned: list[Any]) -> None:
    """The tile geometry from DENSE_TILE, or from UNION_TILE (DENSE_TILE then stays at its
    128-line default: the union's rows a tile must come from UNION_TILE's BM). TILE_HEADS=
    "group": a row's lines are its group's heads exactly, so RP is not a power of two (group
    6 in 32 lines: 5 rows, 2 padding lines; group 3 in 16: 5 rows, 1; group 12: 2 rows in 24
    of 32), a line's counts taken from its row's by the one-hot MMAs."""
    rp = _rp(tile, group, heads)
    q, k, v, idx, lengths = _shared_case(3, group=group, hkv=hkv, dtype=dtype, block=rp,
                                         total_q=max(16, 4 * rp))
    want = _tile_paths(idx, lengths, k.shape[0], rp, pct)
    assert UNION in want and GATHER in want, want  # the case exercises both paths
    cfg = {**BASE, "BLOCK_M": max(8, triton.next_power_of_2(group)), "UNION": pct,
           tile_key: tile, "TILE_HEADS": heads}
    _run(q, k, v, idx, cfg, lengths=lengths)
    assert len(poisoned) == 1 and poisoned[0].tolist() == want


def test_union_without_lengths_and_every_tile_union(poisoned: list[Any]) -> None:
    q, k, v, idx, _ = _shared_case(4, total_q=10, spread=())
    idx[idx == k.shape[0] - 1] = -1  # no lengths: every entry counts; keep the NaN slot out
    cfg = {**BASE, "UNION": 10**6, "DENSE_TILE": "32x16x4x2"}
    _run(q, k, v, idx, cfg)
    assert poisoned[0].tolist() == [UNION] * 3  # 10 rows, RP 4: the last tile has 2 rows


@pytest.mark.parametrize("union_tile", ["", "32x32x2x1"])
@pytest.mark.parametrize("heads,rp", [("pow2", 4), ("group", 5)])
def test_union_and_dense_in_one_call(union_tile: str, heads: str, rp: int,
                                     poisoned: list[Any]) -> None:
    """DENSE and UNION on the same tiles of rows; the union kernel at DENSE_TILE's geometry, or
    at its own (UNION_TILE: the same BM, other slots a step, warps and stages). TILE_HEADS=
    "group": group 6 in 32 lines is 5 rows a tile (30 lines), for both paths and the gathering
    kernel's skip (FLAG of row // 5)."""
    # the first rows select all of a narrow span (dense), a shared block (union), a spread one
    q, k, v, idx, lengths = _shared_case(5, total_q=4 * rp, block=rp, spread=(3,))
    idx[:rp] = torch.arange(10, 30, dtype=torch.int32)[torch.randperm(20)][None, :]
    lengths[:rp] = 20
    lengths[1] = 0
    cfg = {**BASE, "DENSE": 200, "UNION": 250, "DENSE_TILE": "32x16x4x2",
           "UNION_TILE": union_tile, "TILE_HEADS": heads}
    want = _tile_paths(idx, lengths, k.shape[0], rp, 250, dense=200)
    assert want == [DENSE, UNION, UNION, GATHER], want
    g = torch.Generator().manual_seed(55)
    # the dense kernel streams the 16-slot blocks around the span (slots 0 .. 31): finite
    k[:32], v[:32] = torch.randn(k[:32].shape, generator=g), torch.randn(v[:32].shape, generator=g)
    _run(q, k, v, idx, cfg, lengths=lengths)
    assert poisoned[0].tolist() == want
    # a NaN V row the dense tile streams but no row of it selects: the tile is handed back to
    # the gathering kernel (FLAG 0), the output stays right
    v[31] = NAN
    idx[rp:][idx[rp:] == 31] = 30
    _run(q, k, v, idx, cfg, lengths=lengths)
    assert poisoned[1].tolist() == [GATHER, UNION, UNION, GATHER]


@pytest.mark.parametrize("heads,rp", [("pow2", 4), ("group", 5)])
def test_union_dense_gives_dense_tiles_with_a_small_union_to_the_union_path(
        heads: str, rp: int, poisoned: list[Any]) -> None:
    """UNION_DENSE=80: the union pre-pass runs first and decides DENSE's tiles too. Tile 0's
    rows select all of a 20-slot span (union = span: stays dense), tile 1's the same 20 slots
    of a 40-slot span (union 50% of the span: union), tile 2 a shared block (union), tile 3 is
    spread (gathered). Without UNION_DENSE tile 1 is dense. A NaN V row in tile 0's streamed
    blocks hands it back to the gathering kernel, with the tiles' FLAG written by the
    pre-pass."""
    q, k, v, idx, lengths = _shared_case(5, total_q=4 * rp, block=rp, spread=(3,))
    idx[:rp] = torch.arange(10, 30, dtype=torch.int32)[torch.randperm(20)][None, :]
    lengths[:rp] = 20
    lengths[1] = 0
    idx[rp:2 * rp] = torch.arange(40, 80, 2, dtype=torch.int32)[torch.randperm(20)][None, :]
    lengths[rp:2 * rp] = 20
    g = torch.Generator().manual_seed(55)
    fin = k.shape[0] - 8   # slots 0 .. 87 finite: both dense tiles' streamed blocks
    k[:fin], v[:fin] = torch.randn(k[:fin].shape, generator=g), \
        torch.randn(v[:fin].shape, generator=g)
    for ud, tile1 in ((80, UNION), (0, DENSE)):
        cfg = {**BASE, "DENSE": 250, "UNION": 250, "DENSE_TILE": "32x16x4x2",
               "UNION_TILE": "32x32x2x1", "TILE_HEADS": heads, "UNION_DENSE": ud}
        want = _tile_paths(idx, lengths, k.shape[0], rp, 250, dense=250, union_dense=ud)
        assert want == [DENSE, tile1, UNION, GATHER], want
        _run(q, k, v, idx, cfg, lengths=lengths)
        assert poisoned[-1].tolist() == want
    v[31] = NAN   # in tile 0's last streamed block (slots 16 .. 31), selected by no row
    idx[rp:][idx[rp:] == 31] = 30
    _run(q, k, v, idx, {**cfg, "UNION_DENSE": 80}, lengths=lengths)
    assert poisoned[-1].tolist() == [GATHER, UNION, UNION, GATHER]


def test_the_gate_skips_the_exact_count_of_tiles_whose_last_row_is_new(
        poisoned: list[Any]) -> None:
    # RP 8. Tile 0: seven rows of one set A and a last row of a disjoint set B: the exact union
    # (2 x 20) would pass at 300%, but the gate's estimate (20 + 7 x 20) is over twice the
    # threshold, so the tile is gathered. Tile 1: the last row is A again: union.
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((16, 6, 16), (96, 1, 16),
                                                             (96, 1, 16)))
    a, b = torch.arange(0, 40, 2, dtype=torch.int32), torch.arange(41, 81, 2, dtype=torch.int32)
    idx = a.repeat(16, 1)
    idx[7] = b
    gates: list[bool] = []
    want = _tile_paths(idx, None, 96, 8, 300, gates=gates)
    assert want == [GATHER, UNION] and gates == [False, True]
    _run(q, k, v, idx, {**BASE, "UNION": 300, "DENSE_TILE": "64x16x4x2"})
    assert poisoned[0].tolist() == want


@pytest.mark.parametrize("heads,rp", [("pow2", 4), ("group", 5)])
def test_union_kernel_writes_exactly_its_tiles(heads: str, rp: int,
                                               poisoned: list[Any]) -> None:
    # the row-tile half of a call on a NaN output: only the union tiles' rows are written; the
    # tiles' rows (RP) it reports are the ones the gathering kernel skips by
    from backends.sparse_prefill.config import _variant

    q, k, v, idx, lengths = _shared_case(6, spread=(1, 2), block=rp, total_q=4 * rp)
    var = _variant({**BASE, "UNION": 250, "DENSE_TILE": "32x16x4x2", "TILE_HEADS": heads})
    want = _tile_paths(idx, lengths, k.shape[0], rp, 250)
    assert want == [UNION, GATHER, GATHER, UNION], want
    ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx, lengths=lengths)
    out = torch.full_like(q, NAN)
    scale = q.shape[2] ** -0.5 * 1.4426950408889634
    flag, got_rp = tile_kernels.row_tiles(q, k, v, idx, lengths, True, out, scale, var, "ieee",
                                          16)
    assert got_rp == rp and flag.tolist() == want
    for t, path in enumerate(want):
        rows = slice(rp * t, rp * t + rp)
        if path == UNION:
            assert (out[rows].double() - ref[rows]).abs().max() <= error_bound(q.dtype)
        else:
            assert out[rows].isnan().all(), f"tile {t} is the gathering kernel's"


def test_union_tiles_in_chunks_of_the_scratch_budget(monkeypatch: pytest.MonkeyPatch,
                                                     poisoned: list[Any]) -> None:
    q, k, v, idx, lengths = _shared_case(7, total_q=20, num_slots=64, spread=(2,))
    want = _tile_paths(idx, lengths, 64, 4, 200)
    # a tile: 2 x 2 bitmap words, ceil(20 * 2) = 40 slots, 4 x 20 count words = 496 bytes,
    # so two tiles a chunk: 3 chunks
    monkeypatch.setattr(tile_kernels, "_UNION_SCRATCH_BYTES", 2 * 496 + 100)
    _run(q, k, v, idx, {**BASE, "UNION": 200, "DENSE_TILE": "32x16x4x2"}, lengths=lengths)
    assert poisoned[0].tolist() == want and UNION in want and GATHER in want


@pytest.mark.parametrize("offs32,fits,want", [(1, True, True), (1, False, False),
                                              (0, True, False)])
def test_union_gathers_with_int32_offsets_only_where_they_fit(
        offs32: int, fits: bool, want: bool, monkeypatch: pytest.MonkeyPatch,
        poisoned: list[Any]) -> None:
    # the union kernel's OFFS32 is the config's OFFS32 and _offsets_fit_int32 (of the cache's
    # slots, K/V row strides and padded head dim); both offset widths match the reference
    import backends.sparse_prefill.triton_kernels as tk

    asked: list[tuple[int, ...]] = []

    def fit(*a: int) -> bool:
        asked.append(a)
        return fits

    monkeypatch.setattr(tk, "_offsets_fit_int32", fit)
    launched: list[bool] = []
    real = tile_kernels._union_fwd

    class Spy:
        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kw: Any) -> Any:
                launched.append(kw["OFFS32"])
                return real[grid](*args, **kw)
            return launch

    monkeypatch.setattr(tile_kernels, "_union_fwd", Spy())
    q, k, v, idx, lengths = _shared_case(9, d=24)
    _run(q, k, v, idx, {**BASE, "OFFS32": offs32, "UNION": 250, "DENSE_TILE": "32x16x4x2"},
         lengths=lengths)
    assert UNION in poisoned[0].tolist()
    assert launched and set(launched) == {want}
    if offs32:
        assert (k.shape[0], k.stride(0), v.stride(0), 32) in asked


def test_union_counts_duplicates_and_only_valid_entries(poisoned: list[Any]) -> None:
    # one tile: row 0 lists slot 9 three times, row 1 once; row 2 past its length lists NaN
    # slots; row 3 only invalid entries
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((4, 6, 16), (96, 1, 16), (96, 1, 16)))
    idx = torch.tensor([[9, 9, 9, 4, 5, -1, 95, 2**31 - 1],
                        [9, 4, 5, 6, 6, 6, -3, 100],
                        [4, 5, 6, 9, 90, 91, 92, 93],
                        [-1, -2, 96, 97, 2**31 - 1, -1, -1, -1]], dtype=torch.int32)
    lengths = torch.tensor([8, 8, 4, 8], dtype=torch.int32)
    k[90:94], v[90:94] = NAN, INF
    out, _ = _run(q, k, v, idx, {**BASE, "UNION": 10**6, "DENSE_TILE": "32x16x4x2"},
                  lengths=lengths)
    assert poisoned[0].tolist() == [UNION]
    assert (out[3] == 0).all()


@pytest.mark.parametrize("key", ["UNION", "DENSE"])
def test_exact_head_tiles_carry_counts_past_one_byte(key: str, poisoned: list[Any]) -> None:
    # TILE_HEADS="group" moves a row's 16-bit counts to its lines by two one-hot MMAs, of the
    # counts' low and high bytes: a row that lists one slot 300 times (and others 256 and 255
    # times) must weigh it 300 times, in the union and the dense tiles alike
    g = torch.Generator().manual_seed(21)
    topk, num_slots = 900, 64
    q, k, v = (torch.randn(shape, generator=g) for shape in ((10, 6, 16), (num_slots, 1, 16),
                                                             (num_slots, 1, 16)))
    idx = torch.randint(0, 40, (10, topk), generator=g, dtype=torch.int32)
    idx[3, :300] = 7
    idx[3, 300:556] = 8
    idx[3, 556:811] = 9
    idx[6, :] = 5
    cfg = {**BASE, key: 10**6, "DENSE_TILE": "32x16x4x2", "TILE_HEADS": "group"}
    _run(q, k, v, idx, cfg)
    assert poisoned[0].tolist() == [DENSE if key == "DENSE" else UNION] * 2


@pytest.mark.parametrize("runs", [True, False])
@pytest.mark.parametrize("block", [8, 16])
def test_union_marks_ascending_runs_across_blocks(monkeypatch: pytest.MonkeyPatch, block: int,
                                                  runs: bool, poisoned: list[Any]) -> None:
    # Rows ascending as an indexer emits them: runs of entries in one bitmap word (the mark
    # pass's RUNS ORs a run's bits before one atomic and must not lose any; without RUNS every
    # entry has its own atomic). Runs cross the pass's block edges (8 or 16 entries), a word's
    # run is broken by -1 and out-of-range entries and resumes, slots repeat next to each
    # other, and one row is descending. A bit lost at a run's or block's edge drops a slot
    # from the union: a wrong output.
    monkeypatch.setattr(tile_kernels, "_UNION_BLOCK", block)
    monkeypatch.setattr(tile_kernels, "_MARK_RUN_ENTRIES", 0 if runs else 10**9)
    assert tile_kernels.mark_runs(40, 96) is runs
    g = torch.Generator().manual_seed(31)
    num_slots, topk = 96, 40
    q = torch.randn((8, 6, 16), generator=g)
    k, v = (torch.randn((num_slots, 1, 16), generator=g) for _ in range(2))
    rows = []
    for r in range(8):
        keep = torch.randperm(num_slots, generator=g)[:topk - 5].sort().values
        row = torch.cat([keep[:10], keep[9:10], keep[9:10], torch.tensor([-1]), keep[10:20],
                         torch.tensor([num_slots + 3]), keep[20:], torch.tensor([-1])])
        rows.append(row.flip(0) if r == 5 else row)
    idx = torch.stack(rows).to(torch.int32)
    assert idx.shape == (8, topk)
    _run(q, k, v, idx, {**BASE, "UNION": 10**6, "DENSE_TILE": "32x16x4x2"})
    assert poisoned[0].tolist() == [UNION, UNION]


def test_mark_runs_only_where_rows_fill_their_words() -> None:
    # The seed's top-k 2051 (about 8 entries a word at KV 8K, measured faster with runs; 2 at
    # 32K, measured slower), and the edges of the rule (4 entries a word).
    assert tile_kernels.mark_runs(2051, 8192)
    assert tile_kernels.mark_runs(2048, 16384)
    assert not tile_kernels.mark_runs(2047, 16384)
    assert not tile_kernels.mark_runs(2051, 32768)


@pytest.mark.parametrize("key", ["UNION", "DENSE"])
@pytest.mark.parametrize("rising", [True, False])
def test_row_tiles_rescale_when_a_later_block_scores_far_higher(key: str, rising: bool,
                                                                poisoned: list[Any]) -> None:
    # Scores spread over hundreds of log2 units, growing (or falling) with the slot: a line's
    # running maximum moves by far more than the rescale slack after its first block, several
    # times, and rows select the slots in shuffled order (the kernels visit them ascending).
    # Without the rescale the weights overflow (rising) or the normalization is wrong.
    g = torch.Generator().manual_seed(21)
    num_slots, topk, d = 64, 40, 16
    q = torch.randn((8, 6, d), generator=g)
    k = torch.randn((num_slots, 1, d), generator=g)
    v = torch.randn((num_slots, 1, d), generator=g)
    ramp = torch.linspace(0.2, 12.0, num_slots) if rising else torch.linspace(12.0, 0.2, num_slots)
    k = k * ramp[:, None, None]
    q = q * 6.0
    pool = torch.randperm(num_slots, generator=g)[:44]
    idx = torch.stack([pool[torch.randperm(44, generator=g)[:topk]] for _ in range(8)]).to(
        torch.int32)
    idx[0, :3] = idx[0, 3]  # a slot counted four times
    cfg = {**BASE, key: 10**6, "DENSE_TILE": "32x16x4x2"}
    _run(q, k, v, idx, cfg)
    assert poisoned[0].tolist() == [DENSE if key == "DENSE" else UNION] * 2


def test_rescale_slack_keeps_the_weights_finite_in_the_kv_dtype() -> None:
    slack = tile_kernels._rescale_slack
    assert slack(torch.bfloat16, 2051) == slack(torch.float32, 2051) == 8.0
    assert slack(torch.float16, 2051) == 4.0  # 2051 * 2**4 <= 65504 < 2051 * 2**5
    assert slack(torch.float16, 200) == 8.0 and slack(torch.float16, 65504) == 0.0
    for topk in (1, 255, 256, 2051, 40000):
        assert topk * 2 ** slack(torch.float16, topk) <= 65504
    with pytest.raises(ConfigError, match="fp16 cannot hold"):
        slack(torch.float16, 65505)


# ------------------------------------------------------------------ chunk (CPU)


def _chunk_shared(seed: int, *, reqs: tuple[int, ...] = (8, 8),
                  prefixes: tuple[int, ...] = (30, 60), group: int = 6, hkv: int = 1,
                  d: int = 16, page_size: int = 2, topk: int = 16,
                  dtype: Any = torch.float32) -> tuple[Any, ...]:
    """A chunk batch whose first request's rows pick from one shared pool of positions (union
    tiles) and whose second request's rows pick at random (little sharing), on a shuffled page
    table with an unmapped page; hazards as the prefill case."""
    g = torch.Generator().manual_seed(seed)
    total_q = sum(reqs)
    ctx = max(p + r for p, r in zip(prefixes, reqs, strict=True))
    max_pages = -(-ctx // page_size) + 1
    num_slots = len(reqs) * max_pages * page_size - 1
    q = torch.randn((total_q, group * hkv, d), generator=g).to(dtype)
    k = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    v = torch.randn((num_slots, hkv, d), generator=g).to(dtype)
    pt = torch.randperm(len(reqs) * max_pages, generator=g).to(torch.int32)
    pt = pt.reshape(len(reqs), max_pages).clone()
    pt[1, 1] = -1  # unmapped page of the second request
    idx = torch.empty((total_q, topk), dtype=torch.int32)
    pool = torch.randperm(prefixes[0], generator=g)[:20]
    for r in range(total_q):
        if r < reqs[0]:
            idx[r] = pool[torch.randperm(20, generator=g)[:topk]].to(torch.int32)
        else:
            pos = prefixes[1] + r - reqs[0]
            idx[r] = torch.randint(0, pos + 3, (topk,), generator=g, dtype=torch.int32)
    idx[0, :3] = idx[0, 3]  # duplicates
    idx[1, 4] = -1
    idx[2, 5] = 10**6
    lengths = torch.randint(topk - 4, topk + 1, (total_q,), generator=g, dtype=torch.int32)
    lengths[3] = 0
    cu = torch.tensor([0, *torch.tensor(reqs).cumsum(0).tolist()], dtype=torch.int32)
    kw = dict(kind="chunk", lengths=lengths, cu_seqlens_q=cu,
              prefix_lens=torch.tensor(prefixes, dtype=torch.int32), page_table=pt,
              page_size=page_size, max_q=max(reqs))
    return q, k, v, idx, kw


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_union_chunk_runs_on_pretranslated_slots(dtype: Any, poisoned: list[Any]) -> None:
    q, k, v, idx, kw = _chunk_shared(9, dtype=dtype)
    cfg = {**BASE, "CHUNK_MODE": "pretranslate", "UNION": 250, "DENSE_TILE": "32x16x4x2"}
    _run(q, k, v, idx, cfg, **kw)
    paths = poisoned[0].tolist()
    assert paths[:2] == [UNION, UNION] and GATHER in paths[2:], paths


def test_union_chunk_tiles_take_positions_within_one_request(poisoned: list[Any]) -> None:
    # UNION without DENSE on chunk rows unions token positions (tile_kernels.ChunkIds): both
    # requests' rows pick from the same positions, which their shuffled page tables map to
    # different slots, and one page of the second request aliases a page of the first. The
    # tile whose rows span both requests must be gathered (a union over positions would mix
    # the two requests' K/V); the others union, and each output is the reference's.
    g = torch.Generator().manual_seed(31)
    reqs, prefixes, ps, topk = (6, 10), (40, 40), 2, 12
    max_pages = 26
    num_slots = 2 * max_pages * ps
    q = torch.randn((16, 6, 16), generator=g)
    k = torch.randn((num_slots, 1, 16), generator=g)
    v = torch.randn((num_slots, 1, 16), generator=g)
    pt = torch.randperm(2 * max_pages, generator=g).to(torch.int32).reshape(2, max_pages).clone()
    pt[1, 3] = pt[0, 5]  # positions 6-7 of request 1 are positions 10-11 of request 0's slots
    pool = torch.randperm(30, generator=g)[:16]
    idx = torch.stack([pool[torch.randperm(16, generator=g)[:topk]] for _ in range(16)]).to(
        torch.int32)
    idx[5, 0] = 45  # past the row's causal position (40 + 5): invalid
    idx[9, 1] = -1
    cu = torch.tensor([0, 6, 16], dtype=torch.int32)
    kw = dict(kind="chunk", cu_seqlens_q=cu, prefix_lens=torch.tensor(prefixes, dtype=torch.int32),
              page_table=pt, page_size=ps, max_q=max(reqs))
    cfg = {**BASE, "CHUNK_MODE": "pretranslate", "UNION": 10**6, "DENSE_TILE": "32x16x4x2"}
    _run(q, k, v, idx, cfg, **kw)
    assert poisoned[0].tolist() == [UNION, GATHER, UNION, UNION]


def test_union_chunk_needs_translated_entries() -> None:
    q, k, v, idx, kw = _chunk_shared(10)
    for mode in ("fused", "staged"):
        cfg = {**BASE, "CHUNK_MODE": mode, "UNION": 250, "DENSE_TILE": "32x16x4x2"}
        with pytest.raises(ConfigError, match=r"UNION=250 gathers KV slots.*'pretranslate'"):
            sparse_prefill_triton(q, k, v, idx, config=cfg, **kw)


# ------------------------------------------------------------------ config (CPU)


@pytest.mark.parametrize("cfg,match", [
    ({**BASE, "UNION": -1}, "UNION=-1: expected 0"),
    ({**BASE, "UNION": True}, "UNION=True"),
    ({**BASE, "UNION": "300"}, "UNION='300'"),
    ({**BASE, "UNION": 300, "SLOT_ORDER": 1}, "UNION and SLOT_ORDER"),
    ({**BASE, "UNION": 300, "DENSE_TILE": "96x32x8x3"}, "BM=96 must be a power of two"),
    ({**BASE, "UNION": 300, "UNION_TILE": "64x32"}, "UNION_TILE='64x32': expected 'BMxBNxWxS'"),
    ({**BASE, "UNION": 300, "UNION_TILE": 128}, "UNION_TILE=128: expected"),
    ({**BASE, "UNION": 300, "UNION_TILE": "96x32x8x3"}, "UNION_TILE='96x32x8x3': BM=96"),
    ({**BASE, "DENSE": 250, "UNION": 300, "UNION_TILE": "64x64x8x2"},
     "BM=64 must equal DENSE_TILE's BM=128 .* use '128x64x8x2'"),
    ({"BLOCK_M": 8, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "ENGINE": "gluon_wgmma",
      "UNION": 300, "REVERSE_ROWS": 1}, "does not take REVERSE_ROWS"),
    ({**BASE, "UNION": 300, "UNION_DENSE": 80}, "UNION_DENSE=80 .* needs DENSE and UNION both "
                                                 "on .*DENSE=0, UNION=300"),
    ({**BASE, "DENSE": 250, "UNION_DENSE": 80}, "UNION_DENSE=80 .*UNION=0.*or drop UNION_DENSE"),
    ({**BASE, "DENSE": 250, "UNION": 300, "UNION_DENSE": -5}, "UNION_DENSE=-5: expected 0"),
    ({**BASE, "DENSE": 250, "UNION": 300, "UNION_DENSE": 0.8}, "UNION_DENSE=0.8: expected 0 "
                                                               ".*e.g. 80"),
    ({**BASE, "DENSE": 250, "UNION": 300, "UNION_DENSE": True}, "UNION_DENSE=True"),
])
def test_bad_union_configs(cfg: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        validate_config(cfg, 6, 256)


def test_union_top_k_past_16_bit_counts_is_config_error() -> None:
    q = torch.randn(2, 6, 16)
    k = v = torch.randn(8, 1, 16)
    idx = torch.zeros((2, 65536), dtype=torch.int32)
    with pytest.raises(ConfigError, match=r"UNION counts .* top-k <= 65535"):
        sparse_prefill_triton(q, k, v, idx, config={**BASE, "UNION": 300})


def test_popcount_and_union_helpers_agree_with_python() -> None:
    # the pre-pass's bit arithmetic on words with bit 31 set (negative int32)
    from backends.sparse_prefill.bench import format_geometry, parse_geometry

    cfg = parse_geometry("8x16x1x2:rev:split2:v2:lean:o32:union300:dt64x32x4x2")
    assert cfg["UNION"] == 300 and cfg["DENSE_TILE"] == "64x32x4x2"
    assert parse_geometry(format_geometry(cfg)) == cfg
    xh = parse_geometry("8x16x1x2:union300:ut128x64x8x2:uc:xh")
    assert xh["TILE_HEADS"] == "group" and parse_geometry(format_geometry(xh)) == xh
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((4, 6, 16), (70, 1, 16), (70, 1, 16)))
    idx = torch.tensor([[31, 63, 0, 32, 33, 64], [31, 62, 63, 1, 69, 30],
                        [63, 31, 30, 32, 0, 64], [69, 68, 62, 31, 63, 64]], dtype=torch.int32)
    out = sparse_prefill_triton(q, k, v, idx, config={**BASE, "UNION": 10**6,
                                                      "DENSE_TILE": "32x16x4x2"})
    ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx)
    assert compare(out, ref) is None and (out.double() - ref).abs().max() <= 1e-4


def _is_policy_union(cfg: dict[str, Any]) -> bool:
    """One of the policy's union configs (chunk g6; prefill g6 beside its dense tiles), offered
    to the tuner as they are (a prefill case gets the chunk one without CHUNK_MODE)."""
    from plugins.nvidia_hopper import H200_UNION_CONFIGS

    def strip(c: dict[str, Any]) -> dict[str, Any]:
        return {k: x for k, x in c.items() if k != "CHUNK_MODE"}

    return any(strip(cfg) == strip(H200_UNION_CONFIGS[key])
               for key in (("chunk", 6), ("prefill", 6)))


def test_tuner_space_has_union_candidates_over_the_family() -> None:
    from backends.sparse_prefill import tuning
    from backends.sparse_prefill.bench import BenchCase
    from plugins.nvidia_hopper import H200_DENSE_CONFIGS, H200_PREFILL_CONFIGS, H200_UNION_CONFIGS

    for kind in ("prefill", "chunk"):
        case = BenchCase(kind=kind, group_size=6, total_q=8192, kv_len=8192)
        cands = [cfg for _, cfg, _ in tuning.candidates(case, None) if cfg is not None]
        unions = [cfg for cfg in cands if cfg.get("UNION")]
        fam = {k: v for k, v in H200_PREFILL_CONFIGS[("prefill", 6)].items()}
        want = {**fam, "UNION": 300, **({"CHUNK_MODE": "pretranslate"} if kind == "chunk"
                                        else {})}
        assert want in unions, unions
        for tile in ("128x64x8x2", "64x32x4x3"):
            assert {**want, "DENSE_TILE": tile} in unions, tile
        dense_union = {**H200_DENSE_CONFIGS[("prefill", 6)], "UNION": 300,
                       "UNION_TILE": "128x64x8x2"}
        if kind == "chunk":
            assert H200_UNION_CONFIGS[("chunk", 6)] in unions
            assert all(cfg.get("CHUNK_MODE") == "pretranslate" for cfg in unions)
            assert dense_union not in unions   # DENSE runs on prefill rows only
        else:
            assert not any("CHUNK_MODE" in cfg for cfg in unions)
            assert dense_union in unions, unions
            # and with the union pre-pass first, taking DENSE's tiles of a small union
            assert {**dense_union, "UNION_DENSE": 80} in unions, unions
        assert all(cfg.get("DENSE") for cfg in unions if cfg.get("UNION_DENSE"))
        for cfg in unions:
            validate_config(cfg, 6, 256)
        # not on tiles of the group's heads exactly (measured slower, session 43)
        assert not any(cfg.get("TILE_HEADS") for cfg in unions), unions
        # with the Triton pre-pass unless the device is sm_90 (the CUDA one's only target;
        # the policy's chunk config, offered as it is, names the CUDA one)
        assert not any("UNION_PREP" in cfg for cfg in unions
                       if not _is_policy_union(cfg)), unions


def test_tuner_union_candidates_take_the_cuda_pre_pass_on_sm90_only() -> None:
    from backends.sparse_prefill import tuning
    from backends.sparse_prefill.bench import BenchCase
    from plugins.nvidia_hopper import H200_UNION_CONFIGS
    from registry import profiles

    assert H200_UNION_CONFIGS[("chunk", 6)]["UNION_PREP"] == "cuda"
    assert H200_UNION_CONFIGS[("prefill", 6)]["UNION_PREP"] == "cuda"
    for kind in ("prefill", "chunk"):
        case = BenchCase(kind=kind, group_size=6, total_q=8192, kv_len=8192)
        for dev, prep in (("h200", {"cuda"}), ("rtx-5090", {None}), ("mi300x", {None})):
            unions = [cfg for _, cfg, _ in tuning.candidates(case, profiles()[dev])
                      if cfg is not None and cfg.get("UNION") and not _is_policy_union(cfg)]
            assert len(unions) >= 3 and {cfg.get("UNION_PREP") for cfg in unions} == prep, dev


def test_explain_says_which_path_a_union_config_takes() -> None:
    import registry
    from backends.sparse_prefill.config import describe_path
    from backends.sparse_prefill.guarantees import kernel_contract
    from registry import Implementation, hookimpl

    union = {**BASE, "UNION": 300}
    assert describe_path(union).startswith("union tiles where a tile's union of selected slots "
                                           "is <= 300%")
    assert "dense-span tiles" in describe_path({**union, "DENSE": 250})
    positions = "chunk rows: the union counted over their token positions"
    assert positions in describe_path({**union, "CHUNK_MODE": "pretranslate"})
    assert positions not in describe_path(union)
    assert positions not in describe_path({**union, "CHUNK_MODE": "pretranslate", "DENSE": 250})
    assert describe_path(BASE) == "the Triton per-row gathering kernel for every row"
    assert "(DENSE_TILE 128x32x8x3;" in describe_path(union)
    both = describe_path({**union, "DENSE": 250, "UNION_TILE": "128x64x8x2"})
    assert "(DENSE_TILE 128x32x8x3)" in both and "(UNION_TILE 128x64x8x2;" in both, both
    assert "UNION_DENSE" not in both
    first = describe_path({**union, "DENSE": 250, "UNION_DENSE": 80})
    assert "tried first on the dense tiles too: one whose union is <= 80% of its span goes " \
        "union (UNION_DENSE; one whose largest row alone is past that stays dense " \
        "ungated)" in first, first
    validate_config({**union, "DENSE": 250, "UNION_DENSE": 80}, 6, 256)

    class _Plugin:
        @hookimpl
        def kreg_implementations(self) -> list[Implementation]:
            return [Implementation(
                op="sparse_prefill", name="test_union.explain", priority=10**6,
                config=dict(union), describe_config=describe_path, contract=kernel_contract,
                kernel="backends.sparse_prefill.triton_kernels:sparse_prefill_triton")]

    fields = {"kind": "prefill", "topk": 2051, "head_dim": 256, "group_size": 6,
              "num_kv_heads": 1, "total_q": 8192, "num_requests": 1, "max_q": 8192,
              "dtype": "bfloat16", "kv_len": 32768}
    registry.register_plugin(_Plugin(), "test_union_explain")
    try:
        reg = registry.get_registry()
        decision = registry.select("sparse_prefill", fields, reg.resolve_device("h200"))
    finally:
        registry.unregister_plugin("test_union_explain")
    text = decision.explain()
    assert decision.implementation == "test_union.explain"
    assert "note: path: union tiles where" in text and "UNION=300" in text, text
    # a tile's path depends on its neighbouring rows: deterministic, not batch-invariant
    assert decision.guarantees == ["deterministic"], decision.guarantees


# ------------------------------------------------------------------ GPU


def _cuda_prep_or_skip() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: UNION_PREP='cuda' is a CUDA kernel")
    from backends.sparse_prefill import union_prep

    ok, why = union_prep.available(torch.device("cuda"), 1 << 16, 8192)
    if not ok:
        pytest.skip(f"UNION_PREP='cuda' cannot run here: {why}")


@pytest.mark.gpu
@pytest.mark.parametrize("indices", ["topk", "walk"])
@pytest.mark.parametrize("by_req", [False, True])
@pytest.mark.parametrize("rp", [16, 21])
@pytest.mark.parametrize("given", ["stats", "own", "out"])
def test_gpu_cuda_pre_pass_writes_what_the_triton_one_does(by_req: bool, indices: str,
                                                           rp: int, given: str) -> None:
    # the one-kernel pre-pass (union_prep.cu) against tile_kernels' four Triton kernels on the
    # GPU, output by output: FLAG, USZ, a union tile's slots and counts; rows an indexer emits
    # (or the walk) with -1, negative, out-of-range, duplicate and past-length entries, ragged
    # lengths, rows past the last full tile; by_req: chunk positions through a page table, a
    # tile spanning two requests gathered; given "own": the kernel gets no row statistics and
    # takes its tiles' from their ids (the host's launch without DENSE tiles); "out": the same,
    # and it writes them out (UNION_DENSE's launch): _row_stats' values, row by row
    _cuda_prep_or_skip()
    from backends.sparse_prefill import union_prep
    from backends.sparse_prefill.indices import topk_indices, walk_indices

    # rp 21: TILE_HEADS="group" tiles of group 6 in 128 lines
    total_q, width, topk, pct = 2003, 8192, 2051, 300
    vis = torch.arange(width - total_q + 1, width + 1, device="cuda")
    make = topk_indices if indices == "topk" else walk_indices
    idx, lens = make(vis, topk)
    g = torch.Generator(device="cuda").manual_seed(7)
    for val in (-1, -9, width + 5):
        m = torch.rand(idx.shape, generator=g, device="cuda") < 0.002
        idx[m] = val
    idx[::5, 1:100] = idx[::5, :99].clone()   # duplicates (a slot listed twice counts twice)
    lens = lens.clone()
    # ragged lengths on every 9th row from row 2: never a 21-row tile's first row (a short
    # first row inflates the gate's estimate: with lens[::7] 84 of 96 tiles were gathered)
    lens[2::9] = torch.randint(0, topk + 40, lens[2::9].shape, generator=g, device="cuda",
                               dtype=torch.int32)
    lens[3] = -4
    by = None
    if by_req:
        row_req = (torch.arange(total_q, device="cuda", dtype=torch.int32) >= 1000).int()
        pt = torch.stack([torch.randperm(2 * width // 16, generator=g, device="cuda")[
            : width // 16] for _ in range(2)]).int()
        by = (row_req, pt, 16, pt.stride(0))
    stats = tile_kernels.row_stats(idx, lens, True, width)
    tiles = -(-total_q // rp)
    umax = -(-topk * pct // 100)
    umax += umax & 1
    flag0 = torch.zeros((tiles,), device="cuda", dtype=torch.int32)
    want = tile_kernels.union_prep_triton(idx, lens, True, stats, flag0.clone(), 0, pct, rp,
                                          umax, width, by)
    flag = flag0.clone()
    usz = torch.full_like(flag, -7)
    slots = torch.full((tiles, umax), -7, device="cuda", dtype=torch.int32)
    cnt = torch.full((tiles, rp, umax // 2), -7, device="cuda", dtype=torch.int32)
    out = tuple(torch.full((total_q,), -7, device="cuda", dtype=torch.int32)
                for _ in range(3))
    assert union_prep.run(idx, lens, stats if given == "stats" else None, flag, usz, slots, cnt,
                          by, num_ids=width, tile0=0, ntiles=tiles, rp=rp, dense_span=0,
                          pct=pct, umax=umax, stats_out=out if given != "own" else None)
    torch.cuda.synchronize()
    for name, got, ref in zip(("LO", "HI", "NV"), out, stats, strict=True):
        if given == "out":
            assert torch.equal(got, ref), name
        else:   # not asked for (or given the statistics): never written
            assert (got == -7).all(), name
    assert flag.tolist() == want[0].tolist()
    assert usz.tolist() == want[1].tolist()
    union = [t for t in range(tiles) if flag[t] == UNION and usz[t] > 0]
    if indices == "topk":
        assert len(union) > tiles // 2, f"{len(union)} union tiles of {tiles}"
    for t in union:
        u = int(usz[t])
        assert torch.equal(slots[t, :u], want[2][t, :u]), f"tile {t}: slots"
        h = (u + 1) // 2
        # (an odd U's last word: its high field is 0 in both, cleared before counting)
        assert torch.equal(cnt[t, :, :h], want[3][t, :, :h]), f"tile {t}: counts"


@pytest.mark.gpu
@pytest.mark.parametrize("indices", ["topk", "walk"])
@pytest.mark.parametrize("ud", [80, 100])
def test_gpu_union_dense_on_the_seed_ramp(indices: str, ud: int,
                                          poisoned: list[Any]) -> None:
    # UNION_DENSE 80 / 100 (the policy's 60 takes few tiles at KV 4096) on the H200 family's
    # prefill g6 union config against it without UNION_DENSE (dense tiles, union tiles at their
    # own geometry, the CUDA pre-pass) at the seed's shapes on a prefix-free causal ramp of 4096
    # rows: the CUDA and the Triton pre-pass send every tile the same way, some of
    # DENSE's tiles go union on top-k rows (their union ~1.15 x top-k, their span up to 4096),
    # only DENSE's tiles change hands, and every output is within the bf16 bound of the fp32
    # reference
    _cuda_prep_or_skip()
    from backends.sparse_prefill.bench import BenchCase, make_inputs
    from plugins.nvidia_hopper import H200_UNION_CONFIGS

    inp = make_inputs(BenchCase(kind="prefill", group_size=6, kv_heads=1, total_q=4096,
                                kv_len=4096, indices=indices), "cuda")
    q, k, v, idx, kw = inp["q"], inp["k"], inp["v"], inp["indices"], inp["kwargs"]
    ref = sparse_prefill_reference(q, k, v, idx, out_dtype=torch.float32, **kw)
    base = H200_UNION_CONFIGS[("prefill", 6)]
    outs = {}
    for prep in ("cuda", "triton"):
        cfg = {**base, "UNION_DENSE": ud, "UNION_PREP": prep}
        outs[prep] = sparse_prefill_triton(q, k, v, idx, config=cfg, **kw)
        assert compare(outs[prep], ref) is None
        err = (outs[prep].float() - ref).abs().max().item()
        assert err <= error_bound(torch.bfloat16), (prep, err)
    legacy = sparse_prefill_triton(q, k, v, idx, config={**base, "UNION_DENSE": 0}, **kw)
    torch.cuda.synchronize()
    cuda_paths, triton_paths, legacy_paths = (f.tolist() for f in poisoned[-3:])
    assert cuda_paths == triton_paths
    taken = sum(a == UNION and b == DENSE for a, b in zip(cuda_paths, legacy_paths,
                                                          strict=True))
    if indices == "topk":
        assert taken > 0, (cuda_paths, legacy_paths)
    assert all(a == b for a, b in zip(cuda_paths, legacy_paths, strict=True)
               if b != DENSE)   # only DENSE's tiles change hands
    assert (legacy.float() - ref).abs().max().item() <= error_bound(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("indices", ["topk", "walk"])
@pytest.mark.parametrize("kind", ["prefill", "chunk"])
@pytest.mark.parametrize("group", [6, 12])
@pytest.mark.parametrize("prep", ["triton", "cuda"])
@pytest.mark.parametrize("heads", ["pow2", "group"])
def test_gpu_union_through_dispatch(kind: str, group: int, indices: str, prep: str,
                                    heads: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: the union kernels at the seed's shapes in bf16")
    if prep == "cuda":
        _cuda_prep_or_skip()
    import registry
    from backends.sparse_prefill.bench import BenchCase, make_inputs
    from registry import Implementation, hookimpl
    from registry.requirements import vendor_in

    union = {"BLOCK_M": 8 if group <= 8 else 16, "BLOCK_N": 16, "num_warps": 1,
             "num_stages": 2, "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1, "OFFS32": 1,
             "REVERSE_ROWS": 1, "UNION": 300, "DENSE_TILE": "128x32x8x3",
             "UNION_PREP": prep, "TILE_HEADS": heads}
    if kind == "chunk":
        union = {**union, "CHUNK_MODE": "pretranslate"}

    class _Plugin:
        @hookimpl
        def kreg_implementations(self) -> list[Implementation]:
            return [Implementation(
                op="sparse_prefill", name="test_union.sparse_prefill", priority=10**6,
                requirements=(vendor_in("nvidia"),), config=dict(union),
                kernel="backends.sparse_prefill.triton_kernels:sparse_prefill_triton")]

    case = BenchCase(kind=kind, group_size=group, kv_heads=1, total_q=1024,
                     kv_len=4096 if kind == "prefill" else 16384, indices=indices)
    inp = make_inputs(case, "cuda")
    registry.register_plugin(_Plugin(), "test_union")
    paths: list[Any] = []
    tile_kernels.TILE_PATHS = paths
    try:
        with registry.record() as launches:
            out = registry.dispatch("sparse_prefill", inp["q"], inp["k"], inp["v"],
                                    inp["indices"], **inp["kwargs"])
        torch.cuda.synchronize()
    finally:
        tile_kernels.TILE_PATHS = None
        registry.unregister_plugin("test_union")
    assert [(x.implementation, x.config.get("UNION")) for x in launches] == \
        [("test_union.sparse_prefill", 300)], launches
    flags = paths[0].tolist()
    if kind == "prefill":   # the slots are the entries: every tile's path is the rule's
        rp = _rp(union["DENSE_TILE"], group, heads)
        assert flags == _tile_paths(inp["indices"].cpu(), inp["kwargs"]["lengths"].cpu(),
                                    inp["k"].shape[0], rp, union["UNION"])
    if indices == "topk":
        assert flags.count(UNION) > 0, f"no tile took the union path: {flags}"
    elif kind == "chunk":   # the walk at KV 16K: rows share few slots, the gathers do them
        assert flags.count(GATHER) > 0, f"no tile left to the gathering kernel: {flags}"
    ref = sparse_prefill_reference(inp["q"], inp["k"], inp["v"], inp["indices"],
                                   out_dtype=torch.float32, **inp["kwargs"])
    assert compare(out, ref) is None
    err = (out.float() - ref).abs().max().item()
    assert err <= 2e-2, f"max abs err {err} (union tiles {flags.count(UNION)}/{len(flags)})"


# ------------------------------------------------------------------ the Gluon per-row kernels


def test_gluon_engines_take_row_tiles_and_explain_says_so() -> None:
    from backends.sparse_prefill.config import describe_path

    wg = {"BLOCK_M": 8, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "ENGINE": "gluon_wgmma",
          "OFFS32": 1, "MAXNREG": 96}
    for extra in ({"UNION": 300, "DENSE_TILE": "128x64x8x2"},
                  {"UNION": 300, "DENSE": 250, "DENSE_TILE": "32x64x4x2"}):
        cfg = {**wg, **extra}
        validate_config(cfg, 6, 256)
        text = describe_path(cfg)
        assert text.startswith("dense-span tiles" if "DENSE" in extra else "union tiles"), text
        assert text.endswith("the Gluon wgmma per-row kernel for the other tiles' rows"), text
    with pytest.raises(ConfigError, match=r"BM=96 must be a power of two"):
        validate_config({**wg, "UNION": 300, "DENSE_TILE": "96x32x8x3"}, 6, 256)


def _wgmma_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _wgmma_gpu(), reason="ENGINE='gluon_wgmma' needs an sm_90 GPU")
@pytest.mark.parametrize("engine,bm", [("gluon_wgmma", 8), ("gluon", 8)])
@pytest.mark.parametrize("dense", [0, 200])
def test_gpu_row_tiles_before_the_gluon_per_row_kernels(engine: str, bm: int, dense: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # DENSE / UNION tiles (the Triton row-tile kernels) first, then a Gluon per-row kernel
    # that must skip exactly those tiles' rows (FLAG != 0) and compute every other row:
    # _shared_case's hazards at head_dim 256, outputs poisoned first
    poison_empty(monkeypatch)
    paths: list[Any] = []
    monkeypatch.setattr(tile_kernels, "TILE_PATHS", paths)
    q, k, v, idx, lengths = _shared_case(11, total_q=24, group=6, hkv=1, d=256, num_slots=160,
                                         topk=40, pool=48, spread=(2,), dtype=torch.bfloat16)
    if dense:   # the first tile's rows select all of a narrow span, which is finite
        idx[:4] = torch.arange(10, 50, dtype=torch.int32)[torch.randperm(40)][None, :]
        lengths[:4] = 40
        k[:64], v[:64] = torch.randn(k[:64].shape).bfloat16(), torch.randn(v[:64].shape).bfloat16()
    want = _tile_paths(idx, lengths, k.shape[0], 4, 250, dense=dense)
    assert UNION in want and GATHER in want and (DENSE in want) == bool(dense), want
    geo = {"BLOCK_M": bm, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2} \
        if engine == "gluon_wgmma" else {"BLOCK_M": bm, "BLOCK_N": 16, "num_warps": 2,
                                         "num_stages": 1}
    cfg = {**geo, "ENGINE": engine, "OFFS32": 1, "UNION": 250, "DENSE": dense,
           "DENSE_TILE": "32x64x4x2"}
    out = sparse_prefill_triton(*[x.cuda() for x in (q, k, v, idx)], config=cfg,
                                lengths=lengths.cuda())
    ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx, lengths=lengths)
    assert compare(out.cpu(), ref) is None, compare(out.cpu(), ref)
    assert torch.isfinite(out).all(), "unwritten or leaked non-finite output elements"
    err = (out.double().cpu() - ref).abs().max().item()
    assert err <= error_bound(torch.bfloat16), f"max abs err {err}"
    got = paths[0].tolist()
    assert all(g == w or (w != GATHER and g == GATHER) for g, w in zip(got, want, strict=True))
    assert got.count(UNION) > 0, got


@pytest.mark.gpu
@pytest.mark.skipif(not _wgmma_gpu(), reason="ENGINE='gluon_wgmma' needs an sm_90 GPU")
@pytest.mark.parametrize("indices", ["topk", "walk"])
@pytest.mark.parametrize("kind", ["prefill", "chunk"])
@pytest.mark.parametrize("group", [6, 12])
def test_gpu_union_tiles_with_the_wgmma_per_row_kernel(kind: str, group: int,
                                                       indices: str) -> None:
    # the seed's shapes (bf16, top-k 2051, head_dim 256), 1024 rows: union tiles (Triton) and
    # the Gluon wgmma kernel for the rest, against the fp32 reference
    from backends.sparse_prefill.bench import BenchCase, make_inputs

    case = BenchCase(kind=kind, group_size=group, kv_heads=1, total_q=1024,
                     kv_len=4096 if kind == "prefill" else 16384, indices=indices)
    inp = make_inputs(case, "cuda")
    ref = sparse_prefill_reference(inp["q"], inp["k"], inp["v"], inp["indices"],
                                   out_dtype=torch.float32, **inp["kwargs"])
    cfg = {"BLOCK_M": 8 if group <= 8 else 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2,
           "ENGINE": "gluon_wgmma", "OFFS32": 1, "MAXNREG": 96 if group <= 8 else 128,
           "UNION": 300, "DENSE_TILE": "128x64x8x2" if group <= 8 else "64x32x4x3"}
    if kind == "chunk":
        cfg["CHUNK_MODE"] = "pretranslate"
    paths: list[Any] = []
    tile_kernels.TILE_PATHS = paths
    try:
        out = sparse_prefill_triton(inp["q"], inp["k"], inp["v"], inp["indices"], config=cfg,
                                    **inp["kwargs"])
        torch.cuda.synchronize()
    finally:
        tile_kernels.TILE_PATHS = None
    assert compare(out, ref) is None
    err = (out.float() - ref).abs().max().item()
    flags = paths[0].tolist()
    assert err <= 2e-2, f"max abs err {err} (union tiles {flags.count(UNION)}/{len(flags)})"
    if indices == "topk":
        assert flags.count(UNION) > 0, flags
    elif kind == "chunk":   # the walk at KV 16K: rows share few slots, the per-row kernel
        assert flags.count(GATHER) > 0, flags


def test_cuda_pre_pass_off_a_gpu_falls_back_to_the_triton_one(poisoned: list[Any],
                                                             caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    # UNION_PREP="cuda" where its kernel cannot run (CPU tensors here): the Triton pre-pass
    # runs, the answer and the tiles' paths are the rule's, the reason is logged; explain
    # names the pre-pass; a bad value is a config error naming the choices
    from backends.sparse_prefill.config import describe_path

    q, k, v, idx, lengths = _shared_case(3, group=6, hkv=1, dtype=torch.float16)
    want = _tile_paths(idx, lengths, k.shape[0], _rp("32x16x4x2", 6), 250)
    cfg = {**BASE, "UNION": 250, "DENSE_TILE": "32x16x4x2", "UNION_PREP": "cuda"}
    with caplog.at_level("WARNING", logger="kreg"):
        tile_kernels._PREP_LOGGED.clear()
        _run(q, k, v, idx, cfg, lengths=lengths)
    assert poisoned[0].tolist() == want
    assert "the Triton pre-pass runs instead" in caplog.text
    assert "pre-pass: one CUDA kernel a tile" in describe_path(cfg)
    with pytest.raises(ConfigError, match=r"UNION_PREP='nvcc': expected one of"):
        validate_config({**cfg, "UNION_PREP": "nvcc"}, 6, 16)


def test_cuda_pre_pass_without_nvcc_says_what_runs_and_the_fix(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # no nvcc: the library is not had, the warning names the pre-pass, that the Triton one
    # runs and the config fix (not the indexer's selection variable), and nothing is retried
    from backends.indexer_topk import cluster
    from backends.sparse_prefill import union_prep

    monkeypatch.setattr(cluster, "nvcc", lambda: None)
    monkeypatch.setattr(union_prep, "_lib", None)
    monkeypatch.setattr(union_prep, "_FAILED", [])
    with caplog.at_level("WARNING", logger="kreg"):
        assert union_prep._load() is None
        assert union_prep._load() is None
    assert len(union_prep._FAILED) == 1
    text = caplog.text
    assert text.count("unavailable") == 1, text
    assert "the Triton pre-pass runs instead" in text and "needs nvcc" in text, text
    assert "UNION_PREP='triton'" in text and "KREG_SELECT_INDEXER_TOPK" not in text, text


# ------------------------------------------------- the warp-specialized union kernel (gluon_ws)


def test_union_engine_config_explain_and_geometry() -> None:
    # UNION_ENGINE: "triton" (default) or "gluon_ws", only with UNION; explain names the kernel
    # and where it falls back; the bench's ``:uws`` suffix round-trips
    from backends.sparse_prefill.bench import format_geometry, parse_geometry
    from backends.sparse_prefill.config import describe_path

    cfg = {**BASE, "UNION": 300, "DENSE_TILE": "128x64x8x2", "UNION_ENGINE": "gluon_ws"}
    validate_config(cfg, 6, 256)
    text = describe_path(cfg)
    assert "attention: the warp-specialized Gluon kernel (sm_90, 16-bit K/V, head_dim 256; " \
        "the Triton union kernel elsewhere)" in text, text
    assert "warp-specialized" not in describe_path({**cfg, "UNION_ENGINE": "triton"})
    assert "under the previous step's PV MMAs" not in text
    lap = describe_path({**cfg, "UNION_ENGINE": "gluon_ws_overlap"})
    assert "attention: the warp-specialized Gluon kernel, each step's softmax under the " \
        "previous step's PV MMAs (sm_90" in lap, lap
    two = describe_path({**cfg, "UNION_ENGINE": "gluon_ws_2wg"})
    assert "attention: the warp-specialized Gluon kernel, two consumer warpgroups of 64 " \
        "lines (sm_90" in two, two
    with pytest.raises(ConfigError, match=r"UNION_ENGINE='gluon_ws' runs the union tiles, "
                                          r"and this config has none \(UNION=0\): set UNION"):
        validate_config({**BASE, "UNION_ENGINE": "gluon_ws"}, 6, 256)
    with pytest.raises(ConfigError, match=r"UNION_ENGINE='cuda': expected one of"):
        validate_config({**cfg, "UNION_ENGINE": "cuda"}, 6, 256)
    for sfx, engine in (("uws", "gluon_ws"), ("uwso", "gluon_ws_overlap"),
                        ("uws2", "gluon_ws_2wg")):
        geo = parse_geometry(f"8x16x1x2:rev:o32:uc:{sfx}:dense250:union300:ut128x64x8x2:ud60")
        assert geo["UNION_ENGINE"] == engine
        assert parse_geometry(format_geometry(geo)) == geo


def test_union_ws_scope_names_what_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # union_ws.unsupported: None only for sm_90, 16-bit K/V, head_dim 256 and 128-line tiles of
    # 64 positions filled by the rows' heads; otherwise the reason (which explain's fallback logs)
    from types import SimpleNamespace

    from backends.sparse_prefill import union_ws

    if union_ws._IMPORT_ERROR is not None:
        pytest.skip(f"this Triton has no Gluon: {union_ws._IMPORT_ERROR}")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cap = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: cap[0])

    def ask(dtype: Any = torch.bfloat16, d: int = 256, hp: int = 8, rp: int = 16,
            bm: int = 128, bn: int = 64, dev: str = "cuda") -> str | None:
        q = SimpleNamespace(device=torch.device(dev), shape=(64, 6, d))
        k = SimpleNamespace(dtype=dtype)
        return union_ws.unsupported(q, k, hp, rp, bm, bn)

    assert ask() is None and ask(torch.float16) is None
    assert "float32" in ask(torch.float32)
    assert "head_dim 128" in ask(d=128)
    assert "TILE_HEADS='pow2'" in ask(rp=21, hp=6)   # exact-head tiles: 126 of 128 lines
    assert "64 positions" in ask(bn=32)
    assert "sm_90" in ask(dev="cpu")
    cap[0] = (10, 0)
    assert "sm_90" in ask()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter" in ask()


def test_union_ws_off_a_gpu_falls_back_to_the_triton_union_kernel(
        poisoned: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    # UNION_ENGINE="gluon_ws" where the Gluon kernel cannot run (the interpreter, CPU tensors):
    # the Triton union kernel runs, outputs and paths are the rule's and equal to the Triton
    # engine's, and the reason is logged once
    q, k, v, idx, lengths = _shared_case(4, group=6, hkv=1, dtype=torch.float16)
    want = _tile_paths(idx, lengths, k.shape[0], _rp("32x16x4x2", 6), 250)
    assert UNION in want
    cfg = {**BASE, "UNION": 250, "DENSE_TILE": "32x16x4x2"}
    base_out, _ = _run(q, k, v, idx, cfg, lengths=lengths)
    with caplog.at_level("WARNING", logger="kreg"):
        tile_kernels._WS_LOGGED.clear()
        ws_out, _ = _run(q, k, v, idx, {**cfg, "UNION_ENGINE": "gluon_ws"}, lengths=lengths)
        _run(q, k, v, idx, {**cfg, "UNION_ENGINE": "gluon_ws"}, lengths=lengths)
        others = [_run(q, k, v, idx, {**cfg, "UNION_ENGINE": e}, lengths=lengths)[0]
                  for e in ("gluon_ws_overlap", "gluon_ws_2wg")]
    assert [p.tolist() for p in poisoned] == [want] * 5
    assert all(torch.equal(o, base_out) for o in (ws_out, *others))
    assert caplog.text.count("the Triton union kernel runs instead") == 1, caplog.text
    assert "UNION_ENGINE='gluon_ws'" in caplog.text, caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not _wgmma_gpu(), reason="UNION_ENGINE='gluon_ws' needs an sm_90 GPU")
@pytest.mark.parametrize("indices", ["topk", "walk"])
@pytest.mark.parametrize("kind,dtype,cfg_name", [
    ("prefill", "bfloat16", "union"), ("prefill", "float16", "union"),
    ("prefill", "bfloat16", "policy"), ("chunk", "bfloat16", "policy")])
@pytest.mark.parametrize("engine", ["gluon_ws", "gluon_ws_overlap", "gluon_ws_2wg"])
def test_gpu_union_ws_against_the_triton_union_kernel(kind: str, dtype: str, cfg_name: str,
                                                      indices: str, engine: str,
                                                      poisoned: list[Any]) -> None:
    # the union tiles on the warp-specialized kernel (in order, with the softmax under the
    # previous step's PV MMAs, two consumers) against the same config on the Triton union
    # kernel: "union", prefill union tiles alone (128x64x8x2, the CUDA pre-pass) at 4096 rows
    # and KV 4096 (253 / 189 of 256 tiles union on top-k rows / the walk); "policy", the H200
    # family's group-6 config (prefill: dense + union tiles with UNION_DENSE=60 at 8192 rows
    # and KV 8192, where 218 of 512 tiles go union on top-k rows: at KV 4096 none do; chunk:
    # union tiles over positions at 4096 rows, KV 16384). The same tiles' paths, every output
    # within the dtype's bound of the fp32 reference and of the Triton kernel's (same
    # arithmetic, another summation order); then a NaN V row in a slot of a union tile that
    # only some of its rows select: the tile hands back (FLAG 0) and the gathering kernel
    # computes it by the op's rules
    from backends.sparse_prefill import union_ws
    from backends.sparse_prefill.bench import BenchCase, make_inputs, parse_geometry
    from plugins.nvidia_hopper import H200_UNION_CONFIGS

    if cfg_name == "union":
        base = parse_geometry("8x16x1x2:rev:split2:v2:lean:o32:union300:dt128x64x8x2:uc")
        rows = kv = 4096
    else:
        base = dict(H200_UNION_CONFIGS[(kind, 6)])
        rows, kv = (8192, 8192) if kind == "prefill" else (4096, 16384)
        if kind == "prefill" and indices == "walk":
            pytest.skip("the policy's prefill tiles on the walk stay dense or gathered")
    inp = make_inputs(BenchCase(kind=kind, group_size=6, kv_heads=1, total_q=rows, kv_len=kv,
                                indices=indices, dtype=dtype), "cuda")
    q, k, v, idx, kw = inp["q"], inp["k"], inp["v"], inp["indices"], inp["kwargs"]
    ws = {**base, "UNION_ENGINE": engine}
    assert union_ws.unsupported(q, k, 8, 16, 128, 64) is None
    ref = sparse_prefill_reference(q, k, v, idx, out_dtype=torch.float32, **kw)
    tri = sparse_prefill_triton(q, k, v, idx, config=base, **kw)
    got = sparse_prefill_triton(q, k, v, idx, config=ws, **kw)
    torch.cuda.synchronize()
    tri_paths, ws_paths = (p.tolist() for p in poisoned[-2:])
    assert ws_paths == tri_paths
    if indices == "topk" or cfg_name == "union":
        assert ws_paths.count(UNION) > 0, ws_paths
    assert compare(got, ref) is None
    bound = error_bound(getattr(torch, dtype))
    assert (got.float() - ref).abs().max().item() <= bound
    assert (got.float() - tri.float()).abs().max().item() <= bound
    # NaN V in a slot some union tile's rows select and others do not (prefill: the ids are
    # slots; chunk ids are positions)
    if kind == "chunk" or UNION not in ws_paths:
        return
    t = ws_paths.index(UNION)
    ids = idx[t * 16: (t + 1) * 16]   # RP 16: group 6 on 128-line tiles
    first = set(ids[0].tolist())
    lone = next((s for s in ids[-1].tolist() if 0 <= s < k.shape[0] and s not in first), None)
    assert lone is not None, "the tile's last row adds nothing to its first"
    v2 = v.clone()
    v2[lone] = float("nan")
    ref2 = sparse_prefill_reference(q, k, v2, idx, out_dtype=torch.float32, **kw)
    got2 = sparse_prefill_triton(q, k, v2, idx, config=ws, **kw)
    torch.cuda.synchronize()
    assert poisoned[-1].tolist()[t] == GATHER   # handed back
    assert compare(got2, ref2) is None
