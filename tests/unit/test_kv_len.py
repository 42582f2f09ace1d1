"""sparse_prefill's kv_len: derived from shapes by dispatch, part of the dispatch cache key and of
the tuning buckets, a point field of the measured plugin (floor rule, None not served, entries
written before kv_len existed still served)."""

from __future__ import annotations

import hashlib
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import registry
from backends.sparse_prefill.bench import BenchCase, make_inputs
from plugins.measured import identity_of, implementations_from
from registry.errors import WorkloadError
from registry.tuning.store import TuningEntry, TuningStore

from unit_helpers import seed_workload

SPEC = registry.get_registry().spec("sparse_prefill")
MEASURED = "measured.sparse_prefill"
HOPPER = "nvidia_hopper.sparse_prefill_tuned"
TABLE = "generic.sparse_prefill_table"


def derived(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The workload dispatch derives for this call (the miss path, without running anything)."""
    return SPEC.workload_from_key(SPEC.call_key(*args, **kwargs)[2:]).model_dump()


def prefill_inputs(num_slots: int, total_q: int = 4) -> tuple[Any, ...]:
    q = torch.randn(total_q, 2, 16)
    k = torch.randn(num_slots, 1, 16)
    idx = torch.randint(0, max(num_slots, 1), (total_q, 5), dtype=torch.int32)
    return q, k, k.clone(), idx


def chunk_kwargs(max_pages: int, page_size: int, reqs: tuple[int, ...] = (3, 2)) -> dict[str, Any]:
    cu = torch.tensor([0, *torch.tensor(reqs).cumsum(0).tolist()], dtype=torch.int32)
    return {"kind": "chunk", "cu_seqlens_q": cu,
            "prefix_lens": torch.full((len(reqs),), 4, dtype=torch.int32),
            "page_table": torch.zeros(len(reqs), max_pages, dtype=torch.int32),
            "page_size": page_size, "max_q": max(reqs)}


# -- the workload field and its derivation ------------------------------------------------------


def test_prefill_kv_len_is_k_slot_count() -> None:
    q, k, v, idx = prefill_inputs(37)
    assert derived(q, k, v, idx)["kv_len"] == 37
    with registry.record() as launches:
        out = registry.dispatch("sparse_prefill", q, k, v, idx, kind="prefill")
    assert out.shape == q.shape
    assert launches[0].workload["kv_len"] == 37


def test_chunk_kv_len_is_the_page_tables_reach_not_the_kv_cache_size() -> None:
    q, k, v, idx = prefill_inputs(37, total_q=5)
    kw = chunk_kwargs(max_pages=5, page_size=4)
    wl = derived(q, k, v, idx, **kw)
    assert (wl["kv_len"], wl["num_requests"], wl["max_q"]) == (20, 2, 3)
    assert derived(q, k, v, idx, **{**kw, "page_size": 1})["kv_len"] == 5
    kw.pop("page_size")   # the default page size is 1
    assert derived(q, k, v, idx, **kw)["kv_len"] == 5
    with registry.record() as launches:
        registry.dispatch("sparse_prefill", q, k, v, idx, **chunk_kwargs(5, 4))
    assert launches[0].workload["kv_len"] == 20


def test_dispatch_cache_key_distinguishes_kv_len(fresh: registry.Registry) -> None:
    q, k16, v16, idx = prefill_inputs(16)
    _, k32, v32, _ = prefill_inputs(32)
    keys = [SPEC.call_key(q, k16, v16, idx), SPEC.call_key(q, k32, v32, idx)]
    assert keys[0] != keys[1]
    chunk = [SPEC.call_key(q, k16, v16, idx, **chunk_kwargs(5, ps, reqs=(2, 2))) for ps in (1, 2)]
    assert chunk[0] != chunk[1]
    for key, (kk, vv) in zip(keys, ((k16, v16), (k32, v32)), strict=True):
        registry.dispatch("sparse_prefill", q, kk, vv, idx)
        assert key in fresh.dispatch_map
    assert [fresh.last_decisions[key].workload["kv_len"] for key in keys] == [16, 32]


def test_no_kv_slots_derives_none_and_still_runs() -> None:
    q, k, v, idx = prefill_inputs(0)
    assert derived(q, k, v, idx)["kv_len"] is None
    out = registry.dispatch("sparse_prefill", q, k, v, idx - 1)
    assert out.shape == q.shape and not out.any()


def test_select_without_kv_len_still_works_and_bad_values_are_refused() -> None:
    wl = registry.get_registry().workload("sparse_prefill", seed_workload())
    assert wl.kv_len is None  # type: ignore[attr-defined]
    assert registry.select("sparse_prefill", seed_workload(kv_len=32768), "h200") \
        .workload["kv_len"] == 32768
    for bad in (0, -8):
        with pytest.raises(WorkloadError, match=r"kv_len: Input should be greater than or equal "
                                                r"to 1 \(KV slots the rows index"):
            registry.select("sparse_prefill", seed_workload(kv_len=bad), "h200")


@pytest.mark.parametrize("change,match", [
    ({"page_size": 0}, r"page_size=0: must be a python int >= 1"),
    ({"page_size": -2}, r"page_size=-2: must be a python int >= 1"),
    ({"page_table": torch.zeros(8, dtype=torch.int32)},
     r"page_table \[num_requests, max_pages\]; got page_table \[8\]"),
    ({"page_table": None}, r"needs cu_seqlens_q=.*page_table=\[num_requests, max_pages\]"),
])
def test_bad_chunk_paging_is_a_clear_error(change: dict[str, Any], match: str) -> None:
    q, k, v, idx = prefill_inputs(16, total_q=5)
    with pytest.raises(WorkloadError, match=match):
        registry.dispatch("sparse_prefill", q, k, v, idx, **{**chunk_kwargs(4, 2), **change})


# -- the tuner's buckets are what dispatch derives ----------------------------------------------


def _small_cases() -> list[BenchCase]:
    from registry.tuning.tune import load_tuner

    tuner = load_tuner("sparse_prefill")
    grid = {"kind": ["prefill", "chunk"], "group_size": ["2"], "head_dim": ["16"],
            "topk": ["24"], "kv_len": ["40", "64"], "total_q": ["8", "48"],
            "dtype": ["float32"], "space": ["tiny"]}
    cases: list[BenchCase] = list(tuner.cases(grid))
    assert {c.kind for c in cases} == {"prefill", "chunk"}
    cases += [BenchCase(kind="chunk", group_size=2, kv_len=50, total_q=12, topk=24, head_dim=16,
                        dtype="float32", page_size=4),   # kv_len not a multiple of page_size
              BenchCase(kind="chunk", group_size=3, kv_heads=2, kv_len=30, total_q=12,
                        req_lens=(5, 7), topk=24, head_dim=16, dtype="float32", page_size=2)]
    return cases


@pytest.mark.parametrize("case", _small_cases(), ids=lambda c: f"{c.label()} ps={c.page_size}")
def test_tuner_bucket_is_the_workload_dispatch_derives(case: BenchCase) -> None:
    from registry.tuning.tune import load_tuner

    inp = make_inputs(case, device="cpu")
    wl = derived(inp["q"], inp["k"], inp["v"], inp["indices"], **inp["kwargs"])
    assert wl["kv_len"] is not None
    assert load_tuner("sparse_prefill").bucket(case) == wl


# -- the measured plugin: kv_len as a point field -----------------------------------------------

H200 = registry.profiles()["h200"]
SHAPE = {"kind": "prefill", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
         "dtype": "bfloat16"}


def cfg(bn: int) -> dict[str, int]:
    return {"BLOCK_M": 16, "BLOCK_N": bn, "num_warps": 1, "num_stages": 2}


def entry(total_q: int, kv_len: int | None, bn: int, facts: registry.DeviceFacts = H200,
          **shape: Any) -> TuningEntry:
    device, sw = identity_of(facts)
    bucket: dict[str, Any] = {**SHAPE, **shape, "total_q": total_q, "num_requests": 1,
                              "max_q": total_q}
    if kv_len is not None:
        bucket["kv_len"] = kv_len
    return TuningEntry(op="sparse_prefill", family=TABLE, device=device, software=sw,
                       bucket=bucket, config=cfg(bn), timings_ms={f"16x{bn}x1x2": 1.0},
                       command="test")


# (kv_len, total_q) -> BLOCK_N, so each test sees which point serves
GRID = {(8192, 512): 16, (8192, 1024): 17, (32768, 512): 32, (32768, 1024): 33,
        (131072, 512): 64, (131072, 1024): 65}
PER_KV = [entry(tq, kv, bn) for (kv, tq), bn in GRID.items()]
OLD = [entry(512, None, 128), entry(1024, None, 129)]   # written before kv_len existed


def selector(entries: list[TuningEntry]) -> registry.Registry:
    """A registry with the in-tree policy plugins and a measured plugin over ``entries``."""
    import backends.sparse_prefill as op
    import plugins.generic as generic
    import plugins.nvidia_hopper as hopper
    import plugins.reference as ref

    impls = {i.name: i for i in implementations_from(entries, registry.get_registry().ops)}
    reg = registry.Registry(load_entry_points=False)
    reg.register_plugin(op, "sparse_prefill")
    for mod, name in ((ref, "reference"), (generic, "generic"), (hopper, "nvidia_hopper")):
        reg.register_plugin(mod, name)
    reg.register_plugin(types.SimpleNamespace(kreg_implementations=registry.hookimpl(
        lambda: [impls[MEASURED]])), "measured")
    return reg


def wl(total_q: int, kv_len: int | None = None) -> dict[str, Any]:
    out = {**SHAPE, "total_q": total_q, "num_requests": 1, "max_q": total_q}
    return out if kv_len is None else {**out, "kv_len": kv_len}


@pytest.mark.parametrize("kv_len,total_q,block_n", [
    (8192, 512, 16), (8192, 1024, 17), (16384, 700, 16), (16384, 1024, 17),
    (32768, 512, 32), (65536, 1023, 32), (65536, 1024, 33), (131072, 512, 64),
    (131072, 1024, 65),
])
def test_floor_rule_across_kv_len_points(kv_len: int, total_q: int, block_n: int) -> None:
    d = selector(PER_KV).select("sparse_prefill", wl(total_q, kv_len), H200)
    assert d.implementation == MEASURED
    assert d.config == cfg(block_n)
    (kv_pt, tq_pt), = [p for p, bn in GRID.items() if bn == block_n]
    assert f"served by the point (kv_len={kv_pt}, total_q={tq_pt})" in d.explain(verbose=True)


@pytest.mark.parametrize("kv_len,total_q,why", [
    (4096, 512, "kv_len 4096 below the lowest measured 8192"),
    (262144, 1024, "kv_len 262144 above the highest measured 131072"),
    (32768, 256, "total_q 256 below the lowest measured 512"),
    (32768, 4096, "total_q 4096 above the highest measured 1024"),
])
def test_outside_the_measured_kv_range_is_not_served(kv_len: int, total_q: int, why: str) -> None:
    d = selector(PER_KV).select("sparse_prefill", wl(total_q, kv_len), H200)
    assert d.implementation != MEASURED
    assert f"measured_range: kv_len = {kv_len}, total_q = {total_q}" in d.explain()
    assert why in d.explain()


@pytest.mark.parametrize("total_q", [512, 1000, 1024])
def test_kv_len_none_is_not_served_and_falls_to_what_runs_without_a_store(total_q: int) -> None:
    d = selector(PER_KV).select("sparse_prefill", wl(total_q), H200)
    without = selector([]).select("sparse_prefill", wl(total_q), H200)
    assert (d.implementation, d.config) == (without.implementation, without.config)
    assert d.implementation == (HOPPER if total_q >= 1024 else TABLE)
    assert "kv_len not given (None)" in d.explain()
    # the same point with kv_len given is served
    assert selector(PER_KV).select("sparse_prefill", wl(total_q, 8192), H200).implementation \
        == MEASURED


def test_entries_without_kv_len_serve_any_kv_len_until_per_kv_entries_exist() -> None:
    old = selector(OLD)
    for kv_len in (None, 1, 8192, 10**7):
        d = old.select("sparse_prefill", wl(700, kv_len), H200)
        assert (d.implementation, d.config) == (MEASURED, cfg(128)), kv_len
        assert "entries measured before kv_len was recorded" in d.explain(verbose=True)
    assert old.select("sparse_prefill", wl(256, 8192), H200).implementation != MEASURED
    mixed = selector(OLD + PER_KV)
    d = mixed.select("sparse_prefill", wl(700, 8192), H200)
    assert (d.implementation, d.config) == (MEASURED, cfg(16))
    assert "2 older entries without kv_len superseded" in d.explain(verbose=True)
    assert mixed.select("sparse_prefill", wl(700), H200).implementation != MEASURED
    # per-KV entries of another shape do not supersede this shape's older ones
    other = selector([*OLD, entry(512, 8192, 16, group_size=12)])
    assert other.select("sparse_prefill", wl(700), H200).config == cfg(128)


def test_nothing_changes_for_workloads_without_kv_len_and_no_store() -> None:
    """Without a store a kv_len changes no answer, except nvidia_hopper's own long-KV config
    (from LONG_KV_FROM slots and LONG_KV_MIN_TOTAL_Q rows): the same implementation, the
    long-KV config instead of the short-KV one."""
    from plugins.nvidia_hopper import H200_LONG_KV_CONFIGS, LONG_KV_FROM, LONG_KV_MIN_TOTAL_Q

    for dev in ("h200", "rtx-pro-6000-blackwell-server", "h20", "mi355x"):
        for kind in ("prefill", "chunk"):
            for tq in (256, 1024, 8192):
                base = seed_workload(kind=kind, total_q=tq, max_q=tq)
                a = registry.select("sparse_prefill", base, dev)
                kv = 131072
                b = registry.select("sparse_prefill", {**base, "kv_len": kv}, dev)
                assert a.implementation == b.implementation
                long_kv = (dev == "h200" and a.implementation.startswith("nvidia_hopper.")
                           and tq >= LONG_KV_MIN_TOTAL_Q[(kind, 6)] and kv >= LONG_KV_FROM)
                want = H200_LONG_KV_CONFIGS[(kind, 6)] if long_kv else a.config
                assert b.config == want, (dev, kind, tq)
                assert dev != "h200" or tq < 1024 or long_kv  # the h200 case is exercised


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("KREG_HOME", str(tmp_path))
    registry.reset_registry()
    yield tmp_path
    monkeypatch.undo()  # first: the registry rebuilt below must not read this store
    registry.reset_registry()


def test_a_store_written_before_kv_len_loads_and_serves(home: Path) -> None:
    """A tuning.json as the previous version wrote it (buckets without kv_len), on disk."""
    entries = [json.loads(e.model_dump_json()) for e in OLD]
    for e in entries:
        assert "kv_len" not in e["bucket"]
    canon = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    doc = {"schema_version": 1, "checksum": hashlib.sha256(canon.encode()).hexdigest(),
           "entries": entries}
    (home / "tuning.json").write_text(json.dumps(doc), "utf-8")
    assert len(TuningStore().load()) == 2
    registry.reset_registry()
    for kv_len in (None, 65536):
        d = registry.select("sparse_prefill", wl(1024, kv_len), "h200")
        assert (d.implementation, d.config) == (MEASURED, cfg(129))
    # a new run adds per-KV entries next to them; those then serve and the old ones step aside
    TuningStore().put([entry(512, 8192, 16)])
    registry.reset_registry()
    assert registry.select("sparse_prefill", wl(512, 8192), "h200").config == cfg(16)
    assert registry.select("sparse_prefill", wl(1024), "h200").implementation == HOPPER
