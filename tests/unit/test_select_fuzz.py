"""Random facts, workloads and overrides give a Decision or a KregError subclass, nothing else.

CI runs a few hundred examples; ``KREG_FUZZ_EXAMPLES=10000`` (benchmarks/bench_select.py's
fuzz run) runs more.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import registry
from registry.errors import KregError

EXAMPLES = int(os.environ.get("KREG_FUZZ_EXAMPLES", "300"))

versions = st.one_of(st.none(), st.sampled_from(["3.6.0", "3.7.1", "3.10", "2.13.0+cu130",
                                                 "banana", "", "4", "3.7.0rc1"]),
                     st.text(max_size=6))
facts = st.builds(
    registry.DeviceFacts,
    vendor=st.sampled_from(["nvidia", "amd", "cpu"]),
    name=st.one_of(st.sampled_from(["NVIDIA RTX PRO 6000 Blackwell Server Edition",
                                    "AMD Instinct MI355X", "NVIDIA H200"]),
                      st.text(min_size=1, max_size=10)),  # an empty name is refused (#24)
    arch=st.sampled_from(["sm_120", "sm_121", "sm_90", "gfx950", "gfx942", "cpu", "sm_1200"]),
    compute_capability=st.one_of(st.none(), st.tuples(st.integers(0, 20), st.integers(0, 9))),
    sm_count=st.sampled_from([0, 1, 132, 170, 188, 256, 304]),
    memory_bytes=st.integers(0, 2**40),
    torch_version=versions, triton_version=versions, runtime_version=versions,
    extra=st.dictionaries(st.sampled_from(["triton_interpret", "x"]), st.sampled_from(["1", "0"])),
)
anything = st.one_of(st.integers(-10, 10_000), st.text(max_size=5), st.none(), st.floats(),
                     st.booleans())
sparse_wl = st.fixed_dictionaries(
    {"kind": st.sampled_from(["prefill", "chunk"]), "topk": st.sampled_from([1, 2051, 2048]),
     "head_dim": st.sampled_from([64, 256, 512]), "group_size": st.sampled_from([1, 6, 12, 16]),
     "num_kv_heads": st.sampled_from([1, 2]), "total_q": st.integers(0, 20000),
     "num_requests": st.integers(0, 64), "max_q": st.integers(0, 20000),
     "dtype": st.sampled_from(["bfloat16", "float16", "float32", "int8"])},
    optional={"bogus": anything, "kv_len": st.one_of(st.none(), st.integers(-2, 1 << 20))})
topk_wl = st.fixed_dictionaries(
    {"k": st.sampled_from([0, 1, 2048]), "num_rows": st.integers(-1, 5000),
     "max_keys": st.integers(0, 600_000), "dtype": st.sampled_from(["float32", "bfloat16", "x"])})
overrides = st.one_of(st.none(), st.sampled_from([
    "auto", "reference.sparse_prefill", "generic.sparse_prefill_table",
    "nvidia_sm120.sparse_prefill_tuned", "nvidia_sm120.sparse_prefill_tuned:measure",
    "reference.indexer_topk", "amd_mi355x.indexer_topk_sliced:measure",
    "amd_mi355x.indexer_topk_sliced", "nope", "x:y", ":measure"]))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(f=facts, op_wl=st.one_of(st.tuples(st.just("sparse_prefill"), sparse_wl),
                                st.tuples(st.just("indexer_topk"), topk_wl),
                                st.tuples(st.text(max_size=4), st.just({}))),
       override=overrides, strict=st.booleans(), mutate=anything)
def test_select_gives_a_decision_or_a_kreg_error(f: registry.DeviceFacts,
                                                 op_wl: tuple[str, dict[str, Any]],
                                                 override: str | None, strict: bool,
                                                 mutate: Any) -> None:
    op, wl = op_wl
    if mutate is not None and wl:
        wl = {**wl, sorted(wl)[0]: mutate}
    reg = registry.get_registry()
    reg.strict = strict
    try:
        try:
            if override is not None and op in reg.ops:
                with reg.override(op, override):
                    d = reg.select(op, wl, f)
            else:
                d = reg.select(op, wl, f)
        except KregError:
            return
        assert isinstance(d, registry.Decision)
        assert d.implementation in {c.implementation for c in d.candidates if c.eligible}
        assert d.fallback == d.implementation.startswith("reference.")
        if strict:
            assert not d.fallback
            assert d.override is None or d.override.honoured
        assert d.explain()
    finally:
        reg._settings.strict_set = None
        reg.invalidate()
