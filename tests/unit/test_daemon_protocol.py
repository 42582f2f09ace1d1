"""The daemon's protocol without sockets: frames, request handling, the journal, client backoff."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Any

import pytest

import registry
from registry.daemon import client as dc
from registry.daemon.client import remote_select
from registry.daemon.journal import Journal, journal_files, read_journal
from registry.daemon.protocol import PROTOCOL_VERSION, decode_frame, encode_frame, resolve_socket
from registry.daemon.server import Daemon
from registry.errors import ConfigError

DEVICE = "rtx-pro-6000-blackwell-server"
WORKLOAD = {"kind": "chunk", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
            "total_q": 8192, "num_requests": 1, "max_q": 8192, "dtype": "bfloat16"}


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    return Daemon(tmp_path / "d.sock")


def _ask(d: Daemon, msg: Any, pid: int = 100, raw: bytes | None = None) -> dict[str, Any]:
    body = raw if raw is not None else json.dumps(msg).encode()
    frame, _close = d.handle(body, pid)
    (n,) = struct.unpack(">I", frame[:4])
    reply = decode_frame(frame[4:4 + n])
    rest = frame[4 + n:]
    if "attachment" in reply:  # a select reply: the Decision JSON follows in its own frame
        (m,) = struct.unpack(">I", rest[:4])
        assert m == reply["attachment"] == len(rest) - 4
        reply["decision"] = json.loads(rest[4:])
    else:
        assert not rest
    return reply


def _select(d: Daemon, pid: int = 100, with_facts: bool = True, **change: Any) -> dict[str, Any]:
    facts = registry.profiles()[DEVICE]
    msg: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": 7, "type": "select",
                           "op": "sparse_prefill", "facts_fp": facts.fingerprint,
                           "workload": dict(WORKLOAD), "override": None,
                           "plugins": registry.get_registry().plugin_fingerprint()}
    if with_facts:
        msg["facts"] = facts.model_dump_json()
    msg.update(change)
    return _ask(d, msg, pid)


def test_frame_round_trip() -> None:
    frame = encode_frame({"v": 1, "type": "stats", "id": 3})
    (n,) = struct.unpack(">I", frame[:4])
    assert n == len(frame) - 4
    assert decode_frame(frame[4:]) == {"v": 1, "type": "stats", "id": 3}
    with pytest.raises(ValueError, match="JSON object"):
        decode_frame(b"[1, 2]")
    with pytest.raises(ValueError):
        decode_frame(b"{nope")


@pytest.mark.parametrize(("raw", "code"), [
    (b"{not json", "bad_json"),
    (b"\xff\xfe\x00", "bad_json"),
    (b"[1, 2, 3]", "bad_json"),
    (b"", "bad_json"),
    (json.dumps({"v": 2, "id": 1, "type": "stats"}).encode(), "unsupported_version"),
    (json.dumps({"id": 1, "type": "stats"}).encode(), "unsupported_version"),
    (json.dumps({"v": 1, "id": 1, "type": "launch"}).encode(), "unknown_type"),
    (json.dumps({"v": 1, "id": 1, "type": "select", "op": 3}).encode(), "bad_request"),
    (json.dumps({"v": 1, "id": 1, "type": "explain", "pid": "x"}).encode(), "bad_request"),
])
def test_bad_requests_get_an_error_reply(daemon: Daemon, raw: bytes, code: str) -> None:
    reply = _ask(daemon, None, raw=raw)
    assert reply["ok"] is False
    assert reply["error"]["code"] == code
    assert daemon.errors[code] == 1
    assert _ask(daemon, {"v": 1, "id": 2, "type": "stats"})["ok"]  # still serving


def test_select_shares_the_first_decision(daemon: Daemon) -> None:
    first = _select(daemon, pid=11)
    assert first["ok"] and first["hit"] is False and first["first_pid"] == 11 and first["id"] == 7
    decision = registry.Decision.model_validate(first["decision"])
    assert decision.source == "daemon"
    assert decision.implementation == registry.select("sparse_prefill", WORKLOAD,
                                                      DEVICE).implementation
    # Another process, facts by fingerprint only: served from the shared cache.
    second = _select(daemon, pid=12, with_facts=False)
    assert second["hit"] is True and second["first_pid"] == 11
    assert second["decision"] == first["decision"]
    # A workload dict in another key order is the same key.
    third = _select(daemon, pid=13, workload=dict(reversed(list(WORKLOAD.items()))))
    assert third["hit"] is True
    stats = daemon.stats()
    assert (stats["selects"], stats["hits"], stats["misses"]) == (3, 2, 1)
    assert stats["cache_entries"] == 1


def test_override_is_part_of_the_key(daemon: Daemon) -> None:
    auto = _select(daemon)
    forced = _select(daemon, override="reference.sparse_prefill")
    assert forced["hit"] is False
    assert forced["decision"]["implementation"] == "reference.sparse_prefill"
    assert auto["decision"]["implementation"] != "reference.sparse_prefill"


def test_plugin_mismatch_and_unknown_facts_are_refused(daemon: Daemon) -> None:
    reply = _select(daemon, plugins="0000000000000000")
    assert reply["error"]["code"] == "plugin_mismatch"
    assert "differs from the daemon's" in reply["error"]["message"]
    reply = _select(daemon, with_facts=False, facts_fp="feedfeedfeedfeed")
    assert reply["error"]["code"] == "unknown_facts"
    reply = _select(daemon, facts_fp="feedfeedfeedfeed")  # facts that do not match the fp
    assert reply["error"]["code"] == "bad_request" and "fingerprint" in reply["error"]["message"]


def test_select_failure_is_reported_not_raised(daemon: Daemon) -> None:
    reply = _select(daemon, workload={**WORKLOAD, "max_q": 1})
    assert reply["error"]["code"] == "select_failed"
    assert "WorkloadError" in reply["error"]["message"]
    reply = _select(daemon, op="no_such_op")
    assert reply["error"]["code"] == "select_failed"
    assert "UnknownOpError" in reply["error"]["message"]


def test_explain_filters_by_pid_and_op(daemon: Daemon) -> None:
    _select(daemon, pid=21)
    _select(daemon, pid=22)
    _select(daemon, pid=22, workload={**WORKLOAD, "total_q": 64, "max_q": 64})
    every = _ask(daemon, {"v": 1, "id": 1, "type": "explain"})["decisions"]
    assert [r["pid"] for r in every] == [21, 22, 22]
    only = _ask(daemon, {"v": 1, "id": 1, "type": "explain", "pid": 22})["decisions"]
    assert [r["hit"] for r in only] == [True, False]
    assert all(r["op"] == "sparse_prefill" and r["implementation"] and r["reason"] for r in only)
    assert _ask(daemon, {"v": 1, "id": 1, "type": "explain", "op": "indexer_topk"})[
        "decisions"] == []
    last = _ask(daemon, {"v": 1, "id": 1, "type": "explain", "limit": 1})["decisions"]
    assert len(last) == 1 and last[0]["pid"] == 22


def test_journal_rotates_within_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "j" / "decisions.jsonl"
    journal = Journal(path, max_bytes=2000, files=3)
    for i in range(500):
        journal.write({"i": i, "pad": "x" * 40})
    journal.close()
    files = [p for p in journal_files(path, 3) if p.exists()]
    assert len(files) == 3
    assert all(p.stat().st_size < 2000 + 100 for p in files)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    records = list(read_journal(path))
    assert records[-1]["i"] == 499
    assert [r["i"] for r in records] == list(range(records[0]["i"], 500))  # newest, in order
    with open(path, "a") as fh:
        fh.write('{"torn": ')  # a crash mid-line: skipped, not fatal
    assert list(read_journal(path))[-1]["i"] == 499


def test_socket_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert resolve_socket("1") == tmp_path / "kreg" / "daemon.sock"
    assert resolve_socket(None) == tmp_path / "kreg" / "daemon.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    assert resolve_socket("1") == tmp_path / "home" / "run" / "daemon.sock"
    assert resolve_socket(str(tmp_path / "x.sock")) == tmp_path / "x.sock"
    with pytest.raises(ConfigError, match="Unix sockets allow 107"):
        resolve_socket("/tmp/" + "x" * 120)


def test_unreachable_daemon_falls_back_once_then_backs_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    sock = tmp_path / "none.sock"
    monkeypatch.setenv("KREG_DAEMON", str(sock))
    dc.reset_links()
    connects = []
    real = dc.DaemonClient.connect

    def counting(self: dc.DaemonClient) -> None:
        connects.append(self.path)
        real(self)

    monkeypatch.setattr(dc.DaemonClient, "connect", counting)
    reg = registry.get_registry()
    facts = registry.profiles()[DEVICE]
    wl = reg.workload("sparse_prefill", WORKLOAD)
    with caplog.at_level(logging.DEBUG, logger="registry.daemon"):
        for _ in range(5):
            decision, note = remote_select(reg, "sparse_prefill", facts, wl, None)
            assert decision is None
            assert note == f"daemon at {sock} unreachable (FileNotFoundError); selected in-process"
    assert len(connects) == 1  # backing off: the dead socket is not retried on every miss
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()
    link = dc._links[str(sock)]
    assert link.delay == 2 * dc.BACKOFF_FIRST
    # After the backoff it tries again, fails again: still one warning, the delay doubles.
    link.next_try = 0.0
    with caplog.at_level(logging.DEBUG, logger="registry.daemon"):
        remote_select(reg, "sparse_prefill", facts, wl, None)
    assert len(connects) == 2 and link.delay == 4 * dc.BACKOFF_FIRST
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    # Through the registry: no error, the decision carries the note.
    registry.invalidate()
    d = registry.select("sparse_prefill", WORKLOAD, DEVICE)
    assert d.source == "local" and any("unreachable" in n for n in d.notes)
    dc.reset_links()


def test_bad_timeout_setting_is_a_note(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KREG_DAEMON", str(tmp_path / "x.sock"))
    monkeypatch.setenv("KREG_DAEMON_TIMEOUT", "fast")
    reg = registry.get_registry()
    wl = reg.workload("sparse_prefill", WORKLOAD)
    decision, note = remote_select(reg, "sparse_prefill", registry.profiles()[DEVICE], wl, None)
    assert decision is None and note is not None
    assert "Unable to use KREG_DAEMON_TIMEOUT='fast'" in note


def test_shared_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    d = Daemon(tmp_path / "d.sock", cache_size=2)
    for total_q in (10, 20, 30, 10):
        reply = _select(d, workload={**WORKLOAD, "total_q": total_q, "max_q": total_q})
        assert reply["ok"]
    stats = d.stats()
    assert stats["cache_entries"] == 2 and stats["aliases"] == 2
    assert stats["misses"] == 4  # 10 was evicted (least recently used) before it came back
