"""Comparing a ``sparse_prefill`` result with the reference's (check mode, the conformance kit).

``OpSpec.compare = "backends.sparse_prefill.compare:compare"``.
"""

from __future__ import annotations

from typing import Any

from backends.sparse_prefill import error_bound

__all__ = ["compare", "max_abs_error"]


def compare(actual: Any, expected: Any) -> str | None:
    """None when ``actual`` agrees with ``expected`` (the reference's output on the same
    inputs), else one line naming the worst element, the error and the bound.

    Agreement, element by element, follows the op's rules for non-finite values
    (:mod:`backends.sparse_prefill`, "Non-finite values"): where the reference is NaN the result
    must be NaN; where it is +-inf (an infinite V value reaching a positive weight) the result
    must be the same infinity or NaN (a kernel's weight may round to 0 where the reference's
    does not); where it is finite the result must be finite and within the op's max-abs bound
    (:func:`backends.sparse_prefill.error_bound` of the result's dtype). So a row with nothing
    valid must be zeros, not NaN, and a NaN the reference does not have is a violation. Shape
    and dtype are checked first.
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
    finite, bad = _nonfinite_disagreement(a, e)
    if bad is not None:
        where = tuple(int(i) for i in bad.nonzero()[0])
        want = float(e[where])
        rule = ("NaN" if want != want else f"{want} or NaN" if abs(want) == float("inf")
                else "finite")
        return (f"non-finite values disagree with the reference at (row, head, dim) {where}: "
                f"got {float(a[where])}, the contract says {rule} (reference {want}); "
                f"{int(bad.sum())} element(s) disagree")
    diff = (a - e).abs()
    if finite is not None:  # where the reference is not finite, the rules above decided
        diff = torch.where(finite, diff, torch.zeros_like(diff))
    err = float(diff.max())
    if err <= bound:
        return None
    where = tuple(int(i) for i in (diff == err).nonzero()[0])
    bad_rows = int((diff.amax(dim=(1, 2)) > bound).sum())
    return (f"max |out - ref| = {err:.3g} > bound {bound:g} ({dtype}) at (row, head, dim) "
            f"{where}: got {float(a[where]):.6g}, reference {float(e[where]):.6g}; "
            f"{bad_rows} of {actual.shape[0]} row(s) outside the bound")


def _nonfinite_disagreement(a: Any, e: Any) -> tuple[Any, Any]:
    """``(where the reference is finite, where a breaks the non-finite rules)`` for the result
    ``a`` and the reference ``e`` (both float64): bool tensors, each None when it would be all
    True (the first) or all False (the second)."""
    import torch

    fin_a, fin_e = torch.isfinite(a), torch.isfinite(e)
    all_e = bool(fin_e.all())
    if all_e and bool(fin_a.all()):
        return None, None
    nan_a = torch.isnan(a)
    ok = torch.where(fin_e, fin_a, torch.where(torch.isnan(e), nan_a, nan_a | (a == e)))
    return (None if all_e else fin_e), (None if bool(ok.all()) else ~ok)


def max_abs_error(actual: Any, expected: Any) -> float:
    """The op's error measure: max |out - ref| in float64 over the elements where the reference
    is finite (inf when the non-finite values disagree with the reference's, as
    :func:`compare` judges them; the bound it is held to is
    :func:`backends.sparse_prefill.error_bound`)."""
    import torch

    if actual.numel() == 0:
        return 0.0
    a, e = actual.detach().double(), expected.detach().double()
    finite, bad = _nonfinite_disagreement(a, e)
    if bad is not None:
        return float("inf")
    diff = (a - e).abs()
    if finite is not None:
        diff = torch.where(finite, diff, torch.zeros_like(diff))
    return float(diff.max())
