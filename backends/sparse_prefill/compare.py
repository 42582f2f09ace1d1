"""Comparing a ``sparse_prefill`` result with the reference's (check mode, the conformance kit).

``OpSpec.compare = "backends.sparse_prefill.compare:compare"``.
"""

from __future__ import annotations

from typing import Any

from backends.sparse_prefill import error_bound

__all__ = ["compare"]


def compare(actual: Any, expected: Any) -> str | None:
    """None when ``actual`` is within the op's max-abs bound of ``expected`` (the reference's
    output on the same inputs), else one line naming the worst element, the error and the bound.

    The bound is :func:`backends.sparse_prefill.error_bound` of the result's dtype; shape, dtype
    and non-finite values are violations too (a row with nothing valid must be zeros, not NaN).
    """
    import torch

    if not isinstance(actual, torch.Tensor):
        return f"result is a {type(actual).__name__}, not a tensor"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape {list(actual.shape)} != reference {list(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != reference {expected.dtype} (the output has q's dtype)"
    dtype = str(actual.dtype).removeprefix("torch.")
    bound = error_bound(dtype)
    if actual.numel() == 0:
        return None
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    finite = torch.isfinite(a)
    if not bool(finite.all()):
        where = tuple(int(i) for i in (~finite).nonzero()[0])
        return (f"non-finite output {float(a[where])} at (row, head, dim) {where}; "
                f"{int((~finite).sum())} non-finite element(s)")
    diff = (a - e).abs()
    err = float(diff.max())
    if err <= bound:
        return None
    where = tuple(int(i) for i in (diff == err).nonzero()[0])
    bad_rows = int((diff.amax(dim=(1, 2)) > bound).sum())
    return (f"max |out - ref| = {err:.3g} > bound {bound:g} ({dtype}) at (row, head, dim) "
            f"{where}: got {float(a[where]):.6g}, reference {float(e[where]):.6g}; "
            f"{bad_rows} of {actual.shape[0]} row(s) outside the bound")
