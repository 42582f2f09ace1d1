"""Torch reference for ``sparse_prefill`` (runs on CPU and GPU).

Semantics (the pinned op contract):

* ``kind="prefill"``: ``indices[r, j]`` is a slot of ``k``/``v`` directly. Entry ``j`` of row ``r``
  is skipped when ``j >= lengths[r]`` or the slot is ``< 0`` or ``>= num_slots``.
* ``kind="chunk"``: ``indices[r, j]`` is a token position ``t`` of the row's request ``b``; the row
  sits at position ``p = prefix_lens[b] + (r - cu_seqlens_q[b])``. The entry is valid iff
  ``j < lengths[r]``, ``0 <= t <= p``, ``t // page_size < max_pages``,
  ``page_table[b, t // page_size] >= 0`` and the slot
  ``page_table[b, t // page_size] * page_size + t % page_size`` is ``< num_slots``.

Query head ``j`` reads KV head ``j // group_size``. A slot listed twice counts twice. A row with
nothing valid yields zeros. Softmax runs in float32 (float64 when the inputs are float64).
The inputs are checked by :func:`backends.sparse_prefill.check_inputs` (the same rules and
messages as every kernel); NaN and inf follow the op's rules (:mod:`backends.sparse_prefill`,
"Non-finite values"): K/V rows of invalid entries are zeroed before they are used, a NaN or
+inf score makes its row-head NaN, a -inf score is a weight of 0.

Memory is bounded: rows are processed in chunks so that the gathered K/V of one chunk stays near
``_CHUNK_ELEMS`` elements, which lets the reference run at the seed's shapes (8192 rows x 2051 x
256) on a GPU.
"""

from __future__ import annotations

from typing import Any

__all__ = ["resolve_slots", "sparse_prefill_reference"]

_CHUNK_ELEMS = 1 << 25  # gathered elements per K (or V) chunk: 32M -> 128 MiB in fp32


def resolve_slots(indices: Any, *, kind: str = "prefill", lengths: Any = None, num_slots: int,
                  cu_seqlens_q: Any = None, prefix_lens: Any = None, page_table: Any = None,
                  page_size: int = 1, row_start: int = 0) -> tuple[Any, Any]:
    """Slots and validity of ``indices`` rows ``[row_start, row_start + len(indices))``.

    Returns ``(slot, valid)``: int64 ``[rows, topk]`` (invalid entries hold 0) and bool.
    """
    import torch

    rows, topk = indices.shape
    dev = indices.device
    idx = indices.to(torch.int64)
    j = torch.arange(topk, device=dev, dtype=torch.int64)
    r = torch.arange(row_start, row_start + rows, device=dev, dtype=torch.int64)
    if lengths is None:
        n = torch.full((rows,), topk, device=dev, dtype=torch.int64)
    else:
        n = lengths[row_start:row_start + rows].to(torch.int64)
    valid = j[None, :] < n[:, None]
    if kind == "prefill":
        slot = idx
    elif kind == "chunk":
        cu = cu_seqlens_q.to(torch.int64)
        b = torch.searchsorted(cu, r, right=True) - 1
        b = b.clamp(0, cu.numel() - 2)
        p = prefix_lens.to(torch.int64)[b] + (r - cu[b])
        valid &= (idx >= 0) & (idx <= p[:, None])
        max_pages = page_table.shape[1]
        page_no = torch.div(idx, page_size, rounding_mode="floor")
        valid &= page_no < max_pages
        pt = page_table.to(torch.int64)
        page = pt[b[:, None], page_no.clamp(0, max(max_pages - 1, 0))] if max_pages > 0 \
            else torch.full_like(idx, -1)
        valid &= page >= 0
        slot = page * page_size + torch.remainder(idx, page_size)
    else:
        raise ValueError(f"kind={kind!r}: expected 'prefill' or 'chunk'")
    valid &= (slot >= 0) & (slot < num_slots)
    slot = torch.where(valid, slot, torch.zeros_like(slot))
    return slot, valid


def sparse_prefill_reference(q: Any, k: Any, v: Any, indices: Any, *, kind: str = "prefill",
                             lengths: Any = None, sm_scale: float | None = None,
                             cu_seqlens_q: Any = None, prefix_lens: Any = None,
                             page_table: Any = None, page_size: int = 1, max_q: int | None = None,
                             out_dtype: Any = None) -> Any:
    """Sparse GQA attention of every query row over its selected KV slots (see module doc).

    Computes in float32 (float64 when ``q`` is float64); returns ``out_dtype`` (default q.dtype).
    ``max_q`` is accepted and ignored.
    """
    import torch

    from backends.sparse_prefill import check_inputs

    check_inputs(q, k, v, indices, kind=kind, lengths=lengths, sm_scale=sm_scale,
                 cu_seqlens_q=cu_seqlens_q, prefix_lens=prefix_lens, page_table=page_table,
                 page_size=page_size, max_q=max_q)
    total_q, hq, d = q.shape
    num_slots, hkv, _ = k.shape
    topk = indices.shape[1]
    group = hq // hkv
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = float(sm_scale) if sm_scale is not None else d ** -0.5
    out = torch.empty((total_q, hq, d), device=q.device, dtype=out_dtype or q.dtype)
    if total_q == 0:
        return out
    per_row = max(1, topk * hkv * d)
    step = max(1, min(total_q, _CHUNK_ELEMS // per_row))
    for r0 in range(0, total_q, step):
        r1 = min(total_q, r0 + step)
        slot, valid = resolve_slots(indices[r0:r1], kind=kind, lengths=lengths,
                                    num_slots=num_slots, cu_seqlens_q=cu_seqlens_q,
                                    prefix_lens=prefix_lens, page_table=page_table,
                                    page_size=page_size, row_start=r0)
        rows = r1 - r0
        if num_slots == 0:
            out[r0:r1] = 0
            continue
        kg = k[slot.reshape(-1)].to(cdt).reshape(rows, topk, hkv, d)
        vg = v[slot.reshape(-1)].to(cdt).reshape(rows, topk, hkv, d)
        vmask = valid[:, :, None, None]
        kg = torch.where(vmask, kg, torch.zeros((), dtype=cdt, device=q.device))
        vg = torch.where(vmask, vg, torch.zeros((), dtype=cdt, device=q.device))
        qc = q[r0:r1].to(cdt).reshape(rows, hkv, group, d)
        s = torch.einsum("rhgd,rthd->rhgt", qc, kg) * scale
        s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
        # The kernels' online softmax, in one pass: the max is the reference point unless it is
        # -inf (nothing valid, or every valid score -inf: then every weight is exp(-inf) = 0). A
        # NaN score makes the max NaN and a +inf one makes inf - inf: both give NaN weights, so
        # the row-head is NaN, as the contract says; nothing here replaces a NaN.
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        denom = p.sum(dim=-1, keepdim=True)
        o = torch.einsum("rhgt,rthd->rhgd", p, vg)
        # A zero sum (no weight at all) divides by 1: the sum of 0 * v, zeros unless a valid V
        # row holds a NaN or inf (0 * inf is NaN in the kernels' products too).
        o = o / torch.where(denom == 0, torch.ones_like(denom), denom)
        out[r0:r1] = o.reshape(rows, hq, d).to(out.dtype)
    return out
