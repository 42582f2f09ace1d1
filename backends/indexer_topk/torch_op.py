"""``torch.ops.kreg.indexer_topk``: the op as a torch custom op, for ``torch.compile``.

Importing this module registers ``kreg::indexer_topk``. Its real implementation is
``registry.dispatch("indexer_topk", scores, lengths, k=k)`` (selection, overrides, the recorder
and check mode all apply); its fake implementation gives the int32 ``[rows, k]`` output without
running anything, so ``torch.compile(fullgraph=True)`` traces code that calls it without a graph
break::

    import backends.indexer_topk.torch_op  # registers the op
    idx = torch.ops.kreg.indexer_topk(scores, lengths, 2048)

Functional (nothing is mutated), no autograd formula (selection is not differentiable).

No ``from __future__ import annotations`` here: ``torch.library`` infers the schema from the
annotations.
"""

import torch

import registry

__all__ = ["indexer_topk"]


@torch.library.custom_op("kreg::indexer_topk", mutates_args=())
def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int = 2048) -> torch.Tensor:
    """Exact per-row top-k positions (ascending, -1 padded) through ``registry.dispatch``."""
    out: torch.Tensor = registry.dispatch("indexer_topk", scores, lengths, k=k)
    return out


@indexer_topk.register_fake
def _indexer_topk_fake(scores: torch.Tensor, lengths: torch.Tensor, k: int = 2048
                       ) -> torch.Tensor:
    return scores.new_empty((scores.shape[0], k), dtype=torch.int32)
