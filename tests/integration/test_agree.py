"""``registry.agree`` across 3 CPU processes (gloo): a planted divergence is reported exactly and
resolved by ``adopt=True``.

Every rank dispatches the same small prefill through the registry. With the Triton interpreter
(TRITON_INTERPRET=1, set by conftest and inherited by the spawned ranks) the generic Triton kernel
is eligible on the CPU and wins; rank 2 runs under ``registry.override(...reference...)``, so it
dispatches the torch reference instead.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

WORLD = 3
DIVERGENT_RANK = 2
GENERIC = "generic.sparse_prefill_table"
REFERENCE = "reference.sparse_prefill"


def _bound(reg: Any, key: Any) -> tuple[str, Any]:
    """Which implementation's kernel, with which config, the dispatch map holds for ``key``."""
    bound = reg.dispatch_map[key]
    kernel = getattr(bound, "func", bound)  # Implementation.bind: a partial, or the bare kernel
    config = getattr(bound, "keywords", {}).get("config")
    for impl in reg.implementations("sparse_prefill"):
        try:
            if impl.load_kernel() is kernel:
                return impl.name, config
        except Exception:  # a kernel not loadable here is not the bound one
            continue
    return repr(bound), config


def _rank(rank: int, world: int, init_file: str, out_dir: str) -> None:
    # Module level, so that spawn can import it by name in the child.
    import torch.distributed as dist

    import registry

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        gen = torch.Generator().manual_seed(0)  # the same inputs on every rank
        q = torch.randn(4, 2, 16, generator=gen)
        k = torch.randn(8, 1, 16, generator=gen)
        v = torch.randn(8, 1, 16, generator=gen)
        idx = torch.randint(0, 8, (4, 4), dtype=torch.int32, generator=gen)
        reg = registry.get_registry()
        ctx = registry.override("sparse_prefill", REFERENCE) if rank == DIVERGENT_RANK \
            else nullcontext()
        with ctx:
            first = registry.dispatch("sparse_prefill", q, k, v, idx, kind="prefill")
            (key,) = list(reg.last_decisions)
            ran_first = reg.last_decisions[key].implementation
            before = registry.agree()
            adopted = registry.agree(adopt=True)
            with registry.record() as launches:
                second = registry.dispatch("sparse_prefill", q, k, v, idx, kind="prefill")
            bound_impl, bound_cfg = _bound(reg, key)
            after = reg.last_decisions[key]
            final = registry.agree()
            registry.invalidate()  # a pin survives invalidation (override or plugin changes)
            with registry.record() as relaunched:
                registry.dispatch("sparse_prefill", q, k, v, idx, kind="prefill")
        result = {
            "rank": rank, "ran_first": ran_first,
            "before": {"agreed": before.agreed, "keys": before.keys, "text": str(before),
                       "divergences": [{"key": d.key, "op": d.op, "workload": d.workload,
                                        "choices": {str(r): c for r, c in d.choices.items()}}
                                       for d in before.divergences]},
            "adopt": {"pinned": adopted.pinned, "text": str(adopted),
                      "adopted": [d.adopted for d in adopted.divergences]},
            "after": {"bound": bound_impl, "bound_config": bound_cfg,
                      "launched": [x.implementation for x in launches],
                      "relaunched": [x.implementation for x in relaunched],
                      "implementation": after.implementation,
                      "source": after.source, "config": after.config},
            "final_agreed": final.agreed, "final_divergences": len(final.divergences),
            "max_diff": float((second - first).abs().max()),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_agree_reports_and_resolves_a_planted_divergence(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.multiprocessing as tmp

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("KREG_DAEMON", raising=False)
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    tmp.spawn(_rank, args=(WORLD, str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD,
              join=True)
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]

    assert [r["ran_first"] for r in res] == [GENERIC, GENERIC, REFERENCE]
    # Exactly one divergence, the same report on every rank, every rank's choice in it.
    for r in res:
        b = r["before"]
        assert b["agreed"] is False and b["keys"] == 1 and len(b["divergences"]) == 1
        assert b["divergences"] == res[0]["before"]["divergences"]
    div = res[0]["before"]["divergences"][0]
    assert div["op"] == "sparse_prefill"
    assert div["workload"] == {"kind": "prefill", "topk": 4, "head_dim": 16, "group_size": 2,
                               "num_kv_heads": 1, "total_q": 4, "num_requests": 1, "max_q": 4,
                               "dtype": "float32", "kv_len": 8}   # k's 8 slots
    choices = div["choices"]
    assert choices["2"] == [REFERENCE, None]
    assert choices["0"][0] == choices["1"][0] == GENERIC
    assert choices["0"] == choices["1"] and choices["0"][1]["BLOCK_M"] == 16
    text = res[0]["before"]["text"]
    assert "3 ranks, 1 decision keys, 1 divergent" in text
    assert f"rank 2: {REFERENCE}  config: -" in text and f"rank 0: {GENERIC}  config: BLOCK_M=16" \
        in text

    # adopt=True: rank 2 is pinned to rank 0's kernel and config; the others change nothing.
    # Rank 2 re-binds its dispatch entry (and its decision-cache copy); the others keep theirs.
    assert [r["adopt"]["pinned"] for r in res][:2] == [0, 0] and res[2]["adopt"]["pinned"] >= 1
    assert all(r["adopt"]["adopted"] == [True] for r in res)
    cfg0 = choices["0"][1]
    for r in res:
        assert r["after"]["implementation"] == GENERIC
        assert r["after"]["config"] == cfg0
        assert r["after"]["bound"] == GENERIC and r["after"]["bound_config"] == cfg0
        assert r["after"]["relaunched"] == [GENERIC]
        assert r["after"]["launched"] == [GENERIC]
        assert r["final_agreed"] is True and r["final_divergences"] == 0
        assert r["max_diff"] < 1e-4  # the adopted kernel computes the same op
    assert res[2]["after"]["source"] == "adopted"
    assert res[0]["after"]["source"] == "local"


def test_agree_needs_an_initialized_process_group() -> None:
    import registry
    from registry.errors import ConfigError

    if torch.distributed.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(ConfigError, match="init_process_group"):
        registry.agree()
