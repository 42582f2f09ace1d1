"""The requirement library: verdicts in words, version semantics, composition."""

from __future__ import annotations

import pytest

import registry
from backends.sparse_prefill import SparsePrefillWorkload
from registry import requirements as R
from registry.versions import parse_version, version_at_least

from unit_helpers import profile, seed_workload


def wl(**changes: object) -> SparsePrefillWorkload:
    return SparsePrefillWorkload(**seed_workload(**changes))  # type: ignore[arg-type]


@pytest.mark.parametrize("have,floor,ok", [
    ("3.10.0", "3.9", True), ("3.9.9", "3.10", False), ("3.7", "3.7.0", True),
    ("3.7.0rc1", "3.7", True), ("2.13.0+cu130", "2.13", True), ("3.6.0", "3.7", False),
    ("v4", "3.99", True)])
def test_version_semantics(have: str, floor: str, ok: bool) -> None:
    assert version_at_least(have, floor) is ok


def test_parse_version_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_version("banana")
    assert parse_version("3.7.1+git3a4b") == (3, 7, 1)


def test_verdicts_carry_observed_and_required() -> None:
    f5090 = profile("rtx-5090")
    c = R.sm_count_in(188).check(f5090, wl())
    assert not c.passed and str(c) == "sm_count: 170, requires one of {188}"
    c = R.arch_in("sm_120").check(profile("gb10"), wl())
    assert str(c) == "arch: sm_121, requires sm_120" and c.kind == "capability"
    c = R.version_at_least("triton", "3.7").check(f5090.what_if(triton_version=None), wl())
    assert str(c) == "triton: not installed, requires >= 3.7"
    c = R.version_at_least("runtime", "12.8").check(f5090, wl())
    assert c.passed and c.observed == "13.0"
    c = R.device_in(("NVIDIA H200", 132)).check(f5090, wl())
    assert c.kind == "envelope" and "NVIDIA GeForce RTX 5090 (170 SMs)" in str(c)


def test_workload_predicates() -> None:
    f = profile("h200")
    assert R.field_eq("topk", 2051).check(f, wl()).passed
    assert str(R.field_eq("topk", 2051).check(f, wl(topk=7))) == "topk: 7, requires = 2051"
    assert R.field_in("dtype", ["bfloat16"]).check(f, wl()).passed
    assert not R.field_at_least("total_q", 8192).check(f, wl(total_q=8191, max_q=8191)).passed
    assert not R.field_at_most("head_dim", 128).check(f, wl()).passed
    shape = R.fields_in(("group_size", "num_kv_heads"), [(6, 1)], name="rank_shape")
    c = shape.check(f, wl(num_kv_heads=2))
    assert not c.passed and "(group_size, num_kv_heads) = (6, 2)" in c.observed


def test_derived_conditions_use_exact_integers() -> None:
    f = profile("h200")
    rpr = R.rows_per_request_at_least(512)
    assert not rpr.check(f, wl(total_q=1023, num_requests=2, max_q=512)).passed
    assert rpr.check(f, wl(total_q=1024, num_requests=2, max_q=512)).passed
    grid = R.grid_bound(2)
    assert grid.check(f, wl(total_q=4096, num_requests=2, max_q=4096)).passed
    assert not grid.check(f, wl(total_q=4096, num_requests=3, max_q=4000)).passed


def test_when_applies_only_to_matching_workloads() -> None:
    f = profile("h200")
    req = R.when("kind", "prefill", R.field_at_least("total_q", 8192))
    c = req.check(f, wl(kind="chunk", total_q=64, max_q=64))
    assert c.passed and c.observed == "n/a (kind=chunk)"
    c = req.check(f, wl(kind="prefill", total_q=64, max_q=64))
    assert not c.passed and c.name == "total_q [kind=prefill]"


def test_triton_runtime_on_cpu_depends_on_the_interpreter() -> None:
    cpu = registry.DeviceFacts(vendor="cpu", name="x", arch="cpu", sm_count=2, memory_bytes=1,
                               torch_version="2.13.0", triton_version="3.9.0")
    rt = R.triton_runtime()
    assert not rt.check(cpu, wl(dtype="float32")).passed
    interp = cpu.what_if(extra={"triton_interpret": "1"})
    assert rt.check(interp, wl(dtype="float32")).passed
    c = rt.check(interp, wl(dtype="bfloat16"))
    assert not c.passed and "bfloat16" in c.observed


def test_predicate_for_custom_conditions() -> None:
    req = R.predicate("even_rows", R.ENVELOPE,
                      lambda f, w: (w.total_q % 2 == 0, str(w.total_q), "an even count"))
    c = req.check(profile("h200"), wl(total_q=8191, max_q=8191))
    assert str(c) == "even_rows: 8191, requires an even count" and c.kind == "envelope"
