"""The indexer_topk torch reference against a naive Python/float64 sort, its helpers, and the
comparison helper's negative controls."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")

from backends.indexer_topk.reference import (  # noqa: E402
    indexer_topk_reference,
    score_keys,
    topk_mismatches,
    topk_to_slots,
)
from registry.errors import WorkloadError  # noqa: E402


def naive(scores, lengths, k):
    """Python float64: sort valid positions by (value desc with NaN lowest, position asc)."""
    out = []
    rows, n = scores.shape
    vals = scores.double().tolist()
    for r in range(rows):
        ln = max(0, min(int(lengths[r]), n))

        def rank(p, row=vals[r]):
            v = row[p]
            if math.isnan(v):
                return (1, 0.0, p)
            return (0, -(v + 0.0), p)   # + 0.0 folds -0.0 into +0.0

        sel = sorted(sorted(range(ln), key=rank)[:k])
        out.append(sel + [-1] * (k - len(sel)))
    return torch.tensor(out, dtype=torch.int32).reshape(rows, k)


def _special_row(n, rng):
    pool = [float("inf"), float("-inf"), float("nan"), -0.0, 0.0, 1.0, -1.0, 1e-40, -1e-40]
    return [rng.choice(pool) if rng.random() < 0.3 else rng.gauss(0, 1) for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_reference_matches_naive(seed, dtype):
    rng = random.Random(seed)
    rows, n = 5, rng.choice([1, 7, 40, 97])
    k = rng.choice([1, 3, 8, 50, 128])
    data = [_special_row(n, rng) if r % 2 else [rng.gauss(0, 1) for _ in range(n)]
            for r in range(rows)]
    if seed % 3 == 0:   # ties: four values
        data = [[rng.choice([0.5, -1.0, 2.0, 3.0]) for _ in range(n)] for _ in range(rows)]
    scores = torch.tensor(data, dtype=getattr(torch, dtype))
    lengths = torch.tensor([rng.randint(0, n) for _ in range(rows)], dtype=torch.int32)
    got = indexer_topk_reference(scores, lengths, k)
    want = naive(scores, lengths, k)
    assert topk_mismatches(got, want) == []


def test_keys_order_and_specials():
    vals = [float("nan"), float("-inf"), -3.0, -1e-40, -0.0, 0.0, 1e-40, 2.0, float("inf")]
    keys = score_keys(torch.tensor(vals)).tolist()
    assert keys[4] == keys[5] == 0                      # -0.0 == +0.0
    strict = keys[:4] + keys[5:]
    assert strict == sorted(strict) and len(set(strict)) == len(strict)
    assert keys[0] == -(2 ** 31) + 1                   # every NaN: below -inf
    assert score_keys(torch.tensor([-float("nan")])).item() == keys[0]


def test_lengths_semantics_and_padding():
    scores = torch.tensor([[1.0, 3.0, 2.0, 5.0], [4.0, 4.0, 4.0, 4.0], [0.0, 1.0, 2.0, 3.0]])
    lengths = torch.tensor([4, 3, 0], dtype=torch.int32)
    got = indexer_topk_reference(scores, lengths, k=6)
    assert got.tolist() == [[0, 1, 2, 3, -1, -1], [0, 1, 2, -1, -1, -1], [-1] * 6]
    got = indexer_topk_reference(scores, lengths, k=2)
    assert got.tolist() == [[1, 3], [0, 1], [-1, -1]]


def test_validation_errors():
    s = torch.zeros(2, 8)
    with pytest.raises(WorkloadError, match="lengths must be <= max_keys"):
        indexer_topk_reference(s, torch.tensor([9, 1], dtype=torch.int32), 4)
    with pytest.raises(WorkloadError, match="int32"):
        indexer_topk_reference(s, torch.tensor([1, 1]), 4)
    with pytest.raises(WorkloadError, match="dtype"):
        indexer_topk_reference(s.double(), torch.tensor([1, 1], dtype=torch.int32), 4)
    with pytest.raises(WorkloadError, match="k must be"):
        indexer_topk_reference(s, torch.tensor([1, 1], dtype=torch.int32), 0)
    with pytest.raises(WorkloadError, match="2-D"):
        indexer_topk_reference(s[0], torch.tensor([1], dtype=torch.int32), 4)


def test_topk_to_slots():
    idx = torch.tensor([[0, 5, 9, -1], [3, -1, -1, -1]], dtype=torch.int32)
    table = torch.tensor([[7, 2, 4], [1, 0, 0]], dtype=torch.int32)
    got = topk_to_slots(idx, table, page_size=4)
    assert got.tolist() == [[28, 9, 17, -1], [7, -1, -1, -1]]


def _controls(scores, lengths, k):
    """A correct list and three corrupted copies: a selected key replaced by the best unselected
    one, two entries swapped, one score's bits flipped (list recomputed from flipped scores)."""
    good = indexer_topk_reference(scores, lengths, k)
    row = good[0].tolist()
    keys = score_keys(scores[0]).tolist()
    unsel = [p for p in range(int(lengths[0])) if p not in set(row)]
    best = max(unsel, key=lambda p: (keys[p], -p))
    worst_sel = min(row, key=lambda p: (keys[p], -p))
    repl = good.clone()
    repl[0] = torch.tensor(sorted([p for p in row if p != worst_sel] + [best]), dtype=torch.int32)
    swapped = good.clone()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]
    flipped_scores = scores.clone()
    bits = flipped_scores.view(torch.int32)
    bits[0, worst_sel] ^= -0x80000000  # a selected (positive) score's sign bit: it drops out
    flipped = indexer_topk_reference(flipped_scores, lengths, k)
    return good, {"replaced": repl, "swapped": swapped, "bits_flipped": flipped}


def test_checker_catches_negative_controls():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 300, generator=g)
    lengths = torch.tensor([300, 200], dtype=torch.int32)
    good, bad = _controls(scores, lengths, 16)
    assert topk_mismatches(good, good.clone()) == []
    for name, b in bad.items():
        msgs = topk_mismatches(b, good)
        assert msgs and msgs[0].startswith("row 0"), name
    assert "missed" in topk_mismatches(bad["replaced"], good)[0]
    assert topk_mismatches(good[:, :8], good) and topk_mismatches(good.long(), good)
