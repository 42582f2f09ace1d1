"""FlashInfer's paged-KV arguments for a sparse selection, ``page_size = 1``: each query row is
one request whose pages are its valid KV slots. Pure torch; used by the ``flashinfer`` plugin
(``flashinfer.sparse_prefill``) and by ``kreg bench sparse_prefill --providers
flashinfer-paged`` (FlashInfer's decode wrapper planned once, ``run()`` timed alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PagedKV", "paged_kv_args"]


@dataclass
class PagedKV:
    """FlashInfer's paged-KV arguments with ``page_size=1``: one request per query row."""

    indptr: Any         # int32 [rows + 1] on the host: cumulative pages
    indices: Any        # int32 [indptr[-1]] on the device: the pages (slots), row after row
    last_page_len: Any  # int32 [rows] on the host: 1 (every page holds one token)
    empty: Any          # bool [rows] on the device: rows with nothing valid (zeroed after)


def paged_kv_args(slot: Any, valid: Any) -> PagedKV:
    """The valid slots of each row as pages, in row order then entry order (a slot listed twice
    is a page twice). A row with nothing valid gets one page (slot 0; its output is zeroed):
    FlashInfer gives a request of zero pages one token (``get_seq_lens`` clamps the page count
    at 0 before adding ``last_page_len``), which would read the next row's page. One
    device-to-host copy (``indptr``)."""
    import torch

    rows = slot.shape[0]
    counts = valid.sum(dim=1, dtype=torch.int32)
    empty = counts == 0
    per_row = torch.where(empty, torch.ones_like(counts), counts)
    indptr_dev = torch.zeros(rows + 1, dtype=torch.int32, device=slot.device)
    indptr_dev[1:] = torch.cumsum(per_row, dim=0, dtype=torch.int32)
    indptr = indptr_dev.cpu()   # the call's one synchronization; plan() needs it on the host
    total = int(indptr[-1])
    start = indptr_dev[:-1, None]
    rank = torch.cumsum(valid, dim=1, dtype=torch.int32) - 1
    spill = torch.full_like(rank, total)      # invalid entries land past the end, cut off
    dest = torch.where(valid, start + rank, spill).to(torch.int64)
    flat = torch.empty(total + 1, dtype=torch.int32, device=slot.device)
    flat.scatter_(0, dest.reshape(-1), slot.to(torch.int32).reshape(-1))
    first = torch.where(empty, indptr_dev[:-1], torch.full_like(counts, total)).to(torch.int64)
    flat.scatter_(0, first, torch.zeros_like(counts))
    return PagedKV(indptr=indptr, indices=flat[:total],
                   last_page_len=torch.ones(rows, dtype=torch.int32), empty=empty)
