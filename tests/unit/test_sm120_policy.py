"""Every gate of the sm120 seed, on fabricated facts (no GPU needed)."""

from __future__ import annotations

import pytest

import registry
from plugins.generic import sparse_prefill_table_config
from plugins.nvidia_sm120 import SM120_PREFILL_CONFIGS
from registry.errors import StrictModeError

from unit_helpers import profile, seed_workload, setenv

TUNED = "nvidia_sm120.sparse_prefill_tuned"
TABLE = "generic.sparse_prefill_table"
SERVER = "rtx-pro-6000-blackwell-server"


def pick(workload: dict[str, object], device: object = SERVER) -> registry.Decision:
    return registry.select("sparse_prefill", workload, device)  # type: ignore[arg-type]


def failed(decision: registry.Decision, impl: str = TUNED) -> dict[str, str]:
    cand = next(c for c in decision.candidates if c.implementation == impl)
    return {c.name: str(c) for c in cand.checks if not c.passed}


@pytest.mark.parametrize("group,kv", [(6, 1), (12, 1), (12, 2)])
@pytest.mark.parametrize("total_q", [512, 1024, 2048, 8192])
def test_tuned_tuple_at_every_measured_chunk_count(group: int, kv: int, total_q: int) -> None:
    d = pick(seed_workload(group_size=group, num_kv_heads=kv, total_q=total_q, max_q=total_q))
    assert d.implementation == TUNED
    assert d.config == SM120_PREFILL_CONFIGS[group]
    assert d.fallback is False


def test_the_two_tuned_tuples_are_the_seeds() -> None:
    assert pick(seed_workload(group_size=6)).config == {
        "BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 4, "num_stages": 3}
    assert pick(seed_workload(group_size=12)).config == {
        "BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 2, "num_stages": 3}


@pytest.mark.parametrize("total_q", [32, 64, 128, 256, 511])
def test_below_512_rows_per_request_takes_the_table(total_q: int) -> None:
    d = pick(seed_workload(total_q=total_q, max_q=total_q))
    assert d.implementation == TABLE
    assert d.config == sparse_prefill_table_config(6, total_q)
    assert "rows_per_request [kind=chunk]" in failed(d)


def test_511_512_boundary() -> None:
    assert pick(seed_workload(total_q=511, max_q=511)).implementation == TABLE
    assert pick(seed_workload(total_q=512, max_q=512)).implementation == TUNED


def test_sixteen_requests_of_64_rows_go_to_the_table() -> None:
    # The seed's measured 16 x 64 batch: 1,024 rows but 64 per request on average.
    d = pick(seed_workload(total_q=1024, num_requests=16, max_q=64))
    assert d.implementation == TABLE
    assert "64 (1024 rows / 16 requests)" in failed(d)["rows_per_request [kind=chunk]"]


def test_grid_bound_rejects_one_long_request_padded_by_short_ones() -> None:
    # 2 requests, 4,096 rows in all, one of 4,000: average 2,048 passes, but
    # max_q * num_requests = 8,000 > 2 * ... no: 8,000 <= 8,192 passes; make it 3 requests.
    ok = pick(seed_workload(total_q=4096, num_requests=2, max_q=4000))
    assert ok.implementation == TUNED
    d = pick(seed_workload(total_q=3072, num_requests=3, max_q=2560))
    assert d.implementation == TABLE
    assert set(failed(d)) == {"grid_bound [kind=chunk]"}
    assert "2560 * 3 = 7680 vs 2 * 3072 = 6144" in failed(d)["grid_bound [kind=chunk]"]


def test_ordinary_prefill_needs_8192_rows() -> None:
    ok = pick(seed_workload(kind="prefill", total_q=8192, max_q=8192))
    assert ok.implementation == TUNED
    d = pick(seed_workload(kind="prefill", total_q=8191, max_q=8191))
    assert d.implementation == TABLE
    assert set(failed(d)) == {"total_q [kind=prefill]"}
    # the chunk-only gates do not apply to prefill
    checks = {c.name: c for c in ok.chosen.checks}
    assert checks["rows_per_request [kind=chunk]"].observed.startswith("n/a")


@pytest.mark.parametrize("field,value,check", [
    ("topk", 2050, "topk"), ("topk", 2048, "topk"), ("head_dim", 128, "head_dim"),
    ("group_size", 8, "rank_shape"), ("num_kv_heads", 2, "rank_shape"),
])
def test_workload_capability_gates(field: str, value: int, check: str) -> None:
    d = pick(seed_workload(**{field: value}))
    assert d.implementation == TABLE
    assert check in failed(d)
    assert "[capability]" in d.explain()


def test_group12_with_two_kv_heads_is_a_measured_rank_shape() -> None:
    assert pick(seed_workload(group_size=12, num_kv_heads=2)).implementation == TUNED


@pytest.mark.parametrize("device", ["rtx-5090", "rtx-pro-6000-blackwell-workstation"])
def test_unlisted_sm120_parts_refused_under_auto_accepted_with_measure(
        device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    d = pick(seed_workload(), device)
    assert d.implementation == TABLE
    assert set(failed(d)) == {"device"}
    setenv(monkeypatch, "KREG_SELECT_SPARSE_PREFILL", TUNED + ":measure")
    d = pick(seed_workload(), device)
    assert d.implementation == TUNED
    assert d.override is not None and d.override.honoured and d.override.measure
    waived = [c.name for c in d.chosen.checks if c.waived]
    assert waived == ["device"]
    assert "waived" in d.reason


def test_measure_does_not_waive_the_row_envelope_on_its_own_terms(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # :measure skips device set and row gates (envelope) and keeps workload/arch/version gates.
    setenv(monkeypatch, "KREG_SELECT_SPARSE_PREFILL", TUNED + ":measure")
    d = pick(seed_workload(total_q=64, max_q=64), "rtx-5090")
    assert d.implementation == TUNED
    d = pick(seed_workload(topk=2048), "rtx-5090")
    assert d.implementation == TABLE
    assert d.override is not None and not d.override.honoured
    assert "topk" in d.override.reason


def test_plain_override_on_unlisted_part_is_not_honoured_and_says_measure_would(
        monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_SELECT_SPARSE_PREFILL", TUNED)
    d = pick(seed_workload(), "rtx-5090")
    assert d.implementation == TABLE
    assert d.override is not None and not d.override.honoured
    assert ":measure would waive" in d.override.reason


def test_gb10_sm121_refused_even_with_measure(monkeypatch: pytest.MonkeyPatch) -> None:
    d = pick(seed_workload(), "gb10")
    assert "arch" in failed(d)
    assert "sm_121, requires sm_120" in failed(d)["arch"]
    setenv(monkeypatch, "KREG_SELECT_SPARSE_PREFILL", TUNED + ":measure")
    d = pick(seed_workload(), "gb10")
    assert d.implementation == TABLE
    assert d.override is not None and not d.override.honoured
    assert "arch" in d.override.reason


def test_gb10_with_measure_is_an_error_under_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "KREG_SELECT_SPARSE_PREFILL", TUNED + ":measure")
    setenv(monkeypatch, "KREG_STRICT", "1")
    with pytest.raises(StrictModeError, match="arch"):
        pick(seed_workload(), "gb10")


@pytest.mark.parametrize("version,ok", [("3.6.0", False), ("3.6.9", False), ("3.7.0", True),
                                        ("3.7.1", True), ("3.10.0", True), ("4.0", True)])
def test_triton_floor(version: str, ok: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    facts = profile(SERVER, triton_version=version)
    d = pick(seed_workload(), facts)
    assert (d.implementation == TUNED) is ok
    if not ok:
        assert failed(d)["triton"] == f"triton: {version}, requires >= 3.7"
        # a capability gate: :measure does not waive it
        setenv(monkeypatch, "KREG_SELECT_SPARSE_PREFILL", TUNED + ":measure")
        assert pick(seed_workload(), facts).implementation == TABLE


def test_no_triton_at_all_falls_back_to_reference() -> None:
    facts = profile(SERVER, triton_version=None)
    d = pick(seed_workload(), facts)
    assert d.implementation == "reference.sparse_prefill"
    assert d.fallback is True


@pytest.mark.parametrize("device", ["h100", "h20", "l20", "mi300x", "mi355x"])
def test_other_devices_take_the_table(device: str) -> None:
    d = pick(seed_workload(), device)
    assert d.implementation == TABLE
    assert d.config == sparse_prefill_table_config(6, 8192)


@pytest.mark.parametrize("total_q,expected", [
    (1, (32, 8, 2)), (32, (32, 8, 2)), (33, (64, 8, 2)), (64, (64, 8, 2)), (128, (64, 4, 2)),
    (129, (32, 4, 2)), (512, (32, 4, 2)), (513, (16, 1, 2)), (8192, (16, 1, 2))])
def test_table_by_total_q(total_q: int, expected: tuple[int, int, int]) -> None:
    cfg = sparse_prefill_table_config(6, total_q)
    assert (cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]) == expected
    assert cfg["BLOCK_M"] == 16


@pytest.mark.parametrize("group,block_m", [(1, 16), (6, 16), (12, 16), (16, 16), (17, 32),
                                           (24, 32), (48, 64)])
def test_table_head_tile(group: int, block_m: int) -> None:
    assert sparse_prefill_table_config(group, 8192)["BLOCK_M"] == block_m
