"""``registry.agree(outputs=True)`` across 3 CPU processes (gloo): identical ranks agree on their
answers; a rank whose implementation is perturbed is caught, with the op, the dispatch, what ran
and which ranks, and is an error under strict mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

WORLD = 3
BAD_RANK = 1


def _rank(rank: int, world: int, init_file: str, out_dir: str, plant: bool) -> None:
    import torch.distributed as dist

    import registry
    from registry import Implementation, hookimpl

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        if plant and rank == BAD_RANK:
            from backends.indexer_topk.reference import indexer_topk_reference

            def off_by_one(scores: Any, lengths: Any, k: int = 2048) -> Any:
                out = indexer_topk_reference(scores, lengths, k)
                out[0, 0] = -1  # a wrong answer on one rank only
                return out

            class Perturbed:
                @hookimpl
                def kreg_implementations(self) -> list[Implementation]:
                    return [Implementation(op="indexer_topk", name="perturbed.topk",
                                           priority=900, kernel=off_by_one,
                                           configurable=False)]

            registry.register_plugin(Perturbed(), "perturbed")
        gen = torch.Generator().manual_seed(0)  # the same inputs on every rank
        scores = torch.randn(4, 64, generator=gen)
        lengths = torch.full((4,), 64, dtype=torch.int32)
        honest = registry.override("indexer_topk", "reference.indexer_topk") if not (
            plant and rank == BAD_RANK) else _null()
        with honest, registry.record_outputs(["indexer_topk"], every=2):
            for _ in range(5):   # dispatches 0, 2 and 4 are digested
                registry.dispatch("indexer_topk", scores, lengths, k=8)
            report = registry.agree(outputs=True)
            again = registry.agree(outputs=True)   # nothing recorded since
            strict_error = None
            registry.dispatch("indexer_topk", scores, lengths, k=8)  # #5: not sampled
            registry.dispatch("indexer_topk", scores, lengths, k=8)  # #6: sampled
            try:
                from registry._agree import agree as _agree

                _agree(outputs=True, strict=True)
            except registry.errors.StrictModeError as exc:
                strict_error = str(exc)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
            "agreed": report.agreed, "compared": report.outputs_compared,
            "divergent": [(d.op, d.seq, {str(k): v for k, v in d.outputs.items()})
                          for d in report.output_divergences],
            "text": str(report), "again": again.outputs_compared,
            "strict_error": strict_error}))
    finally:
        dist.destroy_process_group()


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plant: bool) -> list[dict[str, Any]]:
    import torch.multiprocessing as tmp

    monkeypatch.delenv("KREG_DAEMON", raising=False)
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    tmp.spawn(_rank, args=(WORLD, str(tmp_path / "init"), str(tmp_path), plant), nprocs=WORLD,
              join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_identical_ranks_agree_on_their_outputs(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(tmp_path, monkeypatch, plant=False)
    for r in res:
        assert r["agreed"] is True and r["compared"] == 3 and r["divergent"] == []
        assert "3 replicated outputs compared, 0 differ" in r["text"]
        assert r["again"] == 0 and r["strict_error"] is None


def test_a_perturbed_rank_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(tmp_path, monkeypatch, plant=True)
    for r in res:
        assert r["agreed"] is False and r["compared"] == 3
        # Every sampled dispatch differs on rank 1 only; every rank reports the same.
        assert [(op, seq) for op, seq, _ in r["divergent"]] == [
            ("indexer_topk", 0), ("indexer_topk", 2), ("indexer_topk", 4)]
        outputs = r["divergent"][0][2]
        assert outputs["1"][0].startswith("perturbed.topk")
        assert outputs["0"][0].startswith("reference.indexer_topk")
        assert outputs["0"][1] == outputs["2"][1] != outputs["1"][1]
        assert "indexer_topk dispatch #0: outputs differ across ranks" in r["text"]
        assert "ranks [0, 2]" in r["text"] and "ranks [1]" in r["text"]
        assert r["strict_error"] is not None and "dispatch #6" in r["strict_error"]
