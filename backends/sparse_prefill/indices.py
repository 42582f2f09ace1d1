"""Index sets for ``sparse_prefill`` benches and tests (pure functions of torch tensors).

Two generators of each row's selected positions, both ``(indices int32 [rows, topk], lengths
int32 [rows])`` with ``lengths[r] = min(topk, visible[r])`` valid leading entries and ``-1``
after them:

* :func:`walk_indices`: the seed's affine walk (the bench's ``--indices walk``, unchanged):
  ``t_j = (r * 7919 + j * 1000003) mod V`` in a scattered order. Neighbouring rows share about as
  many positions as two random subsets do: a pessimistic view of inter-row reuse.
* :func:`topk_indices` (``--indices topk``): the real top-k of synthetic indexer scores, emitted
  in ascending position order as an indexer's top-k emits them. Row ``r`` of request ``b``, at a
  visible range of positions ``[0, V_r)``, scores position ``t`` as::

      s[r, t] = sqrt(overlap) * importance[b, t] + sqrt(1 - overlap) * noise[r, t]

  with ``importance`` (one value per token of the request, shared by all its rows) and
  ``noise`` (per row and position) independent standard normals; the last ``window`` visible
  positions (``t >= V_r - window``: the recent tokens) score ``+inf`` and positions ``t >=
  V_r`` (not visible, causal) ``-inf``. The row keeps its ``min(topk, V_r)`` best positions,
  sorted ascending.

  Parameters (:class:`TopkParams`):

  - ``overlap`` in ``[0, 1]`` (default 0.95): the correlation of two rows' scores at a position.
    0: every row an independent random subset (the walk's overlap, about ``p / (2 - p)`` Jaccard
    at ``p = topk / V`` visible); 1: the rows of a request select the same positions but for the
    causal ramp and the window (near-identical rows). The default gives neighbouring rows most
    of their slots in common (the figures :func:`overlap_stats` measures are in
    docs/notes/sparse_prefill.md).
  - ``window`` (default 64): the recent positions every row selects (sliding-window locality;
    capped at ``topk``).
  - ``seed`` (default 0): the generator's seed. The same seed, shapes and device type give the
    same indices (the random streams are drawn on ``visible``'s device, so CPU and CUDA draw
    different ones).

  Cost: rows are scored in blocks of about ``2**26`` scores (``[block, max(V)]`` fp32 noise, a
  top-k and a sort of ``topk`` entries a row, all on the device): 8192 rows x KV 131072 is 16
  blocks of 512 rows.

:func:`overlap_stats` measures what neighbouring rows share: the mean Jaccard of the valid
entry sets of rows ``r`` and ``r + 1`` and the mean size of the union of 16 consecutive rows,
over ``topk`` (pairs and blocks that cross a request boundary are left out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TopkParams", "overlap_stats", "topk_indices", "walk_indices"]

_P = 1000003
_BLOCK_ELEMS = 1 << 26  # scores (or mask entries) one block of rows holds at most


@dataclass(frozen=True)
class TopkParams:
    """The synthetic indexer's parameters (module doc, :func:`topk_indices`)."""

    overlap: float = 0.95
    window: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.overlap, int | float) and 0.0 <= self.overlap <= 1.0):
            raise ValueError(f"overlap={self.overlap!r}: expected a number in [0, 1] (the "
                             f"correlation of two rows' scores)")
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 0:
            raise ValueError(f"window={self.window!r}: expected an int >= 0 (recent positions "
                             f"every row selects)")


def walk_indices(visible: Any, topk: int) -> tuple[Any, Any]:
    """The seed's affine walk over each row's ``visible[r]`` positions (module doc)."""
    import torch

    vis = visible.to(torch.int64)
    r = torch.arange(vis.shape[0], device=vis.device, dtype=torch.int64)
    j = torch.arange(topk, device=vis.device, dtype=torch.int64)
    n = torch.clamp(vis, max=topk)
    t = (r[:, None] * 7919 + j[None, :] * _P) % vis[:, None]
    idx = torch.where(j[None, :] < n[:, None], t, torch.full_like(t, -1)).to(torch.int32)
    return idx.contiguous(), n.to(torch.int32)


def _block_rows(width: int, rows: int) -> int:
    return max(16, min(rows, (_BLOCK_ELEMS // max(width, 1)) // 16 * 16))


def topk_indices(visible: Any, topk: int, params: TopkParams | None = None, *,
                 request: Any = None, num_requests: int = 1) -> tuple[Any, Any]:
    """Each row's top-``topk`` positions of the synthetic indexer scores, ascending (module doc).

    ``visible`` int [rows] (on the device the indices are built on): row r sees positions
    ``[0, visible[r])``; ``request`` int [rows] (default all 0): the request of each row, which
    picks its shared importance (``num_requests`` of them). Returns ``(indices int32 [rows,
    topk], lengths int32 [rows])``; entries past ``lengths[r] = min(topk, visible[r])`` are -1.
    """
    import torch

    p = params or TopkParams()
    dev = visible.device
    vis = visible.to(torch.int64)
    rows = vis.shape[0]
    width = int(vis.max()) if rows else 0
    n = torch.clamp(vis, min=0, max=topk)
    idx = torch.full((rows, topk), -1, dtype=torch.int32, device=dev)
    if rows == 0 or width <= 0 or topk <= 0:
        return idx, n.to(torch.int32)
    gen = torch.Generator(device=dev).manual_seed(p.seed)
    imp = torch.randn((num_requests, width), generator=gen, device=dev)
    req = (torch.zeros(rows, dtype=torch.int64, device=dev) if request is None
           else request.to(device=dev, dtype=torch.int64))
    a, b = math.sqrt(p.overlap), math.sqrt(1.0 - p.overlap)
    kk = min(topk, width)
    pos = torch.arange(width, device=dev, dtype=torch.int64)
    window = min(p.window, topk)
    step = _block_rows(width, rows)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        v = vis[r0:r1, None]
        s = torch.randn((r1 - r0, width), generator=gen, device=dev)
        s.mul_(b).add_(imp[req[r0:r1]], alpha=a)
        s.masked_fill_(pos[None, :] >= v - window, float("inf"))
        s.masked_fill_(pos[None, :] >= v, float("-inf"))
        vals, top = torch.topk(s, kk, dim=1, sorted=False)
        del s
        top = torch.where(vals > float("-inf"), top, width)  # not visible: sorts last
        top = torch.sort(top, dim=1).values
        idx[r0:r1, :kk] = torch.where(top < width, top, -1).to(torch.int32)
    return idx, n.to(torch.int32)


def overlap_stats(indices: Any, lengths: Any = None, *, width: int | None = None,
                  row_groups: Sequence[int] | None = None, block: int = 16) -> dict[str, float]:
    """What neighbouring rows share, on the valid entries (``0 <= t < width``, ``j <
    lengths[r]``; a set: duplicates count once).

    ``row_groups``: the row counts of the requests in order (default one request): pairs and
    ``block``-row blocks (aligned to the request's first row) that cross a request are left out.
    Returns ``{"jaccard": mean Jaccard of rows r, r + 1, "union16": mean union size of ``block``
    consecutive rows, "union16_over_topk": that over topk}`` (0 where no pair or block exists).
    """
    import torch

    rows, topk = indices.shape
    dev = indices.device
    if width is None:
        width = int(indices.max()) + 1 if indices.numel() else 0
    width = max(int(width), 1)
    groups = list(row_groups) if row_groups else [rows]
    if sum(groups) != rows:
        raise ValueError(f"row_groups sum to {sum(groups)}, not the {rows} rows")
    j = torch.arange(topk, device=dev)
    jac_sum, jac_n, uni_sum, uni_n = 0.0, 0, 0.0, 0
    step = max(block, (_BLOCK_ELEMS // width) // block * block)
    g0 = 0
    for g in groups:
        for r0 in range(g0, g0 + g, step):
            r1 = min(g0 + g, r0 + step + 1)  # one row more: the pair across the block edge
            t = indices[r0:r1].to(torch.int64)
            ok = (t >= 0) & (t < width)
            if lengths is not None:
                ok &= j[None, :] < lengths[r0:r1, None].to(torch.int64)
            m = torch.zeros((r1 - r0, width), dtype=torch.bool, device=dev)
            m.scatter_(1, torch.where(ok, t, 0), ok)  # invalid entries write False at 0
            m[:, 0] = (ok & (t == 0)).any(dim=1)  # slot 0 as written, not as the fill's target
            if r1 - r0 >= 2:
                inter = (m[:-1] & m[1:]).sum(dim=1)
                union = (m[:-1] | m[1:]).sum(dim=1)
                jac = torch.where(union > 0, inter / union.clamp(min=1), 1.0)
                jac_sum += float(jac.sum())
                jac_n += r1 - r0 - 1
            full = min(r1, r0 + step) - r0  # rows this block owns (not the extra one)
            nb = full // block
            if nb:
                u = m[:nb * block].view(nb, block, width).any(dim=1).sum(dim=1)
                uni_sum += float(u.sum())
                uni_n += nb
        g0 += g
    jaccard = jac_sum / jac_n if jac_n else 0.0
    union16 = uni_sum / uni_n if uni_n else 0.0
    return {"jaccard": jaccard, "union16": union16, "union16_over_topk": union16 / topk}
