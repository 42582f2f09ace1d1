"""The registry's state: loaded plugins, ops, implementations, overrides and caches.

Two caches, both cleared whenever the answer could change (a plugin registered, an override
entered or left, ``invalidate()``, which also re-reads KREG_SELECT_<OP> and KREG_STRICT):

* the decision cache, a bounded LRU (``functools.lru_cache``, implemented in C) keyed by
  ``(op, device, workload items, override value)`` where the device is a profile name (immutable
  facts) or DeviceFacts (hashed by fingerprint), for ``select``;
* the dispatch map, ``(op, device index, *workload values) -> bound kernel``, for ``dispatch``.
  Its hit path is one dict lookup: no pydantic model, no device read, no environment read, no
  lock; safe during CUDA graph capture. It is bounded and approximately least-recently-used at
  no cost to that lookup: two generations of DISPATCH_MAP_SIZE keys, a key missed in the current
  one but found in the previous one promoted without selecting again (``_insert``).

The plugin set is not spelled out in the keys: a change to it clears both caches and bumps
``generation``, which is equivalent and keeps the hit paths short. Pins (``pin()``, used by
``registry.agree(adopt=True)``) are the one thing invalidation keeps.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.metadata
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pluggy

from registry import hookspecs
from registry._decision import Decision
from registry._facts import (
    DeviceFacts,
    load_profile,
    looks_like_path,
    probe_index,
    profiles,
    profiles_in,
)
from registry._format import format_config
from registry._knobs import knobs, required_from_env, select_override_var, warn_unknown_settings
from registry._select import OverrideRequest, parse_override, select_pure
from registry._spec import Implementation, OpSpec
from registry._workload import Workload, make_workload
from registry.errors import (
    ConfigError,
    KernelUnavailableError,
    KregError,
    NoEligibleImplementationError,
    OverrideError,
    PluginError,
    UnknownDeviceError,
    UnknownImplementationError,
    UnknownOpError,
)
from registry.requirements import Requirement

logger = logging.getLogger("registry")

T = TypeVar("T")

__all__ = ["PluginRecord", "Registry", "note_build_state"]

RemoteSource = Callable[["Registry", str, DeviceFacts, Workload, "tuple[str, str] | None"],
                        "tuple[Decision | None, str | None]"]
# ``lock(registry, decision) -> decision`` (registry.lock, while KREG_LOCK is set).
LockCheck = Callable[["Registry", Decision], Decision]

ENTRY_POINT_GROUP = "kreg"
DECISION_CACHE_SIZE = 4096
DISPATCH_MAP_SIZE = 4096

# Where kreg's own top-level packages (registry, backends, plugins) are installed side by side.
_KREG_ROOT = Path(__file__).resolve().parent.parent
_KREG_DIST = "kreg"

# While a registry's plugins run their hooks: what state they read, by name (see
# note_build_state). Per thread and task, so concurrent builds never mix their notes.
_building: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "kreg_registry_build", default=None)


def note_build_state(key: str, identity: str) -> None:
    """Record that the registry being built (if any, in this thread) read state ``key`` whose
    content is ``identity``. The tuning store calls it on every load (the ``measured`` plugin
    loads it in its hook), so ``plugin_fingerprint()`` covers the entries a registry serves and
    a daemon and a client agree only when built from the same store."""
    notes = _building.get()
    if notes is not None:
        known = notes.get(key)
        notes[key] = identity if known in (None, identity) else f"{known}+{identity}"


@dataclass
class PluginRecord:
    """What ``kreg plugins`` shows for one plugin.

    ``errors`` keeps every error of the plugin (an import failure, each raising hook, each bad
    item), once each; ``error`` joins them (None when there is none), and assigning to it adds
    one. ``notes`` says why it loaded although KREG_PLUGINS leaves it out, or what of it was
    skipped.
    """

    name: str
    source: str  # "entry point backends.sparse_prefill" / "registered"
    loaded: bool
    errors: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    implementations: list[str] = field(default_factory=list)
    skipped_reason: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def error(self) -> str | None:
        return "; ".join(self.errors) if self.errors else None

    @error.setter
    def error(self, message: str | None) -> None:
        if message is None:
            self.errors.clear()
        elif message not in self.errors:
            self.errors.append(message)

    @property
    def failed(self) -> bool:
        """An error, or not loaded for any reason but KREG_PLUGINS / KREG_DISABLE_PLUGINS."""
        return bool(self.errors) or (not self.loaded and self.skipped_reason is None)

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)


@dataclass
class _Settings:
    """The registry's selection settings: ``registry.override()`` / ``registry.require()``
    scopes (innermost last) over what the environment said at the last invalidation."""

    context_overrides: dict[str, list[str]] = field(default_factory=dict)
    context_required: dict[str, list[frozenset[str]]] = field(default_factory=dict)
    env_overrides: dict[str, str | None] = field(default_factory=dict)  # KREG_SELECT_<OP>
    env_required: dict[str, frozenset[str]] = field(default_factory=dict)  # KREG_REQUIRE_<OP>
    env_strict: bool = False  # KREG_STRICT
    strict_set: bool | None = None  # set through Registry.strict; wins over KREG_STRICT
    env_profiles: tuple[Any, ...] = ()  # KREG_PROFILES


@dataclass
class _Loading:
    """What loading the entry points left behind, kept across rebuilds."""

    errors: dict[str, str] = field(default_factory=dict)  # import failures, by plugin
    # Entry points KREG_PLUGINS / KREG_DISABLE_PLUGINS left out, by name: an op package is
    # named after its op, so the op packages a listed plugin needs can be loaded with it.
    skipped: dict[str, Any] = field(default_factory=dict)


@dataclass
class _ProfileCache:
    """Device profiles by name: (facts as written, source), built at first use after each
    invalidation from the shipped files, plugins' kreg_profiles and KREG_PROFILES; and the
    enriched facts of each one asked for."""

    table: dict[str, tuple[DeviceFacts, str]] | None = None
    facts: dict[str, DeviceFacts] = field(default_factory=dict)


class Registry:
    """One registry of ops and implementations. ``registry.*`` functions use a process default."""

    def __init__(self, *, load_entry_points: bool = True,
                 decision_cache_size: int = DECISION_CACHE_SIZE) -> None:
        self._lock = threading.RLock()
        self.pm = pluggy.PluginManager("kreg")
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginRecord] = {}
        self.ops: dict[str, OpSpec] = {}
        self.op_plugins: dict[str, str] = {}  # op -> the plugin whose kreg_ops defines it
        self.call_keys: dict[str, Callable[..., tuple[Any, ...]]] = {}
        self.impls: dict[str, dict[str, Implementation]] = {}
        self.generation = 0
        # Keep the instance's attributes fewer than 30: CPython 3.11 specializes a method call
        # (``reg.select(...)``, the select hit path) only on instances whose attribute dict
        # shares its keys, which stops at 30 (35 attributes made a select hit 7% slower, see
        # tests/unit/test_registry_state.py). Cold state therefore lives in the three holders.
        self._settings = _Settings()
        self._loading = _Loading()
        self._profile_cache = _ProfileCache()
        # select(): a C LRU for hits; _decisions keeps the made decisions (bounded, oldest out)
        # for registry.agree() to list and pin; _FRESH.fresh hands a miss's own decision back.
        self.decision_cache_size = decision_cache_size
        self._lru = functools.lru_cache(maxsize=decision_cache_size)(self._lru_miss)
        self._decisions: dict[tuple[Any, ...], Decision] = {}
        # The override value, or (override value, required guarantees) while some are required:
        # the part of the selection key that settings decide (one lookup on the hit path).
        self._override_now: dict[str, Any] = {}
        # The dispatch map is approximately least-recently-used without costing the hit path
        # anything: its hit is one lookup in ``dispatch_map``; when that is full, a miss moves it
        # whole to ``_dispatch_old`` (the previous generation) and starts it afresh, and a miss
        # found in the previous generation is promoted back without selecting again. A key used
        # at least once per DISPATCH_MAP_SIZE newer keys therefore stays, and any key survives at
        # least DISPATCH_MAP_SIZE newer ones; at most 2 * DISPATCH_MAP_SIZE kernels are held.
        self.dispatch_map: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._dispatch_old: dict[tuple[Any, ...], Callable[..., Any]] = {}
        # The decision behind every key of both generations (what agree() and observers read).
        self.last_decisions: dict[tuple[Any, ...], Decision] = {}
        self.build_state: dict[str, str] = {}
        # Dispatch keys pinned to a decision (registry.agree(adopt=True)): they survive
        # invalidation, until unpin() or a new registry.
        self.pins: dict[tuple[Any, ...], Decision] = {}
        # Called as obs(registry, decision, args, kwargs, result) after each dispatch while
        # non-empty: the launch recorder and check mode. Empty in production: the hit path
        # tests it once.
        self.observers: list[Callable[..., Any]] = []
        self._facts: dict[int, DeviceFacts] = {}
        self._warned: set[tuple[Any, ...]] = set()
        self.listeners: list[Callable[[Decision], None]] = []
        # Where a miss asks first (the daemon client, attached by the composition root when
        # KREG_DAEMON is set): ``remote(registry, op, facts, workload, raw override)`` returns
        # ``(decision, None)`` or ``(None, note)`` and never raises. None: decide in-process.
        self.remote: RemoteSource | None = None
        # Consulted after every decision a miss makes (the composition root attaches the
        # registry.lock hook while KREG_LOCK is set): returns the decision, or the locked one in
        # pin mode, or raises (a drift under KREG_STRICT=1). None: no lockfile. Hits never see it.
        self.lock: LockCheck | None = None
        # Called at the end of every invalidate(), after the core's own settings are re-read:
        # subsystems re-read theirs here (the composition root registers them).
        self.settings_readers: list[Callable[[Registry], None]] = []
        if load_entry_points:
            self._load_entry_points()
        self._rebuild()
        warn_unknown_settings(self.ops)

    # -----------------------------------------------------------------------------------------
    # plugins

    def _load_entry_points(self) -> None:
        allow, deny = knobs.plugins, knobs.disable_plugins or frozenset()
        eps = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
        _check_not_shadowed(eps)
        seen: set[str] = set()
        for ep in eps:
            if ep.name in seen:
                continue  # the same distribution seen twice on sys.path
            seen.add(ep.name)
            rec = PluginRecord(name=ep.name, source=f"entry point {ep.value}", loaded=False)
            self.plugins[ep.name] = rec
            if allow is not None and ep.name not in allow:
                rec.skipped_reason = "not in KREG_PLUGINS"
                self._loading.skipped[ep.name] = ep
                continue
            if ep.name in deny:
                rec.skipped_reason = "in KREG_DISABLE_PLUGINS"
                self._loading.skipped[ep.name] = ep
                continue
            self._load_entry_point(ep, rec)

    def _load_entry_point(self, ep: Any, rec: PluginRecord) -> None:
        try:
            obj = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # any import failure (sys.exit too) is isolated, named
            rec.error = f"Error importing plugin {ep.name!r}: {type(exc).__name__}: {exc}"
            self._loading.errors[ep.name] = rec.errors[-1]
            logger.warning("%s", rec.errors[-1])
            return
        try:
            self.pm.register(obj, name=ep.name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            rec.error = f"Error registering plugin {ep.name!r}: {type(exc).__name__}: {exc}"
            self._loading.errors[ep.name] = rec.errors[-1]
            logger.warning("%s", rec.errors[-1])
            return
        rec.loaded = True

    def _load_op_packages(self, wanted: dict[str, list[str]]) -> bool:
        """KREG_PLUGINS lists policy plugins: load the op packages it left out that a listed
        plugin's implementations need (``wanted``: op -> those plugins). An op package disabled
        by KREG_DISABLE_PLUGINS stays off, and the implementations for its op are skipped with
        a note. Returns whether one was loaded."""
        loaded = False
        for op, users in wanted.items():
            rec = self.plugins[op]
            if rec.skipped_reason == "not in KREG_PLUGINS" and op in self._loading.skipped:
                rec.skipped_reason = None
                rec.note(f"not in KREG_PLUGINS: loaded because it defines op {op!r}, which "
                         f"plugin {users[0]!r} implements")
                self._load_entry_point(self._loading.skipped.pop(op), rec)
                loaded = loaded or rec.loaded
                continue
            for user in users:
                self.plugins[user].note(f"its implementations of op {op!r} are skipped: the op's "
                                        f"package {op!r} is {rec.skipped_reason or 'not loaded'}")
        return loaded

    def register_plugin(self, plugin: object, name: str) -> None:
        """Register a plugin object (a module or any object with hookimpls) at run time."""
        if not isinstance(name, str) or not name:
            raise PluginError(f"a plugin's name must be a non-empty string, not {name!r:.60}")
        with self._lock:
            if name in self.plugins and self.plugins[name].loaded:
                raise PluginError(f"a plugin named {name!r} is already registered "
                                  f"({self.plugins[name].source}); choose another name")
            try:
                self.pm.register(plugin, name=name)
            except (ValueError, pluggy.PluginValidationError) as exc:
                raise PluginError(f"cannot register plugin {name!r}: {type(exc).__name__}: "
                                  f"{exc}") from None
            self.plugins[name] = PluginRecord(name=name, source="registered", loaded=True)
            self._rebuild()

    def unregister_plugin(self, name: str) -> None:
        with self._lock:
            if self.pm.get_plugin(name) is None:
                raise PluginError(f"no plugin named {name!r} is registered; registered: "
                                  f"{', '.join(sorted(self.plugins))}")
            self.pm.unregister(name=name)
            self.plugins.pop(name, None)
            self._rebuild()

    def _call_each(self, hook: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Call one hook on every plugin separately, so a raising plugin is isolated."""
        caller = getattr(self.pm.hook, hook)
        for impl in caller.get_hookimpls():  # registration order
            name = impl.plugin_name
            try:
                result = impl.function(**{k: v for k, v in kwargs.items() if k in impl.argnames})
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit too: a plugin never ends the host
                rec = self.plugins.setdefault(name, PluginRecord(name, "registered", True))
                message = f"plugin {name!r} hook {hook} raised {type(exc).__name__}: {exc}"
                if message not in rec.errors:  # each error once (rec.errors keeps them all)
                    logger.warning("%s", message)
                rec.error = message
                rec.loaded = False
                continue
            if result is not None:
                yield name, result

    def _rebuild(self) -> None:
        notes: dict[str, str] = {}
        token = _building.set(notes)
        try:
            self._collect()
        finally:
            _building.reset(token)
        self.build_state = notes
        self.call_keys = {name: spec.call_key for name, spec in self.ops.items()}
        self._facts.clear()
        self.invalidate()

    def _collect(self) -> None:
        """Call the plugins' kreg_ops and kreg_implementations hooks; keep what is valid."""
        ops: dict[str, OpSpec] = {}
        op_owner: dict[str, str] = {}
        for name, rec in self.plugins.items():  # every rebuild judges the hooks afresh
            rec.ops, rec.implementations = [], []
            rec.error = self._loading.errors.get(name)
            rec.loaded = self.pm.get_plugin(name) is not None
        for name, specs in self._call_each("kreg_ops"):
            for spec in self._items(name, "kreg_ops", specs, OpSpec):
                problem = _spec_problem(spec)
                if problem is None and spec.name in ops:
                    problem = (f"op {spec.name!r} is already defined by plugin "
                               f"{op_owner[spec.name]!r}; rename one of them")
                if problem is not None:
                    self._fail(name, problem)
                    continue
                ops[spec.name] = spec
                op_owner[spec.name] = name
                self.plugins[name].ops.append(spec.name)
        impls: dict[str, dict[str, Implementation]] = {op: {} for op in ops}
        owner: dict[str, str] = {}
        wanted: dict[str, list[str]] = {}  # op -> the plugins needing its left-out package
        for name, found in self._call_each("kreg_implementations", ops=dict(ops)):
            for impl in self._items(name, "kreg_implementations", found, Implementation):
                problem = _impl_problem(impl)
                if problem is None and impl.op not in ops:
                    if impl.op in self._loading.skipped or (impl.op in self.plugins
                                                        and self.plugins[impl.op].skipped_reason):
                        users = wanted.setdefault(impl.op, [])
                        if name not in users:
                            users.append(name)
                        continue
                    add = ("; KREG_PLUGINS lists policy plugins: add the plugin that defines "
                           f"op {impl.op!r} to it" if knobs.plugins is not None else "")
                    problem = (f"implementation {impl.name!r} is for op {impl.op!r}, which no "
                               f"loaded plugin defines (loaded ops: {', '.join(ops)}){add}")
                if problem is None and impl.name in owner:
                    problem = (f"implementation {impl.name!r} is already registered by plugin "
                               f"{owner[impl.name]!r}")
                if problem is not None:
                    self._fail(name, problem)
                    continue
                if impl.plugin != name:
                    logger.debug("implementation %s registered by plugin %s", impl.name, name)
                impls[impl.op][impl.name] = impl
                owner[impl.name] = name
                self.plugins[name].implementations.append(impl.name)
        if wanted and self._load_op_packages(wanted):
            return self._rebuild()
        self.ops, self.impls, self.op_plugins = ops, impls, op_owner
        self.call_keys = {name: spec.call_key for name, spec in ops.items()}
        for op in ops:
            ref_problem = self._reference_problem(op)
            if ref_problem is not None and ref_problem[1]:
                self._fail(op_owner[op], ref_problem[0])
        self._facts.clear()
        self.invalidate()

    def _items(self, plugin: str, hook: str, result: Any, kind: type[T]) -> list[T]:
        """A hook's result as a list of ``kind``. Items of another type fail the plugin, by name,
        and the rest of its items still count; a result that is not a list (a string, a number,
        a mapping), or whose iteration raises, fails the plugin and contributes nothing."""
        if isinstance(result, (str, bytes, Mapping)) or not hasattr(result, "__iter__"):
            self._fail(plugin, f"hook {hook} returned {type(result).__name__} {result!r:.60}; "
                               f"it must return a list of {kind.__name__}")
            return []
        good = []
        try:
            for item in result:
                if isinstance(item, kind):
                    good.append(item)
                else:
                    self._fail(plugin, f"hook {hook} returned {type(item).__name__} "
                                       f"{item!r:.60} among its items; each must be a "
                                       f"{kind.__name__}")
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            self._fail(plugin, f"hook {hook}: reading its result raised {type(exc).__name__}: "
                               f"{exc}; none of its items count")
            return []
        return good

    def _fail(self, plugin: str, message: str) -> None:
        rec = self.plugins.setdefault(plugin, PluginRecord(plugin, "registered", True))
        if message not in rec.errors:
            rec.errors.append(message)
            logger.warning("plugin %r: %s", plugin, message)

    def plugin_fingerprint(self) -> str:
        """A digest of the implementations (op, name, priority) and of the state their plugins
        read at the last build (:func:`note_build_state`: the tuning store's entries): equal only
        for registries that decide alike. The daemon and its clients compare it."""
        import hashlib

        parts = sorted(f"{op}:{n}:{i.priority!r}"
                       for op, d in self.impls.items() for n, i in d.items())
        parts += [f"{k}={v}" for k, v in sorted(self.build_state.items())]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    # -----------------------------------------------------------------------------------------
    # caches and overrides

    def invalidate(self) -> None:
        """Forget every cached decision and re-read KREG_SELECT_<OP> and KREG_STRICT.

        The environment is read here (at first use and on every invalidation), not per call: the
        hit paths stay free of environment reads. ``registry.override()`` needs no invalidation.
        The caches are dropped even when a setting fails to parse (the ConfigError then says
        which): a failed invalidation never leaves a stale decision behind.
        """
        with self._lock:
            self._lru.cache_clear()
            self._decisions.clear()
            self.dispatch_map.clear()
            self._dispatch_old.clear()
            self.last_decisions.clear()
            self.generation += 1
            self._profile_cache.table = None
            self._profile_cache.facts.clear()
            # Each read raises ConfigError for a bad value, the caches already empty.
            env = {op: os.environ.get(select_override_var(op)) for op in self.ops}
            strict = knobs.strict
            required = {op: required_from_env(op) for op in self.ops}
            self._settings.env_overrides, self._settings.env_strict = env, strict
            self._settings.env_required = required
            self._settings.env_profiles = knobs.profiles
            self._override_now = {op: self._selection_setting(op) for op in self.ops}
            for read in list(self.settings_readers):
                read(self)

    @property
    def strict(self) -> bool:
        """KREG_STRICT as read at the last invalidation, unless set here (which drops cached
        decisions)."""
        s = self._settings
        return s.env_strict if s.strict_set is None else s.strict_set

    @strict.setter
    def strict(self, value: bool) -> None:
        if value != self.strict:
            self.invalidate()
        self._settings.strict_set = bool(value)

    def spec(self, op: str) -> OpSpec:
        try:
            spec = self.ops.get(op)
        except TypeError:  # unhashable
            spec = None
        if spec is None:
            known = ", ".join(sorted(self.ops)) or "(none loaded: see kreg plugins)"
            if not isinstance(op, str):
                raise UnknownOpError(f"an op is named by a string, not {type(op).__name__} "
                                     f"{op!r:.60}; known ops: {known}")
            raise UnknownOpError(f"unknown op {op!r}; known ops: {known}")
        return spec

    def implementations(self, op: str) -> list[Implementation]:
        self.spec(op)
        return list(self.impls.get(op, {}).values())

    def reference_kernel(self, op: str) -> Callable[..., Any]:
        """The kernel of ``op``'s reference implementation (``OpSpec.reference``); raises
        KernelUnavailableError naming the op's plugin, the rule and the fix when it is not
        loaded."""
        spec = self.spec(op)
        impl = self.impls.get(op, {}).get(spec.reference)
        if impl is None:
            problem = self._reference_problem(op)
            raise KernelUnavailableError(problem[0] if problem else
                                         f"{op}'s reference implementation is not loaded")
        return impl.load_kernel()

    def _reference_problem(self, op: str) -> tuple[str, bool] | None:
        """Why ``op``'s ``OpSpec.reference`` names no loaded implementation, and whether that is
        an error of the plugin defining the op (True) or of this installation's settings."""
        ref, known = self.ops[op].reference, self.impls.get(op, {})
        if not ref or ref in known:
            return None
        owner = self.op_plugins.get(op, "?")
        head = f"op {op!r} (plugin {owner!r}): OpSpec.reference={ref!r}"
        rule = ("OpSpec.reference must name an implementation ('<plugin>.<impl>') that a "
                "kreg_implementations hook registers for the op, not a 'module:function'")
        if ":" in ref or "." not in ref:
            return (f"{head} is not an implementation name; {rule}: register "
                    f"Implementation(op={op!r}, name='{owner}.reference', kernel="
                    f"{ref if ':' in ref else 'module:function'!r}, configurable=False, "
                    f"fallback=True) and set reference='{owner}.reference'", True)
        plugin = ref.split(".", 1)[0]
        rec = self.plugins.get(plugin)
        if rec is not None and rec.skipped_reason:
            fix = ("add it to KREG_PLUGINS" if rec.skipped_reason == "not in KREG_PLUGINS"
                   else "remove it from KREG_DISABLE_PLUGINS")
            return (f"{head} is not loaded: plugin {plugin!r} is {rec.skipped_reason}; {fix} "
                    f"(check mode, the conformance kit and kreg tune compare with it)", False)
        if rec is not None and rec.failed:
            return (f"{head} is not loaded: plugin {plugin!r} failed ({rec.error}); fix that "
                    f"plugin", False)
        where = (f"plugin {plugin!r} registers {', '.join(rec.implementations) or 'nothing'}"
                 if rec is not None else f"no plugin named {plugin!r} is installed")
        return (f"{head} names no registered implementation ({where}); {rule}", True)

    def offered_configs(self, op: str) -> dict[str, dict[str, Any]]:
        """The named configs plugins offer for ``op`` (hook ``kreg_configs``), keyed
        ``<plugin>.<name>``, in plugin registration order; a plugin whose hook raises or
        returns something other than a mapping of mappings is named in ``kreg plugins``."""
        self.spec(op)
        out: dict[str, dict[str, Any]] = {}
        for plugin, found in self._call_each("kreg_configs", op=op):
            if not isinstance(found, Mapping):
                self._fail(plugin, f"hook kreg_configs returned {type(found).__name__}; it must "
                                   f"return a mapping of config name -> config dict")
                continue
            try:
                items = list(found.items())
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                self._fail(plugin, f"hook kreg_configs: reading its result raised "
                                   f"{type(exc).__name__}: {exc}")
                continue
            for name, cfg in items:
                if not isinstance(name, str) or not isinstance(cfg, Mapping):
                    self._fail(plugin, f"hook kreg_configs: config {name!r:.60} is a "
                                       f"{type(cfg).__name__}; it must be a mapping named by a "
                                       f"string")
                    continue
                try:
                    out[f"{plugin}.{name}"] = dict(cfg)
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:
                    self._fail(plugin, f"hook kreg_configs: config {name!r} cannot be read: "
                                       f"{type(exc).__name__}: {exc}")
        return out

    def implementation(self, op: str, name: str) -> Implementation:
        impl = self.impls.get(self.spec(op).name, {}).get(name)
        if impl is None:
            raise UnknownImplementationError(
                f"no implementation {name!r} for op {op!r}; known: "
                f"{', '.join(sorted(self.impls.get(op, {}))) or '(none)'}")
        return impl

    def _override_raw(self, op: str) -> tuple[str, str] | None:
        stack = self._settings.context_overrides.get(op)
        if stack:
            return stack[-1], "registry.override()"
        raw = self._settings.env_overrides.get(op)
        if raw is None or raw.strip() in ("", "auto"):
            return None
        return raw, select_override_var(op)

    def override_request(self, op: str) -> OverrideRequest | None:
        raw = self._override_raw(op)
        if raw is None:
            return None
        return parse_override(op, raw[0], raw[1], self.impls.get(op, {}))

    @contextmanager
    def override(self, op: str, value: str) -> Iterator[None]:
        """Prefer ``value`` (``auto``, an implementation, or ``impl:measure``) inside the block.

        The override is pushed inside the ``try``: when entering fails (a bad KREG_STRICT makes
        the invalidation raise), it is popped again and nothing stays in force."""
        self.spec(op)
        if not isinstance(value, str):
            raise OverrideError(f"registry.override({op!r}, ...): the override is a string "
                                f"(auto | <implementation> | <implementation>:measure), not "
                                f"{type(value).__name__} {value!r:.60}")
        parse_override(op, value, "registry.override()", self.impls.get(op, {}))  # fail now
        stack = self._settings.context_overrides.setdefault(op, [])
        try:
            with self._lock:
                stack.append(value)
                self.invalidate()
            yield
        finally:
            with self._lock:
                stack.pop()
                self.invalidate()

    # -----------------------------------------------------------------------------------------
    # facts

    def facts_for_index(self, index: int) -> DeviceFacts:
        facts = self._facts.get(index)
        if facts is None:
            facts = self.enrich(probe_index(index))
            self._facts[index] = facts
        return facts

    def enrich(self, facts: DeviceFacts) -> DeviceFacts:
        """``facts`` with every plugin's ``kreg_enrich_facts`` merged into ``extra``, in
        registration order; keys ``facts.extra`` already has are kept. A raising hook (or one
        returning something other than a mapping) fails its plugin only."""
        extra: dict[str, str] = {}
        for plugin, more in self._call_each("kreg_enrich_facts", facts=facts):
            # Each plugin's facts are checked alone: one that returns something other than a
            # mapping of str -> str, or facts DeviceFacts refuses, is named and skipped.
            try:
                if not isinstance(more, Mapping):
                    raise TypeError(f"it returned {type(more).__name__} {more!r:.60}; it must "
                                    f"return a mapping of str -> str, or None")
                add = {str(k): str(v) for k, v in more.items() if str(k) not in facts.extra}
                facts.what_if(extra={**facts.extra, **extra, **add})
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                self._fail(plugin, f"hook kreg_enrich_facts: {type(exc).__name__}: {exc}; its "
                                   f"facts are ignored")
                continue
            extra.update(add)
        return facts.what_if(extra={**facts.extra, **extra}) if extra else facts

    # -----------------------------------------------------------------------------------------
    # device profiles

    def _profile_table(self) -> dict[str, tuple[DeviceFacts, str]]:
        """``{name: (facts, source)}``: the shipped profiles, then plugins' (``kreg_profiles``,
        registration order; a name taken fails the later plugin), then KREG_PROFILES entries
        (the first entry holding a name wins; it replaces a shipped or plugin profile)."""
        table = self._profile_cache.table
        if table is not None:
            return table
        with self._lock:
            table = {name: (facts, "shipped") for name, facts in profiles().items()}
            for plugin, items in self._call_each("kreg_profiles"):
                for facts, where in self._plugin_profiles(plugin, items):
                    name = facts.profile or ""
                    if name in table:
                        self._fail(plugin, f"hook kreg_profiles: profile {name!r} ({where}) is "
                                           f"already {table[name][1]}; rename it")
                        continue
                    table[name] = (facts, f"plugin {plugin}")
            from_env: set[str] = set()
            for entry in self._settings.env_profiles:
                for facts, where in profiles_in(entry):  # a bad file is an error, named
                    name = facts.profile or ""
                    if name not in from_env:
                        from_env.add(name)
                        table[name] = (facts, f"file {where}")
            self._profile_cache.table = table
        return table

    def _plugin_profiles(self, plugin: str, items: Any) -> list[tuple[DeviceFacts, str]]:
        if isinstance(items, (str, bytes, DeviceFacts)) or not hasattr(items, "__iter__"):
            items = [items]
        out: list[tuple[DeviceFacts, str]] = []
        for item in items:
            if isinstance(item, DeviceFacts):
                if not item.profile or looks_like_path(item.profile):
                    self._fail(plugin, f"hook kreg_profiles returned DeviceFacts of "
                                       f"{item.name!r} without a profile name (set profile=)")
                    continue
                out.append((item, "DeviceFacts"))
                continue
            if not (isinstance(item, (str, os.PathLike)) or hasattr(item, "read_text")):
                self._fail(plugin, f"hook kreg_profiles returned {type(item).__name__} "
                                   f"{item!r:.60}; each item must be DeviceFacts or the path of "
                                   f"a profile file or directory")
                continue
            try:
                out.extend(profiles_in(item))
            except ConfigError as exc:
                self._fail(plugin, f"hook kreg_profiles: {exc}")
        return out

    def profiles(self) -> dict[str, DeviceFacts]:
        """Every device profile by name: shipped, plugins' and KREG_PROFILES', each enriched by
        the ``kreg_enrich_facts`` hooks (what ``select(..., device=NAME)`` sees)."""
        return {name: self._profile(name) for name in self._profile_table()}

    def profile_sources(self) -> dict[str, str]:
        """``{name: "shipped" | "plugin NAME" | "file PATH"}`` of every device profile."""
        return {name: source for name, (_, source) in self._profile_table().items()}

    def _profile(self, name: str) -> DeviceFacts:
        facts = self._profile_cache.facts.get(name)
        if facts is None:
            facts = self._profile_cache.facts[name] = self.enrich(self._profile_table()[name][0])
        return facts

    def resolve_device(self, device: DeviceFacts | str | os.PathLike[str] | None, *,
                       enrich: bool = True) -> DeviceFacts:
        """DeviceFacts as given; a profile name (shipped, a plugin's or KREG_PROFILES'); the
        path of a profile file (``.toml`` / ``.json``: a string with a path separator or that
        suffix, or a PathLike); None for this machine's current device. Profiles and this
        machine come enriched by ``kreg_enrich_facts`` unless ``enrich=False``."""
        if isinstance(device, DeviceFacts):
            return device
        if device is None:
            import torch

            index = torch.cuda.current_device() if torch.cuda.is_available() else -1
            return self.facts_for_index(index) if enrich else probe_index(index)
        if isinstance(device, os.PathLike) or (isinstance(device, str)
                                               and looks_like_path(device)):
            facts = load_profile(device)
            return self.enrich(facts) if enrich else facts
        if isinstance(device, str):
            table = self._profile_table()
            if device in table:
                return self._profile(device) if enrich else table[device][0]
            raise UnknownDeviceError(f"unknown device profile {device!r}; known profiles: "
                                     f"{', '.join(sorted(table))} (see `kreg profiles`), or the "
                                     f"path of a .toml/.json profile file, or DeviceFacts, or "
                                     f"None for this machine")
        raise ConfigError(f"device must be DeviceFacts, a profile name, a profile file or None, "
                          f"not {type(device).__name__}")

    # -----------------------------------------------------------------------------------------
    # selection

    def workload(self, op: str, workload: Mapping[str, Any] | Workload) -> Workload:
        return make_workload(self.spec(op).workload_model, workload)

    def select(self, op: str, workload: Mapping[str, Any] | Workload,
               device: DeviceFacts | str | None = None) -> Decision:
        # The hit path: a key from what the caller passed, one lookup in a C-implemented LRU
        # (functools.lru_cache). A profile name stands for its (immutable) facts; DeviceFacts
        # hash by fingerprint; None means this machine's probed facts (one object per device).
        try:
            hit = self._lru(op, device if device is not None else self.resolve_device(None),
                            tuple(workload.items()),  # type: ignore[union-attr]
                            self._override_now.get(op))
        except (AttributeError, TypeError):  # a Workload model, or unhashable values
            return self._select_slow(op, workload, device)
        if _FRESH.fresh is None:
            return hit  # type: ignore[no-any-return]
        fresh, _FRESH.fresh = _FRESH.fresh, None  # this call missed: return what it just made
        return fresh  # type: ignore[no-any-return]

    def _lru_miss(self, op: str, dkey: Any, items: tuple[Any, ...], raw: str | None) -> Decision:
        key = (op, dkey, items, raw)
        known = self._decisions.get(key)  # pinned by registry.agree(), or evicted from the LRU
        if known is not None:
            return known
        facts = self.resolve_device(dkey)
        decision = self._decide(op, facts, make_workload(self.spec(op).workload_model,
                                                         dict(items)), self._override_raw(op),
                                self.required(op))
        cached = decision.model_copy(update={"cached": True})
        with self._lock:
            self._decisions[key] = cached
            while len(self._decisions) > self.decision_cache_size:
                self._decisions.pop(next(iter(self._decisions)))
        _FRESH.fresh = decision
        return cached

    def _select_slow(self, op: str, workload: Mapping[str, Any] | Workload,
                     device: DeviceFacts | str | None) -> Decision:
        """Workload models and unhashable mappings: validated first, then cached by value."""
        spec = self.spec(op)
        facts = self.resolve_device(device)
        if isinstance(workload, Workload):
            if not isinstance(workload, spec.workload_model):
                make_workload(spec.workload_model, workload)  # raises, naming both types
            items = tuple(workload.model_dump().items())
        else:
            items = tuple(make_workload(spec.workload_model, workload).model_dump().items())
        hit = self._lru(op, facts, items, self._override_now.get(op))
        if _FRESH.fresh is None:
            return hit  # type: ignore[no-any-return]
        fresh, _FRESH.fresh = _FRESH.fresh, None
        return fresh  # type: ignore[no-any-return]

    def _override_value(self, op: str) -> str | None:
        stack = self._settings.context_overrides.get(op)
        return stack[-1] if stack else self._settings.env_overrides.get(op)

    def required(self, op: str) -> frozenset[str]:
        """The guarantees required of ``op``'s implementations now (registry.require() scopes
        over KREG_REQUIRE_<OP>)."""
        stack = self._settings.context_required.get(op)
        return stack[-1] if stack else self._settings.env_required.get(op, frozenset())

    def _selection_setting(self, op: str) -> Any:
        req = self.required(op)
        raw = self._override_value(op)
        return (raw, tuple(sorted(req))) if req else raw

    @contextmanager
    def require(self, op: str, guarantees: frozenset[str]) -> Iterator[None]:
        """Require ``guarantees`` of ``op``'s implementations inside the block."""
        self.spec(op)
        with self._lock:
            self._settings.context_required.setdefault(op, []).append(frozenset(guarantees))
        try:
            self.invalidate()
            yield
        finally:
            with self._lock:
                self._settings.context_required[op].pop()
            self.invalidate()

    def _decide(self, op: str, facts: DeviceFacts, wl: Workload,
                raw: tuple[str, str] | None,
                required: frozenset[str] = frozenset()) -> Decision:
        override = None
        if raw is not None:
            override = parse_override(op, raw[0], raw[1], self.impls.get(op, {}))
        if required:
            # Decided in-process: the daemon shares decisions made without requirements.
            return self._finish(self._decide_required(op, facts, wl, override, required))
        note = None
        if self.remote is not None:
            # The daemon shares one decision per key across the node's processes; when it is
            # gone, slow or refuses, selection stays in-process and the decision says why.
            remote, note = self.remote(self, op, facts, wl, raw)
            if remote is not None and remote.implementation in self.impls.get(op, {}):
                return self._finish(remote)
            if remote is not None:
                note = (f"the daemon chose {remote.implementation}, which this process does not "
                        f"have (its plugin set differs); selected in-process")
                logger.warning("%s: %s", op, note)
        decision = select_pure(op, facts, wl, list(self.impls.get(op, {}).values()), override,
                               strict=self.strict)
        if note:
            decision = decision.model_copy(update={"notes": [*decision.notes, note]})
        if decision.override is not None and not decision.override.honoured:
            wkey = (op, facts.fingerprint, wl.key(), decision.override.value)
            if wkey not in self._warned:
                self._warned.add(wkey)
                logger.warning("%s: override %s=%s not honoured for [%s]: %s", op,
                               decision.override.source, decision.override.value, wl.short(),
                               decision.override.reason)
        return self._finish(decision)

    def _finish(self, decision: Decision) -> Decision:
        """The end of every miss: the lockfile's say (KREG_LOCK), then the listeners."""
        if self.lock is not None:
            decision = self.lock(self, decision)
        self._notify(decision)
        return decision

    def _decide_required(self, op: str, facts: DeviceFacts, wl: Workload,
                         override: OverrideRequest | None,
                         required: frozenset[str]) -> Decision:
        """Selection under required guarantees. With ``batch_invariant``, the decision is made
        at the op's batch reference point, so one implementation and one config serve every
        batch size of the remaining workload fields; the chosen one's capability checks must
        also pass at the real workload."""
        spec = self.spec(op)
        impls = list(self.impls.get(op, {}).values())
        at = wl
        if "batch_invariant" in required and spec.batch_fields:
            at = spec.at_batch_reference(wl)
        decision = select_pure(op, facts, at, impls, override, strict=self.strict,
                               required=required)
        if at is wl:
            return decision
        chosen = self.impls[op][decision.implementation]
        failed = [str(c) for r in chosen.requirements if r.kind == "capability"
                  for c in [r.check(facts, wl)] if not c.passed]
        if failed:
            raise NoEligibleImplementationError(
                f"{op}: batch-invariant selection chose {chosen.name} at the batch reference "
                f"point [{at.short()}], but it cannot run [{wl.short()}]: {'; '.join(failed)}; "
                f"fix: unset KREG_REQUIRE_{op.upper()} or require fewer guarantees")
        point = " ".join(f"{k}={getattr(at, k)}" for k in spec.batch_fields)
        notes = [f"batch-invariant: decided at the batch reference point {point} for every "
                 f"batch size of this workload's other fields"]
        try:
            per_batch = select_pure(op, facts, wl, impls, override, strict=False,
                                    required=required - {"batch_invariant"})
            if (per_batch.implementation, per_batch.config) != (decision.implementation,
                                                                decision.config):
                notes.append(f"the per-batch-size choice would be {per_batch.implementation} "
                             f"{format_config(per_batch.config)} (not batch-invariant across "
                             f"batch sizes; docs/BENCHMARKS.md gives the measured cost)")
        except KregError:
            pass
        return decision.model_copy(update={"workload": wl.model_dump(),
                                           "notes": [*decision.notes, *notes]})

    def decide_local(self, op: str, facts: DeviceFacts, workload: Mapping[str, Any] | Workload,
                     override: str | None = None) -> Decision:
        """Decide in this process, ignoring caches and the daemon (the daemon's own path).

        ``override`` is the raw override value the asking client had in force, or None.
        """
        wl = make_workload(self.spec(op).workload_model, workload)
        req = None
        if override is not None and override.strip() not in ("", "auto"):
            req = parse_override(op, override, "client override", self.impls.get(op, {}))
        return select_pure(op, facts, wl, list(self.impls.get(op, {}).values()), req,
                           strict=False)

    def _notify(self, decision: Decision) -> None:
        logger.info("%s", decision.one_line())
        for listener in list(self.listeners):
            try:
                listener(decision)
            except Exception:  # a listener must never break selection
                logger.exception("decision listener %r failed", listener)

    # -----------------------------------------------------------------------------------------
    # dispatch

    def observe(self, key: tuple[Any, ...], fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        """The dispatch path while an observer (recorder, check mode) is installed."""
        decision = self.last_decisions.get(key)
        if decision is None:  # evicted between the lookup and here: decide again
            fn = self.dispatch_miss(key[0], key)
            decision = self.last_decisions[key]
        result = fn(*args, **kwargs)
        for obs in list(self.observers):
            obs(self, decision, args, kwargs, result)
        return result

    def pin(self, key: tuple[Any, ...], decision: Decision) -> None:
        """Make dispatch key ``key`` run ``decision`` (its implementation and config) from now
        on, whatever selection would say, until :meth:`unpin`."""
        impl = self.implementation(decision.op, decision.implementation)
        with self._lock:
            self.pins[key] = decision
            self.dispatch_map[key] = impl.bind(decision.config)
            self.last_decisions[key] = decision

    def unpin(self) -> int:
        """Drop every pin; the next dispatch of those keys selects again. Returns the count."""
        with self._lock:
            n = len(self.pins)
            self.pins.clear()
        self.invalidate()
        return n

    def dispatch_miss(self, op: str, key: tuple[Any, ...]) -> Callable[..., Any]:
        """Decide for a dispatch key ``(op, device index, *workload values)``; bind the kernel."""
        spec = self.spec(op)
        if not (isinstance(key, tuple) and len(key) >= 2 and key[0] == op):
            raise PluginError(f"op {op!r}: its call_key returned {key!r}; it must return "
                              f"(op name, device index, *workload values)")
        with self._lock:
            old = self._dispatch_old.pop(key, None)
            if old is not None and key in self.last_decisions:
                # Used again since the map's last generation began: promote it, no selection.
                self._insert(key, old, self.last_decisions[key])
                return old
        decision = self.pins.get(key)
        if decision is None or decision.implementation not in self.impls[op]:
            facts = self.facts_for_index(key[1])
            wl = spec.workload_from_key(key[2:])
            decision = self.select(op, wl, facts)
        impl = self.impls[op].get(decision.implementation)
        if impl is None:  # unreachable: _decide refuses such decisions; never a KeyError
            raise UnknownImplementationError(
                f"{op}: the decision names {decision.implementation!r}, which this process "
                f"does not have; known: {', '.join(sorted(self.impls[op]))}")
        fn = impl.bind(decision.config)
        with self._lock:
            self._insert(key, fn, decision)
        return fn

    def _insert(self, key: tuple[Any, ...], fn: Callable[..., Any], decision: Decision) -> None:
        """Put ``key`` in the current generation (the lock held); a full one becomes the
        previous generation, and the previous one's keys not used since are dropped."""
        if len(self.dispatch_map) >= DISPATCH_MAP_SIZE and key not in self.dispatch_map:
            for gone in self._dispatch_old:
                if gone not in self.pins:
                    self.last_decisions.pop(gone, None)
            self._dispatch_old = dict(self.dispatch_map)
            # clear(), not a new dict: registry.dispatch reads this very object on its hit path
            self.dispatch_map.clear()
        self.dispatch_map[key] = fn
        self.last_decisions[key] = decision


def _spec_problem(spec: OpSpec) -> str | None:
    """Why an op spec a plugin returned cannot be loaded, or None."""
    try:
        if not isinstance(spec.name, str) or not spec.name:
            return f"an OpSpec's name must be a non-empty string, not {spec.name!r:.60}"
        if not (isinstance(spec.workload_model, type)
                and issubclass(spec.workload_model, Workload)):
            return (f"op {spec.name!r}: OpSpec.workload_model must be a registry.Workload "
                    f"subclass, not {spec.workload_model!r:.60}")
        if not callable(spec.call_key):
            return f"op {spec.name!r}: OpSpec.call_key must be callable"
        spec.check_consistent()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return f"op spec {getattr(spec, 'name', '?')!r:.60} is invalid: {exc}"
    return None


def _impl_problem(impl: Implementation) -> str | None:
    """Why an implementation a plugin returned cannot be registered, or None. (A priority that
    is not an integer is not refused here: selection disqualifies that candidate, by name.)"""
    name, op = impl.name, impl.op
    if not isinstance(name, str) or "." not in name:
        return f"an implementation's name must be 'plugin.impl', not {name!r:.60}"
    if not isinstance(op, str) or not op:
        return f"implementation {name!r}: op must be an op's name, not {op!r:.60}"
    reqs = impl.requirements
    if not isinstance(reqs, (tuple, list)) or not all(isinstance(r, Requirement) for r in reqs):
        return (f"implementation {name!r}: requirements must be a tuple of Requirement, not "
                f"{reqs!r:.80}")
    if impl.config is not None and not (callable(impl.config) or isinstance(impl.config, Mapping)):
        return (f"implementation {name!r}: config must be a mapping, a resolver "
                f"(facts, workload) -> mapping, or None, not {type(impl.config).__name__}")
    if impl.kernel is not None and not (callable(impl.kernel) or isinstance(impl.kernel, str)):
        return (f"implementation {name!r}: kernel must be 'module:function', a callable or "
                f"None, not {type(impl.kernel).__name__}")
    return None


def _check_not_shadowed(eps: Any) -> None:
    """Fail, naming the path and the fix, when a package of the same name earlier on sys.path
    (an application's own ``plugins/`` in its working directory) hides one of kreg's."""
    names = set()
    for ep in eps:
        dist = getattr(ep, "dist", None)
        if dist is not None and getattr(dist, "name", None) == _KREG_DIST:
            names.add(str(ep.value).partition(":")[0].split(".")[0])
    for name in sorted(names):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        where: str | None = None
        if spec is not None and spec.origin not in (None, "namespace", "built-in", "frozen"):
            where = str(spec.origin)
        elif spec is not None and spec.submodule_search_locations:
            where = str(next(iter(spec.submodule_search_locations)))
        mine = _KREG_ROOT / name
        if where is None:
            found = "nothing importable"
        else:
            path = Path(where)
            top = path.parent if path.name.startswith("__init__.") else path
            if top.resolve() == mine.resolve():
                continue
            found = str(top)
        raise PluginError(
            f"kreg's package {name!r} is shadowed: `import {name}` finds {found}, not kreg's "
            f"{mine} (a directory earlier on sys.path, such as the working directory, has its "
            f"own {name!r} package). Every in-tree plugin would fail to import. Fix: rename that "
            f"package, or run from another directory (or remove it from sys.path / PYTHONPATH)")


class _Fresh(threading.local):
    fresh: Decision | None = None


# Per thread: the decision a select() miss just made (the LRU stores its cached copy).
_FRESH = _Fresh()
