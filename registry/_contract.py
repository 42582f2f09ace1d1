"""What an implementation guarantees about its results: its contract.

Three guarantees, each a claim its plugin declares and its tests prove:

* ``exact`` — the op's mathematically defined result, bit for bit (indexer_topk's membership and
  order). Exact implies the other two.
* ``deterministic`` — the same inputs on the same device and software give the same bits, run to
  run.
* ``batch_invariant`` — a row's output does not depend on the other rows of the call or on the
  batch size, *for the config given*. Whether a whole dispatch is batch-invariant also depends on
  selection not switching configs with the batch size: when ``batch_invariant`` is required,
  the registry decides at the op's batch reference point (``OpSpec.batch_reference``) for every
  batch size (docs/ARCHITECTURE.md, "Contracts").

``order_class`` names an implementation's accumulation order for a config: two configs of one
class give the same bits on the same device and inputs (sparse_prefill: the keys that change the
order of the online softmax's sums; the others, such as register caps or row order, do not).

A contract may depend on the config (``Implementation.contract`` is a ``Contract`` or a function
of the resolved config): a tile-dense sparse_prefill config is not batch-invariant where the
row-local ones of the same kernel are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["GUARANTEES", "Contract", "parse_guarantees"]

GUARANTEES = ("exact", "deterministic", "batch_invariant")


@dataclass(frozen=True)
class Contract:
    exact: bool = False
    deterministic: bool = False
    batch_invariant: bool = False
    order_class: str | None = None

    def __post_init__(self) -> None:
        if self.exact:  # exact implies the rest: one defined answer, whatever the batch
            object.__setattr__(self, "deterministic", True)
            object.__setattr__(self, "batch_invariant", True)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(g for g in GUARANTEES if getattr(self, g))

    def describe(self) -> str:
        shown = [g for g in GUARANTEES if getattr(self, g)] or ["none declared"]
        tail = f" (order class {self.order_class})" if self.order_class else ""
        return ", ".join(shown) + tail


def parse_guarantees(raw: str | Iterable[str], source: str) -> frozenset[str]:
    """``"deterministic,batch_invariant"`` (or an iterable of names) -> the set; an unknown name
    is a ConfigError naming the source and the known names."""
    from registry.errors import ConfigError

    items = raw.split(",") if isinstance(raw, str) else list(raw)
    names = frozenset(str(p).strip() for p in items if str(p).strip())
    unknown = sorted(names - set(GUARANTEES))
    if unknown:
        raise ConfigError(f"Unable to use {source}={','.join(sorted(names))!r}: unknown "
                          f"guarantee(s) {unknown}; known: {', '.join(GUARANTEES)}")
    return names
