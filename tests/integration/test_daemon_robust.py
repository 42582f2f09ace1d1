"""The daemon under bad input and slow clients, over its real socket; the client's reconnection."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import registry
from registry.daemon import client as dc
from registry.daemon.client import DaemonClient, remote_select
from registry.daemon.protocol import MAX_REQUEST

WORKLOAD = {"kind": "chunk", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
            "total_q": 8192, "num_requests": 1, "max_q": 8192, "dtype": "bfloat16"}
DEVICE = "rtx-pro-6000-blackwell-server"
READ_TIMEOUT = 0.5


def _start(sock: Path, home: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KREG_HOME": str(home)}
    env.pop("KREG_DAEMON", None)
    proc = subprocess.Popen([sys.executable, "-m", "registry.daemon", "--socket", str(sock),
                             "--read-timeout", str(READ_TIMEOUT)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the daemon exited at start"
        try:
            with DaemonClient(sock, 1.0) as c:
                c.stats()
            return proc
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise AssertionError("the daemon did not answer")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    sock = tmp_path / "d.sock"
    proc = _start(sock, tmp_path / "home")
    yield sock, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _conn(sock: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(sock))
    return s


_pending: dict[int, bytes] = {}


def _read_reply(s: socket.socket) -> dict[str, Any] | None:
    """One reply frame, or None when the daemon closed the connection first (bytes after the
    frame are kept for the next call on the same socket)."""
    buf = _pending.pop(s.fileno(), b"")
    while True:
        if len(buf) >= 4:
            (n,) = struct.unpack(">I", buf[:4])
            if len(buf) >= 4 + n:
                if buf[4 + n:]:
                    _pending[s.fileno()] = buf[4 + n:]
                return dict(json.loads(buf[4:4 + n]))
        chunk = s.recv(65536)
        if not chunk:
            return None
        buf += chunk


def _frame(obj: Any) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def _stats(sock: Path) -> dict[str, Any]:
    with DaemonClient(sock, 5.0) as c:
        return c.stats()


def test_bad_frames_get_errors_and_the_daemon_survives(daemon: tuple[Path, Any]) -> None:
    sock, proc = daemon
    # Several bad frames on one connection: each gets its error, the connection stays usable.
    s = _conn(sock)
    s.sendall(_frame(b"{oops") + _frame(b"[]") + _frame({"v": 9, "id": 4, "type": "stats"})
              + _frame({"v": 1, "id": 5, "type": "nope"}) + _frame({"v": 1, "id": 6,
                                                                    "type": "stats"}))
    codes = [(r["id"], r["error"]["code"]) for r in (_read_reply(s) for _ in range(4)) if r]
    assert codes == [(None, "bad_json"), (None, "bad_json"), (4, "unsupported_version"),
                     (5, "unknown_type")]
    last = _read_reply(s)
    assert last is not None and last["ok"] and last["id"] == 6
    s.close()
    # Oversized: refused on the length prefix alone, then the connection is closed.
    s = _conn(sock)
    s.sendall(struct.pack(">I", MAX_REQUEST + 1) + b"x" * 100)
    reply = _read_reply(s)
    assert reply is not None and reply["error"]["code"] == "too_large"
    assert _read_reply(s) is None
    s.close()
    # Cut off mid-frame by a client that hangs up: nothing to answer, nothing breaks.
    for _ in range(20):
        s = _conn(sock)
        s.sendall(struct.pack(">I", 1000) + b'{"v":1,')
        s.close()
    stats = _stats(sock)
    assert proc.poll() is None
    assert stats["errors"] == {"bad_json": 2, "unsupported_version": 1, "unknown_type": 1,
                               "too_large": 1}


def test_a_slow_client_blocks_nobody_and_is_timed_out(daemon: tuple[Path, Any]) -> None:
    sock, _ = daemon
    slow = _conn(sock)
    slow.sendall(struct.pack(">I", 100) + b'{"v": 1, "type"')  # and then nothing
    idle = _conn(sock)  # connected, sends nothing at all
    t0 = time.monotonic()
    for _ in range(20):
        _stats(sock)
    assert time.monotonic() - t0 < 5  # others are answered meanwhile
    # The half-sent frame's deadline passes: the daemon closes that connection.
    slow.settimeout(READ_TIMEOUT + 5)
    t1 = time.monotonic()
    assert slow.recv(10) == b""
    assert time.monotonic() - t1 < READ_TIMEOUT + 2
    assert _stats(sock)["errors"] == {"read_timeout": 1}
    # A connection with no frame in flight is not subject to the read timeout.
    idle.sendall(_frame({"v": 1, "id": 1, "type": "stats"}))
    reply = _read_reply(idle)
    assert reply is not None and reply["ok"]
    # A client that sends requests but never reads: paused, others still served, bounded.
    greedy = _conn(sock)
    greedy.setblocking(False)
    sent = 0
    try:
        for _ in range(2000):
            sent += greedy.send(_frame({"v": 1, "id": 1, "type": "explain", "limit": 10000}))
    except BlockingIOError:
        pass
    assert _stats(sock)["connections_open"] >= 2
    greedy.close()
    slow.close()
    idle.close()


def test_client_reconnects_after_restart_with_backoff(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    sock = tmp_path / "d.sock"
    home = tmp_path / "home"
    proc = _start(sock, home)
    monkeypatch.setenv("KREG_DAEMON", str(sock))
    monkeypatch.setattr(dc, "BACKOFF_FIRST", 0.2)
    dc.reset_links()
    reg = registry.get_registry()
    facts = registry.profiles()[DEVICE]

    def ask(i: int) -> tuple[Any, str | None]:
        wl = reg.workload("sparse_prefill", {**WORKLOAD, "total_q": 100 + i, "max_q": 100 + i})
        return remote_select(reg, "sparse_prefill", facts, wl, None)

    try:
        assert ask(0)[0].source == "daemon"
        proc.kill()  # kill -9: no goodbye
        proc.wait()
        with caplog.at_level(logging.INFO, logger="registry.daemon"):
            decision, note = ask(1)
            assert decision is None
            assert note == f"daemon at {sock} unreachable (ConnectionRefusedError); selected " \
                           f"in-process"
            link = dc._links[str(sock)]
            assert link.delay == 2 * dc.BACKOFF_FIRST
            proc = _start(sock, home)  # stale socket removed, serving again
            # Still inside the backoff window (pinned, so the restart's duration does not
            # matter): no attempt, the same note.
            link.next_try = time.monotonic() + 60
            assert ask(2) == (None, note)
            link.next_try = time.monotonic()  # the window has passed
            decision, note = ask(3)
            assert note is None and decision.source == "daemon"
            assert link.delay == dc.BACKOFF_FIRST  # reset by the success
        messages = [r.getMessage() for r in caplog.records]
        assert sum("unreachable" in m for m in messages if "further misses" in m) == 1
        assert any("answers again" in m for m in messages)
    finally:
        dc.reset_links()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_slow_daemon_times_out_to_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A listener that accepts and never answers stands in for a stuck daemon.
    sock = tmp_path / "stuck.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock))
    server.listen(8)
    monkeypatch.setenv("KREG_DAEMON", str(sock))
    monkeypatch.setenv("KREG_DAEMON_TIMEOUT", "0.2")
    dc.reset_links()
    try:
        registry.invalidate()
        t0 = time.monotonic()
        d = registry.select("sparse_prefill", {**WORKLOAD, "total_q": 77, "max_q": 77}, DEVICE)
        assert time.monotonic() - t0 < 2
        assert d.source == "local"
        assert d.notes == [f"daemon at {sock} too slow (no answer within 0.2 s); selected "
                           f"in-process"]
    finally:
        dc.reset_links()
        server.close()


def test_connection_limit_and_idle_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from registry.daemon.server import Daemon

    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    sock = tmp_path / "d.sock"
    ready = threading.Event()
    d = Daemon(sock, max_connections=2, idle_timeout=0.5)
    t = threading.Thread(target=d.run, kwargs={"ready": ready.set}, daemon=True)
    t.start()
    assert ready.wait(30)
    a, b = _conn(sock), _conn(sock)
    for s in (a, b):  # both served
        s.sendall(_frame({"v": 1, "id": 1, "type": "stats"}))
        assert (_read_reply(s) or {}).get("ok") is True
    last_active = time.monotonic()
    c = _conn(sock)
    reply = _read_reply(c)
    assert reply is not None and reply["error"]["code"] == "busy"
    assert _read_reply(c) is None  # and closed
    c.close()
    # Idle connections are closed after idle_timeout; the slots free up.
    a.settimeout(5)
    assert a.recv(10) == b""
    assert 0.45 < time.monotonic() - last_active < 4
    b.close()
    a.close()
    with DaemonClient(sock, 5.0) as client:
        assert client.stats()["errors"] == {"busy": 1}
        assert client.shutdown()["pid"] == os.getpid()
    t.join(10)
    assert not t.is_alive()
    assert not sock.exists()
