"""The tuning store under hostile files and newer writers (issue #24)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import filelock
import pytest
from test_store import make_entry

import registry
from registry.errors import StoreError
from registry.tuning.store import SCHEMA_VERSION, TuningStore, load_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> TuningStore:
    return TuningStore(tmp_path / "home" / "tuning.json")


def _newer(store: TuningStore, **extra: object) -> bytes:
    store.path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps({"schema_version": 99, "format": "something else", **extra}).encode()
    store.path.write_bytes(raw)
    return raw


def test_a_fifo_in_place_of_the_store_is_refused_without_blocking(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.mkfifo(home / "tuning.json")
    code = ("import registry\n"
            "from registry.tuning.store import TuningStore\n"
            "try:\n"
            "    TuningStore().load()\n"
            "except registry.errors.StoreError as exc:\n"
            "    print('refused:', exc)\n"
            "reg = registry.get_registry()\n"
            "print('measured:', reg.plugins['measured'].error)\n"
            "print('chose', registry.select('indexer_topk', dict(k=4, num_rows=64, max_keys=8, "
            "dtype='float32'), 'h200').implementation)\n")
    env = {**os.environ, "KREG_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # before: hung on open()
    assert proc.returncode == 0, proc.stderr
    assert "is a FIFO (named pipe), not a regular file" in proc.stdout
    assert "measured: plugin 'measured' hook kreg_implementations raised StoreError" in proc.stdout
    assert "chose generic." in proc.stdout


def test_a_directory_in_place_of_the_store_is_a_store_error(store: TuningStore) -> None:
    store.path.mkdir(parents=True)
    with pytest.raises(StoreError, match="it is a directory, not a regular file"):
        store.load()


def test_a_newer_store_is_neither_served_nor_moved_nor_written(store: TuningStore) -> None:
    raw = _newer(store, written_by="0.9.0")
    with pytest.raises(StoreError) as info:
        store.load()
    msg = str(info.value)
    assert "schema version 99, written by kreg 0.9.0; this kreg reads version 1" in msg
    assert "not corrupt" in msg and "corrupt-" not in msg
    with pytest.raises(StoreError, match="schema version 99"):
        store.put([make_entry()])
    with pytest.raises(StoreError, match="schema version 99"):
        store.clear()
    assert store.path.read_bytes() == raw
    assert not list(store.path.parent.glob("tuning.json.corrupt-*"))


def test_a_newer_store_without_a_writer_says_a_newer_kreg(store: TuningStore) -> None:
    _newer(store)
    with pytest.raises(StoreError, match="schema version 99, written by a newer kreg"):
        store.load()


def test_a_newer_table_is_refused_on_import(store: TuningStore, tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(StoreError, match="upgrade kreg to import it"):
        load_table(table)


def test_a_corrupt_store_in_a_read_only_home_says_corrupt(
        store: TuningStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(b"{ not json")

    def read_only(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")  # what a read-only KREG_HOME gives

    monkeypatch.setattr(filelock.FileLock, "acquire", read_only)
    with pytest.raises(StoreError) as info:
        store.load()
    msg = str(info.value)
    assert msg.startswith(f"tuning store {store.path} is corrupt (not valid JSON")
    assert "Cannot lock" not in msg
    assert "move or delete it by hand" in msg and "Permission denied" in msg
    assert store.path.read_bytes() == b"{ not json"


def test_temporary_files_of_killed_writers_are_removed_on_the_next_write(
        store: TuningStore) -> None:
    store.put([make_entry(1)])
    left = [store.path.with_name(f".tuning.json.{tag}.tmp") for tag in ("k1ll3d00", "x_y_z_42")]
    for p in left:
        p.write_bytes(b"half a document")
    other = store.path.with_name(".table.json.abcdefgh.tmp")  # not this store's
    other.write_bytes(b"")
    store.put([make_entry(2)])
    assert not any(p.exists() for p in left)
    assert other.exists()
    assert len(store.load()) == 2


def test_the_identity_follows_the_entries_not_the_layout(store: TuningStore,
                                                         tmp_path: Path) -> None:
    from registry.tuning.store import store_identity

    empty = store_identity(store.path)
    store.put([make_entry(1), make_entry(2)])
    one = store_identity(store.path)
    assert one != empty
    other = TuningStore(tmp_path / "other" / "tuning.json")
    other.put([make_entry(2), make_entry(1)])
    assert store_identity(other.path) == one
    store.clear()
    assert store_identity(store.path) == empty == store_identity(tmp_path / "none.json")


def test_the_plugin_fingerprint_covers_the_store_the_registry_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREG_HOME", str(tmp_path))
    before = registry.Registry()
    assert "tuning" in before.build_state
    TuningStore().put([make_entry()])
    after = registry.Registry()
    assert after.build_state["tuning"] != before.build_state["tuning"]
    assert after.plugin_fingerprint() != before.plugin_fingerprint()
    assert registry.Registry().plugin_fingerprint() == after.plugin_fingerprint()
