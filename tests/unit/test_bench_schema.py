"""``kreg bench OP --json`` has one schema for every op (docs/BENCHMARKS.md, "JSON schema"),
and the harness behind it scores failures instead of aborting."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

import cli
import registry
from registry.tuning import Trial, measure

TINY = {
    "sparse_prefill": ["--kind", "prefill", "--group-size", "6", "--kv-len", "40", "--total-q",
                       "3", "--topk", "20", "--head-dim", "16", "--dtype", "float32"],
    "indexer_topk": ["--rows", "2", "--keys", "64", "--k", "8"],
}


def _report(op: str) -> dict[str, Any]:
    res = CliRunner().invoke(cli.main, ["bench", op, *TINY[op], "--warmup", "0", "--iters", "1",
                                        "--providers", "reference,auto", "--baseline",
                                        "reference", "--json"])
    assert res.exit_code == 0, res.output
    return dict(json.loads(res.output[res.output.index("{"):]))


def test_both_ops_print_the_same_json_schema() -> None:
    a, b = _report("sparse_prefill"), _report("indexer_topk")
    assert set(a) == set(b) == {"schema", "op", "device", "graphs", "cases"}
    assert a["schema"] == b["schema"] == "kreg.bench/1"
    assert (a["op"], b["op"]) == ("sparse_prefill", "indexer_topk")
    assert set(a["device"]) == set(b["device"]) == {"name", "arch", "torch", "triton", "runtime"}
    (ca,), (cb,) = a["cases"], b["cases"]
    assert set(ca) == set(cb) == {"case", "workload", "params", "baseline", "results", "extra"}
    assert set(cb["extra"]) >= {"bytes_read", "floor_us", "scratch_bytes_per_row", "note"}
    keys = {"label", "runs", "status", "detail", "error", "ms", "ratio", "timing",
            "implementation", "config"}
    for case in (ca, cb):
        assert [r["label"] for r in case["results"]] == ["reference", "auto"]
        for r in case["results"]:
            assert set(r) == keys and r["status"] == "ok" and r["ms"] is not None
    # indexer_topk times its reference in the window (a ratio of 1 to itself); sparse_prefill's
    # slow reference takes its own short window, so no ratio is claimed against it.
    assert cb["results"][0]["ratio"] == 1.0 and cb["results"][0]["timing"] == "plain"
    assert ca["results"][0]["ratio"] is None and ca["results"][0]["timing"] == "isolated"
    # `auto` says what served it: what selection picks for the case on this machine.
    want = registry.select("indexer_topk", {"k": 8, "num_rows": 2, "max_keys": 64,
                                            "dtype": "float32"})
    assert cb["results"][1]["implementation"] == want.implementation
    assert cb["results"][1]["config"] == want.config


def test_a_provider_naming_an_ineligible_implementation_fails_with_the_reason() -> None:
    res = CliRunner().invoke(cli.main, ["bench", "indexer_topk", *TINY["indexer_topk"],
                                        "--warmup", "0", "--iters", "1", "--providers",
                                        "reference,amd_mi355x.indexer_topk_sliced",
                                        "--baseline", "reference"])
    assert res.exit_code == 1
    assert "amd_mi355x.indexer_topk_sliced cannot serve this workload" in res.output
    assert "vendor: cpu, requires amd" in res.output


def test_the_harness_scores_raises_and_violations_and_times_the_rest() -> None:
    import torch

    want = torch.arange(6.0)

    def boom() -> Any:
        raise RuntimeError("compile failed")

    def compare(actual: Any, expected: Any) -> str | None:
        return None if torch.equal(actual, expected) else "differs"

    seen: list[float] = []

    def good() -> Any:
        out = torch.arange(6.0)
        seen.append(float(out.sum()))
        return out

    results = measure([Trial("good", good), Trial("boom", boom),
                       Trial("wrong", lambda: torch.zeros(6)),
                       Trial("anchor", lambda: torch.ones(6), judged=False,
                             describe=lambda got: "anchor note")],
                      expected=want, compare=compare, warmup=0, iters=2, baseline="good")
    by = {m.label: m for m in results}
    assert by["good"].status == "ok" and by["good"].ms is not None and by["good"].ratio == 1.0
    assert by["boom"].status == "error" and "compile failed" in by["boom"].detail
    assert by["boom"].ms is None and by["wrong"].ms is None
    assert by["wrong"].status == "violation" and by["wrong"].detail == "differs"
    assert by["anchor"].status == "unjudged" and by["anchor"].detail == "anchor note"
    assert by["anchor"].ms is not None
    assert len(seen) >= 3  # checked once, then timed


def test_the_harness_poisons_the_output_block_first() -> None:
    import torch

    want = torch.ones(1024)
    # A kernel that returns an uninitialized buffer of the right size: after the poison it
    # reads NaN (the allocator hands the poisoned block back), never a correct stale answer.
    torch.ones(1024)   # a block that held the right answer once
    results = measure([Trial("lazy", lambda: torch.empty(1024))], expected=want,
                      compare=lambda a, e: None if torch.equal(a, e) else "wrong",
                      warmup=0, iters=1)
    assert results[0].status == "violation"


@pytest.mark.parametrize("op", ["sparse_prefill", "indexer_topk"])
def test_bench_table_names_what_ran(op: str) -> None:
    res = CliRunner().invoke(cli.main, ["bench", op, *TINY[op], "--warmup", "0", "--iters",
                                        "1", "--providers", "reference,auto", "--baseline",
                                        "reference"])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if "  auto  " in line)
    picked = registry.select(op, _report(op)["cases"][0]["workload"])
    assert f"{picked.implementation} {registry.format_config(picked.config)}" in row
