"""The CLI says what is wrong instead of printing a traceback (issue #24): the daemon and tuning
commands with a bad KREG_HOME, a store in the way, a socket path too long or a planted link, and
``kreg tune`` on a device where nothing can run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from test_store import make_entry

import cli
import registry
from registry.daemon.server import Daemon, lock_path, pid_path
from registry.errors import DaemonError
from registry.tuning.store import TuningEntry, TuningStore
from registry.tuning.tune import PointResult

TINY = ["--grid", "kind=prefill", "--grid", "group_size=2", "--grid", "head_dim=16",
        "--grid", "topk=24", "--grid", "kv_len=64", "--grid", "total_q=8,16",
        "--grid", "dtype=float32", "--grid", "space=tiny"]


def kreg(*args: str, **env: str) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=env)


def no_traceback(res: Result, *expected: str) -> str:
    assert res.exit_code == 1, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    for text in expected:
        assert text in res.output, res.output
    return res.output


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "not_a_dir"
    path.write_text("")
    return path


def test_daemon_start_with_a_file_as_kreg_home(a_file: Path, tmp_path: Path) -> None:
    no_traceback(kreg("daemon", "start", "--socket", str(tmp_path / "d.sock"),
                      KREG_HOME=str(a_file)),
                 "cannot write the daemon's log", "must be a writable directory")


def test_daemon_start_with_an_unwritable_kreg_home(tmp_path: Path) -> None:
    # /proc refuses new directories even to root (who may write anywhere else)
    no_traceback(kreg("daemon", "start", "--socket", str(tmp_path / "d.sock"),
                      KREG_HOME="/proc/kreg-home"), "cannot write the daemon's log")


def test_daemon_start_with_a_socket_path_too_long(tmp_path: Path) -> None:
    long = tmp_path / ("s" * 150)
    for sub in ("start", "status", "stop"):
        no_traceback(kreg("daemon", sub, "--socket", str(long)),
                     "Unix sockets allow 107: choose a shorter path")


def test_daemon_start_with_a_planted_lock_link(tmp_path: Path) -> None:
    sock = tmp_path / "d.sock"
    lock_path(sock).symlink_to(tmp_path / "elsewhere")
    out = no_traceback(kreg("daemon", "start", "--socket", str(sock),
                            KREG_HOME=str(tmp_path / "home")),
                       "it is a symbolic link, which kreg never follows")
    assert str(lock_path(sock)) in out
    assert not (tmp_path / "elsewhere").exists()


def test_the_pid_file_never_follows_a_planted_link(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    sock = tmp_path / "d.sock"
    target = tmp_path / "victim"
    target.write_text("precious\n")
    pid_path(sock).symlink_to(target)
    d = Daemon(sock)
    with pytest.raises(DaemonError, match=r"pid file .* is a symbolic link"):
        d._acquire()
    assert target.read_text() == "precious\n"
    assert d._lock is None  # released: a later start is not refused as 'already running'
    pid_path(sock).unlink()
    d._acquire()
    try:
        assert pid_path(sock).read_text() == f"{os.getpid()}\n"
        assert not pid_path(sock).is_symlink()
    finally:
        d._release()


def test_a_stale_pid_file_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    sock = tmp_path / "d.sock"
    pid_path(sock).write_text("999999\n")
    d = Daemon(sock)
    d._acquire()
    try:
        assert pid_path(sock).read_text() == f"{os.getpid()}\n"
    finally:
        d._release()


# -- tune and tuning ---------------------------------------------------------------------------


def test_tune_with_a_file_as_kreg_home(a_file: Path) -> None:
    no_traceback(kreg("tune", "sparse_prefill", *TINY, KREG_HOME=str(a_file)),
                 "StoreError", "set KREG_HOME to one")


def test_tune_with_an_unwritable_kreg_home() -> None:
    no_traceback(kreg("tune", "sparse_prefill", *TINY, KREG_HOME="/proc/kreg-home"),
                 "StoreError: Cannot create the store directory")


@pytest.fixture
def cpu_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> Any:
    facts = registry.probe()
    bare = facts.what_if(vendor="cpu", arch="cpu", extra={})
    monkeypatch.setattr(registry, "probe", lambda: bare)
    return bare


@pytest.mark.parametrize("dry", [True, False])
def test_tune_where_nothing_can_run_says_so_up_front(cpu_without_interpreter: Any,
                                                     tmp_path: Path, dry: bool) -> None:
    args = ["tune", "sparse_prefill", *TINY] + (["--dry-run"] if dry else [])
    out = no_traceback(kreg(*args, KREG_HOME=str(tmp_path)),
                       "no candidate of sparse_prefill can run on",
                       "cpu without TRITON_INTERPRET=1", "nothing to measure")
    assert "points" not in out.split("nothing to measure")[1]  # nothing listed or measured
    assert not (tmp_path / "tuning.json").exists()


def test_tune_exits_non_zero_when_some_points_measure_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from registry.tuning import tune as tune_mod

    def only_small(op: str, bucket: Any, facts: Any) -> str | None:
        return "too big for this test" if bucket["total_q"] > 8 else None

    monkeypatch.setattr(tune_mod, "cannot_run_here", only_small)
    res = kreg("tune", "sparse_prefill", *TINY, "--dry-run", KREG_HOME=str(tmp_path))
    out = no_traceback(res, "1 of 2 points cannot run here", "cannot run here (too big",
                       "1 of 2 points measured nothing")
    assert ": dry-run" in out


def test_tuning_list_with_a_directory_as_the_store(tmp_path: Path) -> None:
    (tmp_path / "tuning.json").mkdir()
    no_traceback(kreg("tuning", "list", KREG_HOME=str(tmp_path)),
                 "it is a directory, not a regular file")


def test_tuning_list_of_a_newer_store_neither_moves_nor_calls_it_corrupt(tmp_path: Path) -> None:
    raw = json.dumps({"schema_version": 99, "written_by": "0.7.0"})
    (tmp_path / "tuning.json").write_text(raw)
    for args in (["tuning", "list"], ["tuning", "show", "0"], ["tuning", "clear", "--yes"]):
        out = no_traceback(kreg(*args, KREG_HOME=str(tmp_path)),
                           "schema version 99, written by kreg 0.7.0", "not corrupt")
        assert "corrupt-" not in out
    assert (tmp_path / "tuning.json").read_text() == raw
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == ["tuning.json"]


def test_tuning_list_prints_labelled_configs_for_both_ops(tmp_path: Path) -> None:
    indexer = make_entry(op="indexer_topk", family="generic.indexer_topk_radix")
    indexer = TuningEntry.model_validate({
        **indexer.model_dump(), "bucket": {"k": 2048, "num_rows": 64, "max_keys": 8192,
                                           "dtype": "float32"},
        "config": {"SLICE_KEYS": 64, "GROUP": 16, "num_warps": 4, "FUSED": 0}})
    TuningStore(tmp_path / "tuning.json").put([make_entry(), indexer])
    res = kreg("tuning", "list", KREG_HOME=str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "-> BLOCK_M=16 BLOCK_N=16 num_warps=1 num_stages=2" in res.output
    assert "-> num_warps=4 FUSED=0 GROUP=16 SLICE_KEYS=64" in res.output


def test_plot_panels_join_the_points_of_one_shape() -> None:
    from registry.tuning.cli import _panels
    from registry.tuning.measure import Measurement

    def point(total_q: int, kv_len: int) -> PointResult:
        bucket = {"kind": "prefill", "topk": 24, "total_q": total_q, "max_q": total_q,
                  "num_requests": 1, "kv_len": kv_len}
        m = Measurement(label="a", runs="a", status="ok", ms=0.1 * total_q)
        return PointResult(label=str(total_q), bucket=bucket, status="measured",
                           timings={"a": m})

    panels = _panels([point(8, 64), point(16, 64), point(32, 64), point(8, 96), point(16, 96)],
                     "total_q")
    assert sorted(panels) == ["kind=prefill topk=24 num_requests=1 kv_len=64",
                              "kind=prefill topk=24 num_requests=1 kv_len=96"]
    assert [p for p, _ in panels["kind=prefill topk=24 num_requests=1 kv_len=64"]["a"]] == [
        8, 16, 32]
