"""Eight processes writing the tuning store at once lose no update and leave a valid file."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

from registry.tuning.store import SCHEMA_VERSION, DeviceIdentity, Software, TuningEntry, TuningStore

PROCESSES = 8
WRITES_PER_PROCESS = 100


def _entry(worker: int, i: int) -> TuningEntry:
    return TuningEntry(
        op="sparse_prefill", family="generic.sparse_prefill_table",
        device=DeviceIdentity(name="NVIDIA H200", arch="sm_90", sm_count=132),
        software=Software(torch="2.9.0", triton="3.6.0", runtime="12.8"),
        bucket={"kind": "chunk", "topk": 2051, "head_dim": 256, "worker": worker, "total_q": i},
        config={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2},
        timings_ms={"16x16x1x2": 0.5 + i / 1000, "16x32x4x2": 0.9},
        command=f"worker {worker} write {i}",
        measured_at="2025-11-29T11:00:00+00:00",
    )


def _writer(path: str, worker: int, barrier: Barrier) -> None:
    # Module level so that spawn can import it by name in the child.
    store = TuningStore(Path(path))
    barrier.wait(60)  # start together, so the writes really interleave
    for i in range(WRITES_PER_PROCESS):
        store.put([_entry(worker, i)])


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "kreg" / "tuning.json"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    procs = [ctx.Process(target=_writer, args=(str(path), w, barrier), name=f"writer-{w}")
             for w in range(PROCESSES)]
    start = time.monotonic()
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(120)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    elapsed = time.monotonic() - start
    assert [p.exitcode for p in procs] == [0] * PROCESSES

    doc = json.loads(path.read_text("utf-8"))
    assert doc["schema_version"] == SCHEMA_VERSION
    canon = json.dumps(doc["entries"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert doc["checksum"] == hashlib.sha256(canon.encode("utf-8")).hexdigest()

    loaded = TuningStore(path).load()
    expected = {_entry(w, i).key() for w in range(PROCESSES) for i in range(WRITES_PER_PROCESS)}
    assert len(loaded) == PROCESSES * WRITES_PER_PROCESS
    assert {e.key() for e in loaded} == expected
    assert {e.command for e in loaded} == {f"worker {w} write {i}" for w in range(PROCESSES)
                                           for i in range(WRITES_PER_PROCESS)}
    # No stray temporary file and nothing mistaken for corruption along the way.
    assert sorted(p.name for p in path.parent.iterdir()) == ["tuning.json", "tuning.json.lock"]
    assert elapsed < 60, f"{PROCESSES}x{WRITES_PER_PROCESS} writes took {elapsed:.1f} s"
