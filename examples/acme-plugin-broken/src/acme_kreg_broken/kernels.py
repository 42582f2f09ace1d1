"""The broken kernel: the generic Triton kernel, after removing each row's last valid index.

Plausible-looking and wrong by one entry per row (an off-by-one in a length computation): the
output stays finite and close to the right one, so only a comparison with the reference on
inputs where that last entry matters catches it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["sparse_prefill_blocked"]


def sparse_prefill_blocked(q: Any, k: Any, v: Any, indices: Any, *, config: dict[str, Any],
                           kind: str = "prefill", lengths: Any = None, **kwargs: Any) -> Any:
    import torch

    from backends.sparse_prefill.reference import resolve_slots
    from backends.sparse_prefill.triton_kernels import sparse_prefill_triton

    _, valid = resolve_slots(indices, kind=kind, lengths=lengths, num_slots=k.shape[0],
                             cu_seqlens_q=kwargs.get("cu_seqlens_q"),
                             prefix_lens=kwargs.get("prefix_lens"),
                             page_table=kwargs.get("page_table"),
                             page_size=kwargs.get("page_size", 1))
    topk = indices.shape[1]
    j = torch.arange(topk, device=indices.device)
    last = torch.where(valid, j, torch.full_like(j, -1)).amax(dim=1)  # -1: nothing valid
    dropped = indices.clone()
    rows = torch.nonzero(last >= 0).flatten()
    dropped[rows, last[rows]] = -1
    return sparse_prefill_triton(q, k, v, dropped, config=config, kind=kind, lengths=lengths,
                                 **kwargs)
