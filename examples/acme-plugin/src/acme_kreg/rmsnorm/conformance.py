"""Conformance cases of ``acme_rmsnorm`` (``OpSpec.conformance``): what every implementation
must get right. Each case: a name, what it pins, ``make(device, dtype, seed) -> (args,
kwargs)``. Small, so the Triton interpreter runs them on a CPU in well under a second."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CASES", "DTYPES", "Case"]

#: The interpreter's bfloat16 is broken, so CPU runs float32 and float16.
DTYPES = {"cpu": ("float32", "float16"), "cuda": ("float32", "float16", "bfloat16")}


@dataclass(frozen=True)
class Case:
    name: str
    doc: str
    make: Callable[[Any, Any, int], Any]


def _make(rows: int, cols: int, scale: float = 1.0, zero_row: bool = False,
          eps: float | None = None) -> Callable[[Any, Any, int], Any]:
    def make(device: Any, dtype: Any, seed: int) -> Any:
        import torch

        g = torch.Generator().manual_seed(seed)
        x = torch.randn(rows, cols, generator=g) * scale
        if zero_row and rows:
            x[0] = 0.0
        w = torch.randn(cols, generator=g)
        kwargs = {} if eps is None else {"eps": eps}
        return (x.to(device=device, dtype=dtype), w.to(device=device, dtype=dtype)), kwargs

    return make


CASES = (
    Case("small", "a few rows of a power-of-two width", _make(5, 64)),
    Case("ragged_cols", "a width that is not a power of two (masked tail)", _make(7, 100)),
    Case("one_col", "a single column", _make(3, 1)),
    Case("no_rows", "no rows: an empty output", _make(0, 32)),
    Case("zero_row", "an all-zero row: eps keeps it finite (zeros out)", _make(4, 48, zero_row=True,
                                                                            eps=1e-5)),
    Case("large_values", "values near 300: the sum of squares in float32", _make(3, 96, 300.0)),
    Case("many_rows", "more rows than one program's ROWS", _make(67, 32)),
)
