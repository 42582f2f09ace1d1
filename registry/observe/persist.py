"""Check-mode counters persisted to ``$KREG_HOME/stats.json`` (what ``kreg stats`` reads).

One entry per process id, written at most once a second while counters change and once at
exit; the file keeps the most recently updated processes.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

from registry._knobs import knobs
from registry.observe.counters import stats
from registry.observe.records import Stats
from registry.observe.state import _state

__all__ = ["clear_persisted", "read_persisted", "stats_path"]

logger = logging.getLogger("registry.observe")

STATS_FILENAME = "stats.json"
STATS_SCHEMA_VERSION = 1
PERSIST_INTERVAL_S = 1.0
MAX_PERSISTED_PROCESSES = 64  # the file keeps the most recently updated processes


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
