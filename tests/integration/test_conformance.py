"""The conformance kit (registry/testing.py) in-process: the in-tree kernels pass it, and planted
kernels that are wrong on exactly one corner of the contract fail exactly the cases that pin it.

The pytest glue (``pytest --kreg-conformance PLUGIN`` in a subprocess) is exercised by
tests/integration/test_acme_plugin.py.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import registry
from registry import Implementation, hookimpl
from registry.errors import PluginError
from registry.requirements import vendor_in
from registry.testing import Outcome, Target, conformance_targets, run_target

PLANTED = ("planted_spf", "planted_topk", "planted_gpu", "planted_bad")
# The Triton interpreter's numpy warns on the NaN and inf arithmetic of the non_finite case (made
# on purpose); the suite's "error" filter would turn those warnings into kernel failures.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:All-NaN slice encountered:RuntimeWarning")


@pytest.fixture(autouse=True)
def _wired(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point OpSpec.compare/conformance at the op modules where backends/ does not yet."""
    for op in ("sparse_prefill", "indexer_topk"):
        pkg = importlib.import_module(f"backends.{op}")
        if not pkg.SPEC.compare or not pkg.SPEC.conformance:
            monkeypatch.setattr(pkg, "SPEC", dataclasses.replace(
                pkg.SPEC, compare=pkg.SPEC.compare or f"backends.{op}.compare:compare",
                conformance=pkg.SPEC.conformance or f"backends.{op}.conformance"))
    registry.get_registry()._rebuild()
    yield
    for name in PLANTED:
        if name in registry.get_registry().plugins:
            registry.unregister_plugin(name)
    monkeypatch.undo()
    registry.get_registry()._rebuild()


def _plant(plugin: str, op: str, kernel: Any, **extra: Any) -> str:
    name = f"{plugin}.{op}"

    class Plugin:
        @hookimpl
        def kreg_implementations(self) -> list[Implementation]:
            return [Implementation(op=op, name=name, priority=300, kernel=kernel,
                                   configurable=False, **extra)]

    registry.register_plugin(Plugin(), plugin)
    return name


def _run(plugin: str, dtype: str | None = None) -> dict[str, Outcome]:
    targets = [t for t in conformance_targets(plugin) if dtype is None or t.dtype == dtype]
    assert targets
    return {t.case if dtype else f"{t.dtype}-{t.case}": run_target(t) for t in targets}


def test_targets_cover_every_case_dtype_and_implementation() -> None:
    from backends.indexer_topk import conformance as tk
    from backends.sparse_prefill import conformance as sp

    targets = conformance_targets("generic", devices=["cpu"])
    per_impl = Counter(t.implementation for t in targets)
    assert per_impl == {"generic.sparse_prefill_table": len(sp.CASES) * len(sp.DTYPES["cpu"]),
                        "generic.indexer_topk_radix": len(tk.CASES) * len(tk.DTYPES["cpu"])}
    t = next(t for t in targets if t.case == "duplicates" and t.dtype == "float16")
    assert t.name == "generic.sparse_prefill_table[cpu-float16-duplicates]"
    assert "twice" in t.doc
    with pytest.raises(PluginError, match=r"'nope' is not installed; loaded plugins: .*generic"):
        conformance_targets("nope")


def test_the_generic_triton_kernels_pass() -> None:
    """Both ops' Triton kernels, every case, float32 and float16 (the interpreter on a CPU)."""
    if registry.probe().vendor == "cpu" and registry.probe().extra.get("triton_interpret") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not set: Triton cannot run here")
    results = _run("generic")
    failed = {k: o.message for k, o in results.items() if o.status != "passed"}
    assert not failed, failed
    assert len(results) >= 40


def test_the_references_pass() -> None:
    results = _run("reference", dtype="float32")
    assert {o.status for o in results.values()} == {"passed"}


def test_a_kernel_that_ignores_lengths_fails_exactly_the_length_cases() -> None:
    from backends.sparse_prefill.reference import sparse_prefill_reference

    def no_lengths(*args: Any, lengths: Any = None, **kwargs: Any) -> Any:
        return sparse_prefill_reference(*args, **kwargs)

    _plant("planted_spf", "sparse_prefill", no_lengths)
    results = _run("planted_spf", dtype="float32")
    failed = {case for case, o in results.items() if o.status == "failed"}
    assert failed == {"empty_rows", "lengths", "chunk_ragged", "chunk_paged_prefix",
                      "strided_views"}
    msg = results["lengths"].message
    device = "cuda" if registry.probe().vendor != "cpu" else "cpu"
    assert f"planted_spf.sparse_prefill on {device} float32, case 'lengths'" in msg
    assert "max |out - ref|" in msg and "topk=37" in msg


def test_a_kernel_that_ranks_nan_first_fails_only_the_nan_case() -> None:
    from backends.indexer_topk.reference import indexer_topk_reference

    def nan_high(scores: Any, lengths: Any, k: int = 2048) -> Any:
        return indexer_topk_reference(scores.nan_to_num(nan=float("inf")), lengths, k)

    _plant("planted_topk", "indexer_topk", nan_high)
    results = _run("planted_topk", dtype="float32")
    assert {c for c, o in results.items() if o.status == "failed"} == {"nan_inf"}
    assert "missing" in results["nan_inf"].message and "extra" in results["nan_inf"].message


def test_capability_failures_are_skips_with_the_reason() -> None:
    from backends.indexer_topk.reference import indexer_topk_reference

    _plant("planted_gpu", "indexer_topk", indexer_topk_reference,
           requirements=(vendor_in("nvidia"),))
    results = _run("planted_gpu", dtype="float32")
    if registry.probe().vendor == "nvidia":
        assert {o.status for o in results.values()} == {"passed"}
        return
    assert {o.status for o in results.values()} == {"skipped"}
    assert all("vendor: cpu, requires nvidia" in o.message for o in results.values())


def test_a_kernel_that_raises_or_writes_its_inputs_fails() -> None:
    from backends.indexer_topk.reference import indexer_topk_reference

    def scribbles(scores: Any, lengths: Any, k: int = 2048) -> Any:
        if scores.shape[0] == 3:
            raise registry.errors.WorkloadError("planted: three rows are not supported")
        out = indexer_topk_reference(scores, lengths, k)
        lengths.zero_()
        return out

    _plant("planted_bad", "indexer_topk", scribbles)
    target = next(t for t in conformance_targets("planted_bad")
                  if t.case == "random" and t.dtype == "float32")
    outcome = run_target(target)
    assert outcome.status == "failed" and "modified its input argument 1" in outcome.message
    three_rows = dataclasses.replace(target, case="all_zeros")
    outcome = run_target(three_rows)
    assert outcome.status == "failed"
    assert "dispatch raised WorkloadError: planted: three rows" in outcome.message


def test_an_op_without_cases_is_reported_as_skipped() -> None:
    target = Target("p", "x", "p.x", "cpu", "-", "no-cases", "op 'x' declares no cases")
    assert run_target(target) == Outcome("skipped", "op 'x' declares no cases")


def test_cases_are_added_to_the_ops_never_replace_them() -> None:
    from backends.indexer_topk import conformance as tk

    targets = conformance_targets("generic", devices=["cpu"], probe=False,
                                  cases={"indexer_topk": "plugins.amd_mi355x:CONFORMANCE_CASES"})
    topk = [t for t in targets if t.op == "indexer_topk"]
    assert len(topk) == (len(tk.CASES) + 3) * len(tk.DTYPES["cpu"])
    assert {"random", "k2048", "k2048_past_64_slices"} <= {t.case for t in topk}


def test_a_profile_target_runs_the_table_and_reports_gluon_as_not_runnable() -> None:
    """Judged on the H200 profile, run here: the dense geometry executes and passes, a Gluon
    engine is not runnable under the interpreter (KernelUnavailableError), by name."""
    if registry.probe().vendor != "cpu":
        pytest.skip("checks the CPU's interpreter refusing Gluon")
    targets = {t.name: t for t in conformance_targets("nvidia_hopper", profiles=["h200"],
                                                      devices=["cpu"])}
    dense = targets["nvidia_hopper.sparse_prefill_tuned[h200:cpu-float32-seed_prefill_g6"
                    "@dense.prefill_g6]"]
    assert dict(dense.config or ())["DENSE"] == 250
    assert run_target(dense).status == "passed"
    wgmma = run_target(targets["nvidia_hopper.sparse_prefill_tuned[h200:cpu-float32-"
                               "seed_prefill_g12@wgmma.prefill_g12]"])
    assert wgmma.status == "not_runnable"
    assert wgmma.message.startswith("not runnable here: nvidia_hopper.sparse_prefill_tuned "
                                    "config wgmma.prefill_g12 (BLOCK_M=16 BLOCK_N=64")
    assert "does not run under TRITON_INTERPRET=1" in wgmma.message
    # this machine is a target only when no profile is given
    assert all(t.profile == "h200" for t in targets.values())
    skipped = run_target(targets["nvidia_hopper.sparse_prefill_tuned[h200:cpu-float32-random]"])
    assert skipped.status == "skipped" and "topk: 32, requires = 2051 [capability]" in \
        skipped.checks
