"""The process-wide observer state and the per-(op, implementation, config) counters."""

from __future__ import annotations

import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from registry.observe.records import Counter, Launch, Violation

if TYPE_CHECKING:
    from registry._decision import Decision
    from registry._registry import Registry
    from registry.observe.checker import _OpCheck

MAX_VIOLATIONS_KEPT = 256


class _State:
    """Process-wide observer state. Counters survive ``reset_registry()``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rate = 0.0
        self.seed = 0
        self.rng = random.Random(0)
        self.explicit = False  # check() was called: KREG_CHECK no longer decides the rate
        self.recorders: list[list[Launch]] = []
        self.counters: dict[tuple[Any, ...], _Count] = {}
        self.by_decision: dict[int, tuple[Decision, _Count]] = {}
        self.launches: dict[int, tuple[Decision, Launch]] = {}
        self.violations: deque[Violation] = deque(maxlen=MAX_VIOLATIONS_KEPT)
        self.seq = 0
        self.logged: set[tuple[Any, ...]] = set()
        self.checks: dict[tuple[int, str], _OpCheck] = {}
        self.known: weakref.WeakSet[Registry] = weakref.WeakSet()  # registries given to install()
        self.dirty = False
        self.updated = time.time()
        self.last_write = 0.0
        self.persist_failed = False
        self.atexit_registered = False
        self.capture_probe: Callable[[], bool] | None = None


_state = _State()


class _Count:
    """The mutable counters behind a :class:`Counter` (plain slots: bumped on every observed
    dispatch, where a pydantic ``__setattr__`` would cost more than the rest of the hub)."""

    __slots__ = ("checked", "config", "dispatches", "errors", "implementation", "last_violation",
                 "last_workload", "op", "skipped", "violations")

    def __init__(self, op: str, implementation: str, config: dict[str, Any] | None) -> None:
        self.op, self.implementation, self.config = op, implementation, config
        self.dispatches = self.checked = self.violations = self.errors = self.skipped = 0
        self.last_violation: str | None = None
        self.last_workload: dict[str, Any] | None = None

    def snapshot(self) -> Counter:
        return Counter(op=self.op, implementation=self.implementation,
                       config=None if self.config is None else dict(self.config),
                       dispatches=self.dispatches, checked=self.checked,
                       violations=self.violations, errors=self.errors, skipped=self.skipped,
                       last_violation=self.last_violation,
                       last_workload=None if self.last_workload is None
                       else dict(self.last_workload))


def _counter(decision: Decision) -> _Count:
    # Decisions are long-lived (the registry keeps one per dispatch key): look the counter up by
    # identity first, holding the decision so that its id cannot be reused while cached.
    hit = _state.by_decision.get(id(decision))
    if hit is not None and hit[0] is decision:
        return hit[1]
    cfg = decision.config
    key = (decision.op, decision.implementation, tuple(cfg.items()) if cfg else ())
    c = _state.counters.get(key)
    if c is None:
        c = _state.counters[key] = _Count(decision.op, decision.implementation,
                                          dict(cfg) if cfg is not None else None)
    if len(_state.by_decision) >= 4096:
        _state.by_decision.clear()
    _state.by_decision[id(decision)] = (decision, c)
    return c
