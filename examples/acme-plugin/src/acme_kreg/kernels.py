"""ACME's kernel entry: kreg's generic Triton kernel launched with the blocked geometry.

Imported at the first dispatch that selects it, never at selection time.
"""

from __future__ import annotations

from typing import Any

__all__ = ["sparse_prefill_blocked"]


def sparse_prefill_blocked(q: Any, k: Any, v: Any, indices: Any, *, config: dict[str, Any],
                           **kwargs: Any) -> Any:
    from backends.sparse_prefill.triton_kernels import sparse_prefill_triton

    return sparse_prefill_triton(q, k, v, indices, config=config, **kwargs)
