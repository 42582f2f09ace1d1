"""The one observer observation installs on a registry, and installing it."""

from __future__ import annotations

import threading
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from registry._knobs import knobs
from registry.observe.checker import _check_one
from registry.observe.persist import _register_atexit
from registry.observe.records import Launch
from registry.observe.state import _state

if TYPE_CHECKING:
    from registry._decision import Decision
    from registry._registry import Registry

__all__ = ["install", "sync"]

_local = threading.local()


def _hub(reg: Registry, decision: Decision, args: tuple[Any, ...], kwargs: dict[str, Any],
         result: Any) -> None:
    """The one observer observation installs (see :mod:`registry.observe`)."""
    st = _state
    if st.recorders:
        launch = st.launches.get(id(decision))
        if launch is None or launch[0] is not decision:
            if len(st.launches) >= 4096:
                st.launches.clear()
            # immutable: one record per decision, shared by every dispatch that it served
            launch = st.launches[id(decision)] = (decision, Launch(
                decision.op, decision.implementation,
                MappingProxyType(dict(decision.config or {})),
                MappingProxyType(dict(decision.workload)), decision.fallback))
        for launches in list(st.recorders):
            launches.append(launch[1])
    if st.rate > 0.0 and not getattr(_local, "busy", False):
        _local.busy = True  # a reference that dispatches must not be checked recursively
        try:
            _check_one(reg, decision, args, kwargs, result)
        finally:
            _local.busy = False


def sync(reg: Registry | None = None) -> None:
    """Install the hub in every registry observation knows (those passed to :func:`install`)
    while check mode or a recorder is active; remove it from all of them otherwise."""
    if reg is not None:
        _state.known.add(reg)
    want = _state.rate > 0.0 or bool(_state.recorders)
    for r in list(_state.known):
        if want and _hub not in r.observers:
            r.observers.append(_hub)
        elif not want:
            while _hub in r.observers:
                r.observers.remove(_hub)


def install(reg: Registry) -> None:
    """Attach observation to ``reg`` (the composition root calls it for the default registry):
    apply ``KREG_CHECK`` (unless ``check()`` already set a rate in this process) and install the
    hub if check mode or a recorder is active. Imports neither torch nor Triton."""
    if not _state.explicit:
        rate = knobs.check
        with _state.lock:
            _state.rate = rate
    if _state.rate > 0.0:
        _register_atexit()
    sync(reg)
