"""Contracts: what each implementation declares, requiring guarantees, and batch-invariant
selection (one implementation and config across the batch sizes of a workload)."""

from __future__ import annotations

from typing import Any

import pytest

import registry
from registry import Contract, Implementation, hookimpl
from registry.errors import ConfigError, NoEligibleImplementationError

SEED = {"kind": "chunk", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
        "num_requests": 1, "dtype": "bfloat16", "kv_len": 8192}
TOTAL_Q = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)   # the seed's sweep
TOPK = {"k": 64, "num_rows": 4, "max_keys": 1024, "dtype": "float32"}


def _seed(total_q: int, **kw: Any) -> dict[str, Any]:
    return {**SEED, "total_q": total_q, "max_q": total_q, **kw}


def test_every_in_tree_implementation_declares_a_contract() -> None:
    for op in registry.ops():
        for impl in registry.implementations(op):
            contract = impl.contract_for(None)
            assert contract.deterministic, impl.name
    topk = {i.name: i.contract_for(None) for i in registry.implementations("indexer_topk")}
    assert all(c.exact and c.batch_invariant for c in topk.values())
    ref = next(i for i in registry.implementations("sparse_prefill") if i.name.startswith("ref"))
    assert ref.contract_for(None) == Contract(deterministic=True)   # rows run in batch-sized chunks


def test_dense_configs_are_not_batch_invariant_and_order_classes_drop_neutral_keys() -> None:
    from backends.sparse_prefill.guarantees import kernel_contract, order_class
    from plugins.nvidia_hopper import H200_DENSE_CONFIGS, H200_PREFILL_CONFIGS

    assert not kernel_contract(H200_DENSE_CONFIGS[("prefill", 6)]).batch_invariant
    fam = H200_PREFILL_CONFIGS[("prefill", 6)]
    assert kernel_contract(fam).batch_invariant and kernel_contract(fam).deterministic
    same = {**fam, "OFFS32": 0, "REVERSE_ROWS": 0, "num_stages": 3, "MAXNREG": 80}
    assert order_class(same) == order_class(fam)
    assert order_class({**fam, "BLOCK_N": 32}) != order_class(fam)
    assert order_class({**fam, "SPLIT_QK": 1}) != order_class(fam)


def test_explain_and_the_decision_show_the_guarantees() -> None:
    d = registry.select("sparse_prefill", _seed(8192), "rtx-pro-6000-blackwell-server")
    assert d.guarantees == ["deterministic", "batch_invariant"] and d.order_class
    assert "guarantees: deterministic, batch_invariant (order class triton BLOCK_M=8" \
        in d.explain()
    t = registry.select("indexer_topk", TOPK, "h200")
    assert t.guarantees == ["exact", "deterministic", "batch_invariant"]


def test_requiring_a_guarantee_rejects_what_lacks_it_as_a_capability_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREG_REQUIRE_SPARSE_PREFILL", "deterministic,batch_invariant")
    registry.invalidate()
    d = registry.select("sparse_prefill", _seed(8192), "rtx-5090")   # the table here
    assert d.required == ["deterministic", "batch_invariant"]
    ref = next(c for c in d.candidates if c.implementation == "reference.sparse_prefill")
    (check,) = [c for c in ref.checks if c.name == "contract"]
    assert not check.passed and check.kind == "capability"
    assert check.observed == "deterministic; lacks batch_invariant"
    assert "contract: deterministic; lacks batch_invariant, requires deterministic, " \
           "batch_invariant [capability]" in d.explain()
    monkeypatch.setenv("KREG_REQUIRE_SPARSE_PREFILL", "determinstic")
    with pytest.raises(ConfigError, match=r"KREG_REQUIRE_SPARSE_PREFILL.*unknown guarantee.*"
                                          r"known: exact, deterministic, batch_invariant"):
        registry.invalidate()
    monkeypatch.delenv("KREG_REQUIRE_SPARSE_PREFILL")
    registry.invalidate()
    assert registry.select("sparse_prefill", _seed(8192), "rtx-5090").required == []


class _Noisy:
    """A deliberately non-deterministic implementation (it declares nothing)."""

    @hookimpl
    def kreg_implementations(self) -> list[Implementation]:
        import random

        def noisy(scores: Any, lengths: Any, k: int = 2048) -> Any:
            from backends.indexer_topk.reference import indexer_topk_reference

            out = indexer_topk_reference(scores, lengths, k)
            if random.random() < 0.5:
                out = out.flip(1)
            return out

        return [Implementation(op="indexer_topk", name="noisy.topk", priority=900,
                               kernel=noisy, configurable=False)]


def test_a_non_deterministic_implementation_is_refused_when_determinism_is_required() -> None:
    registry.register_plugin(_Noisy(), "noisy")
    try:
        assert registry.select("indexer_topk", TOPK, "h200").implementation == "noisy.topk"
        with registry.require("indexer_topk", "deterministic"):
            d = registry.select("indexer_topk", TOPK, "h200")
            assert d.implementation != "noisy.topk" and d.required == ["deterministic"]
            noisy = next(c for c in d.candidates if c.implementation == "noisy.topk")
            assert [str(c) for c in noisy.checks if not c.passed] == [
                "contract: none declared; lacks deterministic, requires deterministic"]
        assert registry.select("indexer_topk", TOPK, "h200").implementation == "noisy.topk"
        with pytest.raises(ConfigError, match="unknown guarantee"), \
                registry.require("indexer_topk", "fast"):
            pass
    finally:
        registry.unregister_plugin("noisy")


@pytest.mark.parametrize("device", ["h200", "rtx-pro-6000-blackwell-server", "rtx-5090"])
@pytest.mark.parametrize("kind", ["prefill", "chunk"])
@pytest.mark.parametrize("group", [6, 12])
@pytest.mark.parametrize("kv_len", [8192, 32768, 131072])
def test_batch_invariant_selection_gives_one_config_across_the_seed_sweep(
        device: str, kind: str, group: int, kv_len: int) -> None:
    seen = set()
    per_batch = set()
    for tq in TOTAL_Q:
        wl = _seed(tq, kind=kind, group_size=group, kv_len=kv_len)
        per_batch.add(registry.select("sparse_prefill", wl, device).config_short())
        with registry.require("sparse_prefill", "batch_invariant"):
            d = registry.select("sparse_prefill", wl, device)
        assert "batch_invariant" in d.guarantees and d.workload == {**wl}
        assert any(n.startswith("batch-invariant: decided at the batch reference point "
                                "total_q=8192") for n in d.notes)
        seen.add((d.implementation, d.config_short()))
    assert len(seen) == 1, seen
    if device == "h200" and kv_len == 8192:
        assert len(per_batch) > 1   # without the requirement the choice moves with total_q


def test_batch_invariant_selection_is_cached_apart_and_says_what_it_costs() -> None:
    wl = _seed(512, kind="prefill", group_size=12)
    normal = registry.select("sparse_prefill", wl, "h200")
    with registry.require("sparse_prefill", "batch_invariant"):
        inv = registry.select("sparse_prefill", wl, "h200")
        assert inv.config != normal.config
        assert any(f"the per-batch-size choice would be {normal.implementation}" in n
                   for n in inv.notes)
    assert registry.select("sparse_prefill", wl, "h200").config == normal.config


def test_batch_invariant_requirement_on_a_cpu_without_triton_says_why() -> None:
    cpu = registry.profiles()["h200"].what_if(vendor="cpu", arch="cpu", name="cpu",
                                              compute_capability=None, extra={})
    with registry.require("sparse_prefill", "batch_invariant"), \
            pytest.raises(NoEligibleImplementationError, match="lacks batch_invariant"):
        registry.select("sparse_prefill", _seed(64, dtype="float32"), cpu)
