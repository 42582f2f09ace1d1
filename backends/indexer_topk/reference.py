"""Exact torch reference for ``indexer_topk`` (CPU and GPU).

Semantics (the op contract, shared with the Triton kernels):

* Each score becomes an order-preserving int32 key (:func:`score_keys`): the float32 bit pattern
  with the sign handled so that signed int32 order equals float order. ``-0.0`` is mapped to
  ``+0.0`` first (the two compare equal and tie by position). Every NaN (any sign, any payload)
  maps to ``INT32_MIN + 1``, below ``-inf`` (``0x807FFFFF``): NaN keys stay selectable, last.
  ``+inf`` and ``-inf`` are ordinary values. fp16 and bf16 scores are widened to float32 first
  (exact), so they order exactly as their values.
* Row ``r`` considers its first ``clamp(lengths[r], 0, max_keys)`` keys. Membership is the first
  ``k`` of those by (key descending, position ascending); the list is emitted in ascending
  position order and padded with -1 when the row has fewer than ``k`` valid keys.

The selection is computed with one ``torch.topk`` over a composite int64
``(key + 2**31) << POS_BITS | (2**POS_BITS - 1 - position)``, which has no ties, so the result
does not depend on how ``torch.topk`` breaks ties. Memory: 8 bytes per score (the composite).
"""

from __future__ import annotations

from typing import Any

__all__ = ["NAN_KEY", "indexer_topk", "indexer_topk_reference", "score_keys", "topk_mismatches",
           "topk_to_slots"]

INT32_MIN = -(2 ** 31)
NAN_KEY = INT32_MIN + 1   # below -inf's key (-2139095041); INT32_MIN itself marks "no key"


def _check(scores: Any, lengths: Any, k: int) -> None:
    from backends.indexer_topk.config import check_inputs

    check_inputs(scores, lengths, k)


def score_keys(scores: Any) -> Any:
    """int32 keys whose signed order is the score order (NaN lowest, -0.0 == +0.0)."""
    import torch

    x = scores.float()
    bits = x.view(torch.int32)
    bits = torch.where(bits == INT32_MIN, torch.zeros_like(bits), bits)
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return torch.where(torch.isnan(x), torch.full_like(keys, NAN_KEY), keys)


def indexer_topk_reference(scores: Any, lengths: Any, k: int = 2048) -> Any:
    """Exact top-k positions per row, ascending, -1 padded: int32 ``[rows, k]``."""
    import torch

    _check(scores, lengths, k)
    rows, n = scores.shape
    dev = scores.device
    out = torch.full((rows, k), -1, dtype=torch.int32, device=dev)
    if rows == 0 or n == 0:
        return out
    pos_bits = max(1, (n - 1).bit_length())
    lens = lengths.to(torch.int64).clamp(0, n)
    pos = torch.arange(n, device=dev, dtype=torch.int64)
    comp = ((score_keys(scores).to(torch.int64) - INT32_MIN) << pos_bits) \
        | ((1 << pos_bits) - 1 - pos)
    comp = torch.where(pos[None, :] < lens[:, None], comp, torch.full_like(comp, -1))
    kk = min(k, n)
    vals, idx = torch.topk(comp, kk, dim=1, largest=True, sorted=True)
    big = torch.iinfo(torch.int64).max
    idx = torch.where(vals >= 0, idx, torch.full_like(idx, big))
    idx = torch.sort(idx, dim=1).values
    out[:, :kk] = torch.where(idx == big, torch.full_like(idx, -1), idx).to(torch.int32)
    return out


indexer_topk = indexer_topk_reference


def topk_to_slots(topk_idx: Any, page_table: Any, page_size: int) -> Any:
    """Translate top-k token positions into KV-cache slot ids through a page table.

    ``topk_idx`` int32 ``[rows, k]`` (positions, -1 = none), ``page_table`` int32
    ``[rows, max_pages]`` (page id of each logical page of the row's request). Returns int32
    ``[rows, k]``: ``page_table[r, p // page_size] * page_size + p % page_size``; -1 stays -1.
    """
    import torch

    from registry.errors import WorkloadError

    if page_table.dim() != 2 or page_table.shape[0] != topk_idx.shape[0]:
        raise WorkloadError(f"topk_to_slots: page_table must be [rows={topk_idx.shape[0]}, "
                            f"max_pages]; got {tuple(page_table.shape)}")
    if not isinstance(page_size, int) or page_size < 1:
        raise WorkloadError(f"topk_to_slots: page_size must be a positive int; got {page_size!r}")
    valid = topk_idx >= 0
    p = torch.where(valid, topk_idx, torch.zeros_like(topk_idx)).to(torch.int64)
    page = torch.div(p, page_size, rounding_mode="floor")
    if page_table.shape[1] == 0:
        return torch.full_like(topk_idx, -1)
    page = page.clamp(max=page_table.shape[1] - 1)
    slot = torch.gather(page_table.to(torch.int64), 1, page) * page_size + p % page_size
    return torch.where(valid, slot, torch.full_like(slot, -1)).to(torch.int32)


def topk_mismatches(got: Any, want: Any, *, limit: int = 8) -> list[str]:
    """Entry-by-entry comparison of two top-k lists; [] when bitwise equal.

    Each message names the row, the first differing entry, and the positions one list has and
    the other lacks ("missed"/"extra"), so a wrong member, a swapped pair and a wrong order are
    all reported. At most ``limit`` rows are described.
    """

    if tuple(got.shape) != tuple(want.shape):
        return [f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"]
    if got.dtype != want.dtype:
        return [f"dtype {got.dtype} != expected {want.dtype}"]
    g = got.detach().cpu()
    w = want.detach().cpu()
    bad = (g != w).any(dim=1).nonzero().flatten().tolist() if g.numel() else []
    msgs = []
    for r in bad[:limit]:
        diff = (g[r] != w[r]).nonzero().flatten()
        i = int(diff[0])
        gs = set(g[r].tolist()) - {-1}
        ws = set(w[r].tolist()) - {-1}
        msgs.append(f"row {r}: entry {i} is {int(g[r, i])}, expected {int(w[r, i])} "
                    f"({len(diff)} entries differ; missed {sorted(ws - gs)[:4]} "
                    f"({len(ws - gs)}), extra {sorted(gs - ws)[:4]} ({len(gs - ws)}))")
    if len(bad) > limit:
        msgs.append(f"... and {len(bad) - limit} more rows")
    return msgs
