"""indexer_topk's register-tile searches (``_kth_search_tile``, ``_loose_kth_tile``) on their
own, against a sort, on the tiles that break interpolation: ties, a few levels, keys spread over
the whole int32 range (a bracket wider than 2**31), NaN keys, padding, k = 1 and k = n, a
bracket that is not the tile's min and max.

Since session 25 both searches aim two probes a step by interpolation and snap a bracket that
only lost empty key space to its keys; the selection, the bound and the minimum bound all go
through them, so a wrong step here is a wrong top-k everywhere. Runs under TRITON_INTERPRET=1
without a GPU (tests/conftest.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from backends.indexer_topk.triton_kernels import (  # noqa: E402
    _kth_search_tile,
    _loose_kth_tile,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
I32_MIN = -(2**31)
I32_MAX = 2**31 - 1
POISON = 123456789


@triton.jit
def _search_kernel(xp, argp, outp, CAP: tl.constexpr):
    """One tile a program; args [k, lo, hi, cge, cgt, slack]; out [t, loose lo, its count]."""
    row = tl.program_id(0)
    x = tl.load(xp + row * CAP + tl.arange(0, CAP))
    a = argp + row * 6
    k = tl.load(a)
    lo = tl.load(a + 1).to(tl.int64)
    hi = tl.load(a + 2).to(tl.int64)
    t = _kth_search_tile(x, k, lo, hi, tl.load(a + 3), tl.load(a + 4))
    llo, lcnt = _loose_kth_tile(x, k, lo, hi, tl.load(a + 3).to(tl.int64), tl.load(a + 5))
    tl.store(outp + row * 3, t)
    tl.store(outp + row * 3 + 1, llo.to(tl.int32))
    tl.store(outp + row * 3 + 2, lcnt.to(tl.int32))


def _tiles(cap: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(25)
    n = cap * 3 // 4

    def keys(v: torch.Tensor) -> torch.Tensor:
        return v.to(torch.int64).clamp(I32_MIN + 1, I32_MAX)

    tiles = {
        "randn": torch.randn(n, generator=g).view(torch.int32).to(torch.int64),
        "all_equal": torch.full((n,), 12345, dtype=torch.int64),
        "two_values": torch.where(torch.rand(n, generator=g) < 0.3, 7, -7).to(torch.int64),
        "few_levels": torch.randint(0, 5, (n,), generator=g).to(torch.int64) * (1 << 24),
        "full_range": keys(torch.randint(I32_MIN + 1, I32_MAX, (n,), generator=g)),
        "extremes": torch.tensor([I32_MIN + 1, I32_MAX] * (n // 2), dtype=torch.int64),
        "nan_keys": torch.where(torch.rand(n, generator=g) < 0.5, I32_MIN + 1,
                                torch.randint(-1000, 1000, (n,), generator=g)).to(torch.int64),
        "clustered": torch.cat([torch.randint(0, 8, (n // 2,), generator=g),
                                torch.randint(1 << 30, (1 << 30) + 8, (n - n // 2,),
                                              generator=g)]).to(torch.int64),
        "full_tile": torch.randn(cap, generator=g).view(torch.int32).to(torch.int64),
    }
    out = []
    for name, v in tiles.items():
        tile = torch.full((cap,), I32_MIN, dtype=torch.int64)   # INT32_MIN: no key
        tile[: v.numel()] = v[torch.randperm(v.numel(), generator=g)]
        out.append((name, tile.to(torch.int32)))
    return out


def _cases(cap: int, only: tuple[str, ...] = ()) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """(name, tile, [k, lo, hi, cge, cgt, slack]) for k = 1, 2, mid, n - 1, n and brackets
    at the tile's min / max or inside them (``only``: those tiles)."""
    names, tiles, args = [], [], []
    for name, tile in _tiles(cap):
        if only and name not in only:
            continue
        x = tile.to(torch.int64)
        valid = x[x != I32_MIN]
        srt = torch.sort(valid, descending=True).values
        n = valid.numel()
        for k in sorted({1, 2, n // 3, n - 1, n}):
            t = int(srt[k - 1])
            brackets = [(int(valid.min()), int(valid.max())), (I32_MIN, I32_MAX)]
            # a tighter bracket: lo the (k + n) // 2-th key, hi just below a key above T
            lo_in = int(srt[min(n - 1, (k + n) // 2)])
            above = int(srt[k // 2 - 1]) if k >= 2 else t
            hi_in = above - 1 if above > t else t
            brackets.append((min(lo_in, t), max(hi_in, t)))
            for lo, hi in brackets:
                cge = int((valid >= lo).sum())
                cgt = int((valid > hi).sum())
                for slack in (0, 3, n):
                    names.append(f"{name}-k{k}-[{lo},{hi}]-s{slack}")
                    tiles.append(tile)
                    args.append([k, lo, hi, cge, cgt, slack])
    return names, torch.stack(tiles), torch.tensor(args, dtype=torch.int64)


def _check(x: torch.Tensor, k: int, lo: int, hi: int, slack: int, got: list[int]) -> str:
    """'' when ``got`` = [t, loose lo, its count] is right for the tile, else what is wrong."""
    valid = x.to(torch.int64)
    valid = valid[valid != I32_MIN]
    t_want = int(torch.sort(valid, descending=True).values[k - 1])
    t, llo, lcnt = got
    if t != t_want:
        return f"k-th search {t}, want {t_want}"
    c = int((valid >= llo).sum())
    if lcnt != c:
        return f"loose search says {lcnt} keys >= {llo}, there are {c}"
    if not (c >= k and lo <= llo <= t_want):
        return f"loose bound {llo} ({c} keys >= it) is not a bound of the k-th key {t_want}"
    if c > k + slack and llo != t_want:
        return f"loose bound {llo} leaves {c} keys > k + slack = {k + slack}, short of a tie"
    return ""


@pytest.mark.parametrize("cap,only", [(256, ()), (16, ()),
                                      (32768, ("randn", "two_values", "full_range"))])
def test_tile_searches_match_a_sort(cap, only):
    """Tiles of up to 16,384 entries take the interpolation steps, larger ones halve."""
    names, tiles, args = _cases(cap, only)
    out = torch.full((len(names), 3), POISON, dtype=torch.int32, device=DEV)
    _search_kernel[(len(names),)](tiles.to(DEV), args.to(torch.int32).to(DEV), out, CAP=cap)
    got = out.cpu().tolist()
    bad = []
    for i, name in enumerate(names):
        k, lo, hi, _, _, slack = (int(v) for v in args[i])
        why = _check(tiles[i], k, lo, hi, slack, got[i])
        if why:
            bad.append(f"{name}: {why}")
    assert not bad, f"{len(bad)} of {len(names)} cases wrong:\n" + "\n".join(bad[:20])


def test_check_rejects_wrong_answers():
    """Negative control: the check above fails an off-by-one k-th key, a count that is not the
    bound's, a 'bound' above the k-th key and a loose bound that kept too many keys."""
    x = torch.tensor([5, 9, 9, 1, 7, I32_MIN], dtype=torch.int32)
    assert _check(x, 2, 1, 9, 0, [9, 9, 2]) == ""
    assert _check(x, 3, 1, 9, 0, [7, 7, 3]) == ""
    assert "k-th search" in _check(x, 3, 1, 9, 0, [8, 7, 3])
    assert "says" in _check(x, 3, 1, 9, 0, [7, 7, 4])
    assert "not a bound" in _check(x, 3, 1, 9, 0, [7, 9, 2])
    assert "short of a tie" in _check(x, 3, 1, 9, 0, [7, 1, 5])
    assert _check(x, 3, 1, 9, 2, [7, 1, 5]) == ""
