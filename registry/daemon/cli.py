"""``kreg daemon start|status|stop`` and ``kreg explain --live``."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from registry._format import format_config
from registry.daemon.client import DaemonClient, DaemonUntrusted
from registry.daemon.protocol import resolve_socket
from registry.errors import DaemonError, KregError

__all__ = ["daemon", "show_live", "spawn_daemon", "stop_daemon"]

START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0


def _socket(value: str | None) -> Path:
    from registry._knobs import knobs

    return resolve_socket(value if value is not None else knobs.daemon)


def _checked_socket(value: str | None) -> Path:
    try:
        return _socket(value)
    except KregError as exc:
        raise click.ClickException(str(exc)) from None


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting for a parent that never reaps it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def daemon_stats(path: Path, timeout: float = 1.0) -> dict[str, Any] | None:
    """The running daemon's counters at ``path``, or None when none answers. Raises
    DaemonUntrusted when the process serving ``path`` is another user's."""
    try:
        with DaemonClient(path, timeout) as client:
            return client.stats()
    except DaemonUntrusted:
        raise
    except (OSError, ValueError, DaemonError):
        return None


def spawn_daemon(path: Path, timeout: float = START_TIMEOUT) -> int:
    """Start a daemon in a new session, detached from this terminal; return its pid once the
    socket answers. Raises DaemonError with the daemon's own message when it does not start."""
    from registry._knobs import knobs

    running = daemon_stats(path)
    if running is not None:
        raise DaemonError(f"a kreg daemon (pid {running['pid']}) already serves {path}; "
                          f"`kreg daemon stop --socket {path}` stops it")
    home = knobs.home
    log_path = home / "daemon.log"
    try:
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                     | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise DaemonError(f"cannot write the daemon's log {log_path}: {exc.strerror or exc} "
                          f"({type(exc).__name__}); KREG_HOME ({home}) must be a writable "
                          f"directory: set KREG_HOME to one") from None
    offset = os.lseek(fd, 0, os.SEEK_END)
    try:
        # A new session (no controlling terminal, own process group) and cwd "/" so the daemon
        # neither dies with the shell nor pins a mount; the child is re-parented once we exit.
        # It rotates the log it inherits as stderr (--log): daemon.log stays bounded.
        proc = subprocess.Popen(
            [sys.executable, "-m", "registry.daemon", "--socket", str(path), "--log",
             str(log_path)],
            stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
            close_fds=True, cwd="/", env={**os.environ, "PYTHONPATH": _pythonpath()})
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DaemonError(_log_tail(log_path, offset) or
                              f"the daemon exited with status {proc.returncode}")
        stats = daemon_stats(path, 0.5)
        if stats is not None and stats["pid"] == proc.pid:
            return proc.pid
        time.sleep(0.02)
    proc.terminate()
    raise DaemonError(f"the daemon did not answer on {path} within {timeout:g} s; see {log_path}")


def _pythonpath() -> str:
    # The daemon runs from "/": keep the directory this package was imported from importable
    # (a source checkout that is not installed).
    here = str(Path(__file__).resolve().parent.parent)
    old = os.environ.get("PYTHONPATH")
    return here if not old else here + os.pathsep + old


def _log_tail(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace").strip()
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.startswith("kreg daemon:")]
    return lines[-1].removeprefix("kreg daemon: ") if lines else text[-2000:]


def stop_daemon(path: Path, timeout: float = STOP_TIMEOUT) -> int | None:
    """Ask the daemon on ``path`` to stop and wait until it is gone; its pid, or None when none
    ran. A daemon that holds the lock but does not answer is sent SIGTERM."""
    import signal

    from registry.daemon.server import read_pid

    pid: int | None = None
    try:
        with DaemonClient(path, 2.0) as client:
            pid = int(client.shutdown()["pid"])
    except DaemonUntrusted:
        raise  # another user's: neither asked to stop nor signalled
    except (OSError, ValueError, DaemonError):
        pid = read_pid(path)
        if pid is None or not _alive(pid):
            return None
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return pid
        time.sleep(0.02)
    raise DaemonError(f"the daemon (pid {pid}) on {path} did not stop within {timeout:g} s")


_SOCKET = click.option("--socket", "socket_path", default=None, metavar="PATH",
                       help="Socket path (default: KREG_DAEMON if a path, else "
                            "$XDG_RUNTIME_DIR/kreg/daemon.sock or $KREG_HOME/run/daemon.sock).")


@click.group()
def daemon() -> None:
    """The node-local dispatch daemon: shared decisions, the journal, explain --live."""


@daemon.command()
@_SOCKET
@click.option("--foreground", is_flag=True, help="Serve in this process (logs to stderr).")
def start(socket_path: str | None, foreground: bool) -> None:
    """Start the daemon; returns once its socket answers."""
    from registry._knobs import knobs

    try:
        path = _socket(socket_path)
        if foreground:
            from registry.daemon.server import main

            sys.exit(main(["--socket", str(path)]))
        pid = spawn_daemon(path)
    except KregError as exc:  # DaemonError, or ConfigError for a socket path too long
        raise click.ClickException(str(exc)) from None
    click.echo(f"kreg daemon started (pid {pid}) on {path}; log {knobs.home / 'daemon.log'}")


@daemon.command()
@_SOCKET
@click.option("--json", "as_json", is_flag=True)
def status(socket_path: str | None, as_json: bool) -> None:
    """Whether a daemon answers, and its counters (exit status 1 when none does)."""
    path = _checked_socket(socket_path)
    try:
        stats = daemon_stats(path)
    except DaemonUntrusted as exc:
        raise click.ClickException(str(exc)) from None
    if stats is None:
        if as_json:
            click.echo(json.dumps({"running": False, "socket": str(path)}))
        else:
            click.echo(f"no kreg daemon answers on {path}")
        sys.exit(1)
    if as_json:
        click.echo(json.dumps({"running": True, **stats}, indent=2))
        return
    errors = ", ".join(f"{k} {v}" for k, v in sorted(stats["errors"].items())) or "none"
    click.echo(f"kreg daemon pid {stats['pid']} on {stats['socket']}, up "
               f"{stats['uptime_s']:.0f} s, protocol v{stats['protocol']}, plugins "
               f"{stats['plugins']}")
    click.echo(f"  selects {stats['selects']} (hits {stats['hits']}, misses {stats['misses']}), "
               f"cache {stats['cache_entries']} decisions, connections "
               f"{stats['connections_open']} open / {stats['connections_total']} total")
    click.echo(f"  errors: {errors}")
    click.echo(f"  rss {stats['rss_bytes'] / 2**20:.1f} MiB, torch imported: "
               f"{stats['torch_imported']}, journal {stats['journal']}")


@daemon.command()
@_SOCKET
def stop(socket_path: str | None) -> None:
    """Stop the daemon and wait until it has exited."""
    path = _checked_socket(socket_path)
    try:
        pid = stop_daemon(path)
    except DaemonError as exc:
        raise click.ClickException(str(exc)) from None
    if pid is None:
        click.echo(f"no kreg daemon runs on {path}")
    else:
        click.echo(f"kreg daemon (pid {pid}) on {path} stopped")


def show_live(op: str | None = None, pid: int | None = None, as_json: bool = False,
              socket_path: str | None = None, limit: int = 200) -> None:
    """``kreg explain --live``: recent decisions of the node's processes, from the daemon, or from
    its journal when it is not running."""
    from registry.daemon.journal import read_journal
    from registry.daemon.server import journal_path_for

    path = _socket(socket_path)
    source = f"daemon on {path}"
    try:
        with DaemonClient(path, 2.0) as client:
            records = client.explain(pid=pid, op=op, limit=limit)
    except (OSError, ValueError, DaemonError):
        jpath = journal_path_for(path)
        source = f"journal {jpath} (no daemon answers on {path})"
        records = [r for r in read_journal(jpath)
                   if (pid is None or r.get("pid") == pid) and (op is None or r.get("op") == op)]
        records = records[-limit:]
    if as_json:
        click.echo(json.dumps({"source": source, "decisions": records}, indent=2))
        return
    if not records:
        click.echo(f"no recent decisions (from the {source})")
        return
    click.echo(f"recent decisions (from the {source}), oldest first:")
    # The workload tells two decisions of one op apart.
    rows = [(str(r.get("pid")), _time(r.get("t")), str(r.get("op")),
             str(r.get("implementation")), format_config(r.get("config")),
             str(r.get("workload") or "-"),
             ("shared " if r.get("hit") else "new    ") + str(r.get("reason", "")))
            for r in records]
    head = ("pid", "time", "op", "implementation", "config", "workload", "reason")
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head[:-1])]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    click.echo(fmt.format(*head))
    for row in rows:
        click.echo(fmt.format(*row))


def _time(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]

