"""The composition root: builds the default registry and attaches the subsystems to it.

The core (``_registry``, ``_select`` and the rest of the flat modules) imports no subsystem. This
module is the one place that wires them on:

* observation (:mod:`registry.observe`): the launch recorder and check mode (``KREG_CHECK``)
  install their observer on every registry made here;
* the daemon client (:mod:`registry.daemon`): while ``KREG_DAEMON`` is set, a miss asks the
  daemon first. The setting is read when the registry is made and on every ``invalidate()``,
  like every other setting, never per call.
* the lockfile check (:mod:`registry.lock`): while ``KREG_LOCK`` is set, every decision a miss
  makes is checked against the lockfile (``KREG_LOCK_MODE=verify``) or replaced by the locked
  one (``pin``), through ``Registry.lock``. Read like the daemon setting.

``registry.Registry()`` on its own is a bare registry (no observation, no daemon, no lockfile):
what tests of the core use, and what ``kreg lock`` / ``kreg verify`` decide with.
``reset_registry(reg)`` attaches all three to a registry made elsewhere.
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


def _read_lock_setting(reg: Registry) -> None:
    """KREG_LOCK and KREG_LOCK_MODE, read at creation and on every invalidate().

    A lockfile that cannot be used (missing, corrupt, another schema) raises ConfigError naming
    the file and the fix, and ``reg.lock`` refuses every later decision with the same error: a
    bad lockfile never lets decisions run unchecked.
    """
    path = knobs.lock
    if path is None:
        reg.lock = None
        return
    from registry.lock.runtime import Refuse, load_hook

    try:
        reg.lock = load_hook(path, knobs.lock_mode)
    except ConfigError as exc:
        reg.lock = Refuse(exc)
        raise


def attach(reg: Registry) -> Registry:
    """Attach observation, the daemon client (while KREG_DAEMON is set) and the lockfile check
    (while KREG_LOCK is set) to ``reg``."""
    from registry.observe import install

    install(reg)
    for read in (_read_daemon_setting, _read_lock_setting):  # the lock last: it may raise
        if read not in reg.settings_readers:
            reg.settings_readers.append(read)
        read(reg)
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
