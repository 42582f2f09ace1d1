"""The daemon and its client under issue #24: the client trusts only its own user's or root's
daemon, hostile frames cost no traceback, the log stays bounded, and a changed tuning store is
never served stale."""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import registry
from registry.daemon import client as dc
from registry.daemon import server as ds
from registry.daemon.client import DaemonClient, DaemonUntrusted, remote_select
from registry.daemon.protocol import PROTOCOL_VERSION, decode_frame
from registry.daemon.server import Daemon
from registry.tuning.store import TuningEntry, TuningStore, identity_of

DEVICE = "rtx-pro-6000-blackwell-server"
WORKLOAD = {"kind": "chunk", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
            "total_q": 8192, "num_requests": 1, "max_q": 8192, "dtype": "bfloat16"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def listening(tmp_path: Path) -> Iterator[Path]:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    path = tmp_path / "d.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
    yield path
    srv.close()


def test_peer_uid_reads_the_serving_process(listening: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(listening))
    try:
        assert dc.peer_uid(s) == (os.getpid(), os.getuid())
    finally:
        s.close()


def test_a_daemon_of_another_user_is_not_trusted(listening: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(dc, "peer_uid", lambda sock: (4321, 4242))
    with pytest.raises(DaemonUntrusted, match="runs as uid 4242 \\(pid 4321\\), not as this user"):
        DaemonClient(listening, 1.0).connect()

    dc.reset_links()
    reg = registry.get_registry()
    facts = registry.profiles()[DEVICE]
    caplog.set_level(logging.INFO, logger="registry.daemon")
    for total_q in (100, 200):
        wl = reg.workload("sparse_prefill", {**WORKLOAD, "total_q": total_q, "max_q": total_q})
        decision, note = remote_select(reg, "sparse_prefill", facts, wl, None,
                                       path=str(listening), timeout=1.0)
        assert decision is None
        assert note == (f"daemon at {listening} not trusted (it runs as uid 4242, neither this "
                        f"user's nor root's); selected in-process")
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(loud) == 1 and "runs as uid 4242" in loud[0].getMessage()  # loudly, once
    dc.reset_links()


def test_a_root_daemon_is_trusted(listening: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dc, "peer_uid", lambda sock: (1, 0))
    with DaemonClient(listening, 1.0) as c:
        c.connect()  # no DaemonUntrusted


# -- frames and the log ------------------------------------------------------------------------


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    return Daemon(tmp_path / "d.sock")


def _reply(frame: bytes) -> dict[str, Any]:
    (n,) = struct.unpack(">I", frame[:4])
    return decode_frame(frame[4:4 + n])


def test_deeply_nested_json_is_a_protocol_error_without_a_traceback(
        daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="registry.daemon")
    for body in (b"[" * 60_000 + b"]" * 60_000, b'{"a":' * 60_000 + b"1" + b"}" * 60_000):
        frame, close = daemon.handle(body, 7)
        reply = _reply(frame)
        assert reply["ok"] is False and reply["error"]["code"] == "bad_json"
        assert "nested too deeply" in reply["error"]["message"]
        assert not close
    assert not [r for r in caplog.records if r.exc_info]
    assert daemon.errors == {"bad_json": 2}


def test_internal_error_tracebacks_are_bounded(daemon: Daemon, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    def crash(*args: Any) -> bytes:
        raise RuntimeError("a daemon bug")

    monkeypatch.setattr(daemon, "_select", crash)
    caplog.set_level(logging.ERROR, logger="registry.daemon")
    body = json.dumps({"v": PROTOCOL_VERSION, "id": 1, "type": "select"}).encode()
    for _ in range(20):
        assert _reply(daemon.handle(body, 7)[0])["error"]["code"] == "internal"
    with_tb = [r for r in caplog.records if r.exc_info]
    assert len(with_tb) == ds.TRACEBACKS_PER_KIND
    assert len(caplog.records) == 20
    assert "20 so far" in caplog.records[-1].getMessage()


ROTATE = r"""
import os, sys
from pathlib import Path
from registry.daemon.server import _rotate_log
log = Path(sys.argv[1])
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
os.dup2(fd, 2)
for round in range(5):
    os.write(2, b"x" * 700 + b"\n")
    _rotate_log(log, 1000, files=2)
os.write(2, b"last line\n")
"""


def test_the_log_rotates_and_stays_bounded(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    subprocess.run([sys.executable, "-c", ROTATE, str(log)], check=True, cwd=ROOT, timeout=60)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["daemon.log", "daemon.log.1"]
    assert log.read_text().endswith("last line\n")
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) < 3 * 1000


def test_spawn_passes_the_log_to_rotate() -> None:
    import inspect

    from registry.daemon import cli as dcli

    assert '"--log"' in inspect.getsource(dcli.spawn_daemon)


# -- a changed tuning store ------------------------------------------------------------------


def measured_entry() -> TuningEntry:
    facts = registry.profiles()[DEVICE]
    device, software = identity_of(facts)
    return TuningEntry(op="sparse_prefill", family="generic.sparse_prefill_table",
                       device=device, software=software, bucket=dict(WORKLOAD),
                       config={"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 2, "num_stages": 2},
                       timings_ms={"16x32x2x2": 0.5}, command="test",
                       measured_at="2026-01-02T03:04:05+00:00")


def _select(d: Daemon, plugins: str) -> dict[str, Any]:
    facts = registry.profiles()[DEVICE]
    msg = {"v": PROTOCOL_VERSION, "id": 3, "type": "select", "op": "sparse_prefill",
           "facts_fp": facts.fingerprint, "facts": facts.model_dump_json(),
           "workload": dict(WORKLOAD), "override": None, "plugins": plugins}
    frame, _ = d.handle(json.dumps(msg).encode(), 100)
    reply = _reply(frame)
    if reply.get("ok"):
        (n,) = struct.unpack(">I", frame[:4])
        reply["decision"] = json.loads(frame[4 + n + 4:])
    return reply


def test_a_changed_store_is_never_served_stale(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    registry.reset_registry()
    try:
        d = Daemon(tmp_path / "d.sock")
        old_fp = registry.Registry().plugin_fingerprint()
        assert _select(d, old_fp)["decision"]["implementation"] == \
            "nvidia_sm120.sparse_prefill_tuned"
        assert d.check_store() is False  # nothing changed yet
        TuningStore().put([measured_entry()])  # what kreg tune / kreg tuning import do
        assert d.check_store() is True
        new_fp = registry.Registry().plugin_fingerprint()  # a client started after the change
        assert new_fp != old_fp and d.plugin_fp == new_fp
        assert _select(d, new_fp)["decision"]["implementation"] == "measured.sparse_prefill"
        stale = _select(d, old_fp)  # a client started before: refused, selects in-process
        assert stale["error"]["code"] == "plugin_mismatch"
        assert "tuning store" in stale["error"]["message"]
        TuningStore().put([measured_entry()])  # the same entries again: nothing to rebuild
        assert d.check_store() is False
        assert d.stats()["reloads"] == 1
    finally:
        monkeypatch.undo()
        registry.reset_registry()


def test_status_and_stop_name_another_users_daemon(listening: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import cli

    monkeypatch.setattr(dc, "peer_uid", lambda sock: (4321, 4242))
    killed: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))
    for sub in ("status", "stop", "start"):
        res = CliRunner().invoke(cli.main, ["daemon", sub, "--socket", str(listening)])
        assert res.exit_code == 1, res.output
        assert "runs as uid 4242 (pid 4321), not as this user" in res.output
    assert killed == []  # never signalled
