"""Every environment setting kreg reads, declared once and typed.

Read a knob through ``knobs.<name>``; each read consults the environment, so tests can use
``monkeypatch.setenv``. A bad value fails with ``Unable to use KREG_X='val': expected ...``.
The per-op override variable ``KREG_SELECT_<OP>`` is read through :func:`select_override`.

Every ``KREG_*`` variable kreg knows is declared here (the knobs, ``KREG_SELECT_<OP>`` of each
loaded op, and :data:`OTHER_VARIABLES` read by kreg's tests and probes); any other one in the
environment when a registry is created is logged once, as a warning naming the closest known
variable, so a misspelled ``KREG_STRCT=1`` does not pass silently.
"""

from __future__ import annotations

import difflib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from registry.errors import ConfigError

T = TypeVar("T")

__all__ = ["OTHER_VARIABLES", "knobs", "known_variables", "require_var", "required_from_env",
           "select_override_var", "warn_unknown_settings"]

logger = logging.getLogger("registry")


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"Unable to use {name}={raw!r}: expected 1/0, true/false, yes/no or on/off")


def _parse_fraction(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"Unable to use {name}={raw!r}: expected a number in [0, 1]") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"Unable to use {name}={raw!r}: expected a number in [0, 1]")
    return value


def _parse_seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"Unable to use {name}={raw!r}: expected seconds (a positive number)")
    return value


def _parse_list(name: str, raw: str) -> frozenset[str] | None:
    items = frozenset(p.strip() for p in raw.split(",") if p.strip())
    return items or None


def _parse_path(name: str, raw: str) -> Path:
    return Path(raw).expanduser()


def _parse_optional_path(name: str, raw: str) -> Path | None:
    return Path(raw.strip()).expanduser() if raw.strip() else None


def _parse_lock_mode(name: str, raw: str) -> str:
    mode = raw.strip().lower() or "verify"
    if mode not in ("verify", "pin"):
        raise ConfigError(f"Unable to use {name}={raw!r}: expected verify (log a changed "
                          f"decision) or pin (serve the locked one); see docs/LOCKFILE.md")
    return mode


def _parse_paths(name: str, raw: str) -> tuple[Path, ...]:
    return tuple(Path(p.strip()).expanduser() for p in raw.split(os.pathsep) if p.strip())


@dataclass(frozen=True)
class Knob(Generic[T]):
    name: str
    default: Callable[[], T]
    parse: Callable[[str, str], T]
    doc: str

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default()
        return self.parse(self.name, raw)


def _default_home() -> Path:
    return Path.home() / ".cache" / "kreg"


class _Knobs:
    """Typed access to kreg's environment settings (one read per access)."""

    home_knob = Knob("KREG_HOME", _default_home, _parse_path,
                     "Directory of the tuning store and the decision journal.")
    strict_knob = Knob("KREG_STRICT", lambda: False, _parse_bool,
                       "Make override fallbacks and fallbacks to the torch reference errors.")
    plugins_knob = Knob("KREG_PLUGINS", lambda: None, _parse_list,
                        "Allow-list of plugin names (comma separated); unset loads all. The "
                        "op packages the listed plugins' implementations need load with them.")
    disable_knob = Knob("KREG_DISABLE_PLUGINS", lambda: None, _parse_list,
                        "Deny-list of plugin names (comma separated).")
    daemon_knob = Knob("KREG_DAEMON", lambda: None, lambda n, r: r.strip() or None,
                       "Socket path of the dispatch daemon, or 1 for the default path.")
    daemon_timeout_knob = Knob("KREG_DAEMON_TIMEOUT", lambda: 0.5, _parse_seconds,
                               "Seconds a client waits for the daemon before selecting locally.")
    check_knob = Knob("KREG_CHECK", lambda: 0.0, _parse_fraction,
                      "Fraction of dispatches re-run through the reference and compared.")
    # registry.lock (attached by the composition root, registry/_default.py)
    lock_knob = Knob("KREG_LOCK", lambda: None, _parse_optional_path,
                     "Lockfile (`kreg lock`) this process's decisions are checked against.")
    lock_mode_knob = Knob("KREG_LOCK_MODE", lambda: "verify", _parse_lock_mode,
                          "verify: log a decision that differs from KREG_LOCK (an error under "
                          "KREG_STRICT=1); pin: serve the locked one.")
    profiles_knob = Knob("KREG_PROFILES", lambda: (), _parse_paths,
                         "Directories (or files) of device profiles, separated like PATH; "
                         "a profile here replaces a shipped or plugin one of the same name.")

    @property
    def home(self) -> Path:
        return self.home_knob.get()

    @property
    def strict(self) -> bool:
        return self.strict_knob.get()

    @property
    def plugins(self) -> frozenset[str] | None:
        return self.plugins_knob.get()

    @property
    def disable_plugins(self) -> frozenset[str] | None:
        return self.disable_knob.get()

    @property
    def daemon(self) -> str | None:
        return self.daemon_knob.get()

    @property
    def daemon_timeout(self) -> float:
        return self.daemon_timeout_knob.get()

    @property
    def check(self) -> float:
        return self.check_knob.get()

    @property
    def lock(self) -> Path | None:
        return self.lock_knob.get()

    @property
    def lock_mode(self) -> str:
        return self.lock_mode_knob.get()

    @property
    def profiles(self) -> tuple[Path, ...]:
        return self.profiles_knob.get()

    def all(self) -> list[Knob[Any]]:
        return [self.home_knob, self.strict_knob, self.plugins_knob, self.disable_knob,
                self.daemon_knob, self.daemon_timeout_knob, self.check_knob, self.lock_knob,
                self.lock_mode_knob, self.profiles_knob]


knobs = _Knobs()


def select_override_var(op: str) -> str:
    """The name of the per-op override variable: ``KREG_SELECT_SPARSE_PREFILL``."""
    return "KREG_SELECT_" + op.upper()


def require_var(op: str) -> str:
    """The name of the per-op contract variable: ``KREG_REQUIRE_SPARSE_PREFILL``."""
    return "KREG_REQUIRE_" + op.upper()


def required_from_env(op: str) -> frozenset[str]:
    """``KREG_REQUIRE_<OP>=deterministic,batch_invariant``: the guarantees every implementation
    of ``op`` must declare (registry/_contract.py); unset or empty requires none. An unknown name
    is a ConfigError naming the variable and the known guarantees."""
    from registry._contract import parse_guarantees

    name = require_var(op)
    return parse_guarantees(os.environ.get(name, ""), name)


#: KREG_* variables read outside the knobs: by kreg's tests and probes, never by the library.
OTHER_VARIABLES = {
    "KREG_FUZZ_EXAMPLES": "examples per hypothesis fuzz test (tests/unit)",
    "KREG_SP_EXTRA_GEOMETRIES": "extra sparse_prefill geometries the kernel tests check",
}


def known_variables(ops: Iterable[str]) -> set[str]:
    """Every KREG_* name kreg reads, with the override variables of ``ops``."""
    return ({k.name for k in knobs.all()} | set(OTHER_VARIABLES)
            | {select_override_var(op) for op in ops} | {require_var(op) for op in ops})


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_unknown_settings(ops: Iterable[str], environ: dict[str, str] | None = None) -> list[str]:
    """Log one warning per unknown ``KREG_*`` variable (once per process), naming the closest
    known one; returns the names warned about now."""
    env = os.environ if environ is None else environ
    unknown = [n for n in env if n.startswith("KREG_")]
    if not unknown:
        return []
    known = known_variables(ops)
    out = []
    for name in sorted(unknown):
        if name in known:
            continue
        with _warned_lock:
            if name in _warned:
                continue
            _warned.add(name)
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        if close:
            hint = f"did you mean {close[0]}?"
        elif name.startswith("KREG_SELECT_"):
            hint = ("no loaded op has this override variable; loaded ops: "
                    + (", ".join(sorted(ops)) or "(none)"))
        else:
            hint = "known: " + ", ".join(sorted(k.name for k in knobs.all()))
        logger.warning("unknown setting %s=%r is ignored; %s", name, env[name][:60], hint)
        out.append(name)
    return out
