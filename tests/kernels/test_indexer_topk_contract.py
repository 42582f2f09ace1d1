"""indexer_topk's input rules, held the same way by every implementation (issue #24): one check
(``backends.indexer_topk.check_inputs``) at every entry, a WorkloadError naming the argument and
the fix. (The kernel's own stride handling is tested with the kernel.)"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import registry  # noqa: E402
from backends.indexer_topk import check_inputs  # noqa: E402
from backends.indexer_topk.reference import indexer_topk_reference  # noqa: E402
from registry.errors import WorkloadError  # noqa: E402


def _call() -> tuple[Any, Any]:
    scores = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    return scores, torch.tensor([10, 4, 0], dtype=torch.int32)


BAD = {
    "negative-length": (lambda s, n: (s, n.index_fill(0, torch.tensor([1]), -2), 4),
                        r"lengths must be >= 0 .*got -2 at row 1"),
    "length-past-max_keys": (lambda s, n: (s, n + 1, 4), r"lengths must be <= max_keys \(10\)"),
    "lengths-list": (lambda s, n: (s, n.tolist(), 4), r"lengths must be a 1-D tensor of 3 "),
    "lengths-float": (lambda s, n: (s, 1.5, 4), r"lengths must be a 1-D tensor .*got float"),
    "lengths-2d": (lambda s, n: (s, n[:, None], 4), r"lengths must be a 1-D tensor of 3"),
    "lengths-shorter": (lambda s, n: (s, n[:2], 4), r"lengths must be a 1-D tensor of 3"),
    "lengths-int64": (lambda s, n: (s, n.long(), 4), r"lengths must be int32; got torch.int64"),
    "lengths-on-meta": (lambda s, n: (s, n.to("meta"), 4), r"lengths is on meta but scores"),
    "scores-3d": (lambda s, n: (s[None], n, 4), r"scores must be a 2-D tensor"),
    "scores-float64": (lambda s, n: (s.double(), n, 4), r"scores dtype must be float32"),
    "scores-stride": (lambda s, n: (s.t().contiguous().t(), n, 4),
                      r"scores must have unit stride along keys"),
    "k-zero": (lambda s, n: (s, n, 0), r"k must be a positive int; got 0"),
    "k-float": (lambda s, n: (s, n, 2.5), r"k must be a positive int; got 2.5"),
}


@pytest.mark.parametrize("entry", ["reference", "check_inputs"])
@pytest.mark.parametrize("name", list(BAD))
def test_bad_calls_are_refused_with_the_rule(name: str, entry: str) -> None:
    make, match = BAD[name]
    args = make(*_call())
    fn = indexer_topk_reference if entry == "reference" else check_inputs
    with pytest.raises(WorkloadError, match=match):
        fn(*args)


@pytest.mark.parametrize("name", ["negative-length", "scores-stride", "lengths-int64"])
def test_dispatch_refuses_them_too(name: str) -> None:
    make, match = BAD[name]
    scores, lengths, k = make(*_call())
    for forced in (None, "reference.indexer_topk"):
        ctx = registry.override("indexer_topk", forced) if forced else contextlib.nullcontext()
        with ctx, pytest.raises(WorkloadError, match=match):
            registry.dispatch("indexer_topk", scores, lengths, k=k)


def test_check_inputs_is_public_and_strided_lengths_are_fine() -> None:
    import backends.indexer_topk as op

    assert "check_inputs" in op.__all__ and "check_inputs" in (op.__doc__ or "")
    scores, lengths = _call()
    strided = torch.stack([lengths, torch.full_like(lengths, 99)], 1)[:, 0]
    assert strided.stride(0) == 2
    assert torch.equal(indexer_topk_reference(scores, strided, 4),
                       indexer_topk_reference(scores, lengths, 4))
    # metadata only on a device: meta tensors have no values to read
    check_inputs(scores.to("meta"), lengths.to("meta"), 4)
