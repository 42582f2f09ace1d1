"""The streaming kernel's algorithm on the CPU, through its NumPy model
(``benchmarks/probes/stream_model.py``, the kernel's constants from
``backends/indexer_topk/stream.py``): exact on every distribution with no second read of any
row, exact with counted extra reads on rows built to mislead the sample, exact on rows around
the sample's size. The CUDA itself is tested on an sm_90 GPU
(``tests/kernels/test_indexer_topk_stream.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends.indexer_topk import distributions as D  # noqa: E402
from backends.indexer_topk import stream  # noqa: E402
from backends.indexer_topk.reference import indexer_topk_reference  # noqa: E402

_path = Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "stream_model.py"
_spec = importlib.util.spec_from_file_location("stream_model", _path)
model = importlib.util.module_from_spec(_spec)
sys.modules["stream_model"] = model
_spec.loader.exec_module(model)


def _want(x: np.ndarray, k: int) -> list[int]:
    s = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]
    return indexer_topk_reference(s, torch.tensor([len(x)], dtype=torch.int32), k)[0].tolist()


@pytest.mark.parametrize("name", D.DISTRIBUTIONS)
def test_every_distribution_exact_in_one_read(name: str) -> None:
    s = D.make_scores(name, 3, 131072, seed=4)
    for r in range(3):
        x = s[r].numpy()
        got, extra = model.row_topk(x, 2048)
        assert got == _want(x, 2048)
        assert extra == 0, f"{name}: the sample missed ({extra} extra reads)"


def test_a_misleading_sample_costs_reads_never_the_answer() -> None:
    rng = np.random.default_rng(2)
    n, k = 131072, 2048
    pos = np.array(stream.sample_positions(n))
    hidden = np.setdiff1d(np.arange(n), pos)
    over = rng.standard_normal(n).astype(np.float32)
    over[rng.permutation(hidden)[:9000]] = 50 + rng.random(9000)   # too many above t
    under = rng.standard_normal(n).astype(np.float32)
    under[pos] = 100 + rng.random(len(pos))                        # too few above t
    for x in (over, under):
        got, extra = model.row_topk(x, k)
        assert got == _want(x, k) and extra >= 1


@pytest.mark.parametrize("n, k", [(131072, 2048), (262144, stream.MAX_K)])
def test_keys_rising_past_the_sample_cost_at_most_five_extra_reads(n: int, k: int) -> None:
    """The sample sees only low scores and the rest rise with position: the first retry's
    threshold (from the buffer's first CAP keys, a prefix by position) overflows again, and
    the second miss takes the radix counts: 1 + 1 + 3 + 1 reads, not a read per CAP - k keys
    (this row took 17 extra reads at 131,072 keys before the radix fallback)."""
    pos = np.array(stream.sample_positions(n))
    hidden = np.setdiff1d(np.arange(n), pos)
    x = np.full(n, -1.0, dtype=np.float32)
    x[hidden] = np.arange(len(hidden), dtype=np.float32)
    x[pos] = -2.0 - np.random.default_rng(5).random(len(pos)).astype(np.float32)
    got, extra = model.row_topk(x, k)
    assert got == _want(x, k)
    assert extra == 2 + model.RADIX_READS


@pytest.mark.parametrize("n, k", [(8192, 2048), (8193, 2048), (5000, 2048), (2048, 2048),
                                  (100, 2048), (131072, 1), (131072, stream.MAX_K)])
def test_rows_around_the_sample_size_and_k(n: int, k: int) -> None:
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    x[::97] = np.nan
    x[5::89] = -0.0
    got, _ = model.row_topk(x, k)
    assert got == _want(x, k)


def test_negative_control_a_wrong_tie_cut_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    x = D.make_scores("ties", 1, 131072, seed=1)[0].numpy()
    monkeypatch.setattr(model.np, "sort", lambda a: a[::-1])   # the last ties, not the first
    got, _ = model.row_topk(x, 2048)
    assert got != _want(x, 2048)


def test_float_compares_equal_order_key_compares_at_every_real_key() -> None:
    """The stream compares scores with the float of its threshold (a real key: the bisections
    snap to one); that must agree with the order keys' compares for NaN, +-0, +-inf,
    subnormals and the extremes, at every one of them as the threshold."""
    f32 = np.finfo(np.float32)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, f32.max, -f32.max,
                         f32.tiny, -f32.tiny, f32.tiny / 8, -f32.tiny / 8, 1.0, -1.0, 2.5,
                         -2.5, np.float32(1.0) + f32.eps], dtype=np.float32)
    keys = model.order_keys(specials)
    for t in sorted({int(k) for k in keys}):
        above, equal = model.above_equal(specials, t)
        assert (above == (keys > t)).all() and (equal == (keys == t)).all(), hex(t)
    # and a key that is no real score's (between -0's and +0's) would break the rule: the
    # reason the bisections snap
    above, _ = model.above_equal(specials, 0x7FFFFFFF)
    assert not (above == (keys > 0x7FFFFFFF)).all()
