"""The lane-filter prototype (``benchmarks/probes/lane_filter_topk.py``, issue 25; not a product
path) under the interpreter: every row it takes is exact, entry by entry, on every distribution
it takes (ties at the k-th key broken by position included); it takes
random rows and leaves tie-heavy ones; outputs poisoned first; a negative control."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from backends.indexer_topk import distributions as D  # noqa: E402
from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# small geometry: 2 programs x 32 lanes of 8 slots, a 256-key selection tile, 1024 sampled keys
SMALL = {"S": 2, "NW": 1, "LCAP": 8, "CAP": 256, "NS": 1024, "SW": 1, "FW": 1, "LCH": 16,
         "JMIN": 4, "poison": 2147483647}


@pytest.fixture(scope="module")
def lf():
    spec = importlib.util.spec_from_file_location(
        "lane_filter_topk", ROOT / "benchmarks/probes/lane_filter_topk.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _check(lf, scores, lens, k):
    want = indexer_topk_reference(scores, lens, k)
    got, done = lf.lane_topk(scores, lens, k, **SMALL)
    rows = [i for i in range(scores.shape[0]) if int(done[i])]
    for i in rows:
        assert topk_mismatches(got[i:i + 1], want[i:i + 1]) == [], i
    return rows


@pytest.mark.parametrize("name", ["randn", "recent", "ramp", "quant256", "ties", "zeros"])
def test_rows_taken_are_exact(lf, name):
    k, n = 16, 2000
    s = D.make_scores(name, 4, n + 24, seed=3)[:, :n]   # a strided view
    lens = torch.tensor([n, n - 7, k + 1, 1500], dtype=torch.int32)
    rows = _check(lf, s, lens, k)
    if name in ("randn", "recent", "ramp", "quant256"):
        assert rows == [0, 1, 3]      # the short row (k + 1 keys) has no sample to trust
    else:
        assert rows == []             # a tie spans the window: left to the default path


def test_ties_at_the_kth_key_go_by_position(lf):
    k, n = 16, 2000
    g = torch.Generator().manual_seed(9)
    s = D.make_scores("randn", 4, n, seed=9)
    for r in range(4):
        v = float(s[r].topk(k).values[k - 3])
        s[r, torch.randperm(n, generator=g)[:7]] = v      # 7 keys tie for the last 3 places
    lens = torch.full((4,), n, dtype=torch.int32)
    assert _check(lf, s, lens, k) == [0, 1, 2, 3]


def test_negative_control(lf):
    k, n = 16, 2000
    s = D.make_scores("randn", 1, n, seed=5)
    lens = torch.full((1,), n, dtype=torch.int32)
    got, done = lf.lane_topk(s, lens, k, **SMALL)
    want = indexer_topk_reference(s, lens, k)
    assert int(done[0]) == 1 and topk_mismatches(got, want) == []
    bad = got.clone()
    bad[0, [0, 1]] = bad[0, [1, 0]]                        # order broken
    assert topk_mismatches(bad, want) != []
