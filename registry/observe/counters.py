"""This process's check-mode counters and violations."""

from __future__ import annotations

import os
import time

from registry.observe.records import Stats, Violation
from registry.observe.state import _state

__all__ = ["reset_stats", "stats", "violations"]


def stats() -> Stats:
    """A snapshot of this process's check-mode counters."""
    with _state.lock:
        return Stats(pid=os.getpid(), rate=_state.rate, seed=_state.seed, updated=_state.updated,
                     counters=[c.snapshot() for c in _state.counters.values()])


def violations() -> list[Violation]:
    """The most recent violations of this process (at most 256), oldest first."""
    with _state.lock:
        return list(_state.violations)


def reset_stats() -> None:
    """Forget this process's counters and violations (the persisted entry is left as is)."""
    with _state.lock:
        _state.counters.clear()
        _state.by_decision.clear()
        _state.violations.clear()
        _state.logged.clear()
        _state.dirty = False
        _state.updated = time.time()
