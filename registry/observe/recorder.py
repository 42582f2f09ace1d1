"""``with registry.record() as launches:``: the launch recorder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from registry.observe.hub import sync
from registry.observe.records import Launch
from registry.observe.state import _state

__all__ = ["record"]


@contextmanager
def record() -> Iterator[list[Launch]]:
    """``with registry.record() as launches:`` appends a :class:`Launch` per dispatch."""
    launches: list[Launch] = []
    with _state.lock:
        _state.recorders.append(launches)
    sync()
    try:
        yield launches
    finally:
        with _state.lock:
            # identity, not equality: two recorders holding equal lists are distinct
            _state.recorders = [r for r in _state.recorders if r is not launches]
        sync()
