"""The union path's one-kernel pre-pass (``backends/sparse_prefill/cuda/union_prep.cu``,
``UNION_PREP="cuda"``) run on the CPU under the CUDA emulator (``tests/kernels/cuda_emu``).

Each CUDA thread is a fiber switched at every barrier, warp collective, global load and shared
atomic in a random order (or a few threads far ahead); the emulator reports divergent warp
collectives, deadlocks, reads outside the ids and writes past shared memory or the outputs
(poisoned first). The kernel's outputs (every tile's FLAG and USZ, a union tile's slots and its
rows' 16-bit multiplicities) are compared with an independent NumPy model of the Triton
pre-pass's rules (``tile_kernels._union_gate`` / ``_mark`` / ``_size`` / ``_count``), and one
test runs those four Triton kernels under the interpreter on the same inputs: the three agree
on top-k shaped rows, the walk, dense tiles, chunk positions through a page table, tiles that
span two requests, empty tiles and rows, and -1 / negative / out-of-range / duplicate /
past-length entries; each case both with the rows' statistics given (LO / HI / NV, as beside
DENSE tiles) and counted by the kernel itself (without them, as without DENSE). The GPU test is
in ``test_sparse_prefill_union.py``.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends.sparse_prefill import union_prep  # noqa: E402
from backends.sparse_prefill.indices import topk_indices, walk_indices  # noqa: E402

from kernel_helpers import build_emu, needs_cxx  # noqa: E402

POISON = 0x77777777


def _build(out: Path, source: Path, *defines: str) -> Path:
    return build_emu("union_driver.cpp", out, source, *defines)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("emu") / "union_emu", union_prep.SOURCE)


class Case:
    """One pre-pass call's inputs (NumPy int32), with the row statistics ``_row_stats`` gives."""

    def __init__(self, ids: np.ndarray, lens: np.ndarray | None, num_ids: int, rp: int, *,
                 pct: int = 300, dense_span: int = 0, row_req: np.ndarray | None = None,
                 pt: np.ndarray | None = None, page_size: int = 1, tile0: int = 0,
                 ntiles: int | None = None, union_dense: int = 0) -> None:
        self.ids = np.ascontiguousarray(ids, dtype=np.int32)
        self.total_q, self.topk = self.ids.shape
        self.lens = None if lens is None else np.asarray(lens, dtype=np.int32)
        self.num_ids, self.rp, self.pct, self.dense_span = num_ids, rp, pct, dense_span
        self.union_dense = union_dense
        self.row_req = None if row_req is None else np.asarray(row_req, dtype=np.int32)
        self.pt = np.zeros((1, 1), np.int32) if pt is None else np.asarray(pt, dtype=np.int32)
        self.page_size = page_size
        self.tiles = -(-self.total_q // rp)
        self.tile0 = tile0
        self.ntiles = self.tiles - tile0 if ntiles is None else ntiles
        umax = max(2, min(num_ids, -(-self.topk * pct // 100)))
        self.umax = umax + (umax & 1)
        self.valid = [self._valid(r) for r in range(self.total_q)]
        self.lo = np.array([v.min() if len(v) else num_ids for v in self.valid], np.int32)
        self.hi = np.array([v.max() if len(v) else -1 for v in self.valid], np.int32)
        self.nv = np.array([len(v) for v in self.valid], np.int32)
        # DENSE's FLAG (1 for the tiles its rule takes), as the dense kernel leaves it; with
        # UNION_DENSE the pre-pass runs first and must write every tile of its chunk: poison
        self.flag_in = np.array([1 if self._dense(t) else 0 for t in range(self.tiles)],
                                np.int32)
        if union_dense:
            self.flag_in[tile0: tile0 + self.ntiles] = POISON

    def row_len(self, r: int) -> int:
        if r >= self.total_q:
            return 0
        return self.topk if self.lens is None else int(np.clip(self.lens[r], 0, self.topk))

    def _valid(self, r: int) -> np.ndarray:
        e = self.ids[r, : self.row_len(r)]
        return e[(e >= 0) & (e < self.num_ids)]

    def _rows(self, t: int) -> list[int]:
        return [r for r in range(t * self.rp, t * self.rp + self.rp) if r < self.total_q]

    def _dense(self, t: int) -> bool:
        if not self.dense_span:
            return False
        rows = self._rows(t)
        lo, hi = int(self.lo[rows].min()), int(self.hi[rows].max())
        nv = int(self.nv[rows].sum())
        return max(hi - lo + 1, 0) * self.rp * 100 <= nv * self.dense_span

    def model(self) -> tuple[np.ndarray, dict[int, int], dict[int, list[int]],
                             dict[int, np.ndarray]]:
        """(FLAG, USZ, slots, counts) by the Triton pre-pass's rules (module doc); USZ, slots
        and counts for the tiles in [tile0, tile0 + ntiles), counts as [RP, U] ints. With
        UNION_DENSE a tile DENSE's rule takes is tried too: union when it also has U * 100 <=
        span * union_dense, else dense (FLAG 1), as is one the gate turns away, one with no
        valid entries, and one whose largest row has more valid entries (duplicates counted)
        than union_dense % of the span (never gated)."""
        flag, usz, slots, counts = self.flag_in.copy(), {}, {}, {}
        for t in range(self.tile0, self.tile0 + self.ntiles):
            rows = self._rows(t)
            vs = [self.valid[r] for r in rows]
            nv = sum(len(v) for v in vs)
            lo = min((int(v.min()) for v in vs if len(v)), default=2**31 - 1)
            hi = max((int(v.max()) for v in vs if len(v)), default=-1)
            dense = self._dense(t)
            ud = self.union_dense if dense else 0
            # a dense tile whose largest row alone is past UNION_DENSE's share stays ungated
            widest = max((len(v) for v in vs), default=0)
            go = hi >= lo and (not dense or (ud > 0 and widest * 100 <= (hi - lo + 1) * ud))
            mixed = self.row_req is not None and \
                self.row_req[rows[0]] != self.row_req[rows[-1]]
            usz[t] = 0
            if dense and self.union_dense:
                flag[t] = 1   # unless the union takes it below
            if not go or mixed:
                if not dense:
                    flag[t] = 0 if go else 2
                continue
            first = set(vs[0].tolist())
            hits = sum(int(x) in first for x in vs[-1])
            est = len(vs[0]) + (len(rows) - 1) * max(len(vs[-1]) - hits, 0)
            union = sorted(set(np.concatenate(vs).tolist()))
            if est * self.rp * 100 > 2 * nv * self.pct or \
                    len(union) * self.rp * 100 > nv * self.pct or \
                    (dense and len(union) * 100 > (hi - lo + 1) * ud):
                flag[t] = 1 if dense else 0
                continue
            flag[t], usz[t] = 2, len(union)
            where = {x: i for i, x in enumerate(union)}
            if self.row_req is not None:
                pt_row = self.pt[self.row_req[rows[0]]]
                union = [int(pt_row[x // self.page_size]) * self.page_size + x % self.page_size
                         for x in union]
            slots[t] = union
            c = np.zeros((self.rp, len(where)), np.int64)
            for i, v in enumerate(vs):
                for x, m in Counter(v.tolist()).items():
                    c[i, where[x]] = m
            counts[t] = c
        return flag, usz, slots, counts


def run_emu(binary: Path, case: Case, tmp: Path, *, mode: int = 0, seed: int = 1,
            count_words: int = 0, stats: bool | str = True
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The kernel's (FLAG, USZ, slots [ntiles, umax], counts [ntiles, RP, umax / 2], the
    row statistics it wrote out [3, total_q] (POISON where not written)) and the emulator's
    error count. ``count_words``: the shared count words (at least, and for 0, one row's worst
    case, umax / 2; :func:`count_groups` says how many rows they count at once). ``stats``
    False: the kernel gets no row statistics (LO / HI / NV) and takes its tiles' from their
    ids, as the host launches it without DENSE tiles; "out": the same, and it writes them out
    (as with UNION_DENSE, whose dense kernels read them)."""
    c = case
    rr = np.zeros(c.total_q, np.int32) if c.row_req is None else c.row_req
    lens = np.zeros(c.total_q, np.int32) if c.lens is None else c.lens
    head = np.array([c.total_q, c.topk, c.topk, c.lens is not None, c.num_ids, c.rp, c.tile0,
                     c.ntiles, c.dense_span, c.pct, c.umax, c.row_req is not None, c.page_size,
                     c.pt.shape[1], c.pt.size, c.tiles, c.union_dense], np.int32)
    fin, fout = tmp / "in.bin", tmp / "out.bin"
    fin.write_bytes(b"".join(a.tobytes() for a in (head, c.ids, lens, c.lo, c.hi, c.nv,
                                                   c.flag_in, rr, c.pt)))
    res = subprocess.run([str(binary), str(fin), str(fout), str(mode), str(count_words),
                          "2" if stats == "out" else str(int(bool(stats)))],
                         capture_output=True, text=True, timeout=600, check=False,
                         env={**os.environ, "KREG_EMU_SEED": str(seed)})
    assert res.returncode == 0, res.stderr
    data = np.fromfile(fout, dtype=np.int32)
    n_sl, n_cnt = c.ntiles * c.umax, c.ntiles * c.rp * (c.umax // 2)
    assert len(data) == 2 * c.tiles + n_sl + n_cnt + 3 * c.total_q + 1
    errors = int(data[-1])
    assert (errors == 0) == (res.stderr == ""), res.stderr
    flag, usz = data[: c.tiles], data[c.tiles: 2 * c.tiles]
    slots = data[2 * c.tiles: 2 * c.tiles + n_sl].reshape(c.ntiles, c.umax)
    end = 2 * c.tiles + n_sl + n_cnt
    cnt = data[2 * c.tiles + n_sl: end].reshape(c.ntiles, c.rp, c.umax // 2)
    written = data[end: -1].reshape(3, c.total_q)
    if stats != "out":
        assert (written == POISON).all(), "row statistics written without being asked for"
    else:   # every row of the chunk's tiles (mismatches() checks the values)
        rows = written[:, c.tile0 * c.rp: min((c.tile0 + c.ntiles) * c.rp, c.total_q)]
        assert (rows != POISON).all(), "row statistics asked for and not written"
    return flag, usz, slots, cnt, written, errors


def count_groups(case: Case, count_words: int) -> dict[int, int]:
    """Rows the kernel counts at once in each union tile (the kernel's ``grp``): as many rows'
    ceil(U / 2) words as ``count_words`` hold (at least umax / 2, as the driver and
    ``kreg_union_prep`` make it), one at least, RP at most."""
    cw = max(count_words, case.umax // 2)
    return {t: min(case.rp, max(1, cw // ((u + 1) // 2)))
            for t, u in case.model()[1].items() if u}


def unpack(words: np.ndarray, u: int) -> np.ndarray:
    """[RP, ceil(u / 2)] words of two 16-bit fields -> [RP, u] counts."""
    w = words.astype(np.int64) & 0xFFFFFFFF
    both = np.stack([w & 0xFFFF, w >> 16], axis=-1).reshape(w.shape[0], -1)
    return both[:, :u]


def mismatches(case: Case, got: tuple[np.ndarray, ...]) -> list[str]:
    """What the kernel's outputs get wrong against the model (empty when exact)."""
    flag, usz, slots, cnt = got[:4]
    want_flag, want_usz, want_slots, want_cnt = case.model()
    bad = [f"FLAG[{t}] {flag[t]} != {want_flag[t]}" for t in range(case.tiles)
           if flag[t] != want_flag[t]]
    for t, u in want_usz.items():
        lt = t - case.tile0
        if usz[t] != u:
            bad.append(f"USZ[{t}] {usz[t]} != {u}")
        elif t in want_slots:
            if slots[lt, :u].tolist() != want_slots[t]:
                bad.append(f"tile {t}: slots differ")
            if not np.array_equal(unpack(cnt[lt, :, : (u + 1) // 2], u), want_cnt[t]):
                bad.append(f"tile {t}: counts differ")
    for t in range(case.tiles):
        if not case.tile0 <= t < case.tile0 + case.ntiles and usz[t] != POISON:
            bad.append(f"USZ[{t}] written outside the chunk")
    written = got[4] if len(got) == 6 else None   # run_emu's (the Triton pre-pass: 4)
    if written is not None and not (written == POISON).all():   # statistics written out
        mine = np.zeros(case.total_q, bool)
        mine[case.tile0 * case.rp: (case.tile0 + case.ntiles) * case.rp] = True
        for name, row, want in zip(("LO", "HI", "NV"), written, (case.lo, case.hi, case.nv),
                                   strict=True):
            bad += [f"{name}[{r}] {row[r]} != {want[r]}" for r in np.flatnonzero(mine)
                    if row[r] != want[r]]
            bad += [f"{name}[{r}] written outside the chunk" for r in np.flatnonzero(~mine)
                    if row[r] != POISON]
    return bad


def kinds(case: Case) -> Counter:
    flag, usz, *_ = case.model()
    return Counter("dense" if flag[t] == 1 else "gather" if flag[t] == 0 else
                   "union" if usz.get(t, 0) else "empty" for t in usz)


def _causal(rows: int, width: int) -> torch.Tensor:
    return torch.arange(width - rows + 1, width + 1, dtype=torch.int64)


def nasty(ids: np.ndarray, num_ids: int, seed: int) -> np.ndarray:
    """-1, negative and out-of-range entries and duplicates sprinkled over a copy of ``ids``."""
    rng = np.random.default_rng(seed)
    out = ids.copy()
    rows, k = out.shape
    for r in rng.choice(rows, size=max(1, rows // 3), replace=False):
        j = rng.integers(0, k, size=4)
        out[r, j[0]] = -1
        out[r, j[1]] = -7
        out[r, j[2]] = num_ids + int(rng.integers(0, 5))
        out[r, j[3]] = out[r, (j[3] + 1) % k]   # a slot listed twice counts twice
    return out


@pytest.mark.parametrize("stats", [True, False, "out"])
@needs_cxx
@pytest.mark.parametrize("rp,mode", [(8, 0), (16, 1), (4, 0)])
@pytest.mark.parametrize("groups", ["fewest", "three", "all"])
def test_topk_shaped_rows_with_nasty_entries(emu, tmp_path, rp, mode, groups, stats):
    """Rows an indexer would emit (neighbours share most slots), with -1, negative,
    out-of-range, duplicate and past-length entries, rows past total_q, empty and clamped
    lengths: mostly union tiles, exact against the model. The rows' counts in groups of as
    many rows as one row's worst-case words hold (umax / 2 words: 2 rows here), of 3 rows
    (the largest union's words x 3: the tile's last group short) and every row at once."""
    topk, width, rows = 80, 240, 7 * rp + 3
    ids, lens = topk_indices(_causal(rows, width), topk)
    ids = nasty(ids.numpy(), width, seed=rp)
    lens = lens.numpy().copy()
    lens[1], lens[2], lens[5] = 0, topk + 9, -3
    lens[rows // 2] = topk // 3   # its valid-looking entries past the length never count
    case = Case(ids, lens, width, rp)
    assert kinds(case)["union"] >= 4, kinds(case)
    half = max((u + 1) // 2 for u in case.model()[1].values())
    count_words = {"fewest": 0, "three": 3 * half, "all": 1 << 14}[groups]
    grp = count_groups(case, count_words)
    if groups == "fewest":
        assert set(grp.values()) == {2}, grp
    elif groups == "three":
        assert min(grp.values()) == 3 and any(rp % g for g in grp.values()), grp
    else:
        assert set(grp.values()) == {rp}, grp
    got = run_emu(emu, case, tmp_path, mode=mode, seed=rp, count_words=count_words, stats=stats)
    assert got[-1] == 0
    assert mismatches(case, got) == []


@pytest.mark.parametrize("stats", [True, False, "out"])
@needs_cxx
@pytest.mark.parametrize("count_words,groups", [(0, 1), (1 << 14, 4)])
def test_ascending_rows_with_repeats(emu, tmp_path, count_words, groups, stats):
    """Rows of 2,000 ascending entries, as an indexer emits them: lanes of a warp land on the
    same bitmap word and the same count word (same-address shared atomics), a slot listed 3
    times in a row (three lanes add to one 16-bit field), a duplicate across neighbouring
    lanes, both fields of a count word hit, and the nasty entries. A union of ~2,230 slots
    needs more than half of umax / 2 words a row: counted a row at a time with the fewest
    count words, all 4 rows at once with 16K."""
    topk, rp = 2000, 4
    width = topk + topk // 2
    ids, lens = topk_indices(_causal(3 * rp + 1, width), topk)
    ids = nasty(ids.numpy(), width, seed=5)
    ids[1, 100:103] = ids[1, 100]   # three in a row, lanes 100-102 of one warp
    ids[6, 40] = ids[6, 39]         # a duplicate on two neighbouring lanes
    lens = lens.numpy().copy()
    lens[3] = topk - 7
    case = Case(ids, lens, width, rp)
    assert kinds(case)["union"] >= 2, kinds(case)
    assert set(count_groups(case, count_words).values()) == {groups}
    assert case.model()[3][0][1].max() >= 3   # the triple counted in tile 0's row 1
    got = run_emu(emu, case, tmp_path, mode=1, count_words=count_words, stats=stats)
    assert got[-1] == 0
    assert mismatches(case, got) == []


@pytest.mark.parametrize("stats", [True, False, "out"])
@needs_cxx
@pytest.mark.parametrize("lpt", [8, 1])
def test_rows_longer_than_one_batch_of_loads(tmp_path, lpt, stats):
    """Rows of more entries than one batch of the CTA's id loads (LPT x 512 threads; the
    product's LPT 8 holds rows of up to 4096 in one batch): 4,200 entries in the product, and
    600 with one load a thread in flight (LPT 1), so a row takes two to five batches and a
    thread's last batch is partly past the row's length."""
    binary = _build(tmp_path / f"union_emu_lpt{lpt}", union_prep.SOURCE,
                    f"-DUNION_PREP_LPT={lpt}")
    topk = 4200 if lpt == 8 else 600
    width, rp = topk + topk // 3, 4
    ids, lens = topk_indices(_causal(2 * rp + 1, width), topk)
    ids = nasty(ids.numpy(), width, seed=lpt)
    lens = lens.numpy().copy()
    lens[2] = topk - 5
    case = Case(ids, lens, width, rp)
    assert kinds(case)["union"] >= 2, kinds(case)
    got = run_emu(binary, case, tmp_path, mode=1, seed=lpt, stats=stats)
    assert got[-1] == 0
    assert mismatches(case, got) == []


@pytest.mark.parametrize("stats", [True, False, "out"])
@needs_cxx
@pytest.mark.parametrize("lpt,topk", [(8, 40), (1, 600)])
def test_the_gate_reads_the_last_row(tmp_path, lpt, topk, stats):
    """The gate estimates the union from the first and the last row only: a tile whose last
    row shares nothing with the others is gathered although its exact union (2 x topk) would
    pass, and the same tile with a last row like the first goes union. Both forms of the gate:
    rows of one batch of loads (both rows' ids loaded together) and longer ones (LPT 1)."""
    binary = _build(tmp_path / f"union_emu_gate{lpt}", union_prep.SOURCE,
                    f"-DUNION_PREP_LPT={lpt}")
    rp, rng = 8, np.random.default_rng(topk)
    width = 6 * topk
    a = np.sort(rng.choice(2 * topk, size=topk, replace=False))
    b = np.sort(rng.choice(np.arange(3 * topk, 5 * topk), size=topk, replace=False))
    ids = np.stack([a] * (rp - 1) + [b] + [a] * rp)   # tile 0 ends in b, tile 1 in a
    case = Case(ids, None, width, rp)
    flag = case.model()[0]
    assert flag.tolist() == [0, 2], flag
    got = run_emu(binary, case, tmp_path, mode=1, seed=lpt, stats=stats)
    assert got[-1] == 0
    assert mismatches(case, got) == []


@pytest.mark.parametrize("stats", [True, False, "out"])
@needs_cxx
def test_a_tile_whose_ids_end_on_word_boundaries(emu, tmp_path, stats):
    """A tile's least id the last bit of a bitmap word (31) and its greatest the first of one
    (96, alone in its word): the bitmap's span must hold both words, whether the statistics
    come from LO / HI or from the kernel's own pass over the ids."""
    rp, num_ids = 4, 130
    base = np.array([31, 40, 41, 50, 63, 64, 70], np.int32)
    ids = np.stack([np.append(base, 96 if r == 2 else 65) for r in range(2 * rp)])
    ids[5, 0] = -1
    case = Case(ids, None, num_ids, rp)
    assert kinds(case)["union"] == 2, kinds(case)
    assert case.model()[2][0][0] == 31 and case.model()[2][0][-1] == 96
    got = run_emu(emu, case, tmp_path, mode=1, seed=6, stats=stats)
    assert got[-1] == 0
    assert mismatches(case, got) == []


@pytest.mark.parametrize("stats", [True, False, "out"])
@needs_cxx
def test_walk_tiles_are_gated_to_the_gathering_kernel(emu, tmp_path, stats):
    """The seed's walk (neighbouring rows share little): the gate sends tiles to the gathering
    kernel (its ramp's tiles, which select nearly the same prefix, still go union)."""
    ids, lens = walk_indices(_causal(40, 400), 96)
    case = Case(ids.numpy(), lens.numpy(), 400, 8, pct=150)
    assert kinds(case)["gather"] >= 3, kinds(case)
    got = run_emu(emu, case, tmp_path, mode=1, stats=stats)
    assert got[-1] == 0
    assert mismatches(case, got) == []


@needs_cxx
def test_dense_tiles_keep_their_flag_and_a_chunk_of_tiles(emu, tmp_path):
    """With DENSE, its tiles keep FLAG 1 (USZ 0); a later chunk of tiles (tile0 > 0) writes
    only its own tiles; without DENSE an all-invalid tile is union with U = 0."""
    topk, width = 64, 200
    ids = topk_indices(_causal(48, width), topk)[0].numpy().copy()
    ids[:8] = np.arange(64, dtype=np.int32)[None, :] + np.arange(8, dtype=np.int32)[:, None]
    ids[40:48] = -1   # an empty tile
    case = Case(ids, None, width, 8, dense_span=150, tile0=0)
    assert case.flag_in[0] == 1 and case.flag_in.sum() >= 1
    got = run_emu(emu, case, tmp_path)
    assert got[-1] == 0 and mismatches(case, got) == []
    assert got[0][0] == 1 and got[0][5] == 1   # DENSE's rule takes an empty tile too
    later = Case(ids, None, width, 8, dense_span=150, tile0=2, ntiles=3)
    got = run_emu(emu, later, tmp_path, seed=3)
    assert got[-1] == 0 and mismatches(later, got) == []
    alone = Case(ids, None, width, 8)
    for stats in (True, False, "out"):
        got = run_emu(emu, alone, tmp_path, mode=1, seed=4, stats=stats)
        assert got[-1] == 0 and mismatches(alone, got) == []
        assert got[0][5] == 2 and got[1][5] == 0


def _widest_row_past_the_share(ids: np.ndarray, r0: int, ud: int) -> None:
    """Rows ``r0 .. r0 + 8`` of ``ids`` (32 entries a row): ten slots of the span 40-69, the
    same in every row, each listed three times or more. DENSE=250 takes the tile, and UNION's
    gate, its rule and UNION_DENSE's ``U * 100 <= span * ud`` all pass (U = 10, span 30), but
    each row's 32 valid entries are more than ``ud`` % of the span: UNION_DENSE keeps the tile
    dense without gating it."""
    ten = np.array([40, 43, 46, 49, 52, 55, 58, 61, 64, 69], np.int32)
    ids[r0: r0 + 8] = np.concatenate([np.repeat(ten, 3), ten[[0, -1]]])
    span, u = 30, 10
    assert u * 8 * 100 <= 8 * 32 * 300 and u * 100 <= span * ud < 32 * 100


@needs_cxx
@pytest.mark.parametrize("ud,mode", [(70, 0), (80, 1), (90, 0)])
def test_union_dense_decides_dense_tiles_too(emu, tmp_path, ud, mode):
    """UNION_DENSE: the pre-pass runs before the dense kernels and writes every tile's FLAG
    (the input FLAG is poison). On a causal ramp of top-k rows (a window of 4 recent
    positions) DENSE=250 takes the first 8 tiles; of those, the ones whose union is at most
    ``ud`` % of their span go union, the others stay dense (1), as does an empty tile; the
    rest go union or gathered by UNION's rule. Nasty entries throughout; then a later chunk of
    tiles (tile0 > 0), which writes only its own."""
    from backends.sparse_prefill.indices import TopkParams

    topk, rows, width, rp = 32, 88, 104, 8
    ids, lens = topk_indices(_causal(rows, width), topk, TopkParams(window=4))
    ids = nasty(ids.numpy(), width, seed=ud)
    ids[16:24] = -1   # tile 2: no valid entry (DENSE's rule takes it: span 0)
    # tile 3: seven rows of the even slots of a span and a last row of its odd ones: dense,
    # and the gate turns it away (estimate 8 x 20 entries): it stays dense
    ids[24:32] = -1
    ids[24:31, :20] = np.arange(40, 80, 2, dtype=np.int32)
    ids[31, :20] = np.arange(41, 81, 2, dtype=np.int32)
    _widest_row_past_the_share(ids, 32, ud)   # tile 4: stays dense, never gated
    case = Case(ids, lens.numpy(), width, rp, dense_span=250, union_dense=ud)
    flag = case.model()[0]
    dense = [case._dense(t) for t in range(case.tiles)]
    taken = [t for t in range(case.tiles) if dense[t] and flag[t] == 2]
    kept = [t for t in range(case.tiles) if dense[t] and flag[t] == 1]
    assert {2, 3, 4} <= set(kept) and len(taken) >= 2, (flag, dense)
    assert Case(ids, lens.numpy(), width, rp, dense_span=250).model()[0][taken].tolist() == \
        [1] * len(taken)   # without UNION_DENSE they are DENSE's
    for stats in (True, "out"):   # "out": as the host runs it, the dense kernels' statistics
        got = run_emu(emu, case, tmp_path, mode=mode, seed=ud, stats=stats)
        assert got[-1] == 0
        assert mismatches(case, got) == []
    later = Case(ids, lens.numpy(), width, rp, dense_span=250, union_dense=ud, tile0=3,
                 ntiles=5)
    got = run_emu(emu, later, tmp_path, mode=1 - mode, seed=ud + 1, stats="out")
    assert got[-1] == 0
    assert mismatches(later, got) == []   # FLAG outside the chunk as it came in
    assert (later.flag_in[3:8] == POISON).all() and (got[0][3:8] != POISON).all()


@pytest.mark.parametrize("stats", [True, False, "out"])
@needs_cxx
def test_chunk_positions_through_the_page_table(emu, tmp_path, stats):
    """Chunk rows (ids are positions): the union is written as slots through the request's
    page table; a tile whose rows span two requests is gathered."""
    topk, width, page = 48, 160, 4
    a, _ = topk_indices(_causal(21, width), topk)
    b, _ = topk_indices(_causal(19, width), topk)
    ids = np.concatenate([a.numpy(), b.numpy()])
    row_req = np.array([0] * 21 + [1] * 19, np.int32)
    rng = np.random.default_rng(5)
    pages = width // page
    pt = np.stack([rng.permutation(2 * pages)[:pages] for _ in range(2)]).astype(np.int32)
    case = Case(ids, None, width, 8, row_req=row_req, pt=pt, page_size=page)
    k = kinds(case)
    assert k["union"] >= 3 and k["gather"] >= 1, k   # tile 2 holds rows 16-23: two requests
    got = run_emu(emu, case, tmp_path, mode=1, seed=9, stats=stats)
    assert got[-1] == 0
    assert mismatches(case, got) == []


def test_the_model_is_the_triton_pre_pass():
    """The NumPy model above against tile_kernels' four Triton pre-pass kernels (the
    interpreter): the same FLAG, USZ, slots and counts."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the Triton pre-pass on the CPU under TRITON_INTERPRET=1 (conftest "
                    "sets it when no GPU is present)")
    from backends.sparse_prefill import tile_kernels as tk

    topk, width, rp = 40, 120, 8
    ids, lens = topk_indices(_causal(29, width), topk)
    ids = nasty(ids.numpy(), width, seed=2)
    lens = lens.numpy().copy()
    lens[3] = 7
    cases = []
    for row_req in (None, np.array([0] * 13 + [1] * 16, np.int32)):
        pt = np.arange(2 * width, dtype=np.int32)[::-1].reshape(2, width).copy()
        cases.append(Case(ids, lens, width, rp, row_req=row_req,
                          pt=pt if row_req is not None else None))
    # UNION_DENSE: DENSE's tiles decided by the pre-pass too (a ramp of top-k rows)
    from backends.sparse_prefill.indices import TopkParams

    ramp, ramp_lens = topk_indices(_causal(88, 104), 32, TopkParams(window=4))
    ramp = nasty(ramp.numpy(), 104, seed=8)
    _widest_row_past_the_share(ramp, 32, 70)
    cases += [Case(ramp, ramp_lens.numpy(), 104, rp, dense_span=250, union_dense=ud)
              for ud in (70, 100)]
    assert [c.model()[0][4] for c in cases[2:]] == [1, 1]   # never gated: 32 entries, span 30
    assert {f for c in cases[2:] for f in c.model()[0].tolist()} == {1, 2}
    for case in cases:
        row_req = case.row_req
        width = case.num_ids
        t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in
             dict(ids=case.ids, lens=case.lens, lo=case.lo, hi=case.hi, nv=case.nv,
                  pt=case.pt, rr=case.row_req if row_req is not None else case.lo).items()}
        got = tk.union_prep_triton(
            t["ids"], t["lens"], True, (t["lo"], t["hi"], t["nv"]),
            torch.from_numpy(case.flag_in.copy()), case.dense_span, case.pct, rp, case.umax,
            width, (t["rr"], t["pt"], 1, t["pt"].stride(0)) if row_req is not None else None,
            union_dense=case.union_dense)
        flag, usz, slots, cnt = (x.numpy() for x in got)
        usz_full = usz.copy()
        assert mismatches(case, (flag, usz_full, slots, cnt)) == []


@needs_cxx
def test_negative_control_counting_waits_for_the_cleared_row(tmp_path):
    """The kernel without the barrier between clearing a row's shared counts and counting
    into them: the emulator's schedules give wrong counts (a fast thread counts into a word a
    slow one has not copied out or cleared yet)."""
    src = union_prep.SOURCE.read_text()
    line = "    __syncthreads();   // cleared before any thread counts\n"
    assert src.count(line) == 1
    (tmp_path / "union_prep.cu").write_text(src.replace(line, ""))
    binary = _build(tmp_path / "union_emu_bad", tmp_path / "union_prep.cu")
    ids, lens = topk_indices(_causal(32, 160), 64)
    case = Case(ids.numpy(), lens.numpy(), 160, 16)
    wrong = 0
    for seed in (1, 2, 3):
        got = run_emu(binary, case, tmp_path, mode=seed % 2, seed=seed)
        wrong += bool(mismatches(case, got))
    assert wrong >= 1


def test_count_words_fill_the_budget_within_the_shared_memory():
    """The count words a launch gives the kernel: COUNT_SHARED worth at the seed's shapes, at
    least one row's worst case (umax / 2), never past the shared memory beside the bitmap."""
    cw = union_prep.count_words
    assert cw(8192, 6154) == union_prep.COUNT_SHARED // 4   # KV 8K: 16 rows of a 2,355 union
    assert cw(8192, 40000) == 20000                           # one row's worst case above it
    ids = 1 << 20   # bitmap and prefixes 256 KiB: over the limit, refused before (available)
    assert union_prep.shared_bytes(ids, 2) > union_prep.MAX_SHARED
    ids = 720_896   # 176 KiB of bitmap and prefixes: the counts get what is left
    room = (union_prep.MAX_SHARED - union_prep.shared_bytes(ids, 0)) // 4
    assert 0 < room < union_prep.COUNT_SHARED // 4 and cw(ids, 6154) == room
    assert union_prep.shared_bytes(ids, 0) + 4 * cw(ids, 6154) <= union_prep.MAX_SHARED
