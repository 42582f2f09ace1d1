"""Watching dispatches: the launch recorder and check mode.

Both ride on ``Registry.observers``: a list of ``obs(decision, args, kwargs, result)`` callables
that ``dispatch`` calls after the kernel returns, only while the list is non-empty (the hit path
tests ``if reg.observers:`` and nothing else). This module installs a single observer, the *hub*,
while a recorder is open or the check rate is above zero, and removes it otherwise: with
``KREG_CHECK`` unset and no recorder, the list is empty and dispatch pays nothing.

**Launch recorder.** ``with registry.record() as launches:`` appends a frozen :class:`Launch`
(op, implementation, config, workload) for every dispatch in the block, so a framework's test can
assert the geometry that actually ran.

**Check mode** (``KREG_CHECK=<fraction>`` or ``registry.check(rate)``). A sampled fraction of
dispatches is re-run through the op's torch reference on the same inputs and compared with the
op's ``OpSpec.compare`` (``"module:function"``, ``compare(actual, expected) -> None | str``).
Sampling uses :class:`random.Random` with a seed (default 0), so a run is reproducible.
Dispatches served by the reference itself are counted but not compared. A violation is counted
per (op, implementation, config), logged at WARNING with the workload (once per workload and
config), kept in :func:`violations`, and raised as :class:`CheckViolationError` under
``KREG_STRICT=1``. Dispatches inside CUDA graph capture are never compared (the comparison reads
device memory); they are counted as ``skipped``.

Counters of this process: :func:`stats`. Check mode also persists them to
``$KREG_HOME/stats.json`` (one entry per process id, written at most once a second while
counters change and once at exit), which is what ``kreg stats`` shows from another shell.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from registry._knobs import knobs
from registry.errors import CheckViolationError, ConfigError, KregError

if TYPE_CHECKING:
    from registry._decision import Decision
    from registry._registry import Registry

__all__ = [
    "CheckScope",
    "CheckViolationError",
    "Counter",
    "Launch",
    "Stats",
    "Violation",
    "check",
    "default_compare",
    "install_from_env",
    "read_persisted",
    "record",
    "reset_stats",
    "stats",
    "stats_path",
    "violations",
]

logger = logging.getLogger(__name__)

STATS_FILENAME = "stats.json"
STATS_SCHEMA_VERSION = 1
PERSIST_INTERVAL_S = 1.0
MAX_PERSISTED_PROCESSES = 64  # the file keeps the most recently updated processes
MAX_VIOLATIONS_KEPT = 256


# ---------------------------------------------------------------------------------------------
# records


@dataclass(frozen=True, slots=True)
class Launch:
    """One dispatch as it ran: ``config`` and ``workload`` are read-only mappings."""

    op: str
    implementation: str
    config: Mapping[str, Any]
    workload: Mapping[str, Any]
    fallback: bool = False

    def __str__(self) -> str:
        cfg = ",".join(f"{k}={v}" for k, v in self.config.items()) or "-"
        return f"{self.op} -> {self.implementation} ({cfg})"


@dataclass(frozen=True, slots=True)
class Violation:
    """One comparison outside the op's bound."""

    seq: int
    op: str
    implementation: str
    config: Mapping[str, Any]
    workload: Mapping[str, Any]
    message: str

    def __str__(self) -> str:
        cfg = ",".join(f"{k}={v}" for k, v in self.config.items()) or "-"
        wl = " ".join(f"{k}={v}" for k, v in self.workload.items())
        return f"{self.implementation} ({cfg}) on [{wl}]: {self.message}"


class Counter(BaseModel):
    """Check-mode counters of one (op, implementation, config)."""

    op: str
    implementation: str
    config: dict[str, Any] | None = None
    dispatches: int = Field(default=0, description="dispatches seen while check mode was on")
    checked: int = Field(default=0, description="re-run through the reference and compared")
    violations: int = Field(default=0, description="comparisons outside the op's bound")
    errors: int = Field(default=0, description="checks that could not run (a raise)")
    skipped: int = Field(default=0, description="sampled inside CUDA graph capture: not compared")
    last_violation: str | None = None
    last_workload: dict[str, Any] | None = None


class Stats(BaseModel):
    """Check-mode counters of one process."""

    pid: int
    rate: float
    seed: int
    updated: float = Field(description="time.time() of the last change")
    counters: list[Counter] = []

    @property
    def violations(self) -> int:
        return sum(c.violations for c in self.counters)

    @property
    def checked(self) -> int:
        return sum(c.checked for c in self.counters)

    def counter(self, implementation: str, config: Mapping[str, Any] | None = None) -> Counter:
        """The counter of ``implementation`` (and ``config`` when given); LookupError if none."""
        for c in self.counters:
            if c.implementation == implementation and (config is None
                                                       or dict(c.config or {}) == dict(config)):
                return c
        raise LookupError(f"no check-mode counter for {implementation} "
                          f"{'' if config is None else dict(config)}; have: "
                          f"{', '.join(c.implementation for c in self.counters) or '(none)'}")


# ---------------------------------------------------------------------------------------------
# comparison

def default_compare(actual: Any, expected: Any,
                    bound: Callable[[str], float] | None = None) -> str | None:
    """The comparison used when an op declares no ``OpSpec.compare``: exact for integer
    tensors; for floating ones, max-abs within ``bound(dtype name)`` (the op's
    ``OpSpec.error_bound``), else within 1e-3."""
    import torch

    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return None if actual == expected else f"result {actual!r} != reference {expected!r}"
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)} != reference {list(expected.shape)}"
    if not actual.is_floating_point():
        bad = int((actual != expected).sum())
        return None if bad == 0 else f"{bad} of {actual.numel()} elements differ from the reference"
    limit = 1e-3 if bound is None else bound(str(actual.dtype).removeprefix("torch."))
    diff = (actual.double() - expected.double()).abs()
    err = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
    return None if err <= limit else f"max |result - reference| = {err:.3g} > {limit:g}"


@dataclass(frozen=True)
class _OpCheck:
    reference: Callable[..., Any] | None
    compare: Callable[[Any, Any], str | None]
    problem: str | None = None  # why this op cannot be checked


def _resolve(reg: Registry, op: str) -> _OpCheck:
    from registry._spec import load_object

    spec = reg.spec(op)
    compare: Callable[[Any, Any], str | None] = functools.partial(default_compare,
                                                                  bound=spec.error_bound)
    if spec.compare:
        try:
            compare = load_object(spec.compare)
        except (ImportError, AttributeError) as exc:
            return _OpCheck(None, default_compare,
                            f"cannot load {op}'s compare {spec.compare!r}: {exc}")
    impl = reg.impls.get(op, {}).get(spec.reference)
    if impl is None:
        return _OpCheck(None, compare, f"{op}'s reference implementation {spec.reference!r} is "
                                       "not loaded (is the reference plugin disabled?)")
    try:
        return _OpCheck(impl.load_kernel(), compare)
    except KregError as exc:
        return _OpCheck(None, compare, str(exc))


# ---------------------------------------------------------------------------------------------
# state


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
        self.known: weakref.WeakSet[Registry] = weakref.WeakSet()  # registries seen by _sync
        self.dirty = False
        self.updated = time.time()
        self.last_write = 0.0
        self.persist_failed = False
        self.atexit_registered = False
        self.capture_probe: Callable[[], bool] | None = None


_state = _State()
_local = threading.local()


def _capturing() -> bool:
    """True inside CUDA graph capture on this thread's current stream (never imports torch)."""
    probe = _state.capture_probe
    if probe is None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return False
        probe = _state.capture_probe = torch.cuda.is_current_stream_capturing
    return bool(probe())


def _hub(decision: Decision, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
    """The one observer this module installs; see the module docstring."""
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
            _check_one(decision, args, kwargs, result)
        finally:
            _local.busy = False


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


def _check_one(decision: Decision, args: tuple[Any, ...], kwargs: dict[str, Any],
               result: Any) -> None:
    st = _state
    with st.lock:
        c = _counter(decision)
        c.dispatches += 1
        st.dirty = True
        st.updated = time.time()
        sampled = (not decision.fallback
                   and (st.rate >= 1.0 or st.rng.random() < st.rate))
    if not sampled:
        _maybe_persist()
        return
    if _capturing():
        with st.lock:
            c.skipped += 1
        return
    from registry._registry import get_registry

    reg = get_registry()
    key = (id(reg), decision.op)
    oc = st.checks.get(key)
    if oc is None:
        oc = st.checks[key] = _resolve(reg, decision.op)
    message: str | None
    try:
        if oc.reference is None:
            raise RuntimeError(oc.problem)
        expected = oc.reference(*args, **kwargs)
        message = oc.compare(result, expected)
    except Exception as exc:  # a check must never break the dispatch it watches
        with st.lock:
            c.errors += 1
        wkey = ("error", decision.op, decision.implementation)
        if wkey not in st.logged:
            st.logged.add(wkey)
            logger.warning("check mode: cannot check %s %s: %s: %s", decision.op,
                           decision.implementation, type(exc).__name__, exc)
        _maybe_persist()
        return
    with st.lock:
        c.checked += 1
        if message is not None:
            c.violations += 1
            c.last_violation = message
            c.last_workload = dict(decision.workload)
            st.seq += 1
            v = Violation(st.seq, decision.op, decision.implementation,
                          MappingProxyType(dict(decision.config or {})),
                          MappingProxyType(dict(decision.workload)), message)
            st.violations.append(v)
        st.updated = time.time()
    if message is None:
        _maybe_persist()
        return
    lkey = (decision.op, decision.implementation, c.config and tuple(c.config.items()),
            tuple(decision.workload.items()))
    if lkey not in st.logged:
        st.logged.add(lkey)
        logger.warning("check mode: %s violation: %s", decision.op, v)
    _maybe_persist(force=True)
    if knobs.strict:
        raise CheckViolationError(
            f"KREG_STRICT=1: check mode found {decision.op} implementation {v}; the reference "
            f"{decision.op} disagrees on the same inputs. Fix or disable the implementation "
            f"(KREG_SELECT_{decision.op.upper()}=<another>, KREG_DISABLE_PLUGINS=<plugin>), or "
            f"unset KREG_STRICT to only count violations (kreg stats)")


# ---------------------------------------------------------------------------------------------
# installing the hub

def _sync(reg: Registry | None = None) -> None:
    """Install the hub in every live registry while check mode or a recorder is active; remove
    it from all of them otherwise."""
    if reg is None:
        from registry._registry import get_registry

        reg = get_registry()
    _state.known.add(reg)
    want = _state.rate > 0.0 or bool(_state.recorders)
    for r in list(_state.known):
        if want and _hub not in r.observers:
            r.observers.append(_hub)
        elif not want:
            while _hub in r.observers:
                r.observers.remove(_hub)


def install_from_env(reg: Registry) -> None:
    """Called when a registry is created: apply ``KREG_CHECK`` (unless ``check()`` already set a
    rate in this process) and install the hub if check mode or a recorder is active.

    Takes the registry explicitly because it runs while the default registry is being made.
    Imports neither torch nor Triton.
    """
    if not _state.explicit:
        rate = knobs.check
        with _state.lock:
            _state.rate = rate
    if _state.rate > 0.0:
        _register_atexit()
    _sync(reg)


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
    _sync()


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


@contextmanager
def record() -> Iterator[list[Launch]]:
    """``with registry.record() as launches:`` appends a :class:`Launch` per dispatch."""
    launches: list[Launch] = []
    with _state.lock:
        _state.recorders.append(launches)
    _sync()
    try:
        yield launches
    finally:
        with _state.lock:
            # identity, not equality: two recorders holding equal lists are distinct
            _state.recorders = [r for r in _state.recorders if r is not launches]
        _sync()


# ---------------------------------------------------------------------------------------------
# counters

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


# ---------------------------------------------------------------------------------------------
# persistence

def stats_path(home: Path | None = None) -> Path:
    return (home if home is not None else knobs.home) / STATS_FILENAME


def _register_atexit() -> None:
    if not _state.atexit_registered:
        _state.atexit_registered = True
        atexit.register(_maybe_persist, force=True)


def _maybe_persist(force: bool = False) -> None:
    st = _state
    if not st.dirty or st.persist_failed:
        return
    now = time.monotonic()
    if not force and now - st.last_write < PERSIST_INTERVAL_S:
        return
    st.last_write = now
    snapshot = stats()
    st.dirty = False
    try:
        _write(snapshot)
    except (OSError, ValueError) as exc:
        st.persist_failed = True  # warn once; the in-process counters still work
        logger.warning("check mode: cannot write %s (%s); kreg stats will not show this "
                       "process; set KREG_HOME to a writable directory", stats_path(), exc)


def read_persisted(home: Path | None = None) -> dict[int, Stats]:
    """``{pid: Stats}`` as persisted under ``home`` (default ``$KREG_HOME``); {} if none.

    An unreadable or malformed file reads as empty (the next write replaces it)."""
    path = stats_path(home)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("check mode: ignoring unreadable %s (%s)", path, exc)
        return {}
    if not isinstance(raw, dict) or raw.get("schema_version") != STATS_SCHEMA_VERSION:
        logger.warning("check mode: ignoring %s: not a schema_version %d stats file", path,
                       STATS_SCHEMA_VERSION)
        return {}
    out: dict[int, Stats] = {}
    for pid, data in dict(raw.get("processes", {})).items():
        try:
            out[int(pid)] = Stats.model_validate(data)
        except (ValueError, TypeError):
            continue
    return out


def _write(snapshot: Stats) -> None:
    import filelock

    path = stats_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(path) + ".lock", timeout=10):
        procs = read_persisted(path.parent)
        procs[snapshot.pid] = snapshot
        keep = sorted(procs.values(), key=lambda s: s.updated, reverse=True)
        keep = keep[:MAX_PERSISTED_PROCESSES]
        doc = {"schema_version": STATS_SCHEMA_VERSION,
               "processes": {str(s.pid): s.model_dump(mode="json") for s in keep}}
        fd, tmp = tempfile.mkstemp(prefix=".stats-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def clear_persisted(home: Path | None = None) -> bool:
    """Delete the persisted counters; True when a file was removed."""
    path = stats_path(home)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
