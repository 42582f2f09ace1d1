"""``KREG_LOCK``: the registry checks (``verify``) or serves (``pin``) locked decisions.

The composition root (registry/_default.py) reads ``KREG_LOCK`` and ``KREG_LOCK_MODE`` when a
registry is made and on every ``invalidate()``, and sets ``Registry.lock`` to a :class:`LockHook`
(or None). ``Registry._decide`` calls it after selection, on the miss path only: the dispatch
hit path and the select LRU's hits are unchanged, and a key is checked once per decision made.

A decision is matched to a lock entry by the device's **hardware identity** (vendor, name as the
driver reports it, architecture, multiprocessor count: what ``device_in`` and the tuning store
key on), the op, and the **validated workload** (every field, defaults included). Not by the
facts fingerprint: that covers the software versions, so an upgraded Triton would match no
entry and its drift would pass unseen. Not by profile name: a probed device has none. When
several device labels of one lock share a hardware identity, the entry whose facts fingerprint
equals the running facts wins, else the first in the file. Keys the lock does not hold are
decided as usual: a lockfile is not an allow-list.

* ``verify`` (the default): a decision that differs from its entry (implementation or config)
  is logged once per (entry, decision) at WARNING with the reasons, in explain's words, and
  gets a note; under ``KREG_STRICT=1`` it raises :class:`LockDriftError`.
* ``pin``: the locked implementation and config are served while the implementation is
  registered and its **capability** checks pass (never waived). Its **envelope** checks are
  waived, as ``:measure`` waives them: the lock is the envelope the deployment was tested in,
  and the workload and hardware are the locked ones by construction. A locked implementation
  that is not registered, or fails a capability check, raises :class:`LockPinError` naming it.
  An honoured ``KREG_SELECT_<OP>`` override wins over a pin (it is the emergency switch); the
  departure is logged as in verify mode.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from registry._format import format_config
from registry.errors import ConfigError
from registry.lock.lockfile import (
    ImplInfo,
    LockContext,
    LockDriftError,
    LockedDevice,
    LockEntry,
    Lockfile,
    LockPinError,
    PluginInfo,
    Reason,
    canonical,
    compare_entries,
    entry_from_decision,
    identity_of,
    load_lock,
    registry_info,
    workload_text,
)

if TYPE_CHECKING:
    from registry._decision import Decision
    from registry._facts import DeviceFacts
    from registry._registry import Registry

__all__ = ["LockHook", "Refuse", "load_hook"]

logger = logging.getLogger("registry.lock")

Mode = Literal["verify", "pin"]

_Key = tuple[tuple[str, str, str, int], str, str]


class LockHook:
    """``Registry.lock``: called as ``hook(registry, decision)``, returns the decision to use."""

    def __init__(self, lock: Lockfile, path: str, mode: Mode) -> None:
        self.lock, self.path, self.mode = lock, path, mode
        self.index: dict[_Key, list[LockEntry]] = {}
        for e in lock.entries:
            ident = lock.devices[e.device].identity
            key = ((ident.vendor, ident.name, ident.arch, ident.sm_count), e.op,
                   canonical(e.workload))
            self.index.setdefault(key, []).append(e)
        self._warned: set[tuple[str, str, str]] = set()
        self._info: tuple[int, int, dict[str, PluginInfo], dict[str, dict[str, ImplInfo]]] | \
            None = None

    def find(self, facts: DeviceFacts, op: str, workload: dict[str, Any]) -> LockEntry | None:
        found = self.index.get(((facts.vendor, facts.name, facts.arch, facts.sm_count), op,
                                canonical(workload)))
        if not found:
            return None
        exact = [e for e in found if e.facts_fingerprint == facts.fingerprint]
        return (exact or found)[0]

    def __call__(self, reg: Registry, decision: Decision) -> Decision:
        entry = self.find(decision.facts, decision.op, decision.workload)
        if entry is None:
            return decision
        if decision.implementation == entry.implementation and \
                canonical(decision.config) == canonical(entry.config):
            return decision
        overridden = decision.override is not None and decision.override.honoured
        if self.mode == "pin" and not overridden:
            return self._pin(reg, decision, entry)
        return self._drift(reg, decision, entry)

    # -----------------------------------------------------------------------------------------

    def _where(self, entry: LockEntry) -> str:
        return (f"{entry.op} on {entry.device} [{workload_text(entry.workload)}] (lock entry "
                f"{entry.id})")

    def _plugins(self, reg: Registry) -> tuple[dict[str, PluginInfo],
                                               dict[str, dict[str, ImplInfo]]]:
        info = self._info
        if info is None or info[0] != id(reg) or info[1] != reg.generation:
            plugins, impls = registry_info(reg)
            info = self._info = (id(reg), reg.generation, plugins, impls)
        return info[2], info[3]

    def reasons(self, reg: Registry, decision: Decision, entry: LockEntry) -> list[Reason]:
        """Why ``decision`` differs from ``entry``, in explain's words."""
        plugins, impls = self._plugins(reg)
        f = decision.facts
        device = LockedDevice(source="local", set={}, facts=f.model_dump(mode="json"),
                              fingerprint=f.fingerprint, identity=identity_of(f))
        ctx = LockContext(devices={entry.device: device}, plugins=plugins, implementations=impls)
        new = entry_from_decision(reg, decision, entry.device, plugins)
        return compare_entries(self.lock, entry, ctx, new)

    def _fix(self) -> str:
        return (f"fix: see `kreg verify {self.path}`; then re-lock with `kreg lock` if the new "
                f"decision is wanted, undo the change, or serve the locked decision with "
                f"KREG_LOCK_MODE=pin")

    def _drift(self, reg: Registry, decision: Decision, entry: LockEntry) -> Decision:
        why = "; ".join(r.text for r in self.reasons(reg, decision, entry)) or "no reason found"
        message = (f"KREG_LOCK={self.path} ({self.mode}): {self._where(entry)} is locked to "
                   f"{entry.implementation} {format_config(entry.config)}, but selection now "
                   f"picks {decision.implementation} {format_config(decision.config)}: {why}; "
                   f"{self._fix()}")
        if reg.strict:
            raise LockDriftError("KREG_STRICT=1: " + message)
        self._warn_once(entry, decision, message)
        note = (f"KREG_LOCK: differs from lock entry {entry.id} ({entry.implementation} "
                f"{format_config(entry.config)})")
        return decision.model_copy(update={"notes": [*decision.notes, note]})

    def _warn_once(self, entry: LockEntry, decision: Decision, message: str) -> None:
        key = (entry.id, decision.implementation, canonical(decision.config))
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s", message)

    def _pin(self, reg: Registry, decision: Decision, entry: LockEntry) -> Decision:
        where = self._where(entry)
        cand = next((c for c in decision.candidates if c.implementation == entry.implementation),
                    None)
        impl = reg.impls.get(decision.op, {}).get(entry.implementation)
        if cand is None or impl is None:
            plugins, _ = self._plugins(reg)
            rec = plugins.get(entry.plugin)
            status = rec.status if rec is not None else "not installed"
            raise LockPinError(
                f"KREG_LOCK={self.path} (pin): {where} is locked to {entry.implementation}, "
                f"which is not registered now (plugin {entry.plugin}: {status}); fix: install or "
                f"enable plugin {entry.plugin}, re-lock with `kreg lock`, or set "
                f"KREG_LOCK_MODE=verify to run what selection picks")
        capability = [c for c in cand.checks if not c.passed and c.kind == "capability"]
        if capability:
            failed = "; ".join(f"{c} [capability]" for c in capability)
            raise LockPinError(
                f"KREG_LOCK={self.path} (pin): {where} is locked to {entry.implementation}, "
                f"which cannot run here: {failed} (capability checks are never waived); fix: "
                f"restore what the lock was made with (see `kreg verify {self.path}`), re-lock "
                f"with `kreg lock`, or set KREG_LOCK_MODE=verify")
        waived = [c.name for c in cand.checks if not c.ok]  # envelope checks only, here
        checks = [c.model_copy(update={"waived": True}) if not c.ok else c for c in cand.checks]
        pinned = cand.model_copy(update={"eligible": True, "checks": checks,
                                         "config": entry.config})
        candidates = [pinned if c.implementation == cand.implementation
                      else (c.model_copy(update={"config": None}) if c.config is not None else c)
                      for c in decision.candidates]
        reason = f"pinned by KREG_LOCK={self.path} (lock entry {entry.id})"
        if waived:
            reason += " (envelope waived: " + ", ".join(waived) + ")"
        reason += (f"; selection would pick {decision.implementation} "
                   f"{format_config(decision.config)}")
        why = "; ".join(r.text for r in self.reasons(reg, decision, entry)) or "no reason found"
        self._warn_once(entry, decision, (
            f"KREG_LOCK={self.path} (pin): serving {entry.implementation} "
            f"{format_config(entry.config)} for {where}; selection now picks "
            f"{decision.implementation} {format_config(decision.config)}: {why}"))
        return decision.model_copy(update={
            "implementation": entry.implementation, "config": entry.config,
            "fallback": impl.fallback, "reason": reason, "candidates": candidates,
            "notes": [*decision.notes, f"KREG_LOCK: pinned to lock entry {entry.id}"]})


class Refuse:
    """``Registry.lock`` while KREG_LOCK names a file that cannot be used: every decision
    raises the same ConfigError, so a bad lockfile never lets decisions run unchecked."""

    def __init__(self, error: ConfigError) -> None:
        self.error = error

    def __call__(self, reg: Registry, decision: Decision) -> Decision:
        raise ConfigError(str(self.error))


# (resolved path, mode) -> ((mtime_ns, size), hook): an unchanged file keeps its hook across
# invalidations, so a drift is logged once per process, not once per invalidation.
_LOADED: dict[tuple[str, str], tuple[tuple[int, int], LockHook]] = {}


def load_hook(path: Path, mode: str) -> LockHook:
    """The hook for lockfile ``path`` in ``mode``; ConfigError naming the file and the fix."""
    shown = str(path)
    try:
        st = os.stat(path)
        resolved = str(Path(path).resolve())
    except OSError:
        st, resolved = None, shown
    if st is not None:
        known = _LOADED.get((resolved, mode))
        if known is not None and known[0] == (st.st_mtime_ns, st.st_size):
            return known[1]
    try:
        lock = load_lock(path)
    except ConfigError as exc:
        raise ConfigError(f"KREG_LOCK={shown}: {exc}; or unset KREG_LOCK") from None
    if mode not in ("verify", "pin"):  # the knob's parser already refuses other values
        raise ConfigError(f"Unable to use KREG_LOCK_MODE={mode!r}: expected verify or pin")
    hook = LockHook(lock, shown, "pin" if mode == "pin" else "verify")
    if st is not None:
        _LOADED[(resolved, mode)] = ((st.st_mtime_ns, st.st_size), hook)
    return hook
