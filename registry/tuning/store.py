"""The tuning store: configs that ``kreg tune`` measured, kept per exact device and software.

One JSON document per store, ``$KREG_HOME/tuning.json``::

    {"schema_version": 1, "checksum": "<sha256 hex>", "entries": [<TuningEntry>, ...]}

``checksum`` is the sha256 of the canonical JSON of ``entries`` (sorted keys, no whitespace,
UTF-8, no NaN). The writer puts one entry per line, sorted by key, so files diff cleanly; a reader
accepts any layout. An exported table
(:meth:`TuningStore.export_table`) is the same document, which is what lets a vendor plugin ship
one and read it back with :func:`load_table`.

Writers take ``tuning.json.lock`` (a :mod:`filelock`), read the current file, change it, write a
temporary file in the same directory, fsync it, ``os.replace`` it over the store and fsync the
directory. Readers take no lock: a reader sees the old file or the new one, never a mix.

A file that fails validation (bad JSON, bad checksum, an unknown older schema version, missing
or malformed fields) is never trusted and never overwritten: it is renamed to
``tuning.json.corrupt-<UTC timestamp>-<pid>`` with a warning naming both paths, lookups see an
empty store, and the next write starts a fresh file. When it cannot be renamed (a read-only
``KREG_HOME``), :class:`~registry.errors.StoreError` says it is corrupt and what to do. A file that
cannot be *read* at all (permissions, a directory, a FIFO or a device in the way: only regular
files are opened, so a FIFO never hangs a reader) is an environment problem, not corruption:
that raises :class:`~registry.errors.StoreError` and leaves everything in place.

A store written by a newer kreg (a larger ``schema_version``) is not corrupt: it is never set
aside and never written; every read raises :class:`~registry.errors.StoreError` saying which
schema version (and, when the file says so, which kreg) wrote it, so nothing is served from it.

Writers remove the ``.tuning.json.*.tmp`` files that killed writers left behind (with the lock
held, so no live writer's file is touched). Every :meth:`TuningStore.load` notes the identity of
what it served (a digest of the entries) with the registry being built, if any, so that the
registry's ``plugin_fingerprint()`` covers the store the ``measured`` plugin read.

An entry holds the exact device identity and software it was measured with. :meth:`lookup` serves
only entries that match the running ones and returns the others as :class:`Mismatch` with every
reason ("measured with triton 3.6.0, running 3.7.1") for ``explain`` to show.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import filelock
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from registry._knobs import knobs
from registry._registry import note_build_state
from registry.errors import StoreError

if TYPE_CHECKING:
    from registry._facts import DeviceFacts

__all__ = [
    "SCHEMA_VERSION",
    "DeviceIdentity",
    "Mismatch",
    "Software",
    "TuningEntry",
    "TuningStore",
    "identity_of",
    "load_table",
    "store_identity",
    "utc_now",
]

logger = logging.getLogger(__name__)

#: Version of the on-disk document. A file with a larger one was written by a newer kreg and is
#: left alone (never served, written or set aside); any other version is set aside as corrupt.
SCHEMA_VERSION = 1

STORE_FILENAME = "tuning.json"
_DEFAULT_LOCK_TIMEOUT_S = 60.0
_FILE_MODE = 0o644


def utc_now() -> str:
    """The current time as ISO 8601 UTC with an explicit offset, the form ``measured_at`` takes."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------
# models


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DeviceIdentity(_Frozen):
    """The exact device a measurement holds for: a tuned config is not moved between devices."""

    name: str = Field(min_length=1)
    arch: str = Field(min_length=1)
    sm_count: int = Field(ge=0)


class Software(_Frozen):
    """The software versions a measurement holds for; ``None`` means not installed."""

    torch: str | None
    triton: str | None
    runtime: str | None


def identity_of(facts: DeviceFacts) -> tuple[DeviceIdentity, Software]:
    """The device and software a tuning entry measured on ``facts`` is keyed by."""
    return (DeviceIdentity(name=facts.name, arch=facts.arch, sm_count=facts.sm_count),
            Software(torch=facts.torch_version, triton=facts.triton_version,
                     runtime=facts.runtime_version))


class TuningEntry(_Frozen):
    """One measured winner for a workload bucket, with every candidate's time.

    ``bucket`` holds the workload fields that identify the bucket; its key order does not matter.
    """

    op: str = Field(min_length=1)
    family: str = Field(min_length=1)
    device: DeviceIdentity
    software: Software
    bucket: dict[str, int | str | float]
    config: dict[str, int | str]
    timings_ms: dict[str, float]
    command: str
    measured_at: str = Field(default_factory=utc_now)

    @field_validator("timings_ms")
    @classmethod
    def _finite_timings(cls, value: dict[str, float]) -> dict[str, float]:
        # JSON has no inf/NaN; a candidate that failed to run is left out, not timed as inf.
        bad = {label: ms for label, ms in value.items() if not (math.isfinite(ms) and ms >= 0)}
        if bad:
            raise ValueError(f"timings must be finite and >= 0 ms, got {bad}; "
                             "leave out candidates that failed")
        return value

    @field_validator("bucket")
    @classmethod
    def _finite_bucket(cls, value: dict[str, int | str | float]) -> dict[str, int | str | float]:
        bad = {k: v for k, v in value.items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:
            raise ValueError(f"bucket values must be finite, got {bad}")
        return value

    @field_validator("measured_at")
    @classmethod
    def _utc_iso(cls, value: str) -> str:
        try:
            # Python 3.10's fromisoformat does not read a "Z" suffix.
            when = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
        except ValueError:
            raise ValueError(f"measured_at {value!r} is not ISO 8601; use "
                             f"registry.tuning.utc_now()") from None
        if when.utcoffset() != timedelta(0):
            raise ValueError(f"measured_at {value!r} is not UTC; give it a +00:00 or Z offset")
        return value

    def key(self) -> str:
        """Stable identity of the entry: op, family, device, software and bucket (not the result).

        Two entries with the same key are the same measurement slot; :meth:`TuningStore.put`
        keeps the newer one.
        """
        return _canonical([self.op, self.family, self.device.model_dump(),
                           self.software.model_dump(), self.bucket])


class Mismatch(NamedTuple):
    """A stored entry of the looked-up op that does not apply here, and why (all reasons)."""

    entry: TuningEntry
    reason: str


# --------------------------------------------------------------------------------------------
# document format
#
# The writer lays the document out as one header line, one canonical entry per line (sorted by
# key) and a closing line, so that the entries array in the file *is* the canonical JSON the
# checksum covers. That lets a reader verify the checksum over the text and reuse entries it has
# already validated (the memo) instead of re-parsing and re-validating the whole file on every
# read-modify-write, which would make a tuning sweep quadratic. Any other layout (a table a vendor
# wrote by other means, or a damaged file) takes the full path, which is the authority on what
# is valid and says what is wrong.

# key -> (canonical JSON of the entry, entry)
_Doc = dict[str, tuple[str, TuningEntry]]
# canonical JSON of an entry -> (key, entry)
_Memo = Mapping[str, tuple[str, TuningEntry]]

_HEADER = re.compile(r'\{"schema_version": (\d+), "checksum": "([0-9a-f]{64})", "entries": \[\Z')
_FOOTER = "]}"


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _checksum_of_lines(lines: Iterable[str]) -> str:
    # Equal to sha256(_canonical(entries)): a compact JSON list is "[" + ",".join(items) + "]".
    return hashlib.sha256(("[" + ",".join(lines) + "]").encode("utf-8")).hexdigest()


class _Invalid(Exception):
    """The bytes are not a valid tuning document; the message says which rule they break."""


class _Newer(Exception):
    """The document was written by a newer kreg (a larger schema version): not corrupt."""

    def __init__(self, version: int, writer: str | None) -> None:
        by = f"kreg {writer}" if writer else "a newer kreg"
        super().__init__(f"schema version {version}, written by {by}; this kreg reads version "
                         f"{SCHEMA_VERSION}")
        self.version, self.writer = version, writer


def _parse_document(raw: bytes, memo: _Memo | None = None) -> _Doc:
    """The entries of a tuning document by key, in file order; raises :class:`_Invalid`."""
    doc = _parse_own_layout(raw, memo or {})
    return doc if doc is not None else _parse_any_layout(raw)


def _parse_own_layout(raw: bytes, memo: _Memo) -> _Doc | None:
    """Fast path for a document in the writer's layout; None means "take the full path"."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = text.split("\n")  # not splitlines(): JSON strings may hold U+2028 unescaped
    if len(lines) < 3 or lines[-1] != "" or lines[-2] != _FOOTER:
        return None
    header = _HEADER.match(lines[0])
    if header is None or int(header.group(1)) != SCHEMA_VERSION:
        return None
    body = lines[1:-2]
    if any(not line.endswith(",") for line in body[:-1]) or (body and body[-1].endswith(",")):
        return None
    body = [line[:-1] for line in body[:-1]] + body[-1:]
    if _checksum_of_lines(body) != header.group(2):
        return None
    doc: _Doc = {}
    for line in body:
        known = memo.get(line)
        if known is None:
            known = _entry_from_canonical(line)
            if known is None:
                return None
        key, entry = known
        if key in doc:
            return None
        doc[key] = (line, entry)
    return doc


def _entry_from_canonical(line: str) -> tuple[str, TuningEntry] | None:
    try:
        data = json.loads(line)
        if _canonical(data) != line:
            return None
        entry = TuningEntry.model_validate(data)
    except (ValueError, RecursionError):  # JSONDecodeError and ValidationError are ValueErrors
        return None
    return entry.key(), entry


def _parse_any_layout(raw: bytes) -> _Doc:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _Invalid(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _Invalid(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}; "
                       "truncated?)") from None
    except RecursionError:
        raise _Invalid("not valid JSON (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise _Invalid(f"top level is a JSON {type(doc).__name__}, expected an object")
    version = doc.get("schema_version")
    if type(version) is int and version > SCHEMA_VERSION:
        # A newer format may differ in anything else: nothing more is checked.
        writer = doc.get("written_by", doc.get("kreg_version"))
        raise _Newer(version, str(writer)[:60] if writer is not None else None)
    missing = [k for k in ("schema_version", "checksum", "entries") if k not in doc]
    if missing:
        raise _Invalid(f"missing field(s) {', '.join(missing)}")
    version = doc["schema_version"]
    if type(version) is not int or version != SCHEMA_VERSION:
        raise _Invalid(f"schema version {version!r}, this kreg reads version {SCHEMA_VERSION}")
    raw_entries = doc["entries"]
    if not isinstance(raw_entries, list):
        raise _Invalid(f"'entries' is a JSON {type(raw_entries).__name__}, expected a list")
    try:
        lines = [_canonical(item) for item in raw_entries]
    except ValueError as exc:  # NaN/inf, which Python's json reads as an extension
        raise _Invalid(f"entries are not strict JSON ({exc})") from None
    actual = _checksum_of_lines(lines)
    if doc["checksum"] != actual:
        raise _Invalid(f"checksum mismatch (file says {doc['checksum']!r}, "
                       f"entries hash to {actual!r}); the file was edited or damaged")
    result: _Doc = {}
    index: dict[str, int] = {}
    for i, (item, line) in enumerate(zip(raw_entries, lines, strict=True)):
        try:
            entry = TuningEntry.model_validate(item)
        except ValidationError as exc:
            raise _Invalid(f"entry {i} is malformed: {_short_errors(exc)}") from None
        key = entry.key()
        if key in result:
            raise _Invalid(f"entries {index[key]} and {i} have the same key")
        index[key] = i
        result[key] = (line, entry)
    return result


def _short_errors(exc: ValidationError) -> str:
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '<entry>'}: {e['msg']}"
             for e in exc.errors()[:3]]
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _render_document(doc: _Doc) -> bytes:
    lines = [doc[key][0] for key in sorted(doc)]
    header = (f'{{"schema_version": {SCHEMA_VERSION}, "checksum": "{_checksum_of_lines(lines)}", '
              '"entries": [')
    return "\n".join([header, *([",\n".join(lines)] if lines else []), _FOOTER, ""]).encode()


def _as_doc(entries: Iterable[TuningEntry]) -> _Doc:
    """Entries keyed for a document; a later entry with the same key replaces an earlier one."""
    return {e.key(): (_canonical(e.model_dump(mode="json")), e) for e in entries}


def _memo_of(doc: _Doc) -> dict[str, tuple[str, TuningEntry]]:
    return {line: (key, entry) for key, (line, entry) in doc.items()}


def _identity(doc: _Doc) -> str:
    """A digest of the entries (not of the file's layout): equal entries, equal identity."""
    return _checksum_of_lines(doc[key][0] for key in sorted(doc))[:16]


_EMPTY_IDENTITY = _identity({})


# --------------------------------------------------------------------------------------------
# file system helpers (every OSError leaves as StoreError naming the path and the fix)


def _os_error(action: str, path: Path, exc: OSError, fix: str) -> StoreError:
    reason = exc.strerror or str(exc)
    return StoreError(f"Cannot {action} {path}: {reason} ({type(exc).__name__}); {fix}")


def _fix_for(path: Path) -> str:
    return f"make {path.parent} a readable and writable directory, or set KREG_HOME to one"


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO (named pipe)"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def _read_bytes(path: Path, what: str = "tuning file",
                fix: str | None = None) -> bytes | None:
    """The file's bytes, or None when it does not exist. Only a regular file is read: it is
    opened without blocking and checked first, so a FIFO in its place never hangs the reader."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _os_error(f"read {what}", path, exc, fix or _fix_for(path)) from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StoreError(
                f"Cannot read {what} {path}: it is a {_kind_of(mode)}, not a regular file; "
                + (fix or f"remove it (kreg writes {path.name} itself) or set KREG_HOME to "
                          f"another directory"))
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read()
    except OSError as exc:
        raise _os_error(f"read {what}", path, exc, fix or _fix_for(path)) from exc
    finally:
        if fd >= 0:
            os.close(fd)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; without it a crash can bring the old name back.
    if os.name == "nt":  # Windows cannot open a directory for fsync; os.replace is enough there.
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old bytes or the new, never a mix."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = _FILE_MODE
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _os_error("write", path, exc, _fix_for(path)) from exc
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _os_error("write", path, exc, _fix_for(path)) from exc


def _corrupt_name(path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    return path.with_name(f"{path.name}.corrupt-{stamp}-{os.getpid()}")


# --------------------------------------------------------------------------------------------
# the store


class TuningStore:
    """Measured tuning entries in one JSON file; safe across threads and processes.

    ``path`` defaults to ``$KREG_HOME/tuning.json``, resolved when the store is created.
    """

    def __init__(self, path: Path | None = None, *, lock_timeout: float = _DEFAULT_LOCK_TIMEOUT_S):
        self.path: Path = Path(path) if path is not None else knobs.home / STORE_FILENAME
        self.lock_path: Path = self.path.with_name(self.path.name + ".lock")
        self.lock_timeout = lock_timeout
        self._lock = filelock.FileLock(self.lock_path, timeout=lock_timeout)
        # The last good read or write: its fingerprint, entries and memo. load() runs on every
        # selection that consults the store; parsing and validating are the expensive parts.
        # Replaced as a whole (one assignment), so threads sharing a store see a consistent one.
        # With the identity of those entries (what load() notes for plugin_fingerprint()).
        self._last: tuple[str, _Doc, _Memo, str] = ("", {}, {}, _EMPTY_IDENTITY)

    def __repr__(self) -> str:
        return f"TuningStore({str(self.path)!r})"

    # -- reading -------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """A cheap token that changes whenever the file is replaced: ``mtime_ns-size-inode``.

        ``"missing"`` when there is no file. Every write replaces the file, so it changes inode.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            raise _os_error("stat tuning file", self.path, exc, _fix_for(self.path)) from exc
        return f"{st.st_mtime_ns}-{st.st_size}-{st.st_ino}"

    def load(self) -> list[TuningEntry]:
        """Every entry in the store; ``[]`` when there is no file or it was corrupt (set aside).

        Raises StoreError when the file cannot be read, is not a regular file, was written by a
        newer kreg, or is corrupt and cannot be set aside (a read-only directory)."""
        try:
            doc, ident = self._load_doc()
        except StoreError as exc:
            note_build_state("tuning", f"unusable ({type(exc).__name__})")
            raise
        # By content, not path: a daemon and a client with equal stores in two homes agree.
        note_build_state("tuning", ident)
        return [entry for _, entry in doc.values()]

    def identity(self) -> str:
        """A digest of the entries :meth:`load` serves now (what ``plugin_fingerprint()``
        covers), or ``unusable (...)`` when it raises."""
        try:
            return self._load_doc()[1]
        except StoreError as exc:
            return f"unusable ({type(exc).__name__})"

    def _load_doc(self) -> tuple[_Doc, str]:
        """The entries by key and their identity."""
        fp = self.fingerprint()
        last_fp, last_doc, memo, ident = self._last
        if fp == last_fp:
            return last_doc, ident
        raw = _read_bytes(self.path)
        if raw is None:
            return {}, _EMPTY_IDENTITY
        try:
            doc = _parse_document(raw, memo)
        except _Newer as newer:
            raise self._newer_error(newer) from None
        except _Invalid as problem:
            # Re-check under the lock: a writer may have set it aside and started afresh since.
            try:
                with self._locked():
                    doc = self._read_locked()
                    return doc, self._last[3] if doc else _EMPTY_IDENTITY
            except _Unlockable as exc:
                raise StoreError(
                    f"tuning store {self.path} is corrupt ({problem}) and cannot be set aside "
                    f"here ({exc.reason}); nothing is served from it. Fix: move or delete it by "
                    f"hand, or make {self.path.parent} writable (the next kreg that reads it "
                    f"then moves it aside to tuning.json.corrupt-*)") from None
        # fp was taken before the read, so at worst a newer file is remembered under an
        # older fingerprint, which costs one extra parse later.
        return doc, self._remember(fp, doc)

    def _remember(self, fp: str, doc: _Doc) -> str:
        ident = _identity(doc)
        self._last = (fp, doc, _memo_of(doc), ident)
        return ident

    def _newer_error(self, newer: _Newer) -> StoreError:
        return StoreError(
            f"tuning store {self.path} has {newer}: kreg neither serves nor changes it (it is not "
            f"corrupt). Upgrade kreg to use it, or set KREG_HOME to another directory for this "
            f"version")

    def lookup(self, op: str, device: DeviceIdentity, software: Software
               ) -> tuple[list[TuningEntry], list[Mismatch]]:
        """Entries of ``op`` measured on exactly this device and software, and the others of
        ``op`` with every reason they do not apply."""
        matches: list[TuningEntry] = []
        mismatches: list[Mismatch] = []
        for entry in self.load():
            if entry.op != op:
                continue
            reasons = _mismatch_reasons(entry, device, software)
            if reasons:
                mismatches.append(Mismatch(entry, "; ".join(reasons)))
            else:
                matches.append(entry)
        return matches, mismatches

    # -- writing -------------------------------------------------------------------------------

    def put(self, entries: Iterable[TuningEntry]) -> None:
        """Insert or replace (by :meth:`TuningEntry.key`) the entries, in one locked write."""
        new = list(entries)
        for e in new:
            if not isinstance(e, TuningEntry):
                raise TypeError(
                    f"TuningStore.put takes TuningEntry objects, got {type(e).__name__}")
        if not new:
            return
        with self._locked():
            doc = self._read_locked()
            doc.update(_as_doc(new))
            self._write_locked(doc)

    def remove(self, predicate: Callable[[TuningEntry], bool]) -> int:
        """Remove the entries for which ``predicate`` is true; returns how many were removed."""
        with self._locked():
            doc = self._read_locked()
            keep = {key: item for key, item in doc.items() if not predicate(item[1])}
            removed = len(doc) - len(keep)
            if removed:
                self._write_locked(keep)
        return removed

    def clear(self) -> int:
        """Remove every entry; returns how many there were."""
        return self.remove(lambda _e: True)

    def ensure_writable(self) -> None:
        """Raise StoreError now, naming the path and the fix, when this store could not be
        written (a KREG_HOME that is a file, read-only, ...); ``kreg tune`` asks before it
        measures. Reads the file too: a newer kreg's store is refused the same way."""
        with self._locked():
            self._read_locked()
            if not os.access(self.path.parent, os.W_OK):
                raise StoreError(f"Cannot write tuning store {self.path}: {self.path.parent} is "
                                 f"not writable; {_fix_for(self.path)}")

    # -- tables --------------------------------------------------------------------------------

    def export_table(self, dest: Path, *, op: str | None = None) -> int:
        """Write the entries (of ``op``, or all) to ``dest`` as a table a plugin can ship.

        Returns the number of entries written. The table has the store's format and checksum.
        """
        doc = _as_doc(e for e in self.load() if op is None or e.op == op)
        _atomic_write(Path(dest), _render_document(doc))
        return len(doc)

    def import_table(self, src: Path) -> int:
        """Merge the entries of the table at ``src`` into the store (upsert); returns the count.

        The whole table is validated first: a bad one raises :class:`StoreError` naming the file
        and the problem, and the store is not touched.
        """
        entries = load_table(src)
        self.put(entries)
        return len(entries)

    # -- internals -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _Unlockable(_os_error("create the store directory for", self.path, exc,
                                        _fix_for(self.path)), exc) from exc
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise StoreError(
                f"Cannot lock tuning store {self.path}: {self.lock_path} stayed locked for "
                f"{self.lock_timeout:g} s; another kreg process is writing it. Wait for it, or "
                "stop it if it hangs (the lock is released when its holder exits)") from None
        except OSError as exc:
            raise _Unlockable(_os_error("lock tuning store", self.lock_path, exc,
                                        _fix_for(self.path)), exc) from exc
        try:
            yield
        finally:
            self._lock.release()

    def _read_locked(self) -> _Doc:
        """Read the file with the lock held, setting it aside if it is corrupt.

        Always reads the file, never the remembered copy: another process may have written. The
        result is a fresh dict the caller may change. A newer kreg's store raises StoreError.
        """
        raw = _read_bytes(self.path)
        if raw is None:
            return {}
        try:
            doc = _parse_document(raw, self._last[2])
        except _Newer as newer:
            raise self._newer_error(newer) from None
        except _Invalid as problem:
            self._quarantine(str(problem))
            return {}
        # With the lock held nobody can replace the file, so this fingerprint belongs to doc.
        self._remember(self.fingerprint(), doc)
        return dict(doc)

    def _write_locked(self, doc: _Doc) -> None:
        self._remove_stale_temporaries()
        _atomic_write(self.path, _render_document(doc))
        self._remember(self.fingerprint(), doc)

    def _remove_stale_temporaries(self) -> None:
        """Delete what killed writers left (``.tuning.json.*.tmp``); the lock is held, so every
        live writer of this store is us."""
        try:
            stale = list(self.path.parent.glob(f".{self.path.name}.*.tmp"))
        except OSError:
            return
        for tmp in stale:
            with contextlib.suppress(OSError):
                tmp.unlink()
                logger.info("removed %s, left by an interrupted write of %s", tmp, self.path)

    def _quarantine(self, problem: str) -> None:
        aside = _corrupt_name(self.path)
        try:
            # A same-directory rename keeps the original bytes exactly; if it fails we raise,
            # so a corrupt file is never overwritten by the write that follows.
            os.rename(self.path, aside)
            _fsync_dir(self.path.parent)
        except OSError as exc:
            raise _os_error(
                "set aside corrupt tuning file", self.path, exc,
                f"it is corrupt ({problem}); move or delete it by hand") from exc
        self._last = ("", {}, {}, _EMPTY_IDENTITY)
        logger.warning("tuning store %s is corrupt (%s); moved it aside to %s and ignored it; "
                       "the next write starts a fresh store", self.path, problem, aside)


class _Unlockable(StoreError):
    """The store's directory or lock file cannot be created or opened (read-only KREG_HOME)."""

    def __init__(self, error: StoreError, cause: OSError) -> None:
        super().__init__(str(error))
        self.reason = f"{cause.strerror or cause} ({type(cause).__name__})"


def store_identity(path: Path | None = None) -> str:
    """The identity :meth:`TuningStore.load` of ``path`` (default: ``$KREG_HOME/tuning.json``)
    would note now: what a daemon compares to decide whether its registry is stale."""
    return TuningStore(path).identity()


def _mismatch_reasons(entry: TuningEntry, device: DeviceIdentity, software: Software) -> list[str]:
    reasons: list[str] = []
    have = entry.device
    if have.name != device.name:
        reasons.append(f"measured on {have.name!r}, running on {device.name!r}")
    if have.arch != device.arch:
        reasons.append(f"measured on arch {have.arch}, running {device.arch}")
    if have.sm_count != device.sm_count:
        reasons.append(f"measured with sm_count {have.sm_count}, running {device.sm_count}")
    for name in ("torch", "triton", "runtime"):
        was, now = getattr(entry.software, name), getattr(software, name)
        if was != now:
            measured = f"with {name} {was}" if was is not None else f"without {name}"
            running = f"running {now}" if now is not None else f"running without {name}"
            reasons.append(f"measured {measured}, {running}")
    return reasons


def load_table(path: Path) -> list[TuningEntry]:
    """The entries of a table written by :meth:`TuningStore.export_table` (or a store file).

    For vendor plugins that ship measured tables. A bad table raises :class:`StoreError` naming
    the file and the problem; nothing is set aside, since the file is not the user's store.
    """
    path = Path(path)
    raw = _read_bytes(path, "tuning table", "check the path and that it is a readable file")
    if raw is None:
        raise StoreError(f"Cannot read tuning table {path}: it does not exist; check the path")
    try:
        return [entry for _, entry in _parse_document(raw).values()]
    except _Newer as newer:
        raise StoreError(f"Tuning table {path} has {newer}; upgrade kreg to import it") from None
    except _Invalid as problem:
        raise StoreError(f"Tuning table {path} is invalid: {problem}; re-export it from a store "
                         "(TuningStore.export_table) instead of editing it by hand") from None
