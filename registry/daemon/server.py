"""The dispatch daemon: one node-local service that shares decisions between processes.

``kreg daemon start`` (or ``python -m registry.daemon.server --socket PATH``) serves the protocol of
:mod:`registry.daemon.client` on a Unix socket. It needs no GPU and never imports torch or
Triton: clients send their DeviceFacts, and the daemon decides with
``Registry.decide_local`` on its own plugin set.

Shared cache. A decision is keyed by (facts fingerprint, op, workload key, override value,
plugin-set fingerprint); the first asker's decision is every later asker's, because the event
loop decides a miss before it reads the next request. A client whose plugin set differs is
refused (``plugin_mismatch``): it could be handed an implementation it does not have. In front
of that cache an alias table maps the request's raw text (facts JSON, canonical workload JSON) to
the entry, so a hit parses no pydantic model.

Safety. The socket is 0600 in a 0700 directory and every connection's peer uid is checked
(SO_PEERCRED): another user's process is answered ``forbidden`` and disconnected; clients check
the daemon's uid the same way (it must be theirs, or root's: :mod:`registry.daemon.client`).
One daemon per socket: it holds ``<socket>.lock`` (a filelock) for its lifetime and writes its
pid to ``<socket>.pid``, created afresh with O_EXCL|O_NOFOLLOW (a symbolic link planted in its
place is refused, never followed); a second one exits with a message naming the first. A socket
left by a crash is removed at start (the lock proves nobody serves it).

Freshness. The plugin-set fingerprint clients must match covers the tuning store the daemon's
registry read (``Registry.plugin_fingerprint``). Once a second the daemon looks at the store
file; when its entries changed (``kreg tune``, ``kreg tuning import``) it rebuilds its registry
and drops its cache, so it never serves decisions of an older store: clients started since
agree with it again, older clients (whose registries read the older store) get
``plugin_mismatch`` and select in-process until ``registry.reset_registry()`` or a restart.

Logging. A request that crashes the daemon's own code costs that request only (``internal``);
its traceback is logged for the first few of each kind, then one line each. Started by
``kreg daemon start``, the daemon rotates its log (``--log``) past :data:`LOG_MAX_BYTES`,
keeping :data:`LOG_FILES` files.

Robustness. asyncio protocol callbacks, no blocking reads: a frame longer than
:data:`MAX_REQUEST` is answered ``too_large`` and the connection closed; bad JSON, a non-object,
an unknown version or type get an error reply; a frame not completed within ``read_timeout`` or
a connection idle for ``idle_timeout`` is closed; a client that does not read its replies is
paused (asyncio flow control), so memory per connection stays bounded. Connections beyond
``max_connections`` are answered ``busy``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import stat
import struct
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import filelock

from registry.daemon.journal import DEFAULT_FILES, DEFAULT_MAX_BYTES, Journal
from registry.daemon.protocol import (
    HEADER,
    MAX_REQUEST,
    PROTOCOL_VERSION,
    decode_frame,
    encode_frame,
    resolve_socket,
)
from registry.errors import DaemonError, KregError

__all__ = ["AlreadyRunningError", "Daemon", "journal_path_for", "lock_path", "pid_path", "serve"]

logger = logging.getLogger("registry.daemon")

# Memory at the cap: a sparse_prefill decision is ~6 KiB of JSON (every candidate's verdicts),
# and each cache entry also holds its alias key and fields: 16,384 distinct decisions measured
# 185 MiB RSS, 37 MiB before filling (~9 KiB each; 2026-12, CPython 3.11; issue #24 measured
# 195 MiB), not the ~60 MiB this note used to say.
CACHE_SIZE = 16384
RECENT_SIZE = 10000
EXPLAIN_LIMIT = 10000
_TRUE, _FALSE = b"true", b"false"
#: Tracebacks of internal errors logged per exception type before they shrink to one line.
TRACEBACKS_PER_KIND = 3
#: The log of a daemon started by ``kreg daemon start`` rotates past this size ...
LOG_MAX_BYTES = 4 * 1024 * 1024
#: ... keeping this many files (``daemon.log``, ``daemon.log.1``).
LOG_FILES = 2
#: Seconds between looks at the tuning store.
STORE_CHECK_S = 1.0


class AlreadyRunningError(DaemonError):
    """Another daemon holds this socket's lock."""


def lock_path(sock: Path) -> Path:
    return sock.with_name(sock.name + ".lock")


def pid_path(sock: Path) -> Path:
    return sock.with_name(sock.name + ".pid")


def journal_path_for(sock: Path) -> Path:
    """The journal of the daemon on ``sock``: ``$KREG_HOME/journal/decisions-<hash>.jsonl``.

    Per socket, so two daemons of one user (e.g. tests) never interleave their journals."""
    from registry._knobs import knobs

    digest = hashlib.sha256(str(Path(sock).absolute()).encode()).hexdigest()[:10]
    return knobs.home / "journal" / f"decisions-{digest}.jsonl"


def read_pid(sock: Path) -> int | None:
    try:
        return int(pid_path(sock).read_text().strip())
    except (OSError, ValueError):
        return None


def rss_bytes() -> int:
    """Current resident set size (Linux /proc), else the peak from getrusage."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@dataclass(frozen=True)
class _Entry:
    """A cached decision, ready to send, plus what the journal and explain need."""

    json: bytes
    first_pid: int
    op: str
    implementation: str
    config: dict[str, Any] | None
    reason: str
    workload: str
    device: str
    # The journal line's fields after t, pid and hit, serialized once per decision.
    journal_tail: str = ""

    def record(self, t: float, pid: int, hit: bool) -> dict[str, Any]:
        return {"t": t, "pid": pid, "op": self.op, "implementation": self.implementation,
                "config": self.config, "reason": self.reason, "workload": self.workload,
                "device": self.device, "hit": hit}


class _Reject(Exception):
    def __init__(self, code: str, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.code, self.message, self.close = code, message, close


def _error_frame(rid: Any, code: str, message: str) -> bytes:
    return encode_frame({"v": PROTOCOL_VERSION, "id": rid, "ok": False,
                         "error": {"code": code, "message": message}})


class _Connection(asyncio.Protocol):
    __slots__ = ("buf", "daemon", "last_active", "partial_since", "peer_pid", "transport")

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.peer_pid = -1
        self.last_active = time.monotonic()
        self.partial_since: float | None = None

    # -- asyncio callbacks ---------------------------------------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, base)
        self.transport = transport
        d = self.daemon
        d.connections_total += 1
        pid, uid = _peer(transport)
        self.peer_pid = pid
        if uid is not None and uid != d.uid:
            d.count_error("forbidden")
            logger.warning("refused a connection from pid %s of uid %s (this daemon serves "
                           "uid %s only)", pid, uid, d.uid)
            transport.write(_error_frame(None, "forbidden",
                                         f"uid {uid} may not use the kreg daemon of uid {d.uid}; "
                                         f"start your own with `kreg daemon start`"))
            transport.close()
            return
        if len(d.conns) >= d.max_connections:
            d.count_error("busy")
            transport.write(_error_frame(None, "busy", f"the daemon serves at most "
                                                       f"{d.max_connections} connections"))
            transport.close()
            return
        d.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.daemon.conns.discard(self)
        self.buf = bytearray()

    def pause_writing(self) -> None:
        # The client does not read its replies: stop reading its requests until it does.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False  # close our side too; a half-sent frame is dropped

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        now = time.monotonic()
        self.last_active = now
        buf = self.buf
        buf += data
        d = self.daemon
        while len(buf) >= 4:
            (n,) = HEADER.unpack_from(buf)
            if n > MAX_REQUEST:
                d.count_error("too_large")
                transport.write(_error_frame(None, "too_large", f"a request frame may hold at "
                                             f"most {MAX_REQUEST} bytes; this one announced {n}"))
                transport.close()
                self.buf = bytearray()
                return
            end = 4 + n
            if len(buf) < end:
                break
            body = bytes(buf[4:end])
            del buf[:end]
            reply, close = d.handle(body, self.peer_pid)
            transport.write(reply)
            if close:
                transport.close()
                self.buf = bytearray()
                return
        # A frame has started but not finished: its deadline runs from its first byte.
        if buf:
            if self.partial_since is None:
                self.partial_since = now
        else:
            self.partial_since = None


def _peer(transport: asyncio.BaseTransport) -> tuple[int, int | None]:
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return -1, None  # platforms without SO_PEERCRED rely on the socket's 0600 mode
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return -1, None
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


class Daemon:
    """The server state. :meth:`run` serves until a shutdown request or SIGTERM/SIGINT."""

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *,
                 journal_path: Path | None = None, read_timeout: float = 2.0,
                 idle_timeout: float = 600.0, max_connections: int = 1024,
                 cache_size: int = CACHE_SIZE, journal_max_bytes: int = DEFAULT_MAX_BYTES,
                 journal_files: int = DEFAULT_FILES, log_path: Path | None = None,
                 log_max_bytes: int = LOG_MAX_BYTES) -> None:
        from registry._default import get_registry

        self.path = resolve_socket(socket_path)
        self.journal_path = journal_path or journal_path_for(self.path)
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.cache_size = cache_size
        self.journal_max_bytes = journal_max_bytes
        self.journal_files = journal_files
        self.uid = os.getuid()
        self.log_path = Path(log_path) if log_path is not None else None
        self.log_max_bytes = log_max_bytes
        self.reg = get_registry()
        self.plugin_fp = self.reg.plugin_fingerprint()
        self.reloads = 0
        self.tracebacks: dict[str, int] = {}
        self._store_seen = self._store_stat()
        self._store_checked = time.monotonic()
        self.conns: set[_Connection] = set()
        self.cache: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self.aliases: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        if "tuning" in self.reg.build_state:
            from registry.tuning.store import store_identity

            if store_identity(self._store_path()) != self.reg.build_state["tuning"]:
                self.reload("the tuning store changed since the registry was built")
        self.facts: dict[str, Any] = {}
        # (time, pid, hit, entry) per answered select; expanded into records only by explain.
        self.recent: collections.deque[tuple[float, int, bool, _Entry]] = collections.deque(
            maxlen=RECENT_SIZE)
        self.journal: Journal | None = None
        self.started = time.time()
        self.requests = self.selects = self.hits = self.misses = 0
        self.connections_total = 0
        self.errors: dict[str, int] = {}
        self._stop: asyncio.Event | None = None
        self._lock: filelock.BaseFileLock | None = None

    # -- requests ------------------------------------------------------------------------------

    def count_error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def handle(self, body: bytes, peer_pid: int) -> tuple[bytes, bool]:
        """One request frame body -> (reply frame, close the connection after it)."""
        self.requests += 1
        rid: Any = None
        try:
            try:
                req = decode_frame(body)
            except (ValueError, UnicodeDecodeError) as exc:
                raise _Reject("bad_json", f"the frame is not a JSON object: "
                                          f"{type(exc).__name__}: {str(exc)[:200]}") from None
            rid = req.get("id")
            if not isinstance(rid, int) or isinstance(rid, bool):
                rid = None
            if req.get("v") != PROTOCOL_VERSION:
                raise _Reject("unsupported_version", f"protocol version {req.get('v')!r} is not "
                              f"supported; this daemon speaks v{PROTOCOL_VERSION}")
            kind = req.get("type")
            if kind == "select":
                return self._select(req, rid, peer_pid), False
            if kind == "stats":
                return self._reply(rid, self.stats()), False
            if kind == "explain":
                return self._reply(rid, {"decisions": self._explain(req)}), False
            if kind == "shutdown":
                logger.info("shutdown requested by pid %s", peer_pid)
                if self._stop is not None:
                    asyncio.get_running_loop().call_soon(self._stop.set)
                return self._reply(rid, {"pid": os.getpid()}), False
            raise _Reject("unknown_type", f"unknown request type {kind!r}; known: select, "
                                          f"explain, stats, shutdown")
        except _Reject as rej:
            self.count_error(rej.code)
            return _error_frame(rid, rej.code, rej.message), rej.close
        except Exception as exc:  # a bug must cost one request, never the daemon
            kind = type(exc).__name__
            seen = self.tracebacks.get(kind, 0)
            self.tracebacks[kind] = seen + 1
            if seen < TRACEBACKS_PER_KIND:
                logger.exception("request failed")
            else:  # bounded: a client repeating one bad request cannot fill the log
                logger.error("request failed: %s: %s (%d so far; traceback logged %d times)",
                             kind, str(exc)[:200], seen + 1, TRACEBACKS_PER_KIND)
            self.count_error("internal")
            return _error_frame(rid, "internal", f"{kind}: {str(exc)[:500]}"), False

    @staticmethod
    def _reply(rid: Any, payload: dict[str, Any]) -> bytes:
        return encode_frame({"v": PROTOCOL_VERSION, "id": rid, "ok": True, **payload})

    def _select(self, req: dict[str, Any], rid: int | None, peer_pid: int) -> bytes:
        op, fp, wl = req.get("op"), req.get("facts_fp"), req.get("workload")
        override, plugins = req.get("override"), req.get("plugins")
        if not (isinstance(op, str) and isinstance(fp, str) and isinstance(wl, dict)
                and isinstance(plugins, str) and (override is None or isinstance(override, str))):
            raise _Reject("bad_request", "select needs op (str), facts_fp (str), workload "
                                         "(object), override (str or null), plugins (str), and "
                                         "facts (DeviceFacts JSON text) for new facts")
        self.selects += 1
        if plugins != self.plugin_fp:
            raise _Reject("plugin_mismatch",
                          f"plugin set {plugins} differs from the daemon's {self.plugin_fp}; its "
                          f"decisions could name implementations this client lacks or come "
                          f"from another tuning store (check KREG_PLUGINS, KREG_DISABLE_PLUGINS, "
                          f"registered plugins and KREG_HOME; a process that started before "
                          f"the store last changed picks it up with registry.reset_registry() "
                          f"or a restart)")
        facts_s = req.get("facts")
        if facts_s is not None:
            self._learn_facts(fp, facts_s)
        try:
            # Field order must not matter; values are JSON scalars in every op's workload.
            wl_items: Any = tuple(sorted(wl.items()))
            hash(wl_items)
        except TypeError:
            wl_items = json.dumps(wl, sort_keys=True)
        akey = (op, fp, wl_items, override)
        entry = self.aliases.get(akey)
        if entry is not None:
            hit = True
            self.aliases.move_to_end(akey)
        else:
            entry, hit = self._resolve(op, fp, wl, override, peer_pid)
            self.aliases[akey] = entry
            if len(self.aliases) > self.cache_size:
                self.aliases.popitem(last=False)
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        now = time.time()
        self.recent.append((now, peer_pid, hit, entry))
        if self.journal is not None:
            self.journal.write_line(f'{{"t":{now:.6f},"pid":{peer_pid},'
                                    f'"hit":{"true" if hit else "false"},{entry.journal_tail}}}\n')
        size = len(entry.json)
        body = b"".join((b'{"v":1,"id":', str(rid).encode() if rid is not None else b"null",
                         b',"ok":true,"hit":', _TRUE if hit else _FALSE, b',"first_pid":',
                         str(entry.first_pid).encode(), b',"attachment":', str(size).encode(),
                         b"}"))
        return b"".join((HEADER.pack(len(body)), body, HEADER.pack(size), entry.json))

    def _learn_facts(self, fp: str, facts_s: Any) -> None:
        from pydantic import ValidationError

        from registry._facts import DeviceFacts

        if fp in self.facts:
            return
        if not isinstance(facts_s, str):
            raise _Reject("bad_request", "facts must be DeviceFacts JSON text")
        try:
            facts = DeviceFacts.model_validate_json(facts_s)
        except ValidationError as exc:
            raise _Reject("bad_request", f"facts are not valid DeviceFacts: "
                                         f"{str(exc)[:300]}") from None
        if facts.fingerprint != fp:
            raise _Reject("bad_request", f"facts_fp {fp!r} is not the fingerprint of the facts "
                                         f"sent ({facts.fingerprint!r})")
        if len(self.facts) >= 1024:  # bounded: a client resends on unknown_facts
            self.facts.clear()
        self.facts[fp] = facts

    def _resolve(self, op: str, fp: str, wl: dict[str, Any], override: str | None,
                 peer_pid: int) -> tuple[_Entry, bool]:
        facts = self.facts.get(fp)
        if facts is None:
            raise _Reject("unknown_facts", f"no facts known for fingerprint {fp!r}; send them "
                                           f"in the facts field")
        try:
            workload = self.reg.workload(op, wl)
            key = (facts.fingerprint, op, workload.key(), override, self.plugin_fp)
            entry = self.cache.get(key)
            if entry is not None:
                self.cache.move_to_end(key)
                return entry, True
            decision = self.reg.decide_local(op, facts, workload, override)
        except KregError as exc:
            raise _Reject("select_failed", f"{type(exc).__name__}: {exc}") from None
        decision = decision.model_copy(update={"source": "daemon"})
        fields = {"op": op, "implementation": decision.implementation,
                  "config": decision.config, "reason": decision.reason,
                  "workload": workload.short(), "device": facts.name}
        entry = _Entry(json=decision.model_dump_json().encode(), first_pid=peer_pid,
                       journal_tail=json.dumps(fields, separators=(",", ":"), default=str)[1:-1],
                       **fields)
        self.cache[key] = entry
        if len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return entry, False

    def _explain(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        pid, op, limit = req.get("pid"), req.get("op"), req.get("limit", 200)
        if pid is not None and not isinstance(pid, int):
            raise _Reject("bad_request", "explain: pid must be an integer or null")
        if op is not None and not isinstance(op, str):
            raise _Reject("bad_request", "explain: op must be a string or null")
        if not isinstance(limit, int) or limit < 0:
            raise _Reject("bad_request", "explain: limit must be a non-negative integer")
        if not limit:
            return []
        out = [(t, p, hit, e) for t, p, hit, e in self.recent
               if (pid is None or p == pid) and (op is None or e.op == op)]
        return [e.record(round(t, 6), p, hit) for t, p, hit, e in out[-min(limit, EXPLAIN_LIMIT):]]

    def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(), "uid": self.uid, "socket": str(self.path),
            "protocol": PROTOCOL_VERSION, "plugins": self.plugin_fp,
            "uptime_s": round(time.time() - self.started, 3),
            "requests": self.requests, "selects": self.selects, "hits": self.hits,
            "misses": self.misses, "errors": dict(self.errors),
            "cache_entries": len(self.cache), "aliases": len(self.aliases),
            "connections_open": len(self.conns), "connections_total": self.connections_total,
            "journal": str(self.journal_path),
            "journal_rotations": self.journal.rotations if self.journal else 0,
            "reloads": self.reloads,
            "rss_bytes": rss_bytes(), "cpu_s": round(sum(os.times()[:2]), 3),
            "torch_imported": "torch" in sys.modules, "triton_imported": "triton" in sys.modules,
        }

    # -- lifecycle -----------------------------------------------------------------------------

    # -- the tuning store --------------------------------------------------------------------

    @staticmethod
    def _store_path() -> Path:
        from registry._knobs import knobs

        return knobs.home / "tuning.json"

    def _store_stat(self) -> str:
        try:
            st = os.stat(self._store_path())
        except OSError as exc:
            return f"absent ({type(exc).__name__})"
        return f"{st.st_mtime_ns}-{st.st_size}-{st.st_ino}-{st.st_mode}"

    def check_store(self) -> bool:
        """Rebuild the registry when the tuning store's entries differ from those it was built
        with (called once a second by the event loop); True when it rebuilt."""
        seen = self._store_stat()
        if seen == self._store_seen or "tuning" not in self.reg.build_state:
            return False  # unchanged, or no plugin of this registry reads the store
        # Taken before the rebuild reads the file: a write after this stat is seen next time.
        self._store_seen = seen
        from registry.tuning.store import store_identity

        if store_identity(self._store_path()) == self.reg.build_state.get("tuning"):
            return False  # replaced by the same entries (a resumed kreg tune)
        return self.reload("the tuning store changed")

    def reload(self, why: str) -> bool:
        """Build the registry afresh (its plugins read the store again); drop the cache when
        the fingerprint changed. True when it changed."""
        from registry._default import build_registry

        reg = build_registry()
        old, new = self.plugin_fp, reg.plugin_fingerprint()
        self.reg, self.plugin_fp = reg, new
        self.reloads += 1
        if new == old:
            return False
        self.cache.clear()
        self.aliases.clear()
        logger.info("%s: registry rebuilt, plugins %s -> %s; cached decisions dropped (clients "
                    "started before see plugin_mismatch and select in-process)", why, old, new)
        return True

    # -- lifecycle -----------------------------------------------------------------------------

    def _acquire(self) -> None:
        """Take the socket's lock, write the pid file, remove a stale socket."""
        from registry.daemon.protocol import default_socket_path

        parent = self.path.parent
        try:
            if not parent.exists():
                parent.mkdir(parents=True, mode=0o700)
            elif self.path == default_socket_path():
                parent.chmod(0o700)  # ours alone; a chosen --socket directory is left as it is
        except OSError as exc:
            raise DaemonError(f"cannot create the socket directory {parent}: "
                              f"{exc.strerror or exc} ({type(exc).__name__}); choose another "
                              f"--socket or fix the directory's permissions") from None
        lock = filelock.FileLock(str(lock_path(self.path)), timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            other = read_pid(self.path)
            raise AlreadyRunningError(
                f"another kreg daemon (pid {other if other else 'unknown'}) already serves "
                f"{self.path}; stop it with `kreg daemon stop --socket {self.path}` or choose "
                f"another --socket") from None
        except OSError as exc:
            planted = os.path.islink(lock_path(self.path))
            raise DaemonError(
                f"cannot take the daemon's lock {lock_path(self.path)}: {exc.strerror or exc} "
                f"({type(exc).__name__})"
                + ("; it is a symbolic link, which kreg never follows: remove it (someone else "
                   "may have planted it) or choose another --socket" if planted else
                   "; choose another --socket or fix the directory's permissions")) from None
        self._lock = lock
        try:
            try:
                st = os.lstat(self.path)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISSOCK(st.st_mode):
                    raise DaemonError(f"{self.path} exists and is not a socket; remove it or "
                                      f"choose another --socket")
                # We hold the lock, so no daemon serves it: a crashed daemon left it behind.
                logger.warning("removing stale socket %s left by a previous daemon (pid %s)",
                               self.path, read_pid(self.path))
                self.path.unlink()
            _write_pid_file(pid_path(self.path))
        except BaseException:
            lock.release()
            self._lock = None
            raise

    def _release(self) -> None:
        for p in (self.path, pid_path(self.path)):
            p.unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    async def _serve(self, ready: Any = None) -> None:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        old = os.umask(0o177)  # the socket is created 0600: no window where others may connect
        try:
            server = await loop.create_unix_server(lambda: _Connection(self), path=str(self.path),
                                                   backlog=1024)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Not possible outside the main thread (an embedded daemon; asyncio raises
            # RuntimeError there, uvloop ValueError): stop it by request.
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._stop.set)
        sweeper = loop.create_task(self._sweep())
        logger.info("kreg daemon pid %d serving %s (plugins %s, journal %s)", os.getpid(),
                    self.path, self.plugin_fp, self.journal_path)
        if ready is not None:
            ready()
        try:
            await self._stop.wait()
        finally:
            sweeper.cancel()
            server.close()
            for conn in list(self.conns):
                if conn.transport is not None:
                    conn.transport.close()
            await asyncio.sleep(0)  # let the close callbacks flush the last replies
            await server.wait_closed()

    async def _sweep(self) -> None:
        """Close connections with a stalled frame or idle too long; flush the journal; look at
        the tuning store and the log's size."""
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            if now - self._store_checked >= STORE_CHECK_S:
                self._store_checked = now
                try:
                    self.check_store()
                except Exception:  # never the daemon: the next look tries again
                    logger.exception("checking the tuning store failed")
                if self.log_path is not None:
                    _rotate_log(self.log_path, self.log_max_bytes)
            for conn in list(self.conns):
                t = conn.transport
                if t is None or t.is_closing():
                    continue
                if conn.partial_since is not None and now - conn.partial_since > self.read_timeout:
                    self.count_error("read_timeout")
                    t.abort()
                elif now - conn.last_active > self.idle_timeout:
                    t.close()
            if self.journal is not None:
                self.journal.flush()

    def run(self, ready: Any = None) -> None:
        """Serve until stopped. Raises :class:`AlreadyRunningError` when another one serves."""
        self._acquire()
        try:
            self.journal = Journal(self.journal_path, self.journal_max_bytes, self.journal_files)
            _run_loop(self._serve(ready))
        finally:
            if self.journal is not None:
                self.journal.close()
            self._release()
            logger.info("kreg daemon pid %d stopped", os.getpid())


def _write_pid_file(path: Path) -> None:
    """Write our pid to ``path`` as a new file: a leftover regular file is replaced, a symbolic
    link (or anything else) in its place is refused, never followed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise DaemonError(f"the daemon's pid file {path} is {what}; kreg never follows or "
                              f"overwrites one: remove it (someone else may have planted it) or "
                              f"choose another --socket")
        path.unlink()  # a crashed daemon's (we hold the lock)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise DaemonError(f"cannot create the daemon's pid file {path}: {exc.strerror or exc} "
                          f"({type(exc).__name__}); remove what is there or choose another "
                          f"--socket") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{os.getpid()}\n")


def _rotate_log(path: Path, max_bytes: int, files: int = LOG_FILES) -> bool:
    """When this process's stderr (where it logs) is ``path`` and has passed ``max_bytes``:
    shift ``path`` to ``path.1`` (and so on, the oldest dropped) and point stdout and stderr at
    a fresh ``path``. True when it rotated."""
    try:
        st, err = os.stat(path), os.fstat(2)
    except OSError:
        return False
    if (st.st_ino, st.st_dev) != (err.st_ino, err.st_dev) or err.st_size < max_bytes:
        return False
    try:
        for i in range(files - 1, 0, -1):
            src = path if i == 1 else path.with_name(f"{path.name}.{i - 1}")
            if src.exists():
                os.replace(src, path.with_name(f"{path.name}.{i}"))
        if files <= 1:
            path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
    except OSError as exc:
        logger.warning("cannot rotate %s: %s", path, exc)
        return False
    sys.stderr.flush()
    sys.stdout.flush()
    os.dup2(fd, 2)
    os.dup2(fd, 1)
    os.close(fd)
    logger.info("log rotated (the previous one is %s.1)", path)
    return True


def _run_loop(coro: Any) -> None:
    """Run the server's event loop: uvloop's when installed (the ``daemon`` extra), which cuts
    the per-request event-loop cost of a paced select, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def serve(socket_path: str | os.PathLike[str] | None = None, **options: Any) -> int:
    """Run a daemon in this process; the exit status for a command line."""
    try:
        Daemon(socket_path, **options).run()
    except (DaemonError, KregError) as exc:
        print(f"kreg daemon: {exc}", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:  # a KREG_HOME it cannot write (the journal), a full disk, ...
        where = f" {exc.filename}" if exc.filename else ""
        print(f"kreg daemon: cannot use{where}: {exc.strerror or exc} ({type(exc).__name__}); "
              f"set KREG_HOME to a writable directory", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m registry.daemon",
                                     description="Run the kreg dispatch daemon in the foreground.")
    parser.add_argument("--socket", default=None, help="socket path (default: KREG_DAEMON or "
                                                       "$XDG_RUNTIME_DIR/kreg/daemon.sock)")
    parser.add_argument("--read-timeout", type=float, default=2.0,
                        help="seconds a started request frame may take to arrive (default 2)")
    parser.add_argument("--idle-timeout", type=float, default=600.0,
                        help="seconds an idle connection is kept (default 600)")
    parser.add_argument("--log", type=Path, default=None,
                        help="the file stderr is redirected to: rotated past --log-max-bytes")
    parser.add_argument("--log-max-bytes", type=int, default=LOG_MAX_BYTES)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    from registry._knobs import knobs

    return serve(args.socket if args.socket is not None else knobs.daemon,
                 read_timeout=args.read_timeout, idle_timeout=args.idle_timeout,
                 log_path=args.log, log_max_bytes=args.log_max_bytes)


if __name__ == "__main__":
    sys.exit(main())
