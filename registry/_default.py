"""The composition root: builds the default registry and attaches the subsystems to it.

The core (``_registry``, ``_select`` and the rest of the flat modules) imports no subsystem. This
module is the one place that wires them on:

* observation (:mod:`registry.observe`): the launch recorder and check mode (``KREG_CHECK``)
  install their observer on every registry made here;
* the daemon client (:mod:`registry.daemon`): while ``KREG_DAEMON`` is set, a miss asks the
  daemon first. The setting is read when the registry is made and on every ``invalidate()``,
  like every other setting, never per call.

``registry.Registry()`` on its own is a bare registry (no observation, no daemon): what tests
of the core use. ``reset_registry(reg)`` attaches both to a registry made elsewhere.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from registry._knobs import knobs
from registry._registry import Registry
from registry.errors import ConfigError

if TYPE_CHECKING:
    from registry._decision import Decision
    from registry._facts import DeviceFacts
    from registry._workload import Workload

__all__ = ["attach", "build_registry", "get_registry", "reset_registry"]

# The default registry; ``registry.dispatch`` reads it directly (the hit path).
current: Registry | None = None
_lock = threading.Lock()


def _read_daemon_setting(reg: Registry) -> None:
    """KREG_DAEMON and KREG_DAEMON_TIMEOUT, read at creation and on every invalidate()."""
    raw = knobs.daemon
    if raw is None:
        reg.remote = None
        return
    from registry.daemon.client import remote_select
    from registry.daemon.protocol import resolve_socket

    try:
        path, timeout = str(resolve_socket(raw)), knobs.daemon_timeout
    except ConfigError as exc:
        note = f"daemon not used ({exc}); selected in-process"

        def refuse(reg: Registry, op: str, facts: DeviceFacts, wl: Workload,
                   override: tuple[str, str] | None) -> tuple[Decision | None, str | None]:
            return None, note

        reg.remote = refuse
        return

    def ask(reg: Registry, op: str, facts: DeviceFacts, wl: Workload,
            override: tuple[str, str] | None) -> tuple[Decision | None, str | None]:
        return remote_select(reg, op, facts, wl, override, path=path, timeout=timeout)

    reg.remote = ask


def attach(reg: Registry) -> Registry:
    """Attach observation and (while KREG_DAEMON is set) the daemon client to ``reg``."""
    from registry.observe import install

    install(reg)
    if _read_daemon_setting not in reg.settings_readers:
        reg.settings_readers.append(_read_daemon_setting)
    _read_daemon_setting(reg)
    return reg


def build_registry(*, load_entry_points: bool = True) -> Registry:
    """A registry with the entry-point plugins loaded and the subsystems attached."""
    return attach(Registry(load_entry_points=load_entry_points))


def get_registry() -> Registry:
    """The process's default registry, loading the entry-point plugins on first use."""
    global current
    reg = current
    if reg is None:
        with _lock:
            if current is None:
                current = build_registry()
            reg = current
    return reg


def reset_registry(registry: Registry | None = None) -> Registry:
    """Replace the default registry (tests; after installing or removing a plugin package)."""
    global current
    with _lock:
        current = attach(registry) if registry is not None else build_registry()
        return current
