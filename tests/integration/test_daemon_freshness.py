"""A running daemon after `kreg tuning import`, and a daemon run by another user (issue #24)."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_daemon import WORKLOAD, Node

import registry
from registry.daemon.client import DaemonClient, DaemonUntrusted
from registry.tuning.store import TuningEntry, TuningStore, identity_of

DEVICE = "rtx-pro-6000-blackwell-server"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    n.cleanup()


def test_tuning_import_reaches_a_running_daemon(node: Node, tmp_path: Path) -> None:
    node.start()
    before = node.client([WORKLOAD])["decisions"][0]
    assert (before["source"], before["implementation"]) == (
        "daemon", "nvidia_sm120.sparse_prefill_tuned")
    facts = registry.profiles()[DEVICE]
    device, software = identity_of(facts)
    entry = TuningEntry(op="sparse_prefill", family="generic.sparse_prefill_table",
                        device=device, software=software, bucket=dict(WORKLOAD),
                        config={"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 2, "num_stages": 2},
                        timings_ms={"16x32x2x2": 0.5}, command="test")
    table = tmp_path / "table.json"
    scratch = TuningStore(tmp_path / "scratch" / "tuning.json")
    scratch.put([entry])
    scratch.export_table(table)
    node.kreg("tuning", "import", str(table))
    deadline = time.monotonic() + 15
    while node.stats()["reloads"] < 1:
        assert time.monotonic() < deadline, "the daemon never noticed the import"
        time.sleep(0.1)
    after = node.client([WORKLOAD])["decisions"][0]  # a process started after the import
    assert (after["source"], after["implementation"]) == ("daemon", "measured.sparse_prefill")
    assert after["config"] == entry.config


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="needs root to serve a socket as another user (os.setuid)")
def test_a_daemon_of_another_user_is_refused_by_the_client() -> None:
    """The scenario of #24: another user's process serves a socket in a shared directory."""
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    base = Path(tempfile.mkdtemp(prefix="kreg-trust-", dir="/tmp"))
    base.chmod(0o777)
    path = base / "d.sock"
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user's "daemon": accepts, answers nothing
        try:
            os.close(ready_r)
            os.close(done_w)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(str(path))
            srv.listen(4)
            os.write(ready_w, b"1")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        assert os.read(ready_r, 1) == b"1"
        with pytest.raises(DaemonUntrusted, match=f"runs as uid {nobody.pw_uid}"):
            DaemonClient(path, 2.0).connect()
    finally:
        os.write(done_w, b"1")
        os.waitpid(pid, 0)
        import shutil

        shutil.rmtree(base, ignore_errors=True)
