"""Comparing a ``sparse_prefill`` result with the reference's (check mode, the conformance kit).

``OpSpec.compare = "backends.sparse_prefill.compare:compare"``.
"""

from __future__ import annotations

from typing import Any

from backends.sparse_prefill import error_bound

__all__ = ["compare", "max_abs_error"]


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
    # The reference may be computed in higher precision (the bench and the tuner judge against
    # the fp32 reference); the bound is always the result's dtype's.
    if actual.dtype != expected.dtype and not (
            expected.is_floating_point() and actual.is_floating_point()
            and expected.element_size() > actual.element_size()):
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


def max_abs_error(actual: Any, expected: Any) -> float:
    """The op's error measure: max |out - ref| in float64 (inf when the output has a non-finite
    value; the bound it is held to is :func:`backends.sparse_prefill.error_bound`)."""
    import torch

    if actual.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(actual).all()):
        return float("inf")
    return float((actual.double() - expected.double()).abs().max())
