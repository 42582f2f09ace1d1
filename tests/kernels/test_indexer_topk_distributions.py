"""indexer_topk on every score distribution of ``backends.indexer_topk.distributions``.

The distributions module itself (names, determinism, the property each one is meant to have
at k = 2048), then the Triton kernels against the torch reference, entry by entry, on every
distribution at small sizes under the interpreter: the tie tier (a tie at the bound, taken at
once; and after a gather that overflowed the buffer), with strided score views, short, empty
and ragged rows, NaN and +-inf sprinkled in; and k = 2048 on the GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from backends.indexer_topk import distributions as D  # noqa: E402
from backends.indexer_topk.reference import (  # noqa: E402
    indexer_topk_reference,
    score_keys,
    topk_mismatches,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


# ------------------------------------------------------------------------- distributions.py

def test_names_and_descriptions():
    for name in ("randn", "ties", "zeros", "recent", "lowbits", "relu", "quant256"):
        assert name in D.DISTRIBUTIONS
    assert len(set(D.DISTRIBUTIONS)) == len(D.DISTRIBUTIONS)
    for name in D.DISTRIBUTIONS:
        d = D.describe(name)
        assert isinstance(d, str) and d and "\n" not in d
    with pytest.raises(ValueError, match=r"randn.*ties"):
        D.describe("nope")
    with pytest.raises(ValueError, match="known: randn"):
        D.make_scores("nope", 2, 8)


@pytest.mark.parametrize("name", D.DISTRIBUTIONS)
def test_shape_dtype_and_seed(name):
    a = D.make_scores(name, 3, 1000, seed=5)
    assert a.shape == (3, 1000) and a.dtype == torch.float32 and a.device.type == "cpu"
    assert torch.equal(a.view(torch.int32), D.make_scores(name, 3, 1000, seed=5).view(torch.int32))
    if name != "zeros":
        assert not torch.equal(a, D.make_scores(name, 3, 1000, seed=6))
    h = D.make_scores(name, 2, 64, dtype=torch.float16, seed=1)
    assert h.dtype == torch.float16 and h.shape == (2, 64)
    assert D.make_scores(name, 0, 16).shape == (0, 16)
    assert D.make_scores(name, 2, 0).shape == (2, 0)


def _kth_tie(scores, k):
    """(k-th largest key, how many keys equal it, how many are larger) per row."""
    keys = score_keys(scores)
    kth = keys.topk(k, dim=1).values[:, -1:]
    return kth, (keys == kth).sum(1), (keys > kth).sum(1)


def test_each_distribution_stresses_what_it_claims():
    k, n = 2048, 131072
    kth, eq, gt = _kth_tie(D.make_scores("ties", 2, n), k)
    assert bool((eq > 8 * k).all()) and bool((gt < k).all())       # the k-th inside a big tie
    z = D.make_scores("zeros", 2, n)
    assert bool((z == 0).all()) and bool(torch.signbit(z).any()) and bool((~torch.signbit(z)).any())
    kth, eq, gt = _kth_tie(D.make_scores("relu", 2, n), k)
    assert bool((kth == 0).all()) and bool((eq > n // 2).all()) and bool((gt > k // 4).all())
    r10 = D.make_scores("relu10", 2, n)
    assert 0.05 < float((r10 > 0).float().mean()) < 0.15
    q = D.make_scores("quant256", 2, n)
    assert q.unique().numel() == 256
    kth, eq, gt = _kth_tie(q, k)
    assert bool((eq > 256).all())
    f8 = D.make_scores("fp8", 2, n)
    assert 100 < f8.unique().numel() <= 256
    lb = D.make_scores("lowbits", 2, n).view(torch.int32)
    assert bool(((lb >> 16) == (0x3F800000 >> 16)).all()) and lb.unique().numel() > 30000
    rec = D.make_scores("recent", 2, n)
    assert rec[:, -4096:].abs().mean() > 6 * rec[:, :-4096].abs().mean()
    ramp = D.make_scores("ramp", 1, n)
    assert bool((ramp[0, 1000:] > ramp[0, :-1000]).all())


# ------------------------------------------------------------------------- kernels (CPU/GPU)

@pytest.fixture()
def tk(monkeypatch):
    """The Triton module with poisoned outputs and workspace (every entry starts INT32_MAX)."""
    pytest.importorskip("triton")
    from backends.indexer_topk import triton_kernels

    monkeypatch.setattr(triton_kernels, "_POISON", 2147483647)
    return triton_kernels


# Small geometries whose tiers match the H200 defaults' at 131072 keys: a tie at the bound
# (the tie tier at once) on the fused path with 32- and 16-bit maxima, one or two programs a
# row; a buffer the gathers overflow (the tie tier after an overflow, or the row tier); the
# four-launch path (its tie tier after the placement's overflow).
GEOMS = {
    "fused32": {"FUSED": 1, "GROUP": 4, "GROUP2": 2, "PLACE_KEYS": 64, "CAND_TILE": 64,
                "CAND_CAP": 256, "BOUND_SLACK": 4, "COMPACT_TILE": 32, "ROW_SPLIT": 1,
                "GMAX_BITS": 32},
    "fused16_half": {"FUSED": 1, "GROUP": 4, "GROUP2": 2, "PLACE_KEYS": 64, "CAND_TILE": 64,
                     "CAND_CAP": 256, "BOUND_SLACK": 4, "COMPACT_TILE": 32, "ROW_SPLIT": 1,
                     "GMAX_BITS": 16},
    "fused_split": {"FUSED": 1, "GROUP": 4, "GROUP2": 4, "PLACE_KEYS": 64, "CAND_TILE": 64,
                    "CAND_CAP": 256, "BOUND_SLACK": 4, "COMPACT_TILE": 32, "ROW_SPLIT": 2},
    "fused_overflow": {"FUSED": 1, "GROUP": 4, "GROUP2": 2, "PLACE_KEYS": 32, "CAND_TILE": 16,
                       "CAND_CAP": 32, "BOUND_SLACK": 4, "COMPACT_TILE": 32, "ROW_SPLIT": 2},
    "fused16_overflow": {"FUSED": 1, "GROUP": 4, "GROUP2": 2, "PLACE_KEYS": 32,
                         "CAND_TILE": 16, "CAND_CAP": 32, "BOUND_SLACK": 8,
                         "COMPACT_TILE": 32, "ROW_SPLIT": 1, "GMAX_BITS": 16},
    "four_launch": {"FUSED": 0, "SLICE_KEYS": 256, "GROUP": 8, "GROUP_BLOCK": 8,
                    "CAND_TILE": 32, "CAND_CAP": 64},
}


def _sprinkle(s, seed):
    """NaN, +inf, -inf at a few random places (rows keep their distribution elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(s.shape, generator=g)
    s = s.clone()
    s[r < 0.01] = float("nan")
    s[(r > 0.5) & (r < 0.505)] = float("inf")
    s[(r > 0.7) & (r < 0.71)] = float("-inf")
    return s


# The overflow geometries run the row tier on some distributions: seconds each under the
# interpreter.
@pytest.mark.parametrize("geom", [pytest.param(g, marks=pytest.mark.slow) if "overflow" in g
                                  else g for g in sorted(GEOMS)])
@pytest.mark.parametrize("name", D.DISTRIBUTIONS)
def test_every_distribution_exact(tk, geom, name):
    k, n = 16, 1200
    seed = sum(map(ord, geom + name))
    base = D.make_scores(name, 6, n + 40, seed=seed)
    base[3] = _sprinkle(base[3:4], seed)[0]
    # A strided view: rows 1240 apart, the first 1200 keys of each.
    scores = base[:, :n].to(DEV)
    assert scores.stride(0) == n + 40
    lengths = torch.tensor([n, n - 5, 0, n, k + 1, 700], dtype=torch.int32, device=DEV)
    got = tk.indexer_topk_triton(scores, lengths, k, config=GEOMS[geom])
    want = indexer_topk_reference(scores, lengths, k)
    assert topk_mismatches(got, want) == []


@pytest.mark.parametrize("geom", ["fused32", "fused_split", "four_launch"])
def test_tie_tier_cases(tk, geom):
    """Rows built for each branch of the tie tier: T == L with no key above it, with keys above
    it spread over the row (the equal keys taken up to a point, the larger ones after it copied
    from the buffer), with the larger keys all after the taken equal ones, and with at least k
    keys above L (an ordinary selection over them)."""
    k, n = 16, 1024
    g = torch.Generator().manual_seed(3)
    rows = []
    rows.append(torch.full((n,), 1.5))                                   # all equal
    r = torch.zeros(n)
    r[torch.randperm(n, generator=g)[:k // 2]] = torch.rand(k // 2, generator=g) + 1
    rows.append(r)                                                       # few larger, spread
    r = torch.zeros(n)
    r[-5:] = 2.0
    rows.append(r)                                                       # larger at the end
    r = torch.zeros(n)
    r[torch.randperm(n, generator=g)[:3 * k]] = 1.0
    rows.append(r)                                                       # >= k above the tie
    r = torch.full((n,), -float("inf"))
    r[::7] = float("nan")
    rows.append(r)                                                       # -inf over NaN
    scores = torch.stack(rows).to(DEV)
    lengths = torch.tensor([n, n, n, n - 1, n], dtype=torch.int32, device=DEV)
    got = tk.indexer_topk_triton(scores, lengths, k, config=GEOMS[geom])
    want = indexer_topk_reference(scores, lengths, k)
    assert topk_mismatches(got, want) == []


def test_negative_control_detects_a_wrong_tie_rule(tk):
    """The comparison catches a selection that breaks the tie by anything but position."""
    k, n = 16, 512
    scores = torch.zeros(2, n, device=DEV)
    lengths = torch.tensor([n, n], dtype=torch.int32, device=DEV)
    got = tk.indexer_topk_triton(scores, lengths, k, config=GEOMS["fused32"])
    want = indexer_topk_reference(scores, lengths, k)
    assert topk_mismatches(got, want) == []
    assert got[0].tolist() == list(range(k))
    bad = got.clone()
    bad[0, -1] = k
    assert topk_mismatches(bad, want) != []


def test_strided_lengths_are_read_by_element(tk):
    """A 1-D lengths view with a stride (a column of a 2-D tensor) is read element by element,
    not as if contiguous (row 1 used to read the 0 next to row 0's 8 and come back all -1)."""
    scores = D.make_scores("randn", 2, 64, seed=2).to(DEV)
    lengths = torch.tensor([[8, 0], [8, 0]], dtype=torch.int32, device=DEV)[:, 0]
    assert lengths.stride(0) == 2
    for cfg in ({}, {"FUSED": 1}, {"FUSED": 0}):
        got = tk.indexer_topk_triton(scores, lengths, 4, config=cfg)
        want = indexer_topk_reference(scores, lengths.contiguous(), 4)
        assert topk_mismatches(got, want) == [], cfg
        assert int(got[1].min()) >= 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", D.DISTRIBUTIONS)
def test_gpu_k2048_every_distribution(tk, name):
    k, n = 2048, 131072
    scores = D.make_scores(name, 8, n, seed=11, device="cuda")
    lengths = torch.tensor([n, n - 1, k, k + 1, n // 3, 5, n, 3 * k], dtype=torch.int32,
                           device="cuda")
    want = indexer_topk_reference(scores, lengths, k)
    for cfg in ({}, {"FUSED": 0}, {"FUSED": 1}, {"FUSED": 1, "ROW_SPLIT": 1},
                {"FUSED": 1, "ROW_SPLIT": 2}, {"FUSED": 1, "ROW_SPLIT": 1, "GMAX_BITS": 16},
                {"FUSED": 1, "ROW_SPLIT": 1, "GMAX_BITS": 32}, {"ONE_PASS": 1}):
        got = tk.indexer_topk_triton(scores, lengths, k, config=cfg)
        assert topk_mismatches(got, want) == [], cfg
    for rows in (1, 64, 1024):
        s = D.make_scores(name, rows, n, seed=rows, device="cuda")
        ln = torch.full((rows,), n, dtype=torch.int32, device="cuda")
        got = tk.indexer_topk_triton(s, ln, k, config={})
        assert topk_mismatches(got, indexer_topk_reference(s, ln, k)) == [], rows


@pytest.mark.parametrize("launch", [True, False])
@pytest.mark.parametrize("geom", ["fused_overflow", "fused16_overflow", "four_launch",
                                  "fused_split"])
def test_overflow_refinement_cases(tk, monkeypatch, geom, launch):
    """Rows with more keys above the bound than the buffer holds, for each end of the tie
    tier's refinement (buckets of the keys above the bound, split again while too many reach
    the chosen one): ramps up and down, ramps narrow in key space (a single first pass) and
    spanning almost every key value (several passes), a tie of more than the buffer at the
    k-th key below a few larger keys (the range narrows to that one value, then the equal keys
    are taken by position), NaN and +inf inside a ramp; the rare tiers in a launch of their own
    and inlined."""
    monkeypatch.setattr(tk, "_TIE_LAUNCH", launch)
    k, n = 16, 1200
    g = torch.Generator().manual_seed(0)
    rows = [D.make_scores("ramp", 1, n, seed=1)[0], -D.make_scores("ramp", 1, n, seed=2)[0]]
    r = torch.randn(n, generator=g) - 10
    r[600:] = 5.0
    r[torch.randint(600, n, (5,), generator=g)] = 6.0
    rows.append(r)
    rows.append(torch.arange(n, dtype=torch.float32) * 1e-30)
    rows.append(torch.linspace(-1e30, 1e30, n))
    r = D.make_scores("ramp", 1, n, seed=3)[0]
    r[::97] = float("nan")
    r[5] = float("inf")
    rows.append(r)
    rows.append((torch.arange(n) > 500).float() + 1e-7 * (torch.arange(n) % 3))
    scores = torch.stack(rows).to(DEV)
    lengths = torch.full((len(rows),), n, dtype=torch.int32, device=DEV)
    lengths[1] = n - 7
    got = tk.indexer_topk_triton(scores, lengths, k, config=GEOMS[geom])
    want = indexer_topk_reference(scores, lengths, k)
    assert topk_mismatches(got, want) == []


@pytest.mark.skipif(DEV == "cuda", reason="spies on the interpreter's calls of the tie kernel's "
                    "helpers (CPU only; the GPU tests check the same rows' results)")
@pytest.mark.parametrize("geom,split", [("fused_overflow", 1), ("fused_overflow", 2),
                                        ("four_launch", 1)])
def test_ramp_rows_take_the_minimum_bound(tk, monkeypatch, geom, split):
    """Rows whose scores grow with position overflow the buffer above L (from (super)group
    maxima, which admit about half the row); the tie kernel's bound from the minima the gmax
    kernel wrote (fused: of the supergroups; four-launch: of the groups) admits about k keys,
    so the tie tier selects without its bucket passes (rows split over several programs raise
    L so in the row kernel already, before the compaction). A ramp with one very low key in
    every (super)group gets no better bound and takes the bucket passes; exact either way (NaN
    keys and a row shorter than the batch's too)."""
    calls = {"min": [], "buckets": 0}
    real_min, real_pick = tk._min_bound, tk._pick_bucket

    def min_bound(*a, **kw):
        got = real_min(*a, **kw)
        calls["min"].append((int(got), int(a[3])))   # (the new bound, L)
        return got

    def pick_bucket(*a, **kw):
        calls["buckets"] += 1
        return real_pick(*a, **kw)

    monkeypatch.setattr(tk, "_min_bound", min_bound)
    monkeypatch.setattr(tk, "_pick_bucket", pick_bucket)
    cfg = {**GEOMS[geom]}   # a buffer of 32 (64): every ramp overflows
    if cfg["FUSED"]:
        cfg["ROW_SPLIT"] = split
    width = cfg["GROUP"] * cfg["GROUP2"] if cfg["FUSED"] else cfg["GROUP"]
    k, n = 16, 1200
    ramps = torch.stack([D.make_scores("ramp", 1, n, seed=s)[0] for s in (1, 2)])
    ramps[1, 1100:1110] = float("nan")   # NaN keys in the top supergroups: their minimum drops
    lengths = torch.tensor([n, n - 5], dtype=torch.int32)
    got = tk.indexer_topk_triton(ramps, lengths, k, config=cfg)
    assert topk_mismatches(got, indexer_topk_reference(ramps, lengths, k)) == []
    # Split rows raise L in the row kernel already, each part (then the tie kernel only where
    # the small buffer still overflows); one program a row: in the tie kernel alone.
    first = 2 * split if cfg["FUSED"] and split > 1 else 2
    assert len(calls["min"]) >= first, calls
    assert all(new > lb for new, lb in calls["min"][:first]), calls
    if first == 2:
        assert len(calls["min"]) == 2, calls
    assert calls["buckets"] == 0
    calls.update(min=[], buckets=0)
    comb = D.make_scores("ramp", 1, n, seed=4)
    comb[0, ::width] = -1000.0
    one = torch.tensor([n], dtype=torch.int32)
    got = tk.indexer_topk_triton(comb, one, k, config=cfg)
    assert topk_mismatches(got, indexer_topk_reference(comb, one, k)) == []
    assert len(calls["min"]) == first // 2 + (first > 2), calls
    assert all(new == lb for new, lb in calls["min"]), calls
    assert calls["buckets"] >= 1
    # without the minima (the module switch off) the same ramps take the bucket passes
    calls.update(min=[], buckets=0)
    monkeypatch.setattr(tk, "_MIN_BOUND", False)
    got = tk.indexer_topk_triton(ramps, lengths, k, config=cfg)
    assert topk_mismatches(got, indexer_topk_reference(ramps, lengths, k)) == []
    assert calls["min"] == [] and calls["buckets"] >= 2


def _spy_tie_selection(tk, monkeypatch) -> list[int]:
    """Record the candidate count of every row the tie kernel selects (interpreter only: the
    spy wraps the jitted helper the interpreter calls as Python); a row its own programs
    select never shows up."""
    tied: list[int] = []
    real = tk._select_cands

    def select_cands(*a, **kw):
        tied.append(int(a[7]))   # the row's candidate count (above cap: overflow or tie)
        return real(*a, **kw)

    monkeypatch.setattr(tk, "_select_cands", select_cands)
    return tied


@pytest.mark.skipif(DEV == "cuda", reason="spies on the interpreter's calls of the tie kernel's "
                    "selection (CPU only; the GPU tests check the same rows' results)")
@pytest.mark.parametrize("split", [2, 4])
def test_split_ramp_rows_need_no_tie_kernel(tk, monkeypatch, split):
    """With ROW_SPLIT > 1 a ramp row's L is raised by its supergroup minima before the
    compaction, so with a buffer that holds about k keys its programs gather and select it
    themselves: the tie kernel selects nothing. Random rows keep L (their minima never reach
    it). Exact on both."""
    tied = _spy_tie_selection(tk, monkeypatch)
    cfg = {"FUSED": 1, "GROUP": 4, "GROUP2": 2, "PLACE_KEYS": 32, "CAND_TILE": 64,
           "CAND_CAP": 128 * split, "BOUND_SLACK": 4, "COMPACT_TILE": 32, "ROW_SPLIT": split}
    k, n = 16, 1200
    scores = torch.stack([D.make_scores("ramp", 1, n, seed=s)[0] for s in (1, 2)]
                         + [torch.randn(n, generator=torch.Generator().manual_seed(3))])
    lengths = torch.tensor([n, n - 5, n], dtype=torch.int32)
    got = tk.indexer_topk_triton(scores, lengths, k, config=cfg)
    assert topk_mismatches(got, indexer_topk_reference(scores, lengths, k)) == []
    assert tied == [], tied
    # without the minima the ramp rows overflow and the tie kernel takes them
    monkeypatch.setattr(tk, "_MIN_BOUND", False)
    got = tk.indexer_topk_triton(scores, lengths, k, config=cfg)
    assert topk_mismatches(got, indexer_topk_reference(scores, lengths, k)) == []
    assert len(tied) == 2, tied


@pytest.mark.skipif(DEV == "cuda", reason="spies on the interpreter's calls of the tie kernel's "
                    "selection (CPU only; the GPU tests check the same rows' results)")
def test_split_parts_hold_a_crowded_row(tk, monkeypatch):
    """A `recent` row's candidates crowd into its last part (its last keys are 8x): with four
    parts a row and a region of one register tile a part, that part overflows and the row goes
    to the tie kernel; with default_config's rule (a double tile a part) every part holds its
    candidates and the row programs select it themselves. Exact both ways."""
    tied = _spy_tie_selection(tk, monkeypatch)
    k, n, split, tile = 16, 1200, 4, 32
    scores = torch.stack([D.make_scores("recent", 1, n, seed=s)[0] for s in (1, 2)]
                         + [torch.randn(n, generator=torch.Generator().manual_seed(3))])
    lengths = torch.tensor([n, n - 5, n], dtype=torch.int32)
    want = indexer_topk_reference(scores, lengths, k)
    base = {"FUSED": 1, "GROUP": 4, "GROUP2": 2, "PLACE_KEYS": 32, "CAND_TILE": tile,
            "BOUND_SLACK": 4, "COMPACT_TILE": 32, "ROW_SPLIT": split}
    for region, overflows in ((tile, 2), (2 * tile, 0)):
        tied.clear()
        got = tk.indexer_topk_triton(scores, lengths, k,
                                     config={**base, "CAND_CAP": split * region})
        assert topk_mismatches(got, want) == [], region
        assert len(tied) == overflows and all(c > split * region for c in tied), (region, tied)


def test_default_split_regions_hold_a_double_tile():
    """default_config gives each part of a split row a region of at least two register tiles
    (the rule the test above exercises), and rows of one program keep their 16,384 entries."""
    from backends.indexer_topk.config import default_config

    seen = set()
    for rows in (1, 8, 16, 32, 33, 34, 48, 64, 66, 67, 128, 1024, 4096):
        for keys in (8192, 131072, 524288):
            cfg = default_config(rows, keys, 2048)
            split = cfg["ROW_SPLIT"]
            if cfg["FUSED"] and split > 1:
                assert cfg["CAND_CAP"] // split >= 2 * cfg["CAND_TILE"], (rows, keys, cfg)
                seen.add(split)
            else:
                assert cfg["CAND_CAP"] == 16384, (rows, keys, cfg)
    assert seen == {2, 4}, seen
