"""Comparing an ``indexer_topk`` result with the reference's (check mode, the conformance kit).

``OpSpec.compare = "backends.indexer_topk.compare:compare"``. The op is exact, so the comparison
is list equality per row: same positions, same ascending order, same -1 padding.
"""

from __future__ import annotations

from typing import Any

__all__ = ["compare", "differing_entries"]

_SHOWN = 4  # positions listed per side in a message


def compare(actual: Any, expected: Any) -> str | None:
    """None when every row equals the reference's row, else one line naming the first differing
    row, the positions missing from it and the ones it has in excess."""
    import torch

    if not isinstance(actual, torch.Tensor):
        return f"result is a {type(actual).__name__}, not a tensor"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape {list(actual.shape)} != reference {list(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != reference {expected.dtype} (positions are int32)"
    a = actual.detach().cpu()
    e = expected.detach().cpu()
    rows = (a != e).any(dim=1).nonzero().flatten().tolist()
    if not rows:
        return None
    r = rows[0]
    got, want = a[r].tolist(), e[r].tolist()
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        detail = f"missing {_fmt(missing)}, extra {_fmt(extra)}"
    else:
        detail = "same positions in another order (the output must ascend, -1 padding last)"
    valid = sum(1 for x in want if x >= 0)
    return (f"{len(rows)} of {a.shape[0]} row(s) differ; first: row {r} ({valid} selected by "
            f"the reference): {detail}")


def _fmt(xs: list[int]) -> str:
    if not xs:
        return "[]"
    head = ", ".join(map(str, xs[:_SHOWN]))
    return f"[{head}{', ...' if len(xs) > _SHOWN else ''}] ({len(xs)})"


def differing_entries(actual: Any, expected: Any) -> float:
    """The op's error measure: entries that differ from the exact reference (0 when correct;
    every entry when the shapes differ)."""
    if tuple(actual.shape) != tuple(expected.shape):
        return float(expected.numel())
    return float(int((actual != expected).sum()))
