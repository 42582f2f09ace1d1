"""``registry.check(rate)``: the check-mode rate, as a scope that restores the previous one."""

from __future__ import annotations

import random

from registry.errors import ConfigError
from registry.observe.hub import sync
from registry.observe.persist import _register_atexit
from registry.observe.records import Violation
from registry.observe.state import _state

__all__ = ["CheckScope", "check"]


def _set_rate(rate: float, seed: int | None) -> None:
    with _state.lock:
        _state.rate = rate
        _state.explicit = True
        if seed is not None:
            _state.seed = seed
            _state.rng = random.Random(seed)
        _state.checks.clear()
    if rate > 0.0:
        _register_atexit()
    sync()


class CheckScope:
    """What :func:`check` returns: the new rate is already in force; as a context manager it
    restores the previous rate on exit. ``violations`` lists those found since it was made."""

    def __init__(self, rate: float, previous: float, since: int) -> None:
        self.rate = rate
        self.previous = previous
        self._since = since

    @property
    def violations(self) -> list[Violation]:
        with _state.lock:
            return [v for v in _state.violations if v.seq > self._since]

    def __enter__(self) -> CheckScope:
        return self

    def __exit__(self, *exc: object) -> None:
        _set_rate(self.previous, None)

    def __repr__(self) -> str:
        return f"CheckScope(rate={self.rate}, previous={self.previous})"


def check(rate: float, seed: int | None = None) -> CheckScope:
    """Re-run ``rate`` (0..1) of the dispatches through the reference and compare; returns a
    :class:`CheckScope` (a context manager that restores the previous rate). ``seed`` restarts
    the sampling sequence; the default sequence starts from seed 0."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise ConfigError(f"registry.check(rate={rate!r}): expected a number in [0, 1] (the "
                          "fraction of dispatches to re-run through the reference)")
    previous = _state.rate
    scope = CheckScope(float(rate), previous, _state.seq)
    _set_rate(float(rate), seed)
    return scope
