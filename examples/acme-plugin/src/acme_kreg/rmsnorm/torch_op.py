"""``torch.ops.acme.rmsnorm``: the op as a torch custom op (for ``torch.compile``).

Registered when imported; ``registry.load_custom_ops()`` imports it (``OpSpec.custom_op``). The
real implementation is ``registry.dispatch("acme_rmsnorm", ...)``, so selection, overrides,
the recorder and check mode apply; the fake implementation gives the output's shape and dtype
without running anything, so ``torch.compile(fullgraph=True)`` traces through it.

No ``from __future__ import annotations``: torch.library reads the schema from the annotations.
"""

import torch

import registry

__all__ = ["rmsnorm"]


@torch.library.custom_op("acme::rmsnorm", mutates_args=())
def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out: torch.Tensor = registry.dispatch("acme_rmsnorm", x, w, eps=eps)
    return out


@rmsnorm.register_fake
def _rmsnorm_fake(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return torch.empty_like(x)
