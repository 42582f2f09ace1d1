"""Score distributions for ``indexer_topk`` benchmarks, tuning and tests (pure torch).

``make_scores(name, rows, keys, dtype=..., device=..., seed=...)`` returns ``[rows, keys]``
scores drawn from a seeded CPU generator (so a seed gives the same scores on every device),
then cast and moved. The names (:data:`DISTRIBUTIONS`) cover the seed's caches and the cases
that stress an exact top-k whose candidates are bounded by group maxima:

* ``randn``: N(0, 1), the baseline every other distribution is compared with.
* ``ties``: four values (3, 2, 0.5, -1) repeated at random: the k-th score sits inside a tie
  of about keys / 4 equal values (the seed's tie cache).
* ``zeros``: all zeros, with ``-0.0`` at random positions (equal to ``+0.0``: the first k
  positions win).
* ``recent``: N(0, 1) with the last ``min(4096, keys // 8)`` keys scaled 8x: the top-k crowds
  at the end of the row (the seed's "recent 8x").
* ``lowbits``: every score shares its top 16 bits (1.0 ... 1.0039), the low 16 bits random:
  equal group maxima in any truncated (16-bit) form, about two keys a value at 131072 keys.
* ``relu``: ``max(0, N(0, 1) - 2.326)``: about 1% positive, the rest exactly 0, so with
  ``k > 1%`` of the keys the k-th score is 0, a tie of ~99% of the row with the positives
  spread over the whole row (an indexer's ReLU-weighted sums).
* ``relu10``: ``max(0, N(0, 1) - 1.2816)``: about 10% positive: the k-th score a positive.
* ``quant256``: 256 equally spaced values (uniform levels): ties of ``keys / 256`` at every
  value, the k-th inside one.
* ``fp8``: N(0, 1) rounded to float8 e4m3 (FP8 index keys): a few hundred distinct values,
  ties of ~1,400 keys around the k-th at 131072 keys.
* ``ramp``: an increasing ramp plus small noise (scores correlated with position): every
  group maximum of the first half is below the second half's, so a bound from group maxima
  admits half the row.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DISTRIBUTIONS", "describe", "make_scores"]

_DESCRIPTIONS: dict[str, str] = {
    "randn": "N(0, 1) scores (the baseline)",
    "ties": "four values (3, 2, 0.5, -1) at random: the k-th score inside a tie of ~keys/4",
    "zeros": "all zeros, -0.0 mixed in at random (equal to +0.0: the first k positions)",
    "recent": "N(0, 1), the last min(4096, keys/8) keys scaled 8x (the top-k crowds at the end)",
    "lowbits": "equal top 16 bits (1.0 ... 1.0039), random low 16 bits",
    "relu": "max(0, N(0,1) - 2.326): ~1% positive, the rest exactly 0 (k-th score 0 at k > 1%)",
    "relu10": "max(0, N(0,1) - 1.2816): ~10% positive, the rest exactly 0",
    "quant256": "256 equally spaced values at random (ties of keys/256 at every value)",
    "fp8": "N(0, 1) rounded to float8 e4m3 (a few hundred distinct values)",
    "ramp": "increasing with position plus small noise (group maxima correlated with position)",
}

DISTRIBUTIONS: tuple[str, ...] = tuple(_DESCRIPTIONS)


def _unknown(name: Any) -> ValueError:
    return ValueError(f"unknown score distribution {name!r}; known: {', '.join(DISTRIBUTIONS)}")


def describe(name: str) -> str:
    """One line saying what ``name``'s scores are."""
    try:
        return _DESCRIPTIONS[name]
    except (KeyError, TypeError):
        raise _unknown(name) from None


def make_scores(name: str, rows: int, keys: int, *, dtype: Any = None, device: Any = "cpu",
                seed: int = 0) -> Any:
    """``[rows, keys]`` scores of distribution ``name`` (float32 unless ``dtype``), on
    ``device``, the same for the same seed on any device. Raises ValueError for an unknown
    name (naming the known ones)."""
    import torch

    if name not in _DESCRIPTIONS:
        raise _unknown(name)
    if dtype is None:
        dtype = torch.float32
    rows, keys = int(rows), int(keys)
    if rows < 0 or keys < 0:
        raise ValueError(f"make_scores: rows and keys must be >= 0; got {rows} x {keys}")
    g = torch.Generator().manual_seed(int(seed))
    shape = (rows, keys)
    if name == "randn":
        s = torch.randn(shape, generator=g)
    elif name == "ties":
        vals = torch.tensor([3.0, 2.0, 0.5, -1.0])
        s = vals[torch.randint(0, 4, shape, generator=g)]
    elif name == "zeros":
        neg = torch.rand(shape, generator=g) < 0.5
        s = torch.where(neg, torch.tensor(-0.0), torch.tensor(0.0))
    elif name == "recent":
        s = torch.randn(shape, generator=g)
        tail = min(4096, max(1, keys // 8))
        if keys:
            s[:, keys - tail:] *= 8.0
    elif name == "lowbits":
        b = 0x3F800000 + torch.randint(0, 1 << 16, shape, generator=g, dtype=torch.int32)
        s = b.view(torch.float32).clone()
    elif name == "relu":
        s = (torch.randn(shape, generator=g) - 2.326).clamp_min(0.0)
    elif name == "relu10":
        s = (torch.randn(shape, generator=g) - 1.2816).clamp_min(0.0)
    elif name == "quant256":
        s = torch.randint(0, 256, shape, generator=g).float() / 64.0 - 2.0
    elif name == "fp8":
        s = torch.randn(shape, generator=g).to(torch.float8_e4m3fn).float()
    else:  # ramp
        pos = torch.arange(keys, dtype=torch.float32) / max(keys, 1)
        s = pos[None, :] + 1e-3 * torch.randn(shape, generator=g)
    return s.to(dtype).to(device)
