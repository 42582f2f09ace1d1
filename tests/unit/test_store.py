"""The tuning store: round trips, upserts, lookups, corruption handling, tables, OS errors."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from registry.errors import StoreError
from registry.tuning.store import (
    SCHEMA_VERSION,
    DeviceIdentity,
    Software,
    TuningEntry,
    TuningStore,
    load_table,
)

H200 = DeviceIdentity(name="NVIDIA H200", arch="sm_90", sm_count=132)
SW = Software(torch="2.9.0", triton="3.6.0", runtime="12.8")

BUCKET: dict[str, int | str | float] = {
    "kind": "chunk", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
    "dtype": "bfloat16", "total_q": 8192}


def make_entry(total_q: int = 8192, *, op: str = "sparse_prefill",
               family: str = "generic.sparse_prefill_table", device: DeviceIdentity = H200,
               software: Software = SW, block_m: int = 16) -> TuningEntry:
    return TuningEntry(
        op=op, family=family, device=device, software=software,
        bucket={**BUCKET, "total_q": total_q},
        config={"BLOCK_M": block_m, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2},
        timings_ms={f"{block_m}x16x1x2": 0.61, "16x32x4x2": 0.75},
        command="kreg tune sparse_prefill --total-q 8192",
        measured_at="2025-11-29T11:00:00+00:00",
    )


def independent_checksum(doc: dict[str, Any]) -> str:
    # Re-derived here rather than imported, so a bug in the store's own hashing cannot hide.
    canon = json.dumps(doc["entries"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def assert_valid_file(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text("utf-8"))
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["checksum"] == independent_checksum(doc)
    return doc


@pytest.fixture
def store(tmp_path: Path) -> TuningStore:
    return TuningStore(tmp_path / "home" / "tuning.json")


# -- models -------------------------------------------------------------------------------------


def test_entries_are_frozen() -> None:
    entry = make_entry()
    with pytest.raises(ValidationError):
        entry.op = "other"  # type: ignore[misc]


def test_key_ignores_bucket_order_and_result_but_not_identity() -> None:
    a = make_entry()
    reordered = a.model_copy(update={"bucket": dict(reversed(list(a.bucket.items())))})
    assert reordered.key() == a.key()
    assert make_entry(block_m=32).key() == a.key()  # the result is not part of the key
    others = [
        make_entry(total_q=4096),
        make_entry(op="indexer_topk"),
        make_entry(family="nvidia_hopper.sparse_prefill_tuned"),
        make_entry(device=H200.model_copy(update={"sm_count": 114})),
        make_entry(software=SW.model_copy(update={"triton": "3.7.1"})),
    ]
    assert len({a.key(), *(o.key() for o in others)}) == 1 + len(others)


@pytest.mark.parametrize("measured_at", ["yesterday", "2025-11-29T11:00:00",
                                         "2025-11-29T11:00:00+02:00"])
def test_measured_at_must_be_iso_utc(measured_at: str) -> None:
    with pytest.raises(ValidationError, match="measured_at"):
        TuningEntry.model_validate({**make_entry().model_dump(), "measured_at": measured_at})


def test_measured_at_defaults_to_now_utc_and_accepts_z() -> None:
    data = make_entry().model_dump()
    del data["measured_at"]
    assert TuningEntry.model_validate(data).measured_at.endswith("+00:00")
    assert TuningEntry.model_validate({**data, "measured_at": "2025-11-29T11:00:00Z"})


@pytest.mark.parametrize("ms", [float("inf"), float("nan"), -1.0])
def test_timings_must_be_finite(ms: float) -> None:
    with pytest.raises(ValidationError, match="finite"):
        TuningEntry.model_validate({**make_entry().model_dump(), "timings_ms": {"a": ms}})


# -- round trips and upserts --------------------------------------------------------------------


def test_missing_file_is_empty_store(store: TuningStore) -> None:
    assert store.load() == []
    assert store.fingerprint() == "missing"
    assert not store.path.exists()


def test_round_trip_through_a_fresh_instance(store: TuningStore) -> None:
    entries = [make_entry(q) for q in (128, 512, 8192)]
    store.put(entries)
    loaded = TuningStore(store.path).load()
    assert sorted(loaded, key=TuningEntry.key) == sorted(entries, key=TuningEntry.key)
    doc = assert_valid_file(store.path)
    assert len(doc["entries"]) == 3


def test_default_path_is_under_kreg_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "kh"))
    store = TuningStore()
    assert store.path == tmp_path / "kh" / "tuning.json"
    store.put([make_entry()])
    assert (tmp_path / "kh" / "tuning.json").is_file()
    assert (tmp_path / "kh" / "tuning.json.lock").exists()


def test_put_upserts_by_key(store: TuningStore) -> None:
    store.put([make_entry(block_m=16), make_entry(total_q=64)])
    store.put([make_entry(block_m=32)])
    loaded = {e.key(): e for e in store.load()}
    assert len(loaded) == 2
    assert loaded[make_entry().key()].config["BLOCK_M"] == 32
    assert loaded[make_entry(total_q=64).key()].config["BLOCK_M"] == 16


def test_put_last_of_duplicates_in_one_call_wins(store: TuningStore) -> None:
    store.put([make_entry(block_m=16), make_entry(block_m=64)])
    [only] = store.load()
    assert only.config["BLOCK_M"] == 64


def test_put_rejects_non_entries(store: TuningStore) -> None:
    with pytest.raises(TypeError, match="TuningEntry"):
        store.put([make_entry().model_dump()])  # type: ignore[list-item]
    assert not store.path.exists()


def test_remove_and_clear_count(store: TuningStore) -> None:
    store.put([make_entry(q) for q in (1, 2, 3, 4)])
    assert store.remove(lambda e: e.bucket["total_q"] in (1, 2)) == 2
    assert sorted(e.bucket["total_q"] for e in store.load()) == [3, 4]
    assert store.remove(lambda e: False) == 0
    assert store.clear() == 2
    assert store.load() == []
    assert_valid_file(store.path)


def test_writes_leave_no_temporary_files(store: TuningStore) -> None:
    for q in range(5):
        store.put([make_entry(q)])
    names = sorted(p.name for p in store.path.parent.iterdir())
    assert names == ["tuning.json", "tuning.json.lock"]


def test_fingerprint_changes_on_every_write(store: TuningStore) -> None:
    seen = {store.fingerprint()}
    for q in range(5):
        store.put([make_entry(q, block_m=16)])
        fp = store.fingerprint()
        assert fp == store.fingerprint()
        seen.add(fp)
    assert len(seen) == 6


def test_load_sees_writes_of_another_instance(store: TuningStore) -> None:
    store.put([make_entry(1)])
    assert len(store.load()) == 1  # warms the cache
    TuningStore(store.path).put([make_entry(2)])
    assert len(store.load()) == 2


def test_loaded_list_is_a_copy(store: TuningStore) -> None:
    store.put([make_entry()])
    store.load().clear()
    assert len(store.load()) == 1


def test_load_sees_an_upsert_by_another_instance(store: TuningStore) -> None:
    store.put([make_entry(block_m=16)])
    assert store.load()[0].config["BLOCK_M"] == 16
    TuningStore(store.path).put([make_entry(block_m=64)])
    [entry] = store.load()
    assert entry.config["BLOCK_M"] == 64


def test_file_has_one_sorted_entry_per_line(store: TuningStore) -> None:
    store.put([make_entry(q) for q in (3, 1, 2)])
    lines = store.path.read_text("utf-8").split("\n")
    assert lines[-2:] == ["]}", ""]
    body = [line.rstrip(",") for line in lines[1:-2]]
    keys = [TuningEntry.model_validate_json(line).key() for line in body]
    assert len(keys) == 3
    assert keys == sorted(keys)


def test_a_document_in_another_layout_is_read_and_rewritten(store: TuningStore,
                                                           tmp_path: Path) -> None:
    # A vendor may produce a table by other means; any JSON layout with the right checksum is
    # valid, and the next write brings it back to the writer's layout.
    doc = json.loads(_valid_bytes(tmp_path))
    store.path.parent.mkdir(parents=True)
    store.path.write_text(json.dumps(doc, indent=2, sort_keys=False), "utf-8")
    assert len(store.load()) == 2
    store.put([make_entry(3)])
    assert len(TuningStore(store.path).load()) == 3
    assert store.path.read_text("utf-8").startswith('{"schema_version": 1, "checksum": "')
    assert_valid_file(store.path)


bucket_values = st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=8),
                          st.floats(allow_nan=False, allow_infinity=False))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bucket=st.dictionaries(st.text(min_size=1, max_size=8), bucket_values, max_size=6),
       config=st.dictionaries(st.text(min_size=1, max_size=8),
                              st.one_of(st.integers(-1000, 1000), st.text(max_size=8)), max_size=4),
       timings=st.dictionaries(st.text(min_size=1, max_size=12),
                               st.floats(0, 1e6, allow_nan=False), max_size=4))
def test_any_entry_round_trips_with_a_stable_key(
        tmp_path_factory: pytest.TempPathFactory, bucket: dict[str, int | str | float],
        config: dict[str, int | str], timings: dict[str, float]) -> None:
    entry = TuningEntry(op="op", family="fam.impl", device=H200, software=SW, bucket=bucket,
                        config=config, timings_ms=timings, command="kreg tune ünïcode")
    store = TuningStore(tmp_path_factory.mktemp("prop") / "tuning.json")
    store.put([entry])
    [loaded] = TuningStore(store.path).load()
    assert loaded == entry
    assert loaded.key() == entry.key()
    assert_valid_file(store.path)


# -- lookup -------------------------------------------------------------------------------------


def test_lookup_matches_exact_device_and_software(store: TuningStore) -> None:
    store.put([make_entry(), make_entry(op="indexer_topk")])
    matches, mismatches = store.lookup("sparse_prefill", H200, SW)
    assert [e.op for e in matches] == ["sparse_prefill"]
    assert mismatches == []
    assert store.lookup("unknown_op", H200, SW) == ([], [])


@pytest.mark.parametrize(("running_device", "running_sw", "reason"), [
    (H200, SW.model_copy(update={"triton": "3.7.1"}), "measured with triton 3.6.0, running 3.7.1"),
    (H200, SW.model_copy(update={"triton": None}),
     "measured with triton 3.6.0, running without triton"),
    (H200, SW.model_copy(update={"torch": "2.10.0"}), "measured with torch 2.9.0, running 2.10.0"),
    (H200, SW.model_copy(update={"runtime": "13.0"}), "measured with runtime 12.8, running 13.0"),
    (H200.model_copy(update={"sm_count": 114}), SW, "measured with sm_count 132, running 114"),
    (H200.model_copy(update={"name": "NVIDIA H20"}), SW,
     "measured on 'NVIDIA H200', running on 'NVIDIA H20'"),
    (H200.model_copy(update={"arch": "sm_100"}), SW, "measured on arch sm_90, running sm_100"),
])
def test_lookup_mismatch_reasons(store: TuningStore, running_device: DeviceIdentity,
                                 running_sw: Software, reason: str) -> None:
    store.put([make_entry()])
    matches, mismatches = store.lookup("sparse_prefill", running_device, running_sw)
    assert matches == []
    assert len(mismatches) == 1
    assert mismatches[0].entry == make_entry()
    assert mismatches[0].reason == reason


def test_lookup_reports_every_reason_and_splits_entries(store: TuningStore) -> None:
    here = DeviceIdentity(name="NVIDIA H20", arch="sm_90", sm_count=78)
    new_sw = SW.model_copy(update={"triton": "3.7.1"})
    store.put([make_entry(), make_entry(device=here, software=new_sw)])
    matches, mismatches = store.lookup("sparse_prefill", here, new_sw)
    assert [m.device for m in matches] == [here]
    [mismatch] = mismatches
    assert mismatch.reason == ("measured on 'NVIDIA H200', running on 'NVIDIA H20'; "
                               "measured with sm_count 132, running 78; "
                               "measured with triton 3.6.0, running 3.7.1")


def test_software_none_matches_none(store: TuningStore) -> None:
    cpu_sw = Software(torch="2.9.0", triton=None, runtime=None)
    store.put([make_entry(software=cpu_sw)])
    matches, _ = store.lookup("sparse_prefill", H200, cpu_sw)
    assert len(matches) == 1
    _, [mismatch] = store.lookup("sparse_prefill", H200, SW)
    assert "measured without triton, running 3.6.0" in mismatch.reason


# -- corruption ---------------------------------------------------------------------------------


def _valid_bytes(tmp_path: Path) -> bytes:
    scratch = TuningStore(tmp_path / "scratch" / "tuning.json")
    scratch.put([make_entry(1), make_entry(2)])
    return scratch.path.read_bytes()


def _tamper_checksum(raw: bytes) -> bytes:
    doc = json.loads(raw)
    doc["entries"][0]["config"]["BLOCK_M"] = 128
    return json.dumps(doc).encode()


def _wrong_version(raw: bytes) -> bytes:
    # A version no kreg wrote (a newer one is not corrupt: see test_store_hardening.py).
    doc = json.loads(raw)
    doc["schema_version"] = 0
    return json.dumps(doc).encode()


def _missing_field(raw: bytes) -> bytes:
    # A consistent checksum, so only field validation can catch it.
    doc = json.loads(raw)
    del doc["entries"][0]["command"]
    doc["checksum"] = independent_checksum(doc)
    return json.dumps(doc).encode()


def _duplicate_entry(raw: bytes) -> bytes:
    doc = json.loads(raw)
    doc["entries"].append(doc["entries"][0])
    doc["checksum"] = independent_checksum(doc)
    return json.dumps(doc).encode()


CORRUPTIONS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "truncated": (lambda raw: raw[: len(raw) // 2], "not valid JSON"),
    "empty": (lambda raw: b"", "not valid JSON"),
    "bad checksum": (_tamper_checksum, "checksum mismatch"),
    "wrong schema version": (_wrong_version, "schema version"),
    "missing field": (_missing_field, "entry 0 is malformed: command"),
    "duplicate key": (_duplicate_entry, "same key"),
    "not an object": (lambda raw: b"[]", "top level"),
    "no checksum": (lambda raw: json.dumps({"schema_version": 1, "entries": []}).encode(),
                    "missing field(s) checksum"),
    "binary": (lambda raw: b"\xff\xfe\x00garbage", "not UTF-8"),
}


def _edit_in_place(raw: bytes) -> bytes:
    # Keeps the writer's one-entry-per-line layout, so only the checksum can catch it.
    edited = raw.replace(b'"BLOCK_M":16', b'"BLOCK_M":32', 1)
    assert edited != raw
    return edited


def _flip_checksum_digit(raw: bytes) -> bytes:
    doc = json.loads(raw)
    good = doc["checksum"]
    bad = ("0" if good[0] != "0" else "1") + good[1:]
    return raw.replace(good.encode(), bad.encode())


def _own_layout(raw_entries: list[str], checksum: str) -> bytes:
    # The writer's layout, rebuilt here to feed the reader lines the writer would never produce.
    body = ",\n".join(raw_entries)
    return (f'{{"schema_version": {SCHEMA_VERSION}, "checksum": "{checksum}", "entries": [\n'
            f"{body}\n]}}\n").encode()


def _own_layout_missing_field(raw: bytes) -> bytes:
    doc = json.loads(raw)
    del doc["entries"][0]["command"]
    lines = [json.dumps(e, sort_keys=True, separators=(",", ":")) for e in doc["entries"]]
    return _own_layout(lines, independent_checksum(doc))


def _own_layout_not_canonical(raw: bytes) -> bytes:
    # The checksum matches the text of the lines, but the lines are not canonical JSON, so it
    # is not the checksum the format defines.
    lines = [json.dumps(e) for e in json.loads(raw)["entries"]]
    text = "[" + ",".join(lines) + "]"
    return _own_layout(lines, hashlib.sha256(text.encode()).hexdigest())


CORRUPTIONS.update({
    "edited in place": (_edit_in_place, "checksum mismatch"),
    "checksum digit flipped": (_flip_checksum_digit, "checksum mismatch"),
    "own layout, missing field": (_own_layout_missing_field, "entry 0 is malformed: command"),
    "own layout, checksum of non-canonical text": (_own_layout_not_canonical,
                                                    "checksum mismatch"),
})


def _quarantined(store: TuningStore) -> list[Path]:
    return sorted(store.path.parent.glob("tuning.json.corrupt-*"))


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_file_is_set_aside_on_load(store: TuningStore, tmp_path: Path, kind: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    corrupt, problem = CORRUPTIONS[kind]
    bad = corrupt(_valid_bytes(tmp_path))
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(bad)

    with caplog.at_level(logging.WARNING, logger="registry.tuning.store"):
        assert store.load() == []

    [aside] = _quarantined(store)
    assert aside.read_bytes() == bad
    stamp = r"\d{8}T\d{6}\.\d{6}Z"
    assert re.fullmatch(rf"tuning\.json\.corrupt-{stamp}-{os.getpid()}", aside.name)
    assert not store.path.exists()
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert str(store.path) in record.getMessage()
    assert str(aside) in record.getMessage()
    assert problem in record.getMessage()

    store.put([make_entry(99)])
    doc = assert_valid_file(store.path)
    assert [e["bucket"]["total_q"] for e in doc["entries"]] == [99]
    assert aside.read_bytes() == bad  # the fresh file did not touch the corrupt copy
    assert len(_quarantined(store)) == 1


@pytest.mark.parametrize("kind", ["truncated", "bad checksum", "wrong schema version"])
def test_put_sets_a_corrupt_file_aside_before_writing(store: TuningStore, tmp_path: Path,
                                                      kind: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    bad = CORRUPTIONS[kind][0](_valid_bytes(tmp_path))
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(bad)

    with caplog.at_level(logging.WARNING, logger="registry.tuning.store"):
        store.put([make_entry(7)])

    [aside] = _quarantined(store)
    assert aside.read_bytes() == bad
    assert any(str(aside) in r.getMessage() for r in caplog.records)
    assert [e.bucket["total_q"] for e in store.load()] == [7]  # nothing of the bad file merged


def test_remove_on_corrupt_file_sets_it_aside_and_removes_nothing(store: TuningStore,
                                                                  tmp_path: Path) -> None:
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(b"{")
    assert store.remove(lambda e: True) == 0
    assert len(_quarantined(store)) == 1


def test_corruption_after_a_good_read_is_noticed(store: TuningStore) -> None:
    store.put([make_entry()])
    assert len(store.load()) == 1
    raw = store.path.read_bytes()
    store.path.write_bytes(raw[:-20])  # changes size, so the cached parse is not reused
    assert store.load() == []
    assert len(_quarantined(store)) == 1


def test_failed_quarantine_raises_and_keeps_the_file(store: TuningStore,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(b"{")

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "rename", refuse)
    with pytest.raises(StoreError, match="set aside corrupt tuning file") as info:
        store.put([make_entry()])
    assert str(store.path) in str(info.value)
    assert store.path.read_bytes() == b"{"


# -- tables -------------------------------------------------------------------------------------


def test_export_then_import_into_an_empty_store(store: TuningStore, tmp_path: Path) -> None:
    entries = [make_entry(q) for q in (16, 256)] + [make_entry(op="indexer_topk")]
    store.put(entries)
    table = tmp_path / "vendor" / "table.json"
    assert store.export_table(table) == 3
    assert_valid_file(table)
    assert sorted(load_table(table), key=TuningEntry.key) == sorted(entries, key=TuningEntry.key)

    other = TuningStore(tmp_path / "other" / "tuning.json")
    assert other.import_table(table) == 3
    assert sorted(other.load(), key=TuningEntry.key) == sorted(entries, key=TuningEntry.key)


def test_export_filters_by_op(store: TuningStore, tmp_path: Path) -> None:
    store.put([make_entry(16), make_entry(op="indexer_topk")])
    table = tmp_path / "t.json"
    assert store.export_table(table, op="indexer_topk") == 1
    assert [e.op for e in load_table(table)] == ["indexer_topk"]


def test_import_upserts(store: TuningStore, tmp_path: Path) -> None:
    store.put([make_entry(block_m=16), make_entry(total_q=1)])
    source = TuningStore(tmp_path / "src" / "tuning.json")
    source.put([make_entry(block_m=64)])
    table = tmp_path / "t.json"
    source.export_table(table)
    assert store.import_table(table) == 1
    by_key = {e.key(): e for e in store.load()}
    assert len(by_key) == 2
    assert by_key[make_entry().key()].config["BLOCK_M"] == 64


@pytest.mark.parametrize("kind", ["bad checksum", "truncated", "wrong schema version",
                                  "missing field"])
def test_importing_a_bad_table_raises_and_leaves_the_store_alone(
        store: TuningStore, tmp_path: Path, kind: str) -> None:
    store.put([make_entry(1)])
    before = store.path.read_bytes()
    fp = store.fingerprint()
    table = tmp_path / "vendor.json"
    store.export_table(table)
    corrupt, problem = CORRUPTIONS[kind]
    table.write_bytes(corrupt(table.read_bytes()))
    tampered = table.read_bytes()

    with pytest.raises(StoreError) as info:
        store.import_table(table)
    assert str(table) in str(info.value)
    assert problem in str(info.value)
    assert store.path.read_bytes() == before
    assert store.fingerprint() == fp
    assert table.read_bytes() == tampered  # a shipped table is not the user's to move aside
    assert _quarantined(store) == []


def test_load_table_of_a_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"nope\.json"):
        load_table(tmp_path / "nope.json")


# -- OS errors ----------------------------------------------------------------------------------


def test_home_that_is_a_file_raises_store_error(tmp_path: Path) -> None:
    (tmp_path / "home").write_text("not a directory")
    store = TuningStore(tmp_path / "home" / "tuning.json")
    with pytest.raises(StoreError) as info:
        store.put([make_entry()])
    message = str(info.value)
    assert str(store.path) in message
    assert "KREG_HOME" in message
    with pytest.raises(StoreError, match=r"tuning\.json"):
        store.load()


def test_store_path_that_is_a_directory_raises_store_error(store: TuningStore) -> None:
    store.path.mkdir(parents=True)
    with pytest.raises(StoreError, match=r"Cannot read tuning file .*tuning\.json"):
        store.load()
    assert store.path.is_dir()  # not mistaken for corruption


def test_failed_replace_keeps_the_old_file_and_cleans_up(store: TuningStore,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store.put([make_entry(1)])
    before = store.path.read_bytes()

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(StoreError, match="No space left on device") as info:
        store.put([make_entry(2)])
    assert str(store.path) in str(info.value)
    monkeypatch.undo()
    assert store.path.read_bytes() == before
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["tuning.json",
                                                                   "tuning.json.lock"]


def test_lock_held_elsewhere_times_out_with_store_error(tmp_path: Path) -> None:
    store = TuningStore(tmp_path / "tuning.json", lock_timeout=0.2)
    holder = filelock.FileLock(store.lock_path)
    acquired, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder:
            acquired.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert acquired.wait(10)
        with pytest.raises(StoreError, match="stayed locked") as info:
            store.put([make_entry()])
        assert str(store.lock_path) in str(info.value)
        assert not store.path.exists()
    finally:
        release.set()
        thread.join()
    store.put([make_entry()])
    assert len(store.load()) == 1


def test_threads_do_not_lose_updates(tmp_path: Path) -> None:
    path = tmp_path / "tuning.json"

    def writer(t: int) -> None:
        store = TuningStore(path)
        for i in range(20):
            store.put([make_entry(t * 1000 + i)])

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(TuningStore(path).load()) == 80
    assert_valid_file(path)


def test_store_module_imports_neither_torch_nor_triton() -> None:
    import subprocess
    import sys

    code = ("import sys, registry.tuning.store; "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
