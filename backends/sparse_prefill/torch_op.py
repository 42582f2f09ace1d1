"""``torch.ops.kreg.sparse_prefill``: the op as a torch custom op, for ``torch.compile``.

Importing this module registers ``kreg::sparse_prefill``. Its real implementation is
``registry.dispatch("sparse_prefill", ...)`` (so selection, overrides, the recorder and check
mode all apply), and its fake implementation gives the output's shape and dtype (q's) without
running anything, so ``torch.compile(fullgraph=True)`` traces code that calls it without a graph
break::

    import backends.sparse_prefill.torch_op  # registers the op
    out = torch.ops.kreg.sparse_prefill(q, k, v, indices, kind="prefill", lengths=lengths)

The schema mirrors the ``dispatch`` call (see :mod:`backends.sparse_prefill`); every argument
after ``indices`` is optional (pass them by keyword; a custom op cannot make tensor arguments
keyword-only). The op is functional (no argument is mutated)
and has no autograd formula (inference only).

No ``from __future__ import annotations`` here: ``torch.library`` infers the schema from the
annotations.
"""

from typing import Optional

import torch

import registry
from backends.sparse_prefill import check_inputs

__all__ = ["sparse_prefill"]


@torch.library.custom_op("kreg::sparse_prefill", mutates_args=())
def sparse_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                   kind: str = "prefill", lengths: Optional[torch.Tensor] = None,  # noqa: UP045
                   sm_scale: Optional[float] = None,  # noqa: UP045
                   cu_seqlens_q: Optional[torch.Tensor] = None,  # noqa: UP045
                   prefix_lens: Optional[torch.Tensor] = None,  # noqa: UP045
                   page_table: Optional[torch.Tensor] = None,  # noqa: UP045
                   page_size: int = 1, max_q: Optional[int] = None  # noqa: UP045
                   ) -> torch.Tensor:
    """Sparse GQA prefill attention through ``registry.dispatch`` (the pinned op contract)."""
    out: torch.Tensor = registry.dispatch(
        "sparse_prefill", q, k, v, indices, kind=kind, lengths=lengths, sm_scale=sm_scale,
        cu_seqlens_q=cu_seqlens_q, prefix_lens=prefix_lens, page_table=page_table,
        page_size=page_size, max_q=max_q)
    return out


@sparse_prefill.register_fake
def _sparse_prefill_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         indices: torch.Tensor, kind: str = "prefill",
                         lengths: Optional[torch.Tensor] = None,  # noqa: UP045
                         sm_scale: Optional[float] = None,  # noqa: UP045
                         cu_seqlens_q: Optional[torch.Tensor] = None,  # noqa: UP045
                         prefix_lens: Optional[torch.Tensor] = None,  # noqa: UP045
                         page_table: Optional[torch.Tensor] = None,  # noqa: UP045
                         page_size: int = 1, max_q: Optional[int] = None  # noqa: UP045
                         ) -> torch.Tensor:
    # the op's input rules hold at trace time too (they read metadata only, which fake tensors
    # have): torch.compile reports a bad call where it is traced, with the dispatch's message
    check_inputs(q, k, v, indices, kind=kind, lengths=lengths, sm_scale=sm_scale,
                 cu_seqlens_q=cu_seqlens_q, prefix_lens=prefix_lens, page_table=page_table,
                 page_size=page_size, max_q=max_q)
    return q.new_empty(q.shape)
