"""Conformance cases of ``indexer_topk``: the inputs every implementation must get right.

The conformance kit (``pytest --kreg-conformance PLUGIN``, :mod:`registry.testing`) runs each
case against each implementation a plugin registers and compares the result with the reference
through :mod:`backends.indexer_topk.compare` (exact equality). ``OpSpec.conformance`` names this
module.

A case is a name, a one-line statement of what it pins, and ``make(device, dtype, seed) ->
(args, kwargs)`` building a ``dispatch`` call. Scores are drawn in float32 and cast to the
case's dtype, so fp16 cases carry the ties that rounding creates. The cases cover what the
contract promises: ties broken by position, all-zero rows (``-0.0 == +0.0``), NaN below -inf,
±inf as ordinary values, rows with 0, 1, k-1, k and k+1 valid keys, scores one ulp apart, rows
longer than one slice, and the default k=2048 around its boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CASES", "DTYPES", "FILLS", "Case", "topk_call"]

Call = tuple[tuple[Any, ...], dict[str, Any]]

#: The interpreter handles every dtype here; bfloat16 runs on GPUs only to keep CPU runs short.
DTYPES: dict[str, tuple[str, ...]] = {"cpu": ("float32", "float16"),
                                      "cuda": ("float32", "bfloat16", "float16")}


@dataclass(frozen=True)
class Case:
    name: str
    doc: str
    make: Callable[[Any, Any, int], Call]


def _case(rows: int, keys: int, k: int, fill: Callable[[Any, Any, Any], Any],
          lengths: Callable[[int, int, int], list[int]] | None = None
          ) -> Callable[[Any, Any, int], Call]:
    """Scores ``fill(g, (rows, keys), dtype)``; lengths default to ``keys`` for every row."""

    def make(device: Any, dtype: Any, seed: int) -> Call:
        import torch

        g = torch.Generator().manual_seed(seed)
        scores = fill(g, (rows, keys), dtype).to(dtype=dtype)
        lens = lengths(rows, keys, k) if lengths is not None else [keys] * rows
        return ((scores.to(device).contiguous(),
                 torch.tensor(lens, dtype=torch.int32, device=device)), {"k": k})

    return make


def _randn(g: Any, shape: Any, dtype: Any) -> Any:
    import torch

    return torch.randn(shape, generator=g)


def _ties(g: Any, shape: Any, dtype: Any) -> Any:
    import torch

    x = torch.randint(0, 4, shape, generator=g).float()
    x[0] = 1.0  # a whole row of one value: the first k positions win
    return x


def _zeros(g: Any, shape: Any, dtype: Any) -> Any:
    import torch

    x = torch.zeros(shape)
    neg = torch.rand(shape, generator=g) < 0.5
    x[neg] = -0.0  # -0.0 == +0.0: ties broken by position
    return x


def _nan_inf(g: Any, shape: Any, dtype: Any) -> Any:
    import torch

    x = torch.randn(shape, generator=g)
    u = torch.rand(shape, generator=g)
    x[u < 0.15] = float("nan")
    x[(u >= 0.15) & (u < 0.22)] = float("inf")
    x[(u >= 0.22) & (u < 0.32)] = float("-inf")
    x[1] = float("nan")  # all NaN: still selected, by position
    x[2, ::2] = float("nan")
    x[2, 1::2] = float("-inf")  # -inf ranks above NaN
    x[3, :] = float("-inf")
    x[3, 7] = float("nan")
    return x


def _low_mantissa(g: Any, shape: Any, dtype: Any) -> Any:
    """Scores a few ulps (of the case's dtype) apart: only exact keys order them."""
    import torch

    rows, keys = shape
    int_t = {torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}[dtype]
    base = torch.full((rows, keys), 0.7).to(dtype).view(int_t)
    steps = torch.randint(0, 6, shape, generator=g).to(int_t)
    steps[1] = 0
    steps[1, -1] = 1  # one key one ulp above a row of equal keys
    return (base + steps).view(dtype)


def _negative(g: Any, shape: Any, dtype: Any) -> Any:
    import torch

    return -torch.rand(shape, generator=g) * 100 - 1e-3


def _edges(rows: int, keys: int, k: int) -> list[int]:
    want = [0, 1, k - 1, k, k + 1, keys]
    return [want[i % len(want)] for i in range(rows)]


#: The score patterns of the cases, for a plugin's own cases (:func:`topk_call`).
FILLS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "randn": _randn, "ties": _ties, "zeros": _zeros, "nan_inf": _nan_inf,
    "low_mantissa": _low_mantissa, "negative": _negative}


def topk_call(rows: int, keys: int, k: int, fill: str = "randn",
              lengths: Callable[[int, int, int], list[int]] | None = None
              ) -> Callable[[Any, Any, int], Call]:
    """``make(device, dtype, seed)`` of a case for a plugin's own cases
    (``Implementation.conformance_cases``) at the shapes its capability allows: ``rows`` rows of
    ``keys`` scores in the pattern ``fill`` (a key of :data:`FILLS`), top-``k``,
    ``lengths(rows, keys, k)`` valid keys per row (None: all)."""
    return _case(rows, keys, k, FILLS[fill], lengths)


K = 16

CASES: tuple[Case, ...] = (
    Case("random", "distinct scores, full rows", _case(4, 300, K, _randn)),
    Case("valid_keys_0_1_km1_k_kp1", "rows with 0, 1, k-1, k, k+1 and all keys valid: "
         "-1 padding, no key past lengths[r]", _case(6, 200, K, _randn, _edges)),
    Case("ties", "tie-heavy rows (4 distinct values, one constant row): ties by position",
         _case(4, 300, K, _ties)),
    Case("all_zeros", "all zeros with -0.0 mixed in: the first k positions",
         _case(3, 100, K, _zeros, lambda r, n, k: [n, k + 1, 0])),
    Case("nan_inf", "NaN ranks below -inf, +inf/-inf are ordinary values, all-NaN rows",
         _case(4, 120, K, _nan_inf, lambda r, n, k: [n, n, n, k + 3])),
    Case("low_mantissa", "scores one ulp apart", _case(3, 200, K, _low_mantissa)),
    Case("negative", "all scores negative", _case(3, 150, K, _negative)),
    Case("long_rows", "rows longer than one slice (5,000 keys)",
         _case(2, 5000, K, _ties, lambda r, n, k: [n, n - 3])),
    Case("k2048", "the default k=2048 around its boundary (2047, 2048, 2049 valid keys)",
         _case(4, 2600, 2048, _randn, lambda r, n, k: [k - 1, k, k + 1, n])),
)
