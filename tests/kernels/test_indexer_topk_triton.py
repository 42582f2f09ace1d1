"""The indexer_topk Triton kernels against the torch reference, entry by entry.

Without a GPU they run under TRITON_INTERPRET=1 (set by tests/conftest.py) at small sizes and
small k; the ``gpu`` tests run k=2048 at 131,072 and 524,288 keys.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from backends.indexer_topk import config as indexer_config  # noqa: E402
from backends.indexer_topk import triton_kernels as TK  # noqa: E402
from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches  # noqa: E402
from registry.errors import ConfigError, WorkloadError  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _poisoned(monkeypatch):
    """Every output and workspace entry starts as INT32_MAX (a key above +inf's and an
    impossible position): a stage reading scratch no earlier stage wrote, or an unwritten
    output entry, changes the result."""
    monkeypatch.setattr(TK, "_POISON", 2147483647)

# Small geometries that exercise every path under the interpreter: the four-launch path
# (FUSED=0: several slices with the bound pass and the count pass, one slice with the exact
# bound in the placement) and the fused path; a candidate tile smaller than the candidates
# (buffer tier: the refinement, the four-way search over the buffer), a buffer smaller than the
# candidates (row tier), group maxima beyond the bound tile (chunked).
SMALL = {
    "slices": {"SLICE_KEYS": 256, "GROUP": 16, "GROUP_BLOCK": 16, "CAND_TILE": 128,
               "CAND_CAP": 512, "FUSED": 0},
    "one_slice": {"MAX_SLICES": 1, "GROUP": 8, "GROUP_BLOCK": 32, "CAND_TILE": 256,
                  "CAND_CAP": 256, "FUSED": 0},
    "buffer_tier": {"SLICE_KEYS": 512, "GROUP": 16, "GROUP_BLOCK": 16, "CAND_TILE": 16,
                    "CAND_CAP": 1024, "FUSED": 0},
    # (Until issue 25's clean-up these two ran SPARSE=2's active list; the geometries stay.)
    "slices_g8": {"SLICE_KEYS": 256, "GROUP": 8, "GROUP_BLOCK": 8, "CAND_TILE": 256,
                  "CAND_CAP": 1024, "BOUND_TILE": 256, "FUSED": 0},
    "one_slice_g16": {"MAX_SLICES": 1, "GROUP": 16, "GROUP_BLOCK": 4, "CAND_TILE": 64,
                      "CAND_CAP": 512, "FUSED": 0},
    "row_tier": {"SLICE_KEYS": 512, "GROUP": 16, "GROUP_BLOCK": 16, "CAND_TILE": 64,
                 "CAND_CAP": 64, "FUSED": 0},
    # FUSED=1 (the default path): two launches; the bound over GROUP * GROUP2-key maxima,
    # loose by BOUND_SLACK, from the GROUP-key maxima in memory on rows with fewer than k large
    # groups (lengths below GROUP * GROUP2 * k), none on rows with fewer than k small groups.
    "fused": {"GROUP": 4, "GROUP2": 2, "GROUP_BLOCK": 16, "PLACE_KEYS": 64, "CAND_TILE": 256,
              "CAND_CAP": 1024, "BOUND_SLACK": 4, "COMPACT_TILE": 32},
    "fused_one_level": {"GROUP": 4, "GROUP2": 1, "PLACE_KEYS": 32, "CAND_TILE": 16,
                        "CAND_CAP": 1024, "BOUND_SLACK": 0},
    "fused_row_tier": {"GROUP": 8, "GROUP2": 2, "PLACE_KEYS": 64, "CAND_TILE": 64,
                       "CAND_CAP": 64},
    "fused_chunked": {"GROUP": 2, "GROUP2": 2, "BOUND_TILE": 32, "PLACE_KEYS": 64,
                      "CAND_TILE": 256, "CAND_CAP": 1024, "COMPACT_TILE": 64, "MAX_REGS": 128},
    # ROW_SPLIT: the fused defaults above split these 4-row batches 8 ways; one and two parts.
    "fused_one_part": {"GROUP": 4, "GROUP2": 2, "GROUP_BLOCK": 16, "PLACE_KEYS": 64,
                       "CAND_TILE": 256, "CAND_CAP": 1024, "BOUND_SLACK": 4, "COMPACT_TILE": 32,
                       "ROW_SPLIT": 1},
    "fused_two_parts": {"GROUP": 8, "GROUP2": 2, "PLACE_KEYS": 64, "CAND_TILE": 64,
                        "CAND_CAP": 256, "ROW_SPLIT": 2},
    # GMAX_BITS 16: the group maxima as the keys' top 16 bits (the bound over them and the
    # active test conservative); one part a row (the list as uint16 entries in place of the
    # maxima) and two (the list in an area of its own).
    "fused_gmax16": {"GROUP": 4, "GROUP2": 2, "GROUP_BLOCK": 16, "PLACE_KEYS": 64,
                     "CAND_TILE": 256, "CAND_CAP": 1024, "BOUND_SLACK": 4, "COMPACT_TILE": 32,
                     "GMAX_BITS": 16, "ROW_SPLIT": 1},
    "fused_gmax16_two_parts": {"GROUP": 8, "GROUP2": 1, "PLACE_KEYS": 64, "CAND_TILE": 64,
                               "CAND_CAP": 256, "ROW_SPLIT": 2, "GMAX_BITS": 16},
    # ONE_PASS: no gmax launch; each row program writes its own row's maxima first (two and
    # one levels; the poisoned workspace fails any maximum it forgets).
    "fused_one_pass": {"GROUP": 4, "GROUP2": 2, "GROUP_BLOCK": 16, "PLACE_KEYS": 64,
                       "CAND_TILE": 256, "CAND_CAP": 1024, "BOUND_SLACK": 4, "COMPACT_TILE": 32,
                       "ONE_PASS": 1},
    "fused_one_pass_row_tier": {"GROUP": 8, "GROUP2": 1, "GROUP_BLOCK": 8, "PLACE_KEYS": 64,
                                "CAND_TILE": 64, "CAND_CAP": 64, "ONE_PASS": 1},
    # Half groups read whole (max_keys 1200 is a multiple of GROUP; the gather does it then).
    "fused_half": {"GROUP": 4, "GROUP2": 2, "GROUP_BLOCK": 16, "PLACE_KEYS": 64,
                   "CAND_TILE": 256, "CAND_CAP": 1024, "BOUND_SLACK": 4, "COMPACT_TILE": 32},
}


def make_scores(kind, rows, n, *, seed=0, dtype=torch.float32, device=DEV):
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        s = torch.randn(rows, n, generator=g)
    elif kind == "ties":      # four values repeated: the k-th score sits in a tie
        s = torch.tensor([0.5, -1.0, 2.0, 3.0])[torch.randint(0, 4, (rows, n), generator=g)]
    elif kind == "zeros":
        s = torch.zeros(rows, n)
    elif kind == "recent":    # the last keys scaled 8x: the selection crowds there
        s = torch.randn(rows, n, generator=g)
        s[:, -max(1, n // 8):] *= 8
    elif kind == "lowbits":   # equal high bits, differing only in the low mantissa bits
        b = 0x3F800000 + torch.randint(0, 64, (rows, n), generator=g, dtype=torch.int32)
        s = b.view(torch.float32).clone()
    elif kind == "special":   # -inf, +inf, NaN, -0.0 sprinkled
        s = torch.randn(rows, n, generator=g)
        r = torch.rand(rows, n, generator=g)
        s[r < 0.05] = float("inf")
        s[(r > 0.3) & (r < 0.35)] = float("-inf")
        s[r > 0.9] = float("nan")
        s[(r > 0.5) & (r < 0.55)] = -0.0
        s[(r > 0.55) & (r < 0.6)] = 0.0
    else:
        raise ValueError(kind)
    return s.to(dtype).to(device)


def run_both(scores, lengths, k, cfg):
    got = TK.indexer_topk_triton(scores, lengths, k, config=cfg)
    want = indexer_topk_reference(scores, lengths, k)
    return got, want


@pytest.mark.parametrize("n, half", [(1203, 0), (1202, 0), (1200, 1)])
def test_half_gather_falls_back_when_a_group_would_pass_the_row(monkeypatch, n, half):
    """The gather reads half groups whole, so only when max_keys is a multiple of GROUP (else
    the last group of a full row would extend past its storage): other widths mask every key.
    The choice is the wrapper's (the former ``GATHER_HALF=0`` forced the masked gather)."""
    rows, k = 4, 16
    seen = []
    real = TK._row_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append(kw["HALF"])
                return real[grid](*args, **kw)
            return launch

    monkeypatch.setattr(TK, "_row_kernel", Spy())
    for kind in ("random", "ties", "recent"):
        scores = make_scores(kind, rows, n, seed=n)
        lengths = torch.tensor([n, n - 3, k + 1, 2 * k + 3], dtype=torch.int32, device=DEV)
        got, want = run_both(scores, lengths, k, {**SMALL["fused_half"], "FUSED": 1})
        assert topk_mismatches(got, want) == [], kind
    assert seen == [half] * 3


# The ``fused*`` geometries leave FUSED to the default, which at the 4 rows of these tests is
# the four-launch path (FUSED=1 from 32 rows): each runs that way and, ``+fused``, pinned to
# the fused path its name means.
FUSED_PINNED = sorted(g + "+fused" for g in SMALL if g.startswith("fused"))


def _small(geom):
    base, _, pinned = geom.partition("+")
    return {**SMALL[base], "FUSED": 1} if pinned else SMALL[base]


@pytest.mark.parametrize("geom", sorted(SMALL) + FUSED_PINNED)
@pytest.mark.parametrize("kind", ["random", "ties", "zeros", "recent", "lowbits", "special"])
def test_small_exact(geom, kind):
    rows, n, k = 4, 1200, 16 if kind != "recent" else 64
    scores = make_scores(kind, rows, n, seed=hash((geom, kind)) % 1000)
    lengths = torch.tensor([n, 700, k + 1, 2 * k], dtype=torch.int32, device=DEV)
    got, want = run_both(scores, lengths, k, _small(geom))
    assert topk_mismatches(got, want) == []


def test_short_rows_and_ragged():
    k = 16
    n = 600
    lengths = torch.tensor([0, 1, k - 1, k, k + 1, n, 300, 0], dtype=torch.int32, device=DEV)
    scores = make_scores("random", len(lengths), n, seed=7)
    got, want = run_both(scores, lengths, k, SMALL["slices"])
    assert topk_mismatches(got, want) == []
    assert got[0].tolist() == [-1] * k and got[1].tolist() == [0] + [-1] * (k - 1)
    assert got[7].tolist() == [-1] * k        # (a negative length is refused: check_inputs)


@pytest.mark.parametrize("bits", ["32", "16", "16-area"])
@pytest.mark.parametrize("kind", ["random", "ties", "special", "lowbits"])
def test_fused_bound_levels_causal(kind, bits, monkeypatch):
    """A causal batch crosses every bound level of the fused row program: k full supergroups,
    k half supergroups (written by the gmax kernel for those rows only), k groups read
    directly (with GMAX_BITS 16: their top 16 bits, the bound shifted back), fewer than k
    groups (every key a candidate), and short rows. ``lowbits`` rows differ only below the top
    16 bits, so that 16-bit maxima are all equal. ``16-area``: the active list in an area of
    its own with one part a row (rows of more than 65536 groups), here by lowering the limit."""
    k, n, gs, gs2 = 16, 1200, 2, 4
    cfg = {"GROUP": gs, "GROUP2": gs2, "GROUP_BLOCK": 8, "PLACE_KEYS": 32, "CAND_TILE": 64,
           "CAND_CAP": 256, "BOUND_SLACK": 2, "COMPACT_TILE": 32, "FUSED": 1, "ROW_SPLIT": 1,
           "GMAX_BITS": int(bits[:2])}
    if bits == "16-area":
        monkeypatch.setattr(indexer_config, "LIST16_GROUPS", n // gs - 1)
    assert TK.list_in_place(cfg, n) == (bits != "16-area")
    lengths = torch.tensor([0, 10, 17, 40, 60, 100, 150, 300, n], dtype=torch.int32, device=DEV)
    n_groups2 = -(-n // (gs * gs2))

    def level(length):
        ng2, ngh, ng = -(-length // (gs * gs2)), -(-length // (gs * gs2 // 2)), -(-length // gs)
        if length <= k:
            return "short"
        if ng2 >= k:
            return "supergroups"
        if ngh >= k and ngh <= n_groups2:
            return "half"
        return "groups" if ng >= k else "none"

    assert {level(int(x)) for x in lengths} == {"short", "supergroups", "half", "groups", "none"}
    scores = make_scores(kind, len(lengths), n, seed=len(kind))
    got, want = run_both(scores, lengths, k, cfg)
    assert topk_mismatches(got, want) == []


def _keys(x):
    """The kernels' int32 order keys of float32 scores (NaN lowest, -0.0 as +0.0)."""
    b = x.float().view(torch.int32)
    b = torch.where(b == -(2**31), torch.zeros_like(b), b)
    b = torch.where(b < 0, b ^ 0x7FFFFFFF, b)
    return torch.where(torch.isnan(x), torch.full_like(b, -(2**31) + 1), b)


@pytest.mark.parametrize("seed", [0, 1])
def test_group_maxima_and_minima_exact_on_every_bit_class(seed):
    """``_gmax_kernel``'s stored group maxima, supergroup maxima and minima equal the Python
    twin's (max / min of :func:`_keys`, INT32_MIN past the length), on rows mixing the bit
    patterns the shortcut of ``_group_max_min`` must fix: -0.0 beside +0.0 (alone, as a
    group's maximum, as its minimum), negative NaNs of several payloads (groups of nothing
    else, beside numbers), +/-inf, the smallest denormals of both signs, and a positive NaN in
    some steps only (those take the exact transform); a full row and a ragged one (the masked
    last step). The workspace starts poisoned."""
    gs, gb, gs2, k, n, rows = 8, 16, 4, 16, 1024, 4
    g = torch.Generator().manual_seed(seed)
    pats = torch.tensor([0x80000000, 0x00000000, 0xFFC00000, 0xFFFFFFFF, 0xFF800001,
                         0xFF800000, 0x7F800000, 0x80000001, 0x00000001, 0x3F800000,
                         0xBF800000], dtype=torch.int64)
    bits = pats[torch.randint(0, len(pats), (rows, n), generator=g)]
    bits = torch.where(torch.rand(rows, n, generator=g) < 0.3,
                       torch.randn(rows, n, generator=g).view(torch.int32).to(torch.int64)
                       & 0xFFFFFFFF, bits)
    bits[:, 64:96] = 0xFFC00001                   # a supergroup of negative NaNs only
    bits[:, 200:208] = 0x80000000                 # a group of -0.0 only
    bits[:, 208:216] = torch.tensor([0x80000000, 0] * 4)
    bits[1:3, 300] = 0x7FC00000                   # positive NaNs: rows 1 and 2, one step
    bits[3, :] = 0xFFC00000                       # a row of negative NaNs only
    scores = (bits - ((bits >> 31) << 32)).to(torch.int32).view(torch.float32).to(DEV)
    lengths = torch.tensor([n, n, 1000, n], dtype=torch.int32, device=DEV)
    groups, groups2 = n // gs, n // (gs * gs2)
    off_gm2 = rows * groups
    off_arr = off_gm2 + rows * groups2
    off_min2 = off_arr + rows
    ws = torch.full((off_min2 + rows * groups2,), 12345, dtype=torch.int32, device=DEV)
    TK._gmax_kernel[(rows, 1)](scores, lengths, ws, n, n, groups, n, k, off_gm2, groups2,
                               off_arr, off_min2, GS=gs, GB=gb, GS2=gs2, ARRIVE=0, B16=0,
                               MIN2=1, num_warps=4)
    ws = ws.cpu()
    for r in range(rows):
        ln = int(lengths[r])
        key = torch.full((n,), -(2**31), dtype=torch.int32)
        key[:ln] = _keys(scores[r, :ln].cpu())
        full = torch.where(torch.arange(n) < ln, key, torch.tensor(2**31 - 1, dtype=torch.int32))
        ng, ng2 = -(-ln // gs), -(-ln // (gs * gs2))
        assert torch.equal(ws[r * groups:r * groups + ng], key.view(groups, gs).amax(1)[:ng]), r
        sup = ws[off_gm2 + r * groups2:off_gm2 + r * groups2 + ng2]
        assert torch.equal(sup, key.view(groups2, -1).amax(1)[:ng2]), r
        mins = ws[off_min2 + r * groups2:off_min2 + r * groups2 + ng2]
        want = torch.where(full.view(groups2, -1).amax(1) == 2**31 - 1, -(2**31),
                           key.view(groups2, -1).amin(1))[:ng2]
        assert torch.equal(mins, want), r


def _levels16(length, n, k, gs, gs2):
    """Python twin of _level16 (count of the int32 level a row's bound searches) for a row."""
    ng, ng2, n2 = -(-length // gs), -(-length // (gs * gs2)), -(-n // (gs * gs2))
    ngh = -(-length // (gs * (gs2 // 2))) if gs2 >= 4 else 0
    if ng2 >= k:
        return "supergroups", ng2
    if gs2 >= 4 and k <= ngh <= n2:
        return "half", ngh
    if k <= ng <= n2:
        return "groups", ng
    return ("int16" if ng >= k else "none"), 0


@pytest.mark.parametrize("gs,gs2", [(2, 1), (2, 2), (4, 2), (2, 4), (8, 4), (4, 8), (8, 16)])
def test_fall16_names_exactly_the_shapes_that_need_the_int16_search(gs, gs2):
    """``_fall16`` (whether the row program compiles its search over the int16 maxima) is true
    exactly when some row length up to max_keys has k groups and no int32 level, checked
    length by length against the kernels' level rule, over max_keys around each boundary."""
    k = 16
    for n in sorted({k * gs * gs2 * m // d + e for m in (1, 2, 4) for d in (1, 2, 4)
                     for e in (-gs, -1, 0, 1, gs)} | {4 * k, 1200}):
        if n <= k:
            continue
        want = gs2 < 2 or any(_levels16(length, n, k, gs, gs2)[0] == "int16"
                              for length in range(k + 1, n + 1))
        assert TK._fall16(n, k, gs, gs2) == want, (n, gs, gs2)
    # The H200 defaults' shape: every row with k groups has an int32 level.
    cfg = TK.default_config(4096, 131072, 2048)
    assert not TK._fall16(131072, 2048, cfg["GROUP"], cfg["GROUP2"])


@pytest.mark.parametrize("kind", ["random", "ties", "lowbits"])
@pytest.mark.parametrize("n,gs2", [(1200, 4), (100, 2)])
def test_gmax16_bound_at_every_level(kind, n, gs2):
    """16-bit maxima: each row's bound (the row program stopped after it: the probes' entry
    point ``_indexer_topk_stopped`` with ``stop=1``) comes
    from the level the rule names, and is a valid one: at most the row's k-th largest key, and
    above INT32_MIN wherever the row has k groups. 1200 keys: supergroups, half supergroups and
    the int32 group maxima in their area; 100 keys with GROUP2 2: rows whose group maxima do not
    fit that area search the int16 maxima (``FALL16``). Then the top-k, exact."""
    k, gs = 16, 2
    cfg = {"GROUP": gs, "GROUP2": gs2, "GROUP_BLOCK": 8, "PLACE_KEYS": 32, "CAND_TILE": 64,
           "CAND_CAP": 256, "BOUND_SLACK": 2, "COMPACT_TILE": 32, "FUSED": 1, "ROW_SPLIT": 1,
           "GMAX_BITS": 16}
    lens = [17, 31, 40, 55, 60, 100] + ([150, 300, 1200] if n == 1200 else [])
    lengths = torch.tensor(lens, dtype=torch.int32, device=DEV)
    levels = {_levels16(x, n, k, gs, gs2)[0] for x in lens}
    assert levels == ({"none", "groups", "half", "supergroups"} if n == 1200
                      else {"none", "groups", "int16", "supergroups"})
    assert TK._fall16(n, k, gs, gs2) == (n == 100)
    scores = make_scores(kind, len(lens), n, seed=n + gs2)
    lb = TK._indexer_topk_stopped(scores, lengths, k, config=cfg, stop=1)[:, 0].cpu()
    keys = _keys(scores.cpu())
    for r, length in enumerate(lens):
        kth = int(keys[r, :length].topk(k).values[-1])
        level = _levels16(length, n, k, gs, gs2)[0]
        assert int(lb[r]) <= kth, (r, level)
        assert (int(lb[r]) > -(2**31)) == (level != "none"), (r, level)
    got, want = run_both(scores, lengths, k, cfg)
    assert topk_mismatches(got, want) == []


def test_gmax16_list_entries_past_int16():
    """16-bit maxima, one part a row: the active list's uint16 entries in place of the maxima
    hold group indices up to 65535 (past int16's 32767, read back unsigned). 66,000 keys in
    2-key groups (33,000 groups); the largest keys sit in groups on both sides of 32768."""
    k, n = 16, 66000
    cfg = {"GROUP": 2, "GROUP2": 2, "GROUP_BLOCK": 2048, "SLICE_KEYS": 8192,
           "BOUND_TILE": 4096, "COMPACT_TILE": 4096, "PLACE_KEYS": 64, "CAND_TILE": 64,
           "CAND_CAP": 256, "ROW_SPLIT": 1, "GMAX_BITS": 16}
    assert TK.list_in_place(cfg, n)
    scores = make_scores("random", 2, n, seed=3)
    hot = torch.tensor([5, 30000, 65535, 65536, 65537, 65600, 65999])
    scores[0, hot] = 10.0 + torch.arange(len(hot), dtype=torch.float32)
    scores[1, 65536:] += 3.0            # the row's top keys all in groups past 32767
    lengths = torch.tensor([n, n - 7], dtype=torch.int32, device=DEV)
    got, want = run_both(scores, lengths, k, cfg)
    assert topk_mismatches(got, want) == []
    assert int(got[1].min()) >= 65536


@pytest.mark.parametrize("fused", [0, 1])
@pytest.mark.parametrize("kind", ["random", "ties", "special", "zeros"])
def test_refined_candidates(fused, kind):
    """Rows with 2x and 4x more candidates than the select tile (no group bound: fewer than k
    groups): the maxima of 2 or 4 candidates give a tighter bound and the buffer is compacted
    to it; ties crossing that bound leave more than the tile (the buffer search runs)."""
    k, tile = 16, 32
    cfg = {"FUSED": fused, "GROUP": 16, "GROUP2": 1, "GROUP_BLOCK": 4, "SLICE_KEYS": 64,
           "PLACE_KEYS": 64, "CAND_TILE": tile, "CAND_CAP": 256, "COMPACT_TILE": 32}
    # 16-key groups: fewer than k = 16 groups below 241 keys, so every valid key is a
    # candidate: 40 and 64 (2x), 100 and 128 (4x), 129+ (beyond 4x: the buffer search).
    lengths = torch.tensor([40, 64, 100, 128, 200, 17], dtype=torch.int32, device=DEV)
    scores = make_scores(kind, len(lengths), 240, seed=5 + fused)
    got, want = run_both(scores, lengths, k, cfg)
    assert topk_mismatches(got, want) == []


def test_every_row_short_fast_path():
    scores = make_scores("random", 3, 10, seed=1)
    lengths = torch.tensor([10, 4, 0], dtype=torch.int32, device=DEV)
    got, want = run_both(scores, lengths, 16, {})
    assert topk_mismatches(got, want) == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs(dtype):
    scores = make_scores("random", 2, 800, seed=3, dtype=dtype)
    lengths = torch.tensor([800, 500], dtype=torch.int32, device=DEV)
    try:
        got, want = run_both(scores, lengths, 32, SMALL["slices"])
    except Exception as e:   # the interpreter may not load bf16
        if DEV == "cpu" and dtype == torch.bfloat16:
            pytest.skip(f"interpreter without bf16 loads: {e!r}"[:200])
        raise
    assert topk_mismatches(got, want) == []


def test_k2048_few_thousand_keys():
    k = 2048
    n = 6000
    cfg = TK.default_config(2, n, k)
    scores = make_scores("random", 2, n, seed=11)
    lengths = torch.tensor([n, 3000], dtype=torch.int32, device=DEV)
    got, want = run_both(scores, lengths, k, cfg)
    assert topk_mismatches(got, want) == []


def test_lengths_over_max_keys_rejected_on_host():
    scores = make_scores("random", 2, 64)
    with pytest.raises(WorkloadError, match="max_keys"):
        TK.indexer_topk_triton(scores.cpu(), torch.tensor([65, 1], dtype=torch.int32), 8,
                               config={})


def test_input_validation():
    s = make_scores("random", 2, 64)
    ln = torch.tensor([64, 64], dtype=torch.int32, device=DEV)
    with pytest.raises(WorkloadError, match="int32"):
        TK.indexer_topk_triton(s, ln.long(), 8, config={})
    with pytest.raises(WorkloadError, match="dtype"):
        TK.indexer_topk_triton(s.double(), ln, 8, config={})
    with pytest.raises(WorkloadError, match="unit stride"):
        TK.indexer_topk_triton(torch.zeros(64, 2, device=DEV).t(), ln, 8, config={})
    with pytest.raises(WorkloadError, match="k must be"):
        TK.indexer_topk_triton(s, ln, 0, config={})
    with pytest.raises(WorkloadError, match="1-D"):
        TK.indexer_topk_triton(s, ln[:1], 8, config={})


@pytest.mark.parametrize("bad, key", [
    ({"GROUP": 12}, "GROUP"), ({"num_warps": 3}, "num_warps"), ({"CAND_CAP": 8}, "CAND_CAP"),
    ({"CAND_TILE": 65536, "CAND_CAP": 1024}, "CAND_TILE"), ({"MAX_SLICES": 0}, "MAX_SLICES"),
    ({"BOGUS": 1}, "BOGUS"), ({"SLICE_KEYS": 1.5}, "SLICE_KEYS"),
    ({"FUSED": 2}, "FUSED"), ({"BOUND_SLACK": -1}, "SLACK"),
    ({"PLACE_KEYS": 8, "GROUP": 16}, "PLACE_KEYS"), ({"PLACE_KEYS": 3000}, "PLACE_KEYS"),
    ({"GROUP2": 128}, "GROUP2"), ({"COMPACT_TILE": 100}, "COMPACT_TILE"),
    ({"MAX_REGS": 16}, "MAX_REGS"), ({"MAX_REGS": 300}, "MAX_REGS"),
    ({"FUSED": 1, "GROUP2": 8, "GROUP_BLOCK": 4}, "GROUP2"),
    ({"GMAX_BITS": 8}, "GMAX_BITS"), ({"ONE_PASS": 2}, "ONE_PASS"),
    ({"ONE_PASS": 1, "ROW_SPLIT": 2}, "ONE_PASS=1 .*ROW_SPLIT"),
    ({"ONE_PASS": 1, "FUSED": 0}, "ONE_PASS=1 .*FUSED"),
    ({"ONE_PASS": 1, "GMAX_BITS": 16}, "ONE_PASS=1 .*GMAX_BITS"),
])
def test_validate_config(bad, key):
    with pytest.raises(ConfigError, match=key):
        TK.validate_config(bad, 16, 1000)


# The knobs issue 25 removed, at their former default and at the values that were removed.
REMOVED = [("SEARCH_BITS", 1), ("SEARCH_BITS", 2), ("SPARSE", 0), ("SPARSE", 1), ("SPARSE", 2),
           ("BOUND_PASS", -1), ("BOUND_PASS", 0), ("BOUND_PASS", 1), ("PDL", 0), ("PDL", 1),
           ("GATHER_HALF", 0), ("GATHER_HALF", 1)]


@pytest.mark.parametrize("key, val", REMOVED)
def test_removed_knobs_are_rejected_by_name(key, val):
    """A config naming a removed key, at any value (its old default too), is a ConfigError that
    names the key, says it was removed and where it was last, and what to do; from
    validate_config, from the kernel's entry point and from a config that is otherwise fine."""
    assert key in indexer_config.REMOVED_KEYS and key not in TK.DEFAULT_CONFIG
    want = rf"{key} \(={val}\) was removed .*ea33f7d.*drop the key"
    with pytest.raises(ConfigError, match=want):
        TK.validate_config({key: val}, 16, 1000)
    with pytest.raises(ConfigError, match=want):
        TK.validate_config({**TK.default_config(4, 1000, 16), key: val}, 16, 1000)
    s, ln = torch.zeros(2, 100, device=DEV), torch.full((2,), 100, dtype=torch.int32, device=DEV)
    with pytest.raises(ConfigError, match=want):
        TK.indexer_topk_triton(s, ln, 8, config={"FUSED": 0, key: val})


def test_shipped_tables_name_only_live_keys():
    """Every indexer_topk entry of the shipped tuning tables (docs/tables) is a valid config
    without removed keys. (The H200 table's 4 entries, measured on session 6's kernel, were
    dropped in session 17; a re-tune's entries must pass this too.)"""
    from pathlib import Path

    from registry import load_table

    tables = sorted((Path(__file__).parents[2] / "docs" / "tables").glob("*.json"))
    assert tables
    entries = [e for t in tables for e in load_table(t) if e.op == "indexer_topk"]
    for e in entries:
        assert not set(e.config) & set(indexer_config.REMOVED_KEYS), e.bucket
        TK.validate_config(dict(e.config), e.bucket["k"], e.bucket["max_keys"])


def test_probe_parameters_are_not_on_the_product_entry_point():
    """``STOP`` (stopping the row program after a phase) is for the probes: the entry point
    dispatch binds has no such parameter; the probes' private one checks its value."""
    import inspect

    assert list(inspect.signature(TK.indexer_topk_triton).parameters) == [
        "scores", "lengths", "k", "config"]
    s, ln = torch.zeros(2, 100, device=DEV), torch.full((2,), 100, dtype=torch.int32, device=DEV)
    with pytest.raises(TypeError):
        TK.indexer_topk_triton(s, ln, 8, config={}, _stop=1)
    with pytest.raises(ValueError, match="stop must be 1, 2 or 3"):
        TK._indexer_topk_stopped(s, ln, 8, config={}, stop=0)


def test_register_cap_is_a_launch_option_on_nvidia_only(monkeypatch):
    """MAX_REGS becomes Triton's ``maxnreg`` launch option, which the ROCm backend rejects
    (KeyError: unrecognised keyword): on a ROCm build of torch it is left out."""
    assert TK._regs({"MAX_REGS": 128}) == ({"maxnreg": 128} if torch.version.hip is None else {})
    assert TK._regs({"MAX_REGS": 0}) == {}
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    assert TK._regs({"MAX_REGS": 128}) == {}


def test_default_config_and_scratch():
    for rows, n in [(1, 131072), (64, 131072), (4096, 131072), (1, 524288), (8, 8192)]:
        cfg = TK.default_config(rows, n, 2048)
        TK.validate_config(cfg, 2048, n)
        p = TK.plan(cfg, n)
        assert 1 <= p["slices"] <= 64 and p["slices"] * p["slice_len"] >= n
        assert TK.scratch_bytes_per_row(cfg, 2048, n) > 0
    # The H200-measured switches (docs/notes/indexer_topk.md): four-launch below 32 rows,
    # 8-warp row programs up to 256 rows, 4 warps and 1024-value steps above, 128 registers
    # (96 from 2048 rows), 16384-key gmax slices, row programs split below 67 rows.
    assert [TK.default_config(r, 131072, 2048)["FUSED"] for r in (1, 16, 31, 32)] == [0, 0, 0, 1]
    # The bound's slack: k/32 groups for one row on the four-launch path, k/8 elsewhere
    assert [TK.default_config(r, 131072, 2048)["BOUND_SLACK"] for r in (1, 2, 16, 64, 4096)] \
        == [64, 256, 256, 256, 256]
    assert TK.default_config(1, 131072, 2048, fused=True)["BOUND_SLACK"] == 256
    assert TK.default_config(1, 8192, 64)["BOUND_SLACK"] == 2
    few = TK.default_config(256, 131072, 2048)
    assert (few["SEARCH_WARPS"], few["COMPACT_TILE"], few["PLACE_KEYS"]) == (8, 2048, 2048)
    cfg = TK.default_config(4096, 131072, 2048)
    assert cfg["FUSED"] == 1 and cfg["GROUP"] == 8 and cfg["GROUP2"] == 4
    assert (cfg["SEARCH_WARPS"], cfg["COMPACT_TILE"], cfg["PLACE_KEYS"]) == (4, 1024, 1024)
    assert few["MAX_REGS"] == TK.default_config(1024, 131072, 2048)["MAX_REGS"] == 128
    assert cfg["MAX_REGS"] == TK.default_config(2048, 131072, 2048)["MAX_REGS"] == 96
    assert cfg["GROUP"] * cfg["GROUP_BLOCK"] == 4096      # gmax: 4096 keys a step
    assert TK.plan(cfg, 131072)["slices"] == 8
    assert [TK.default_config(r, 131072, 2048)["ROW_SPLIT"] for r in (32, 33, 64, 66, 67)] \
        == [4, 4, 2, 2, 1]
    # 32-bit group maxima by default (issue 25: 16-bit ones make every group active on rows
    # equal in their top 16 bits, and the tie tier needs exact maxima); 16 when pinned.
    assert [TK.default_config(r, 131072, 2048)["GMAX_BITS"] for r in (64, 66, 67, 4096)] \
        == [32, 32, 32, 32]
    assert TK.default_config(4096, 2**24, 2048)["GMAX_BITS"] == 32
    assert TK.resolve_config({"GROUP": 2}, 4096, 2**17, 2048)["GMAX_BITS"] == 32
    assert TK.resolve_config({"ROW_SPLIT": 2, "GMAX_BITS": 16}, 4096, 131072)["GMAX_BITS"] == 16
    assert TK.resolve_config({"FUSED": 0}, 4096, 131072, 2048)["GMAX_BITS"] == 32
    # ONE_PASS (no gmax launch) from 30 rows an SM: 4096 rows on the H200's 132 SMs, not 2048,
    # nor on a 256-CU MI355X; a config pinning two programs a row or 16-bit maxima, or the
    # four-launch path, takes the gmax launch without naming ONE_PASS.
    assert [TK.default_config(r, 131072, 2048)["ONE_PASS"] for r in (1, 64, 2048, 3959, 3960)] \
        == [0, 0, 0, 0, 1]
    assert TK.default_config(4096, 131072, 2048, sm_count=256)["ONE_PASS"] == 0
    assert [TK.resolve_config(c, 4096, 131072)["ONE_PASS"] for c in (
        {}, {"ROW_SPLIT": 2}, {"GMAX_BITS": 16}, {"FUSED": 0}, {"ROW_SPLIT": 1})] == [1, 0, 0, 0, 1]
    for c in ({"ROW_SPLIT": 2}, {"GMAX_BITS": 16}, {"FUSED": 0}, {}):
        TK.validate_config(TK.resolve_config(c, 4096, 131072), 2048, 131072)
    # Scratch: 2-byte group maxima, the active list in their place with one part a row and up
    # to 65536 groups, else in an area of its own; 4-byte maxima the list overwrites.
    assert TK.scratch_bytes_per_row({**cfg, "GMAX_BITS": 16}, 2048, 131072) \
        == 2 * 16384 + 4 * 4096 + 8 * 16384
    # 4-byte maxima: the supergroup minima too (the tie kernel's minimum bound)
    assert TK.scratch_bytes_per_row(cfg, 2048, 131072) \
        == 4 * 16384 + 4 * 4096 + 8 * 16384 + 4 * 4096
    assert TK.scratch_bytes_per_row({**cfg, "GMAX_BITS": 16, "ROW_SPLIT": 2}, 2048, 131072) \
        == 2 * 16384 + 4 * 4096 + 8 * 16384 + 4 * 3 + 4 * 16384
    wide = {**cfg, "GMAX_BITS": 16, "GROUP": 2}
    assert TK.list_in_place(wide, 131072) and not TK.list_in_place(wide, 131074)
    old = TK.resolve_config({"FUSED": 0}, 4096, 131072, 2048)
    assert old["GROUP"] == 32 and old["GROUP"] * old["GROUP_BLOCK"] == 4096
    # four-launch: group maxima, the tie tier's list, the candidates, the counts, and the group
    # minima (the tie kernel's minimum bound) where the groups fit its tile
    assert TK.scratch_bytes_per_row(old, 2048, 131072) \
        == 8 * 4096 + 8 * 16384 + 4 * 3 + 4 * 4096
    assert TK.scratch_bytes_per_row({**old, "GROUP": 16}, 2048, 131072) \
        == 8 * 8192 + 8 * 16384 + 4 * 3


def test_one_pass_launches_no_gmax_kernel(monkeypatch):
    """ONE_PASS=1 is one launch (two with the rare tiers'): the row programs compute the group
    maxima the gmax launch would have (the workspace starts poisoned), and the defaults it
    resolves to are the fused path's with one program a row and exact maxima, whatever the
    row count would pick."""
    def refuse(*args, **kwargs):
        raise AssertionError("ONE_PASS launched _gmax_kernel")

    cfg = TK.resolve_config({"ONE_PASS": 1}, 4, 1200, 16)
    assert (cfg["FUSED"], cfg["ROW_SPLIT"], cfg["GMAX_BITS"]) == (1, 1, 32)
    assert TK.resolve_config({"FUSED": 1}, 4, 1200, 16)["ROW_SPLIT"] > 1    # what it overrides
    scores = make_scores("random", 4, 1200, seed=5)
    lengths = torch.tensor([1200, 700, 17, 40], dtype=torch.int32, device=DEV)
    want = indexer_topk_reference(scores, lengths, 16)
    monkeypatch.setattr(TK._gmax_kernel, "run", refuse, raising=False)
    got = TK.indexer_topk_triton(scores, lengths, 16, config={"ONE_PASS": 1})
    assert topk_mismatches(got, want) == []
    with pytest.raises(AssertionError, match="launched _gmax_kernel"):   # the control
        TK.indexer_topk_triton(scores, lengths, 16, config={"FUSED": 1})

def test_tuner_space_has_both_sides_of_one_pass():
    """The tuner measures the default against the other side of ONE_PASS where one program a
    row runs (and 16-bit maxima only with the gmax launch): every candidate valid, labels
    distinct."""
    import types

    from backends.indexer_topk import tuning
    from backends.indexer_topk.bench import BenchCase

    facts = types.SimpleNamespace(sm_count=132)
    for rows, want_base in ((4096, True), (1024, False)):
        case = BenchCase(rows=rows, keys=131072, k=2048, dtype="float32", dist="randn")
        assert tuning.baseline(case, facts).endswith(" one") is want_base
        cands = tuning.candidates(case, facts)
        assert all(cfg is not None for _lab, cfg, _why in cands), cands
        fused = [cfg for _lab, cfg, _why in cands if cfg.get("FUSED") == 1]
        assert {cfg["ONE_PASS"] for cfg in fused} == {0, 1}
        assert all(cfg["GMAX_BITS"] == 32 for cfg in fused if cfg["ONE_PASS"])
        assert len({lab for lab, _c, _w in cands}) == len(cands)


# ------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("n", [131072, 524288])
@pytest.mark.parametrize("kind", ["random", "ties", "zeros", "recent", "lowbits", "special"])
def test_gpu_k2048(n, kind):
    rows = 6
    k = 2048
    scores = make_scores(kind, rows, n, seed=n % 97, device="cuda")
    lengths = torch.tensor([n, n - 1, k, k + 1, n // 3, 5], dtype=torch.int32, device="cuda")
    for cfg in ({}, {"FUSED": 1}, {"FUSED": 1, "SLICE_KEYS": 1024, "MAX_SLICES": 64},
                {"FUSED": 1, "SEARCH_WARPS": 4, "COMPACT_TILE": 1024, "PLACE_KEYS": 1024},
                {"FUSED": 1, "SEARCH_WARPS": 4, "COMPACT_TILE": 1024, "PLACE_KEYS": 1024,
                 "MAX_REGS": 96},
                {"FUSED": 1, "SEARCH_WARPS": 8, "GROUP": 16, "GROUP2": 1, "BOUND_SLACK": 0,
                 "PLACE_KEYS": 8192},
                {"FUSED": 0}, {"FUSED": 0, "MAX_SLICES": 1}, {"FUSED": 1, "ROW_SPLIT": 2},
                {"FUSED": 1, "ROW_SPLIT": 1}, {"FUSED": 1, "GMAX_BITS": 16},
                {"FUSED": 1, "GMAX_BITS": 16, "ROW_SPLIT": 2},
                # 16-bit maxima, one part. GROUP 8: 16384 or 65536 groups a row, the uint16
                # list in place (entries past 32767 at 524288 keys). GROUP 4: 32768 (in place)
                # or 131072 (more than uint16 entries hold: the list's own area).
                {"FUSED": 1, "GMAX_BITS": 16, "ROW_SPLIT": 1, "GROUP": 8},
                {"FUSED": 1, "GMAX_BITS": 16, "ROW_SPLIT": 1, "GROUP": 4},
                # ONE_PASS: the row programs write their own maxima (4 warps, 128 / 96
                # registers as at 1024 / 4096 rows)
                {"ONE_PASS": 1, "SEARCH_WARPS": 4, "COMPACT_TILE": 1024, "PLACE_KEYS": 1024},
                {"ONE_PASS": 1, "SEARCH_WARPS": 4, "COMPACT_TILE": 1024, "PLACE_KEYS": 1024,
                 "MAX_REGS": 96}):
        got, want = run_both(scores, lengths, k, cfg)
        assert topk_mismatches(got, want) == [], cfg


@pytest.mark.gpu
@pytest.mark.parametrize("cfg,rows", [({"FUSED": 0}, 64), ({"FUSED": 0}, 1), ({"FUSED": 1}, 64)],
                         ids=["four_launch", "four_launch_1row", "fused"])
def test_gpu_launches_order_against_the_neighbouring_kernels(cfg, rows):
    """The launches are ordered with the neighbouring kernels of the stream (the four-launch
    path chains its kernels as programmatic dependent launches on sm_90 and later: each waits
    for the one before, the last lets nothing of the caller's start early). The scores
    are written by a torch kernel right before the call
    and the output is read by one right after, with no synchronization between them, in a loop
    (the next iteration's write must not overtake the previous call), and once more captured
    in a CUDA graph replayed over new scores."""
    n, k = 131072, 2048
    g = torch.Generator(device="cuda").manual_seed(11)
    lengths = torch.full((rows,), n, dtype=torch.int32, device="cuda")
    lengths[::5] = n // 3
    scores = torch.empty(rows, n, device="cuda")
    outs, srcs = [], []
    for _ in range(4):
        src = torch.randn(rows, n, device="cuda", generator=g)
        scores.copy_(src)
        outs.append(TK.indexer_topk_triton(scores, lengths, k, config=cfg).clone())
        srcs.append(src)
    for out, src in zip(outs, srcs, strict=True):
        assert topk_mismatches(out, indexer_topk_reference(src, lengths, k)) == []
    src = torch.randn(rows, n, device="cuda", generator=g)
    TK.indexer_topk_triton(scores, lengths, k, config=cfg)    # compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scores.copy_(src)
        out = TK.indexer_topk_triton(scores, lengths, k, config=cfg)
        kept = out.clone()
    for _ in range(2):
        src.copy_(torch.randn(rows, n, device="cuda", generator=g))
        graph.replay()
        torch.cuda.synchronize()
        assert topk_mismatches(kept, indexer_topk_reference(src, lengths, k)) == []


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [256, 64])
def test_gpu_half_and_causal(dtype, rows):
    """A causal batch (row r has (r + 1) / rows of the keys): the middle rows search their
    bound over group maxima; at 64 rows the default splits each row over two programs."""
    n, k = 131072, 2048
    scores = make_scores("random", rows, n, seed=5, dtype=dtype, device="cuda")
    lengths = (torch.arange(1, rows + 1, device="cuda") * (n // rows)).to(torch.int32)
    got, want = run_both(scores, lengths, k, TK.default_config(rows, n, k))
    assert topk_mismatches(got, want) == []


# ------------------------------------------------------------------------------ bench library


def test_bench_module_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys; import backends.indexer_topk.bench as b; "
            "assert b.bench_command.name == 'indexer_topk'; "
            "print('torch' in sys.modules, 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_bench_command_checks_and_times(monkeypatch):
    import json

    from click.testing import CliRunner

    from backends.indexer_topk import bench

    args = ["--rows", "2", "--keys", "600", "--k", "16", "--iters", "1", "--warmup", "0",
            "--providers", "torch-topk,reference,triton,geometry=256x8x4:FUSED=0,"
            "geometry=FUSED=1", "--graphs", "--json"]
    res = CliRunner().invoke(bench.bench_command, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[res.output.index("{"):])
    assert data["schema"] == "kreg.bench/1" and data["op"] == "indexer_topk"
    assert data["graphs"] is False   # no GPU: plain calls, and the report says so
    prov = {m["label"]: m for m in data["cases"][0]["results"]}
    assert prov["triton"]["status"] == "ok" and prov["geometry=256x8x4:FUSED=0"]["status"] == "ok"
    assert prov["geometry=FUSED=1"]["status"] == "ok" and prov["triton"]["error"] == 0
    assert prov["torch-topk"]["status"] == "unjudged" and prov["torch-topk"]["detail"] == "same set"
    assert prov["triton"]["ms"] is not None

    # A wrong provider must fail the run (exit 1).
    real = bench._trial

    def broken(name, scores, lengths, k):
        trial = real(name, scores, lengths, k)
        if name == "triton":
            run = trial.run
            trial.run = lambda: run().flip(1)
        return trial
    monkeypatch.setattr(bench, "_trial", broken)
    res = CliRunner().invoke(bench.bench_command, args[:-1])
    assert res.exit_code == 1 and "FAIL" in res.output and "differ" in res.output
    # the table's first line names the device and software it ran on, and the timing
    import triton

    head = next(ln for ln in res.output.splitlines() if ln.startswith("#"))
    assert head.startswith("# indexer_topk on ") and f"triton {triton.__version__}" in head
    assert f"torch {torch.__version__}" in head
    assert ("plain launches" if DEV == "cpu" else "CUDA-graph replays") in head, head


def test_bench_parse_geometry():
    from backends.indexer_topk.bench import parse_geometry

    assert parse_geometry("1024x64x4:GMAX_BITS=16") == {
        "SLICE_KEYS": 1024, "MAX_SLICES": 64, "num_warps": 4, "GMAX_BITS": 16}
    assert parse_geometry("FUSED=0:GROUP=32") == {"FUSED": 0, "GROUP": 32}
    with pytest.raises(Exception, match="SLICE_KEYSxMAX_SLICESxWARPS"):
        parse_geometry("1024x64")


# ------------------------------------------------------------------------------ property test

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None, derandomize=True)
@given(rows=st.integers(1, 4), n=st.integers(1, 700), k=st.sampled_from([1, 5, 16, 40]),
       kind=st.sampled_from(["random", "ties", "zeros", "special", "lowbits"]),
       geom=st.sampled_from(sorted(SMALL)), seed=st.integers(0, 2 ** 16),
       data=st.data())
def test_property_matches_reference(rows, n, k, kind, geom, seed, data):
    lengths = torch.tensor(data.draw(st.lists(st.integers(0, n), min_size=rows, max_size=rows)),
                           dtype=torch.int32, device=DEV)
    scores = make_scores(kind, rows, n, seed=seed)
    cfg = dict(SMALL[geom])
    cfg["CAND_CAP"] = max(cfg["CAND_CAP"], k)
    cfg["CAND_TILE"] = min(cfg["CAND_TILE"], cfg["CAND_CAP"])
    got, want = run_both(scores, lengths, k, cfg)
    assert topk_mismatches(got, want) == []


@settings(max_examples=30, deadline=None, derandomize=True)
@given(n=st.integers(300, 1100), k=st.sampled_from([5, 16, 40]),
       kind=st.sampled_from(["random", "ties", "recent", "special"]),
       split=st.sampled_from([1, 2, 4, 8]), group=st.sampled_from([2, 4, 8]),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_property_split_rows_match_reference(n, k, kind, split, group, seed, data):
    """The fused path's parts (ROW_SPLIT), whole half-group loads (when n is a multiple of
    GROUP; masked whole groups otherwise) and small candidate regions (a part that overflows
    its region sends the row to the row tier), on rows of every length: short, causal-like
    middles whose bound comes from the group maxima, and full rows."""
    rows = 4
    lengths = torch.tensor(data.draw(st.lists(st.integers(0, n), min_size=rows, max_size=rows)),
                           dtype=torch.int32, device=DEV)
    scores = make_scores(kind, rows, n, seed=seed)
    cfg = {"GROUP": group, "GROUP2": 2, "PLACE_KEYS": max(16, group),
           "CAND_TILE": 64, "CAND_CAP": 256, "COMPACT_TILE": 16, "BOUND_SLACK": 2,
           "ROW_SPLIT": split}
    got, want = run_both(scores, lengths, k, cfg)
    assert topk_mismatches(got, want) == []


def test_missing_config_keys_are_sized_for_the_calling_device(monkeypatch):
    """A config that pins part of the geometry (the MI355X policy pins only the slices) gets
    the rest from default_config for the SM count of the device the call runs on (132, the
    H200's, without a GPU): 48 rows split four ways on 256 CUs, two ways on 132 SMs."""
    assert TK._sm_count(torch.device("cpu")) == 132
    seen = []
    real = TK.resolve_config

    def spy(config, rows, n, k, sm_count=132):
        seen.append(sm_count)
        return real(config, rows, n, k, sm_count)

    monkeypatch.setattr(TK, "resolve_config", spy)
    monkeypatch.setattr(TK, "_sm_count", lambda dev: 256)
    monkeypatch.setattr(TK, "_PLANS", {})
    scores = make_scores("random", 2, 8, seed=2)
    lengths = torch.tensor([8, 3], dtype=torch.int32, device=DEV)
    got = TK.indexer_topk_triton(scores, lengths, 16, config={"SLICE_KEYS": 1024})
    assert seen == [256]
    assert topk_mismatches(got, indexer_topk_reference(scores, lengths, 16)) == []
    pinned = {"SLICE_KEYS": 1024, "MAX_SLICES": 64, "num_warps": 4}
    assert real(pinned, 48, 131072, 2048, 256)["ROW_SPLIT"] == 4
    assert real(pinned, 48, 131072, 2048)["ROW_SPLIT"] == 2


def test_tuner_candidates_cover_both_paths():
    from types import SimpleNamespace

    from backends.indexer_topk import tuning
    from backends.indexer_topk.bench import BenchCase

    case = BenchCase(rows=1024, keys=131072)
    cands = tuning.candidates(case, SimpleNamespace(sm_count=132))
    labels = [lab for lab, _cfg, _why in cands]
    assert len(labels) == len(set(labels)) >= 6
    assert all(cfg is not None for _lab, cfg, _why in cands), cands
    fused = [cfg["FUSED"] for _lab, cfg, _why in cands]
    assert fused.count(0) == 1 and fused[0] == 1
    one = tuning.candidates(BenchCase(rows=1, keys=131072), SimpleNamespace(sm_count=132))
    assert one[0][1]["FUSED"] == 0 and sum(c["FUSED"] for _lab, c, _w in one) >= 3
    assert tuning.baseline(case, SimpleNamespace(sm_count=132)) == labels[0]
    # On another device the baseline is that device's default, still the first candidate.
    small = SimpleNamespace(sm_count=16)
    assert tuning.baseline(BenchCase(rows=4, keys=131072), small) == \
        tuning.candidates(BenchCase(rows=4, keys=131072), small)[0][0]
    for _lab, cfg, _why in cands:
        TK.validate_config(cfg, 2048, 131072)
    # Both widths of the group maxima, and at 64 rows both splits, each under its own label
    # (a label shared by two configs dropped one of them).
    assert {cfg["GMAX_BITS"] for _lab, cfg, _why in cands if cfg["FUSED"]} == {16, 32}
    few = tuning.candidates(BenchCase(rows=64, keys=131072), SimpleNamespace(sm_count=132))
    assert {cfg["ROW_SPLIT"] for _lab, cfg, _why in few if cfg["FUSED"]} == {1, 2}
    assert len({lab for lab, _c, _w in few}) == len(few)
    assert len({tuple(sorted(c.items())) for _l, c, _w in few}) == len(few)


def test_fused_phase_stops_for_profiling():
    """``_indexer_topk_stopped`` (benchmarks/probes/profile_indexer.py --phases; the probes'
    entry point) ends the row program after a
    phase and writes its scalar, each part of a split row at the row's output entry of its
    index: the active groups and the candidates both number at least k (the bound's guarantee)
    and the candidates at most GROUP per active group; split in two, the parts add up to the
    whole."""
    k, n = 40, 700
    scores = make_scores("random", 3, n, seed=11)
    lengths = torch.tensor([n, 500, 30], dtype=torch.int32, device=DEV)
    cfg = {"FUSED": 1, "ROW_SPLIT": 1}
    group = TK.resolve_config(cfg, 3, n, k)["GROUP"]
    n_act = TK._indexer_topk_stopped(scores, lengths, k, config=cfg, stop=2)[:2, 0]
    n_cand = TK._indexer_topk_stopped(scores, lengths, k, config=cfg, stop=3)[:2, 0]
    assert bool((n_act >= k).all()) and bool((n_cand >= k).all())
    assert bool((n_cand <= group * n_act).all())
    two = {"FUSED": 1, "ROW_SPLIT": 2}
    for stop, whole in ((2, n_act), (3, n_cand)):
        parts = TK._indexer_topk_stopped(scores, lengths, k, config=two, stop=stop)[:2, :2]
        assert torch.equal(parts.sum(dim=1), whole), stop
    for c in (cfg, two):
        got = TK.indexer_topk_triton(scores, lengths, k, config=c)
        assert topk_mismatches(got, indexer_topk_reference(scores, lengths, k)) == []


@pytest.mark.parametrize("fused,regs", [(0, 0), (1, 0), (1, 128), (1, 96)])
def test_double_tile_selection(fused, regs, monkeypatch):
    """In the fused row kernel, rows whose candidates pass the register tile by up to 2x are
    selected in a tile of twice its size (no refinement), others in the tile or after a
    refinement; not under a register cap below 128 (it spilled there), and never in the
    four-launch selection (it cost every row there). A spy on ``_select_tile`` records the tile
    sizes a call used, and every row is exact. Under the interpreter only (the spy wraps a
    device function; the cap is the wrapper's rule, the interpreter ignores it)."""
    if DEV != "cpu":
        pytest.skip("the spy needs the interpreter")
    k, n = 16, 1200
    sizes: list[int] = []
    orig = TK._select_tile

    def spy(*args, **kwargs):
        sizes.append(int(args[6]))
        return orig(*args, **kwargs)

    monkeypatch.setattr(TK, "_select_tile", spy)
    cfg = {"GROUP": 4, "GROUP2": 2, "GROUP_BLOCK": 16, "PLACE_KEYS": 64, "CAND_TILE": 16,
           "CAND_CAP": 1024, "BOUND_SLACK": 4, "COMPACT_TILE": 32, "FUSED": fused,
           "ROW_SPLIT": 1, "MAX_REGS": regs}
    if not fused:
        cfg = {"SLICE_KEYS": 256, "GROUP": 16, "GROUP_BLOCK": 16, "CAND_TILE": 16,
               "CAND_CAP": 1024, "FUSED": 0}
    for kind in ("random", "recent", "ties"):
        scores = make_scores(kind, 4, n, seed=31)
        lengths = torch.tensor([n, 700, k + 1, 2 * k], dtype=torch.int32, device=DEV)
        got, want = run_both(scores, lengths, k, cfg)
        assert topk_mismatches(got, want) == [], kind
    if fused and regs != 96:
        assert 32 in sizes, f"no row took the double tile: {sizes}"
    elif fused:
        assert 32 not in sizes, f"a 96-register row program took the double tile: {sizes}"
    else:
        assert 16 in sizes, f"no row took the register tile: {sizes}"
        assert 32 not in sizes, f"the four-launch selection took the double tile: {sizes}"


def _launch_modes(monkeypatch, rows, n, cfg):
    """(kernel, PDL mode, launched as a dependent) of each launch of one call with the PDL
    chain on, the kernels captured instead of run."""
    seen = []

    def grab(fn):
        def run(*args, grid=None, warmup=False, **kw):
            seen.append((fn.fn.__name__, kw.get("PDL", 0), bool(kw.get("launch_pdl"))))
        return run

    for name in ("_gmax_kernel", "_bound_kernel", "_place_kernel", "_select_kernel",
                 "_tie_kernel", "_row_kernel"):
        monkeypatch.setattr(getattr(TK, name), "run", grab(getattr(TK, name)), raising=False)
    monkeypatch.setattr(TK, "_pdl_ok", lambda dev: True)
    scores = torch.zeros(rows, n)
    TK.indexer_topk_triton(scores, torch.full((rows,), n, dtype=torch.int32), 16, config=cfg)
    return seen


@pytest.mark.parametrize("tie_launch", [True, False])
@pytest.mark.parametrize("slices", [4, 1])
def test_pdl_chain_of_the_four_launch_path(monkeypatch, slices, tie_launch):
    """With programmatic dependent launches the four-launch path's first kernel only lets the
    next start (mode 2, a plain launch: what ran before the call is not ours to overlap), each
    later kernel is launched as a dependent and waits (1) before it touches memory, and only
    the last one does not let the next start (whatever the caller launches after us); the
    fused path launches as before. The device-side behaviour is the GPU tests'."""
    monkeypatch.setattr(TK, "_TIE_LAUNCH", tie_launch)
    n = 1024
    cfg = {"FUSED": 0, "SLICE_KEYS": n // slices, "GROUP": 16, "GROUP_BLOCK": 64 // slices}
    seen = _launch_modes(monkeypatch, 2, n, cfg)
    names = [s[0] for s in seen]
    want = (["_gmax_kernel"] + (["_bound_kernel", "_place_kernel"] if slices > 1 else [])
            + ["_place_kernel", "_select_kernel"] + (["_tie_kernel"] if tie_launch else []))
    assert names == want, seen
    assert seen[0][1:] == (2, False), seen
    assert all(mode == 3 and dep for _, mode, dep in seen[1:-1]), seen
    assert seen[-1][1:] == (1, True), seen
    fused = _launch_modes(monkeypatch, 2, n, {"FUSED": 1})
    assert fused and all(mode == 0 and not dep for _, mode, dep in fused), fused


def test_pdl_only_where_the_device_has_it(monkeypatch):
    """No PDL chain without a CUDA device of sm_90 or later (the interpreter, a CPU tensor,
    ROCm), nor with the module switch off."""
    assert TK._pdl_ok(torch.device("cpu")) is False
    monkeypatch.setattr(TK, "_PDL", False)
    assert TK._pdl_ok(torch.device("cuda", 0)) is False
    assert TK._pdl_opts(False, 3) == {}
    assert TK._pdl_opts(True, 2) == {"PDL": 2}
    assert TK._pdl_opts(True, 1) == {"PDL": 1, "launch_pdl": True}


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16])
def test_gpu_pdl_chain_matches_plain_launches(monkeypatch, rows):
    """The four-launch path gives the exact top-k with and without its PDL chain, on every
    distribution (the chain is on by default on sm_90+: this checks the switch's other side)."""
    from backends.indexer_topk.distributions import DISTRIBUTIONS
    from backends.indexer_topk.distributions import make_scores as dist_scores

    n, k = 131072, 2048
    for name in DISTRIBUTIONS:
        scores = dist_scores(name, rows, n, seed=7, device="cuda")
        lengths = torch.full((rows,), n, dtype=torch.int32, device="cuda")
        want = indexer_topk_reference(scores, lengths, k)
        for on in (True, False):
            monkeypatch.setattr(TK, "_PDL", on)
            got = TK.indexer_topk_triton(scores, lengths, k, config={"FUSED": 0})
            assert topk_mismatches(got, want) == [], (name, on)
