"""Output digests of replicated dispatches, for ``registry.agree(outputs=True)``.

In tensor-parallel serving every rank runs the indexer on the same scores and must select the
same KV; agreeing on *decisions* does not prove the *answers* agree (a kernel with a
non-deterministic tie break, a rank on other software). :func:`record_outputs` installs an
observer that digests every ``every``-th dispatch of the named ops, keyed by
``(op, dispatch sequence number)``: ranks running the same program dispatch the same sequence,
so equal keys hold the outputs of the same call. ``registry.agree(outputs=True)`` all-gathers the
digests recorded since its last call and reports each key whose digests differ.

A digest is two int64 sums over the output's bits (plain and position-weighted, so a permutation
shows), computed on the output's device without a synchronization: the dispatch never waits.
They are read when ``agree`` runs. Dispatches inside CUDA graph capture are not digested (a
replay would not update them); outputs that are not tensors (or tuples of tensors) are skipped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from registry._format import format_config
from registry.errors import ConfigError
from registry.observe.checker import _capturing

if TYPE_CHECKING:
    from registry._decision import Decision
    from registry._registry import Registry

__all__ = ["OutputRecorder", "digest_tensor", "record_outputs"]

_WEIGHT_PERIOD = 8191  # position weights 1..8191: a swapped pair changes the weighted sum


def digest_tensor(t: Any) -> Any:
    """A 2-element int64 tensor on ``t``'s device: the sum of ``t``'s bits, and the sum of the
    bits weighted by position (wrapping modulo 2**64, the same on every rank)."""
    import torch

    flat = t.detach().contiguous().reshape(-1)
    size = flat.element_size()
    if flat.dtype == torch.bool:
        bits = flat.to(torch.int64)
    else:
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
        bits = flat.view(view).to(torch.int64)
    key = (bits.numel(), bits.device)
    weights = _WEIGHTS.get(key)
    if weights is None:
        weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64)
        weights = weights % _WEIGHT_PERIOD + 1
        # A few output sizes recur: keep their weights, up to 1M elements (8 MB) each and 16
        # sizes; larger outputs build theirs per digest (a transient the size of the bits').
        if bits.numel() <= 1 << 20:
            if len(_WEIGHTS) >= 16:
                _WEIGHTS.clear()
            _WEIGHTS[key] = weights
    return torch.stack([bits.sum(), (bits * weights).sum()])


_WEIGHTS: dict[tuple[int, Any], Any] = {}


@dataclass
class _Record:
    op: str
    seq: int
    implementation: str
    config: str
    digest: Any  # device tensor until collected


@dataclass(eq=False)   # identity: the observer list and the active stack hold this object
class OutputRecorder:
    """Digests every ``every``-th dispatch of ``ops`` (None: every op)."""

    ops: frozenset[str] | None
    every: int
    counts: dict[str, int] = field(default_factory=dict)
    records: list[_Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, reg: Registry, decision: Decision, args: tuple[Any, ...],
                 kwargs: dict[str, Any], result: Any) -> None:
        op = decision.op
        if self.ops is not None and op not in self.ops:
            return
        with self.lock:
            seq = self.counts.get(op, 0)
            self.counts[op] = seq + 1
        if seq % self.every or _capturing():
            return
        tensors = result if isinstance(result, (tuple, list)) else (result,)
        try:
            import torch

            if not all(isinstance(t, torch.Tensor) for t in tensors):
                return
            digest = torch.stack([digest_tensor(t) for t in tensors]).sum(dim=0)
        except Exception:  # a digest must never break the dispatch it watches
            return
        with self.lock:
            self.records.append(_Record(op, seq, decision.implementation,
                                        f"{decision.implementation} "
                                        f"{format_config(decision.config)}", digest))

    def collect(self) -> dict[tuple[str, int], tuple[str, tuple[int, int]]]:
        """The records since the last collect, as ``{(op, seq): (what ran, digest)}``; reads
        the digests (one device synchronization) and forgets them."""
        with self.lock:
            records, self.records = self.records, []
        if not records:
            return {}
        import torch

        values = torch.stack([r.digest.to("cpu") for r in records]).tolist()
        return {(r.op, r.seq): (r.config, (int(v[0]), int(v[1])))
                for r, v in zip(records, values, strict=True)}


_active: list[tuple[Registry, OutputRecorder]] = []


def active() -> OutputRecorder | None:
    return _active[-1][1] if _active else None


@contextmanager
def record_outputs(reg: Registry, ops: Iterable[str] | None = None,
                   every: int = 16) -> Iterator[OutputRecorder]:
    """Digest every ``every``-th dispatch of ``ops`` on ``reg`` inside the block (see module)."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"record_outputs(every={every!r}): expected a positive integer (digest "
                          f"every N-th dispatch of each op)")
    names = None if ops is None else frozenset(ops)
    for op in names or ():
        reg.spec(op)  # an unknown op is an error now, naming the known ones
    rec = OutputRecorder(names, every)
    reg.observers.append(rec)
    _active.append((reg, rec))
    try:
        yield rec
    finally:
        _active.remove((reg, rec))
        if rec in reg.observers:
            reg.observers.remove(rec)
