"""A real daemon process on a temporary socket, and real client processes.

Each test starts its own daemon (``kreg daemon start``, a detached process) with KREG_HOME in
tmp_path and stops it at the end, killing it if a test left it running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from registry.daemon.client import DaemonClient
from registry.daemon.server import read_pid

PYTHON = sys.executable
_SCRIPT = Path(PYTHON).parent / "kreg"
KREG = [str(_SCRIPT)] if _SCRIPT.exists() else [PYTHON, "-c", "import cli; cli.main()"]
WORKLOAD = {"kind": "chunk", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
            "total_q": 8192, "num_requests": 1, "max_q": 8192, "dtype": "bfloat16"}

# One client process: selects the workloads given in argv[1] (JSON) on the sm120 profile with
# KREG_DAEMON set, prints each decision's source, implementation, config and notes, its pid, and
# the warnings it logged.
CLIENT = r"""
import json, logging, os, sys
records = []
class Keep(logging.Handler):
    def emit(self, record): records.append(record.getMessage())
logging.getLogger("registry").addHandler(Keep(level=logging.WARNING))
import registry
out = []
for wl in json.loads(sys.argv[1]):
    d = registry.select("sparse_prefill", wl, "rtx-pro-6000-blackwell-server")
    out.append({"source": d.source, "implementation": d.implementation, "config": d.config,
                "notes": d.notes, "json": d.model_dump(exclude={"source", "notes", "cached"})})
print(json.dumps({"pid": os.getpid(), "decisions": out, "warnings": records}))
"""


class Node:
    """A daemon on ``socket`` with KREG_HOME ``home``; runs kreg and client processes."""

    def __init__(self, tmp: Path) -> None:
        self.home = tmp / "home"
        self.socket = tmp / "d.sock"
        self.env = {**os.environ, "KREG_HOME": str(self.home)}
        self.env.pop("KREG_DAEMON", None)
        self.env.pop("XDG_RUNTIME_DIR", None)

    def kreg(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*KREG, *args], env=self.env, capture_output=True, text=True,
                              timeout=60, cwd=Path(__file__).resolve().parents[2])
        if check and proc.returncode != 0:
            raise AssertionError(f"kreg {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def start(self) -> int:
        out = self.kreg("daemon", "start", "--socket", str(self.socket)).stdout
        assert "kreg daemon started (pid" in out
        pid = read_pid(self.socket)
        assert pid is not None
        return pid

    def client(self, workloads: list[dict[str, Any]], **env: str) -> dict[str, Any]:
        proc = subprocess.run([PYTHON, "-c", CLIENT, json.dumps(workloads)],
                              env={**self.env, "KREG_DAEMON": str(self.socket), **env},
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout))

    def stats(self) -> dict[str, Any]:
        with DaemonClient(self.socket, 5.0) as c:
            return c.stats()

    def cleanup(self) -> None:
        pid = read_pid(self.socket)
        self.kreg("daemon", "stop", "--socket", str(self.socket), check=False)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    n.cleanup()


def test_shared_decisions_status_live_explain_and_stop(node: Node) -> None:
    daemon_pid = node.start()
    assert oct(node.socket.stat().st_mode & 0o777) == "0o600"
    first = node.client([WORKLOAD])
    second = node.client([WORKLOAD])
    a, b = first["decisions"][0], second["decisions"][0]
    assert a["source"] == b["source"] == "daemon"
    assert a["json"] == b["json"]  # the same decision, every field
    assert a["implementation"] == "nvidia_sm120.sparse_prefill_tuned"
    assert a["notes"] == [f"shared by the daemon at {node.socket} (decided for this process)"]
    assert b["notes"] == [f"shared by the daemon at {node.socket} "
                          f"(first asked by pid {first['pid']})"]
    stats = node.stats()
    assert (stats["selects"], stats["hits"], stats["misses"]) == (2, 1, 1)
    assert stats["pid"] == daemon_pid
    assert stats["torch_imported"] is False and stats["triton_imported"] is False

    # A client with another plugin set is refused and selects in-process, saying why.
    other = node.client([WORKLOAD], KREG_DISABLE_PLUGINS="nvidia_sm120")
    d = other["decisions"][0]
    assert d["source"] == "local"
    assert d["implementation"] == "generic.sparse_prefill_table"
    assert len(d["notes"]) == 1 and d["notes"][0].startswith(
        f"daemon at {node.socket} refused this client (plugin set ")
    assert d["notes"][0].endswith("; selected in-process")
    assert len(other["warnings"]) == 1 and "refused this client" in other["warnings"][0]
    assert node.stats()["errors"] == {"plugin_mismatch": 1}

    status = node.kreg("daemon", "status", "--socket", str(node.socket)).stdout
    assert f"kreg daemon pid {daemon_pid} on {node.socket}" in status
    assert "selects 3 (hits 1, misses 1)" in status

    env_live = ("explain", "all", "--live")
    node.env["KREG_DAEMON"] = str(node.socket)
    live = json.loads(node.kreg(*env_live, "--pid", str(second["pid"]), "--json").stdout)
    assert [(r["pid"], r["hit"], r["implementation"]) for r in live["decisions"]] == [
        (second["pid"], True, "nvidia_sm120.sparse_prefill_tuned")]
    text = node.kreg(*env_live).stdout
    assert f"{first['pid']}" in text and f"{second['pid']}" in text
    assert ("nvidia_sm120.sparse_prefill_tuned  BLOCK_M=8 BLOCK_N=16 num_warps=4 num_stages=3"
            in text)
    assert "highest priority (100)" in text

    out = node.kreg("daemon", "stop", "--socket", str(node.socket)).stdout
    assert f"kreg daemon (pid {daemon_pid}) on {node.socket} stopped" in out
    assert not node.socket.exists() and read_pid(node.socket) is None
    down = node.kreg("daemon", "status", "--socket", str(node.socket), check=False)
    assert down.returncode == 1 and "no kreg daemon answers" in down.stdout
    # The journal outlives the daemon: --live falls back to it.
    text = node.kreg(*env_live, "--pid", str(first["pid"])).stdout
    assert "from the journal" in text and str(first["pid"]) in text


def test_second_daemon_refused_kill_fallback_and_stale_socket(node: Node) -> None:
    pid = node.start()
    again = node.kreg("daemon", "start", "--socket", str(node.socket), check=False)
    assert again.returncode != 0
    assert f"a kreg daemon (pid {pid}) already serves {node.socket}" in again.stderr
    # Bypassing the CLI's check: the daemon itself refuses (the pid file's lock is held).
    direct = subprocess.run([PYTHON, "-m", "registry.daemon", "--socket", str(node.socket)],
                            env=node.env, capture_output=True, text=True, timeout=60)
    assert direct.returncode == 1
    assert f"another kreg daemon (pid {pid}) already serves {node.socket}" in direct.stderr
    assert node.stats()["pid"] == pid  # the first one is untouched

    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.02)
    assert node.socket.exists()  # a crash leaves its socket behind
    wls = [WORKLOAD, {**WORKLOAD, "total_q": 4096, "max_q": 4096},
           {**WORKLOAD, "total_q": 2048, "max_q": 2048}]
    res = node.client(wls)
    for d in res["decisions"]:
        assert d["source"] == "local"
        assert d["implementation"] == "nvidia_sm120.sparse_prefill_tuned"
        assert d["notes"] == [f"daemon at {node.socket} unreachable (ConnectionRefusedError); "
                              f"selected in-process"]
    assert len(res["warnings"]) == 1  # once, not per miss

    new_pid = node.start()  # the stale socket is cleaned up
    assert new_pid != pid
    log = (node.home / "daemon.log").read_text()
    assert f"removing stale socket {node.socket} left by a previous daemon (pid {pid})" in log
    assert node.client([WORKLOAD])["decisions"][0]["source"] == "daemon"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _as_user(uid: int, gid: int, fn: Any) -> Any:
    """Run fn() in a forked child with another uid (no exec: the interpreter may not be
    readable by that user); its JSON-able result comes back through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            payload = json.dumps({"ok": fn()})
        except BaseException as exc:
            payload = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
            code = 1
        os.write(w, payload.encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="needs root to run a client as another user (os.setuid)")
def test_client_of_another_uid_is_refused(tmp_path: Path) -> None:
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    # A directory other users may traverse (tmp_path's parents are 0700), so that the uid check,
    # not only the file mode, is what refuses them.
    base = Path(tempfile.mkdtemp(prefix="kreg-uid-", dir="/tmp"))
    base.chmod(0o755)
    node = Node(base)
    try:
        node.start()

        def ask() -> Any:
            import registry
            from registry.daemon.client import remote_select, reset_links

            os.environ["KREG_DAEMON"] = str(node.socket)
            reset_links()
            reg = registry.get_registry()
            wl = reg.workload("sparse_prefill", WORKLOAD)
            return remote_select(reg, "sparse_prefill",
                                 registry.profiles()["rtx-pro-6000-blackwell-server"], wl,
                                 None)[1]

        # The socket is 0600: the other user cannot even connect.
        res = _as_user(nobody.pw_uid, nobody.pw_gid, ask)
        assert res == {"ok": f"daemon at {node.socket} unreachable (PermissionError); "
                             f"selected in-process"}
        # Opened up (as a careless admin might): the daemon's SO_PEERCRED check refuses.
        node.socket.chmod(0o666)
        res = _as_user(nobody.pw_uid, nobody.pw_gid, ask)
        assert res["ok"].startswith(f"daemon at {node.socket} refused this client (uid "
                                    f"{nobody.pw_uid} may not use the kreg daemon of uid 0")
        stats = node.stats()
        assert stats["errors"] == {"forbidden": 1} and stats["selects"] == 0
        # Its own user is still served.
        assert node.client([WORKLOAD])["decisions"][0]["source"] == "daemon"
    finally:
        node.cleanup()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_daemon_start_imports_neither_torch_nor_triton(node: Node) -> None:
    node.home.mkdir(parents=True)
    t0 = time.monotonic()
    proc = subprocess.Popen([PYTHON, "-X", "importtime", "-m", "registry.daemon",
                             "--socket", str(node.socket)],
                            env=node.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 30
        stats = None
        while stats is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                stats = node.stats()
            except OSError:
                time.sleep(0.02)
        ready = time.monotonic() - t0
        assert stats is not None and stats["torch_imported"] is False
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    modules = {line.split("|")[-1].strip() for line in err.splitlines()
               if line.startswith("import time:")}
    assert {"registry", "registry.daemon.protocol", "asyncio"} <= modules  # it did log imports
    assert not {m for m in modules if m.split(".")[0] in ("torch", "triton")}
    # Generous: this 2-core machine is shared; importing torch alone takes longer.
    assert ready < 10, f"the daemon took {ready:.1f} s to answer"
