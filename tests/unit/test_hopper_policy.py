"""The H200 family's gates, on fabricated facts."""

from __future__ import annotations

import pytest

import registry
from backends.sparse_prefill.triton_kernels import validate_config
from plugins.generic import sparse_prefill_table_config
from plugins.nvidia_hopper import (
    DENSE_MAX_KV,
    DENSE_MIN_TOTAL_Q,
    GLUON_MIN_KV,
    GLUON_MIN_TOTAL_Q,
    H200_DENSE_CONFIGS,
    H200_GLUON_CONFIGS,
    H200_LONG_KV_CONFIGS,
    H200_PREFILL_CONFIGS,
    H200_UNION_CONFIGS,
    H200_WGMMA_CONFIGS,
    LONG_KV_FROM,
    LONG_KV_MIN_TOTAL_Q,
    MIN_TOTAL_Q,
    UNION_KV,
    UNION_MIN_TOTAL_Q,
    UNION_OVER_DENSE,
    UNION_POLICY,
    WGMMA_MIN_TOTAL_Q,
    WGMMA_OVER_DENSE,
)

from unit_helpers import profile, seed_workload, setenv

HOPPER = "nvidia_hopper.sparse_prefill_tuned"


def pick(wl: dict[str, object], device: object = "h200") -> registry.Decision:
    return registry.select("sparse_prefill", wl, device)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind,group", sorted(H200_PREFILL_CONFIGS))
def test_family_at_and_above_its_crossover(kind: str, group: int) -> None:
    floor = MIN_TOTAL_Q[(kind, group)]
    for tq in (floor, 2 * floor, 8192):
        d = pick(seed_workload(kind=kind, group_size=group, total_q=tq, max_q=tq))
        assert d.implementation == HOPPER
        assert d.config == H200_PREFILL_CONFIGS[(kind, group)]
    below = pick(seed_workload(kind=kind, group_size=group, total_q=floor - 1, max_q=floor - 1))
    assert below.implementation == "generic.sparse_prefill_table"
    assert below.config == sparse_prefill_table_config(group, floor - 1)


def test_only_the_h200_gets_it() -> None:
    for dev in ("h100", "h20", "l20", "rtx-5090", "mi300x"):
        assert pick(seed_workload(), dev).implementation != HOPPER
    d = pick(seed_workload(), "h100")
    cand = next(c for c in d.candidates if c.implementation == HOPPER)
    assert [c.name for c in cand.checks if not c.passed] == ["device"]


def test_h100_with_measure_and_gates_measure_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_SELECT_SPARSE_PREFILL", HOPPER + ":measure")
    assert pick(seed_workload(), "h100").implementation == HOPPER
    assert pick(seed_workload(topk=2048), "h100").implementation != HOPPER
    assert pick(seed_workload(), "rtx-5090").implementation != HOPPER  # arch is a capability


@pytest.mark.parametrize("change", [{"topk": 2048}, {"head_dim": 128}, {"dtype": "float16"},
                                    {"group_size": 8}])
def test_workload_gates(change: dict[str, object]) -> None:
    assert pick(seed_workload(**change)).implementation != HOPPER


def test_chunk_batches_need_rows_per_request_and_the_grid_bound() -> None:
    assert pick(seed_workload(total_q=8192, num_requests=16, max_q=512)).implementation == HOPPER
    assert pick(seed_workload(total_q=8192, num_requests=64, max_q=128)).implementation != HOPPER
    assert pick(seed_workload(total_q=8192, num_requests=4, max_q=5000)).implementation != HOPPER
    # prefill with two KV heads was not measured
    assert pick(seed_workload(kind="prefill", group_size=12, num_kv_heads=2)).implementation \
        != HOPPER
    assert pick(seed_workload(group_size=12, num_kv_heads=2)).implementation == HOPPER


def test_triton_floor() -> None:
    old = profile("h200", triton_version="3.5.1")
    d = pick(seed_workload(), old)
    assert d.implementation != HOPPER
    assert "triton: 3.5.1, requires >= 3.6 [capability]" in d.explain()


@pytest.mark.parametrize("kind,group", sorted(H200_PREFILL_CONFIGS))
def test_long_kv_config_from_its_measured_kv_length_and_rows(kind: str, group: int) -> None:
    """The slot-ordered long-KV config from LONG_KV_FROM slots and LONG_KV_MIN_TOTAL_Q rows on;
    the short-KV config below either floor and for an unknown KV length."""
    short, long_ = H200_PREFILL_CONFIGS[(kind, group)], H200_LONG_KV_CONFIGS[(kind, group)]
    assert long_["SLOT_ORDER"] == 1 and "SLOT_ORDER" not in short
    if kind == "chunk":  # chunk entries are ordered after translation only
        assert long_["CHUNK_MODE"] == "pretranslate"
    rows = LONG_KV_MIN_TOTAL_Q[(kind, group)]
    assert rows >= MIN_TOTAL_Q[(kind, group)]
    for kv in (None, 8192, 32768, LONG_KV_FROM - 1, LONG_KV_FROM, 131072, 1 << 20):
        for tq in (MIN_TOTAL_Q[(kind, group)], rows - 1, rows, 8192):
            if tq < MIN_TOTAL_Q[(kind, group)]:
                continue
            d = pick(seed_workload(kind=kind, group_size=group, kv_len=kv, total_q=tq,
                                   max_q=tq))
            assert d.implementation == HOPPER
            on = kv is not None and kv >= LONG_KV_FROM and tq >= rows
            # dense and union tiles and the Gluon kernel: the tests below
            if on or not any(k in d.config for k in ("DENSE", "UNION", "ENGINE")):
                assert d.config == (long_ if on else short), (kv, tq, d.config)


@pytest.mark.parametrize("kind,group", sorted(H200_PREFILL_CONFIGS))
def test_dense_config_for_short_prefill_with_the_measured_rows(kind: str, group: int) -> None:
    """Dense tiles for prefill up to DENSE_MAX_KV slots from DENSE_MIN_TOTAL_Q rows; never for
    chunk, an unknown KV length, fewer rows, or longer KV (the short- or long-KV config); group
    12 at KV 8K (from GLUON_MIN_KV) runs the wgmma kernel instead on Triton 3.6 (the profile's)."""
    short = H200_PREFILL_CONFIGS[(kind, group)]
    for kv in (None, 2048, DENSE_MAX_KV, DENSE_MAX_KV + 1, 32768, LONG_KV_FROM):
        for tq in (MIN_TOTAL_Q[(kind, group)], DENSE_MIN_TOTAL_Q - 1, DENSE_MIN_TOTAL_Q, 16384):
            d = pick(seed_workload(kind=kind, group_size=group, kv_len=kv, total_q=tq,
                                   max_q=tq))
            assert d.implementation == HOPPER
            over = ((kind, group) in WGMMA_OVER_DENSE and kv is not None and kv >= GLUON_MIN_KV
                    and tq >= WGMMA_MIN_TOTAL_Q[(kind, group)])
            on = (kind == "prefill" and kv is not None and kv <= DENSE_MAX_KV
                  and tq >= DENSE_MIN_TOTAL_Q and not over)
            if over and kv <= DENSE_MAX_KV and tq >= DENSE_MIN_TOTAL_Q:
                assert d.config == H200_WGMMA_CONFIGS[(kind, group)]
            # prefill group 6 at KV 8192 from 8192 rows: union tiles beside the dense ones
            both = (on and (kind, group) in UNION_OVER_DENSE and kv >= UNION_KV[0]
                    and tq >= UNION_MIN_TOTAL_Q)
            if on:
                dense = H200_DENSE_CONFIGS[(kind, group)]
                assert dense == {**short, "DENSE": dense["DENSE"]} and dense["DENSE"] > 0
                assert d.config == (H200_UNION_CONFIGS[(kind, group)] if both else dense)
                assert ("UNION" in d.config) == both, (kv, tq, d.config)
            else:
                assert "DENSE" not in d.config, (kv, tq, d.config)


@pytest.mark.parametrize("kind,group", sorted(H200_PREFILL_CONFIGS))
def test_gluon_configs_for_mid_kv_prefill_on_triton_3_6(kind: str, group: int) -> None:
    """From GLUON_MIN_KV to below LONG_KV_FROM slots, on the Triton release they were measured
    on and where the dense tiles do not apply: the wgmma kernel for prefill groups 6 and 12
    and chunk group 12 (pretranslated) from WGMMA_MIN_TOTAL_Q rows, else the mma_v2 Gluon
    kernel for prefill group 6 from GLUON_MIN_TOTAL_Q rows; every other cell, fewer rows, an
    unknown KV length and any other Triton keep the Triton configs."""
    gl = H200_GLUON_CONFIGS.get((kind, group))
    wg = H200_WGMMA_CONFIGS.get((kind, group))
    for triton in ("3.6.0", "3.6.1", "3.7.1", "3.5.1"):
        dev = profile("h200", triton_version=triton)
        for kv in (None, GLUON_MIN_KV - 1, GLUON_MIN_KV, DENSE_MAX_KV, DENSE_MAX_KV + 1, 32768,
                   LONG_KV_FROM - 1, LONG_KV_FROM):
            for tq in (MIN_TOTAL_Q[(kind, group)], 2047, 2048, 8191, DENSE_MIN_TOTAL_Q, 16384):
                d = pick(seed_workload(kind=kind, group_size=group, kv_len=kv, total_q=tq,
                                       max_q=tq), dev)
                if triton == "3.5.1":  # below the family's Triton floor
                    assert d.implementation != HOPPER
                    continue
                mid = (triton.startswith("3.6.") and kv is not None
                       and GLUON_MIN_KV <= kv < LONG_KV_FROM)
                wg_on = mid and wg is not None and tq >= WGMMA_MIN_TOTAL_Q[(kind, group)]
                # the dense tiles first, except where the wgmma kernel measured faster
                dense = (kind == "prefill" and kv is not None and kv <= DENSE_MAX_KV
                         and tq >= DENSE_MIN_TOTAL_Q
                         and not (wg_on and (kind, group) in WGMMA_OVER_DENSE))
                mid = mid and not dense
                if dense and (kind, group) in UNION_OVER_DENSE and kv >= UNION_KV[0] \
                        and tq >= UNION_MIN_TOTAL_Q:
                    want = H200_UNION_CONFIGS[(kind, group)]   # with union tiles beside
                elif dense:
                    want = H200_DENSE_CONFIGS[(kind, group)]
                elif wg_on:
                    want = wg
                elif mid and gl is not None and tq >= GLUON_MIN_TOTAL_Q[(kind, group)]:
                    want = gl
                else:
                    want = None
                assert (d.config == want) if want else (d.config.get("ENGINE") is None), \
                    (triton, kv, tq, d.config)
    assert sorted(H200_GLUON_CONFIGS) == [("prefill", 6)]
    assert sorted(H200_WGMMA_CONFIGS) == [("chunk", 12), ("prefill", 6), ("prefill", 12)]
    for (k, g), cfg in H200_WGMMA_CONFIGS.items():
        validate_config(cfg, g, 256)
        assert cfg["ENGINE"] == "gluon_wgmma" and cfg["BLOCK_M"] >= g
        # chunk rows reach the Gluon kernel as slots: pretranslated
        assert cfg.get("CHUNK_MODE", "fused") == ("pretranslate" if k == "chunk" else "fused")


def test_explain_names_the_gluon_engine_and_a_what_if_on_another_triton() -> None:
    wl = seed_workload(kind="prefill", group_size=6, kv_len=32768, total_q=8192, max_q=8192)
    assert "ENGINE=gluon_wgmma" in pick(wl).explain()
    fewer = seed_workload(kind="prefill", group_size=6, kv_len=32768, total_q=4096, max_q=4096)
    assert pick(fewer).config["ENGINE"] == "gluon" and "ENGINE=gluon" in pick(fewer).explain()
    other = pick(wl, profile("h200", triton_version="3.7.1"))
    assert other.implementation == HOPPER and "ENGINE" not in other.config


@pytest.mark.parametrize("kind,group", sorted(H200_PREFILL_CONFIGS))
def test_union_config_only_where_it_was_measured_faster(kind: str, group: int) -> None:
    """Union tiles for chunk group 6 at KV 8192-32768 from 8192 rows (UNION_POLICY, UNION_KV,
    UNION_MIN_TOTAL_Q) and for prefill group 6 at KV 8192 beside its dense tiles
    (UNION_OVER_DENSE, up to DENSE_MAX_KV), nowhere else; without them while batch invariance
    is required."""
    from backends.sparse_prefill import SparsePrefillWorkload
    from plugins.nvidia_hopper import _invariant_config

    assert frozenset({("chunk", 6)}) == UNION_POLICY and UNION_KV == (8192, 32768)
    assert frozenset({("prefill", 6)}) == UNION_OVER_DENSE and UNION_KV[0] == DENSE_MAX_KV
    facts = profile("h200")
    for kv in (None, 4096, 8191, 8192, 8193, 16384, 32768, 32769, 65536):
        for tq in (MIN_TOTAL_Q[(kind, group)], UNION_MIN_TOTAL_Q - 1, UNION_MIN_TOTAL_Q, 16384):
            if tq < MIN_TOTAL_Q[(kind, group)]:
                continue
            w = seed_workload(kind=kind, group_size=group, kv_len=kv, total_q=tq, max_q=tq)
            d = pick(w)
            on = ((kind, group) in UNION_POLICY and kv is not None
                  and UNION_KV[0] <= kv <= UNION_KV[1] and tq >= UNION_MIN_TOTAL_Q)
            over = ((kind, group) in UNION_OVER_DENSE and kv is not None
                    and UNION_KV[0] <= kv <= DENSE_MAX_KV and tq >= UNION_MIN_TOTAL_Q)
            assert ("UNION" in d.config) == (on or over), (kv, tq, d.config)
            if over:
                assert d.config == H200_UNION_CONFIGS[(kind, group)]
                assert d.config["DENSE"] and d.config["UNION_TILE"] == "128x64x8x2"
                assert "dense-span tiles" in d.explain() and "union tiles" in d.explain()
                inv = _invariant_config(facts, SparsePrefillWorkload(**w))
                assert "UNION" not in inv and "DENSE" not in inv
            if on:
                assert d.config == H200_UNION_CONFIGS[(kind, group)]
                assert d.config["CHUNK_MODE"] == "pretranslate"
                assert "batch_invariant" not in d.guarantees
                assert "union tiles" in d.explain()
                inv = _invariant_config(facts, SparsePrefillWorkload(**w))
                assert "UNION" not in inv and inv == H200_PREFILL_CONFIGS[(kind, group)]
