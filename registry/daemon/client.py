"""The daemon's client (the protocol is in :mod:`registry.daemon.protocol`).

:func:`remote_select` is what ``Registry._decide`` calls on a local cache miss when
``KREG_DAEMON`` is set. It never raises: on any failure it returns a one-line note, the caller
selects in-process, and further attempts wait out a backoff (1 s doubling to 30 s) so a dead
socket is not retried on every miss.

Trust. A client trusts only a daemon run by its own user or by root: on every connection it
reads the daemon's uid (SO_PEERCRED on the client's socket, where the platform has it) and a
daemon of any other uid is refused before a request is sent (:class:`DaemonUntrusted`); the
registry then selects in-process and logs the reason once, as an error. Root is trusted because
it can impersonate any user anyway; a daemon in a shared directory run by another user is not.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from registry._knobs import knobs
from registry.daemon.protocol import (
    HEADER,
    MAX_REPLY,
    PROTOCOL_VERSION,
    decode_frame,
    encode_frame,
    resolve_socket,
)
from registry.errors import ConfigError, DaemonError

if TYPE_CHECKING:
    from registry._decision import Decision
    from registry._facts import DeviceFacts
    from registry._registry import Registry
    from registry._workload import Workload

__all__ = ["DaemonClient", "DaemonRefused", "DaemonUntrusted", "peer_uid", "remote_select",
           "reset_links"]

logger = logging.getLogger("registry.daemon")

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0


# ---------------------------------------------------------------------------------------------
# the client


class DaemonRefused(DaemonError):
    """The daemon answered with an error reply (``code`` says which)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DaemonUntrusted(DaemonError):
    """The process serving the socket runs as another user (neither ours nor root)."""

    def __init__(self, path: str, uid: int, pid: int | None) -> None:
        me = os.getuid()
        super().__init__(f"the daemon at {path} runs as uid {uid}"
                         + (f" (pid {pid})" if pid else "")
                         + f", not as this user (uid {me}) or root: its decisions are not "
                         f"trusted; start your own with `kreg daemon start` or point KREG_DAEMON "
                         f"at a socket of yours")
        self.uid = uid


def peer_uid(sock: socket.socket) -> tuple[int, int] | None:
    """``(pid, uid)`` of the process at the other end of a connected Unix socket, or None where
    the platform cannot say (no SO_PEERCRED: the socket's file mode is then the only guard)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def _trusted(uid: int) -> bool:
    return uid in (os.getuid(), 0)


class DaemonClient:
    """One connection to the daemon; requests are synchronous and answered in order.

    Not thread-safe: :func:`remote_select` serializes its use with a lock. Any transport failure
    closes the connection (a late reply would otherwise be read as the next request's answer).
    """

    def __init__(self, path: str | os.PathLike[str], timeout: float | None = None) -> None:
        self.path = str(path)
        self.timeout = knobs.daemon_timeout if timeout is None else timeout
        self._sock: socket.socket | None = None
        self._next_id = 0
        # Fingerprints whose facts this connection has sent: later selects send only the
        # fingerprint, which keeps a request small (a third of the parse time of the daemon).
        self._sent_facts: set[str] = set()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        if self._sock is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
            peer = peer_uid(sock)
            if peer is not None and not _trusted(peer[1]):
                raise DaemonUntrusted(self.path, peer[1], peer[0])
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def close(self) -> None:
        self._sent_facts = set()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _recv_exact(self, sock: socket.socket, n: int, deadline: float) -> bytes:
        chunks = []
        while n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no complete reply within {self.timeout:g} s")
            sock.settimeout(left)
            chunk = sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionResetError("the daemon closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _frame(self, sock: socket.socket, buf: bytes, deadline: float) -> tuple[bytes, bytes]:
        """One frame's body from ``buf`` plus the socket; returns (body, bytes left over)."""
        if len(buf) < HEADER.size:
            buf += self._recv_exact(sock, HEADER.size - len(buf), deadline)
        (n,) = HEADER.unpack_from(buf)
        if n > MAX_REPLY:
            raise DaemonError(f"daemon reply of {n} bytes exceeds the {MAX_REPLY} byte limit")
        end = HEADER.size + n
        if len(buf) < end:
            buf += self._recv_exact(sock, end - len(buf), deadline)
        return buf[HEADER.size:end], buf[end:]

    def request_raw(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return the reply object, ``ok`` or not.

        A kept connection the daemon has since closed (restart, idle timeout) is replaced once,
        transparently; a fresh connection's failure is the caller's."""
        if self._sock is not None:
            try:
                return self._request_once(msg)
            except (BrokenPipeError, ConnectionResetError):
                pass  # raised before any reply was read: try once on a new connection
        return self._request_once(msg)

    def _request_once(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.connect()
        sock = self._sock
        assert sock is not None
        self._next_id += 1
        rid = self._next_id
        msg = {"v": PROTOCOL_VERSION, "id": rid, **msg}
        deadline = time.monotonic() + self.timeout
        try:
            sock.settimeout(self.timeout)
            try:
                sock.sendall(encode_frame(msg))
            except (BrokenPipeError, ConnectionResetError):
                # The daemon may have refused us at connect (another uid, too many clients) and
                # hung up: its reason is still readable, and better than "broken pipe".
                try:
                    (n,) = HEADER.unpack(self._recv_exact(sock, HEADER.size, deadline))
                    early = decode_frame(self._recv_exact(sock, min(n, MAX_REPLY), deadline))
                except (OSError, ValueError, struct.error):
                    early = None
                if early is None or early.get("ok") is not False:
                    raise
                self.close()
                return early
            # One recv usually holds the whole reply: read generously, then complete it.
            buf = sock.recv(65536)
            if not buf:
                raise ConnectionResetError("the daemon closed the connection")
            body, buf = self._frame(sock, buf, deadline)
            reply = decode_frame(body)
            extra = reply.get("attachment")
            if extra is not None:
                attachment, buf = self._frame(sock, buf, deadline)
                if len(attachment) != extra:
                    raise DaemonError(f"daemon attachment of {len(attachment)} bytes, announced "
                                      f"{extra}")
                reply["attachment"] = attachment
            if buf:
                raise DaemonError("the daemon sent more than one reply to one request")
        except BaseException:
            self.close()
            raise
        if reply.get("id") not in (rid, None):
            self.close()
            raise DaemonError(f"daemon reply id {reply.get('id')!r} does not match request {rid}")
        return reply

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send one request; an error reply raises :class:`DaemonRefused`."""
        reply = self.request_raw(msg)
        if not reply.get("ok"):
            err = reply.get("error") or {}
            raise DaemonRefused(str(err.get("code", "error")), str(err.get("message", reply)))
        return reply

    def select(self, op: str, facts_json: str, workload: dict[str, Any], override: str | None,
               plugins: str, facts_fp: str | None = None) -> dict[str, Any]:
        """The raw select: ``reply["attachment"]`` is the Decision's JSON (bytes): give it to
        ``Decision.model_validate_json`` or ``json.loads``.

        ``facts_json`` is ``DeviceFacts.model_dump_json()``; ``facts_fp`` its fingerprint
        (computed here when not given)."""
        if facts_fp is None:
            facts_fp = hashlib.sha256(facts_json.encode()).hexdigest()[:16]
        msg = {"type": "select", "op": op, "facts_fp": facts_fp, "workload": workload,
               "override": override, "plugins": plugins}
        if facts_fp not in self._sent_facts:
            msg["facts"] = facts_json
        try:
            reply = self.request(msg)
        except DaemonRefused as exc:
            if exc.code != "unknown_facts" or "facts" in msg:
                raise
            msg["facts"] = facts_json  # the daemon forgot them (bounded table): once more
            reply = self.request(msg)
        self._sent_facts.add(facts_fp)
        return reply

    def explain(self, pid: int | None = None, op: str | None = None,
                limit: int = 200) -> list[dict[str, Any]]:
        reply = self.request({"type": "explain", "pid": pid, "op": op, "limit": limit})
        return list(reply["decisions"])

    def stats(self) -> dict[str, Any]:
        return self.request({"type": "stats"})

    def shutdown(self) -> dict[str, Any]:
        return self.request({"type": "shutdown"})


# ---------------------------------------------------------------------------------------------
# the registry's entry point


@dataclass
class _Link:
    """Per process and socket: the connection and its backoff state."""

    path: str
    pid: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    client: DaemonClient | None = None
    next_try: float = 0.0
    delay: float = BACKOFF_FIRST
    note: str | None = None
    warned: bool = False
    fingerprint: tuple[int, str] | None = None  # (registry generation, plugin fingerprint)
    facts_json: dict[str, str] = field(default_factory=dict)


_links: dict[str, _Link] = {}
_links_lock = threading.Lock()


def _link(path: str) -> _Link:
    pid = os.getpid()
    link = _links.get(path)
    if link is None or link.pid != pid:
        # A forked child must not share its parent's connection: the replies would interleave.
        with _links_lock:
            link = _links.get(path)
            if link is None or link.pid != pid:
                link = _Link(path=path, pid=pid)
                _links[path] = link
    return link


def reset_links() -> None:
    """Forget connections and backoff state (tests; after restarting the daemon)."""
    with _links_lock:
        for link in _links.values():
            if link.client is not None:
                link.client.close()
        _links.clear()


def _fail(link: _Link, note: str, detail: str, level: int = logging.WARNING) -> None:
    if link.client is not None:
        link.client.close()
        link.client = None
    link.note = note
    link.next_try = time.monotonic() + link.delay
    if not link.warned:
        link.warned = True
        logger.log(level, "%s; further misses select in-process until it answers again "
                   "(next attempt in %g s, backoff up to %g s)", detail, link.delay, BACKOFF_MAX)
    else:
        logger.debug("%s (next attempt in %g s)", detail, link.delay)
    link.delay = min(link.delay * 2, BACKOFF_MAX)


def remote_select(reg: Registry, op: str, facts: DeviceFacts, wl: Workload,
                  raw: tuple[str, str] | None, *, path: str | None = None,
                  timeout: float | None = None) -> tuple[Decision | None, str | None]:
    """Ask the daemon for the decision of one local cache miss.

    Returns ``(decision, None)`` when the daemon answered, else ``(None, note)`` with the reason
    the in-process decision will carry. Never raises for daemon trouble. ``path`` and
    ``timeout`` are what the composition root read from KREG_DAEMON / KREG_DAEMON_TIMEOUT at
    the registry's last invalidation; without them (a direct call) they are read now.
    """
    try:
        path = str(resolve_socket(knobs.daemon)) if path is None else path
        timeout = knobs.daemon_timeout if timeout is None else timeout
    except ConfigError as exc:
        return None, f"daemon not used ({exc}); selected in-process"
    link = _link(path)
    if link.next_try > time.monotonic():
        return None, link.note  # backing off: do not touch the socket
    with link.lock:
        if link.next_try > time.monotonic():
            return None, link.note
        gen = reg.generation
        if link.fingerprint is None or link.fingerprint[0] != gen:
            link.fingerprint = (gen, reg.plugin_fingerprint())
        fjson = link.facts_json.get(facts.fingerprint)
        if fjson is None:
            if len(link.facts_json) > 64:
                link.facts_json.clear()
            fjson = link.facts_json[facts.fingerprint] = facts.model_dump_json()
        try:
            if link.client is None:
                link.client = DaemonClient(path, timeout)
            link.client.timeout = timeout
            reply = link.client.select(op, fjson, wl.model_dump(mode="json"),
                                       raw[0] if raw else None, link.fingerprint[1],
                                       facts.fingerprint)
        except DaemonUntrusted as exc:
            note = f"daemon at {path} not trusted (it runs as uid {exc.uid}, neither this " \
                   f"user's nor root's); selected in-process"
            _fail(link, note, f"kreg: {exc}", logging.ERROR)
            return None, note
        except DaemonRefused as exc:
            if exc.code == "select_failed":
                # The daemon is fine; this workload is not. Selecting in-process raises the
                # same error with the caller's own traceback.
                return None, f"daemon at {path} could not decide ({exc.message}); selected " \
                             f"in-process"
            note = f"daemon at {path} refused this client ({exc.message}); selected in-process"
            _fail(link, note, f"kreg daemon at {path} refused this client: {exc.message}")
            return None, note
        except TimeoutError as exc:
            note = f"daemon at {path} too slow (no answer within {timeout:g} s); selected " \
                   f"in-process"
            _fail(link, note, f"kreg daemon at {path} did not answer within {timeout:g} s "
                              f"({exc})")
            return None, note
        except (OSError, ValueError, DaemonError) as exc:
            note = f"daemon at {path} unreachable ({type(exc).__name__}); selected in-process"
            _fail(link, note, f"kreg daemon at {path} unreachable ({type(exc).__name__}: {exc})")
            return None, note
        if link.warned:
            logger.info("kreg daemon at %s answers again; decisions are shared", path)
        link.warned, link.delay, link.note = False, BACKOFF_FIRST, None
    return _decision_from_reply(reply, raw, path, reg.strict)


def _decision_from_reply(reply: dict[str, Any], raw: tuple[str, str] | None,
                         path: str, strict: bool) -> tuple[Decision | None, str | None]:
    from registry._decision import Decision
    try:
        decision = Decision.model_validate_json(reply["attachment"])
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"daemon at {path} sent an unreadable decision ({type(exc).__name__}); " \
                     f"selected in-process"
    update: dict[str, Any] = {"source": "daemon"}
    if raw is not None and decision.override is not None:
        # The daemon saw only the value; the source (variable or context) is the client's.
        update["override"] = decision.override.model_copy(update={"source": raw[1]})
    hit = bool(reply.get("hit"))
    first = reply.get("first_pid")
    update["notes"] = [*decision.notes,
                       f"shared by the daemon at {path} ("
                       + (f"first asked by pid {first})" if hit else "decided for this process)")]
    decision = decision.model_copy(update=update)
    if strict and (decision.fallback or (decision.override is not None
                                               and not decision.override.honoured)):
        return None, None  # in-process selection raises StrictModeError with the full trace
    return decision, None
