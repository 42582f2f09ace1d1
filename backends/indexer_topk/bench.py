"""Benchmark library for ``indexer_topk`` and the click command ``bench_command``.

``kreg bench indexer_topk`` runs it (``OpSpec.bench`` names :data:`bench_command`); every provider
goes through the one harness, :func:`registry.tuning.measure`, and ``--json`` prints its report.
Importing this module imports neither torch nor Triton; both load inside the functions that
need them.

Inputs (:func:`make_inputs`): scores ~ N(0, 1) from a seeded generator, ``[rows, keys]`` in the
chosen dtype; lengths = keys for every row, or with ``--ragged`` a causal ramp
``lengths[r] = ceil((r + 1) * keys / rows)`` (row r of a prefill chunk sees r-proportional keys).

Providers (``--providers``, comma separated):

* ``torch-topk`` / ``torch-topk-unsorted``: ``torch.topk(scores, k, sorted=True/False)`` over the
  whole row (the anchors; they ignore lengths and ties order, so they are checked as a set
  only where the row is full and reported, never failing the run).
* ``flashinfer-topk``: FlashInfer's raw kernel, ``flashinfer.top_k_ragged_transform(scores,
  offsets=0, lengths, k, tie_break=1)`` on the scores as given (what a framework would call
  instead of kreg: the same membership rule, its own output order), an unjudged anchor compared
  as a set on every row; needs FlashInfer importable (``pip install 'kreg[flashinfer]'``).
  ``flashinfer.indexer_topk`` (kreg's exact wrapper around it, ascending order) is the
  registry implementation.
* ``reference``: the exact torch reference (timed too).
* ``triton``: the Triton kernels at :func:`triton_kernels.default_config` for the shape.
* ``geometry=SLICE_KEYSxMAX_SLICESxWARPS[:key=val...]``: the Triton kernels at a forced config,
  e.g. ``geometry=1024x64x4`` (the MI355X policy's geometry) or
  ``geometry=131072x1x4:FUSED=0`` (one slice a row), or keys alone:
  ``geometry=FUSED=0:GROUP=32``; keys not given come from ``resolve_config`` (the shape's
  defaults).
* ``auto`` and implementation names (optionally ``:measure``): through
  ``registry.dispatch("indexer_topk", scores, lengths, k=k)`` under ``registry.override``.

Every kreg provider's output is compared entry by entry with the reference on every run; any
difference makes the command exit 1. Timed providers alternate in one window
(``registry.tuning.timing.interleaved_median_ms``, CUDA events): plain launches, or with
``--graphs`` replays of a CUDA graph captured per provider (the GPU time without the host's
launch cost, as inside a captured decode step; the reference, which synchronizes, is then
reported as not capturable).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import click

from backends import flashinfer_for_bench

__all__ = ["BenchCase", "bench_command", "make_inputs", "parse_geometry", "run_case"]



@dataclass
class BenchCase:
    rows: int = 64
    keys: int = 131072
    k: int = 2048
    dtype: str = "float32"
    ragged: bool = False
    seed: int = 0
    dist: str = "randn"

    def label(self) -> str:
        dist = "" if self.dist == "randn" else f" {self.dist}"
        return (f"{self.rows}x{self.keys}{' causal' if self.ragged else ''}{dist} {self.dtype} "
                f"k={self.k}")


def make_inputs(case: BenchCase, device: Any = None) -> tuple[Any, Any]:
    import torch

    from backends.indexer_topk.distributions import make_scores

    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    scores = make_scores(case.dist, case.rows, case.keys, dtype=getattr(torch, case.dtype),
                         device=dev, seed=case.seed)
    if case.ragged:
        r = torch.arange(1, case.rows + 1, device=dev, dtype=torch.int64)
        lengths = ((r * case.keys + case.rows - 1) // case.rows).to(torch.int32)
    else:
        lengths = torch.full((case.rows,), case.keys, dtype=torch.int32, device=dev)
    return scores, lengths


def parse_geometry(spec: str) -> dict[str, int]:
    """``SLICE_KEYSxMAX_SLICESxWARPS[:KEY=VAL...]`` or ``KEY=VAL[:KEY=VAL...]`` -> config."""
    head, *opts = spec.split(":")
    cfg: dict[str, int] = {}
    if "=" in head:
        opts = [head, *opts]
    else:
        try:
            sk, ms, w = (int(x) for x in head.split("x"))
        except ValueError:
            raise click.BadParameter(f"geometry {spec!r}: expected SLICE_KEYSxMAX_SLICESxWARPS"
                                     "[:KEY=VAL...], e.g. 1024x64x4, or KEY=VAL[:KEY=VAL...], "
                                     "e.g. SEARCH_WARPS=16") from None
        cfg = {"SLICE_KEYS": sk, "MAX_SLICES": ms, "num_warps": w}
    for o in opts:
        key, _, val = o.partition("=")
        try:
            cfg[key] = int(val)
        except ValueError:
            raise click.BadParameter(f"geometry option {o!r}: expected KEY=INT") from None
    return cfg


def _trial(name: str, scores: Any, lengths: Any, k: int) -> Any:
    """A harness trial for a non-registry provider, or None for ``auto`` / implementation names."""
    import torch

    from registry.tuning import Trial

    if name == "torch-topk":
        return Trial(name, lambda: torch.topk(scores, k, dim=1, sorted=True).indices,
                     runs="torch.topk(sorted=True)", judged=False,
                     describe=lambda got: _anchor_report(got, scores, lengths, k))
    if name == "torch-topk-unsorted":
        return Trial(name, lambda: torch.topk(scores, k, dim=1, sorted=False).indices,
                     runs="torch.topk(sorted=False)", judged=False,
                     describe=lambda got: _anchor_report(got, scores, lengths, k))
    if name == "flashinfer-topk":
        fi = flashinfer_for_bench("flashinfer-topk")
        rows = scores.shape[0]
        offsets = torch.zeros(rows, dtype=torch.int32, device=scores.device)
        lens = lengths.to(torch.int32).contiguous()
        return Trial(name, lambda: fi.top_k_ragged_transform(scores, offsets, lens, k,
                                                             tie_break=1),
                     runs="flashinfer.top_k_ragged_transform(tie_break=1)", judged=False,
                     describe=lambda got: _set_report(got, scores, lengths, k))
    if name == "reference":
        from backends.indexer_topk.reference import indexer_topk_reference
        return Trial(name, lambda: indexer_topk_reference(scores, lengths, k),
                     runs="torch reference", implementation="reference.indexer_topk")
    if name == "triton" or name.startswith("geometry="):
        from backends.indexer_topk import triton_kernels as tk
        from registry import format_config
        rows, n = scores.shape
        cfg: dict[str, int] = {} if name == "triton" else parse_geometry(name.split("=", 1)[1])
        full = tk.resolve_config(cfg, rows, n, k)
        tk.validate_config(full, k, n)
        return Trial(name, lambda: tk.indexer_topk_triton(scores, lengths, k, config=cfg),
                     runs=f"triton {format_config(full)}", config=full,
                     implementation="generic.indexer_topk_radix")
    return None


def _set_report(got: Any, scores: Any, lengths: Any, k: int) -> str:
    """An unordered provider's rows against the exact reference as sets (every row; -1
    padding compared too)."""
    import torch

    from backends.indexer_topk.reference import indexer_topk_reference

    want = indexer_topk_reference(scores, lengths, k)
    g = torch.sort(got.to(torch.int64), dim=1).values
    w = torch.sort(want.to(torch.int64), dim=1).values
    same = (g == w).all(dim=1) if g.shape == w.shape else torch.zeros(1, dtype=torch.bool)
    return "same set" if bool(same.all()) else f"differs on {int((~same).sum())} rows"


def _anchor_report(got: Any, scores: Any, lengths: Any, k: int) -> str:
    """torch.topk as a set on full rows (order and tie choice may differ)."""
    import torch

    from backends.indexer_topk.reference import indexer_topk_reference

    n = scores.shape[1]
    full = (lengths == n).nonzero().flatten()
    if full.numel() == 0:
        return "n/a"
    want = indexer_topk_reference(scores[full], lengths[full], k)
    g = torch.sort(got[full].to(torch.int64), dim=1).values
    w = torch.sort(want.to(torch.int64), dim=1).values
    same = (g == w).all(dim=1)
    return "same set" if bool(same.all()) else f"differs on {int((~same).sum())} rows (ties)"


def run_case(case: BenchCase, providers: list[str], *, warmup: int = 5, iters: int = 50,
             baseline: str | None = None, device: Any = None,
             graphs: bool = False) -> Any:
    """Check and time every provider on one case through the one harness
    (:func:`registry.tuning.measure`); returns a :class:`registry.tuning.measure.CaseResult`.

    ``graphs``: time CUDA-graph replays of each provider (GPU time without host launch cost);
    a provider that cannot be captured is reported and not timed."""
    import registry
    from backends.indexer_topk.compare import differing_entries
    from backends.indexer_topk.reference import indexer_topk_reference
    from registry.tuning import measure
    from registry.tuning.measure import CaseResult, registry_candidates

    scores, lengths = make_inputs(case, device)
    want = indexer_topk_reference(scores, lengths, case.k)
    trials = []
    workload = {"k": case.k, "num_rows": case.rows, "max_keys": case.keys, "dtype": case.dtype}
    for name in providers:
        trial = _trial(name, scores, lengths, case.k)
        if trial is None:
            trial, = registry_candidates(
                "indexer_topk", [name],
                lambda: registry.dispatch("indexer_topk", scores, lengths, k=case.k), workload,
                inputs=((scores, lengths), {"k": case.k}))
        trials.append(trial)
    spec = registry.get_registry().spec("indexer_topk")
    results = measure(trials, expected=want, compare=spec.load_compare(), metric=differing_entries,
                      warmup=warmup, iters=iters, graphs=graphs,
                      baseline=baseline or providers[0])
    extra = _floor(scores, trials, case)
    return CaseResult(case=case.label(), workload=workload, measurements=results,
                      params={"ragged": case.ragged, "seed": case.seed, "dist": case.dist},
                      baseline=baseline or providers[0], extra=extra)


def _copy_gbps() -> float | None:
    """This GPU's copy bandwidth (GB/s: a 1 GiB device-to-device copy, read + write), measured
    once a process; None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    cached = _COPY.get("gbps")
    if cached is None:
        from registry.tuning import interleaved_median_ms

        src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        ms = interleaved_median_ms({"copy": lambda: dst.copy_(src)}, warmup=3, iters=10)["copy"]
        cached = _COPY["gbps"] = 2 * src.numel() * 4 / (ms * 1e-3) / 1e9
        del src, dst
    return cached


_COPY: dict[str, float] = {}


_NO_WORKSPACE = ("nvidia_hopper.indexer_topk_cluster", "nvidia_hopper.indexer_topk_stream")


def _floor(scores: Any, trials: list[Any], case: BenchCase) -> dict[str, Any]:
    """The case's HBM floor (one read of the scores at the measured copy bandwidth) and the
    scratch bytes a row of each Triton provider's config, for the table and the JSON."""
    from backends.indexer_topk.config import scratch_bytes_per_row

    read = scores.numel() * scores.element_size()
    gbps = _copy_gbps()
    floor_us = read / (gbps * 1e9) * 1e6 if gbps else None
    scratch = {t.label: scratch_bytes_per_row(t.config, case.k, case.keys)
               for t in trials if t.config and "SLICE_KEYS" in t.config}
    # the CUDA kernels keep nothing in global memory between their phases
    scratch.update({t.label: 0 for t in trials if t.implementation in _NO_WORKSPACE})
    note = f"one read of the scores: {read / 1e6:.1f} MB"
    if floor_us is not None:
        note += f" = {floor_us:.1f} us at the measured copy bandwidth {gbps:.0f} GB/s"
    if scratch:
        note += "; scratch a row: " + ", ".join(f"{k} {v / 1024:.0f} KiB"
                                                for k, v in scratch.items())
    return {"bytes_read": read, "floor_us": floor_us, "copy_gbps": gbps,
            "scratch_bytes_per_row": scratch, "note": note}


def _plot(results: list[Any], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise click.ClickException("--plot needs matplotlib: pip install matplotlib") from None
    names = sorted({m.label for r in results for m in r.measurements if m.ms is not None})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(results)), 4.5))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        ys = [next((m.ms * 1e3 for m in r.measurements if m.label == n and m.ms), 0)
              for r in results]
        ax.bar([x + i * width for x in range(len(results))], ys, width, label=n)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(results))])
    ax.set_xticklabels([r.case.split(" ")[0] + (" causal" if r.params["ragged"] else "")
                        for r in results], rotation=20)
    ax.set_ylabel("us (median)")
    ax.set_yscale("log")
    ax.set_title(f"indexer_topk, k={results[0].workload['k']}, {results[0].workload['dtype']}",
                 fontsize=9)
    # Outside the axes: a legend inside covered a bar (issue #24).
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)


def _ints(ctx: Any, param: Any, value: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma separated ints") from None


@click.command("indexer_topk")
@click.option("--rows", default="1,64,1024,4096", callback=_ints, show_default=True,
              help="comma list of row counts")
@click.option("--keys", default="131072", callback=_ints, show_default=True,
              help="comma list of max_keys")
@click.option("--ragged", is_flag=True, help="causal lengths (row r sees ~(r+1)/rows of keys)")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              default="float32", show_default=True)
@click.option("--k", "k", default=2048, show_default=True, type=int)
@click.option("--warmup", default=5, show_default=True, type=int)
@click.option("--iters", default=50, show_default=True, type=int)
@click.option("--providers", default="torch-topk,torch-topk-unsorted,triton,auto",
              show_default=True, help="comma list (see the module doc)")
@click.option("--baseline", default="torch-topk", show_default=True,
              help="provider the ratio column divides by")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="write a bar chart PNG (needs matplotlib)")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--dist", "dists", default="randn", show_default=True,
              help="comma list of score distributions (backends/indexer_topk/distributions.py): "
                   "randn, ties, zeros, recent, lowbits, relu, relu10, quant256, fp8, ramp")
@click.option("--graphs", is_flag=True,
              help="time CUDA-graph replays (GPU time without host launch cost)")
def bench_command(rows: list[int], keys: list[int], ragged: bool, dtype: str, k: int,
                  warmup: int, iters: int, providers: str, baseline: str, as_json: bool,
                  plot: str | None, seed: int, dists: str, graphs: bool) -> None:
    """Time indexer_topk providers against torch.topk; exact check on every run."""
    names = [p.strip() for p in providers.split(",") if p.strip()]
    if not names:
        raise click.BadParameter("--providers is empty")
    if "flashinfer-topk" in names:
        # before any case runs: a missing FlashInfer is a usage error
        flashinfer_for_bench("flashinfer-topk")
    from backends.indexer_topk.distributions import DISTRIBUTIONS

    names_d = [d.strip() for d in dists.split(",") if d.strip()]
    unknown = [d for d in names_d if d not in DISTRIBUTIONS]
    if unknown or not names_d:
        raise click.BadParameter(f"{unknown or dists!r}: expected a comma list of "
                                 f"{', '.join(DISTRIBUTIONS)}", param_hint="--dist")
    cases = [BenchCase(rows=r, keys=n, k=k, dtype=dtype, ragged=ragged, seed=seed, dist=d)
             for d in names_d for r in rows for n in keys]
    results = []
    with click.progressbar(cases, label="indexer_topk", file=sys.stderr,
                           item_show_func=lambda c: c.label() if c else None) as bar:
        for case in bar:
            results.append(run_case(case, names, warmup=warmup, iters=iters, baseline=baseline,
                                    graphs=graphs))
    failed = [(r.case, m.label) for r in results for m in r.measurements if m.failed]
    if as_json:
        from registry.tuning.measure import bench_report

        click.echo(json.dumps(bench_report("indexer_topk", results, graphs=graphs), indent=1))
    else:
        from registry.tuning.measure import bench_header, format_table

        click.echo(bench_header("indexer_topk", graphs=graphs,
                                note="differ = entries that differ from the exact reference"))
        click.echo(format_table(results, unit="us", error_name="differ"))
    if plot:
        _plot(results, plot)
    if failed:
        click.echo(f"indexer_topk: {len(failed)} provider run(s) not exact or failed: {failed}",
                   err=True)
        sys.exit(1)
