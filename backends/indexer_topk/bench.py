"""Benchmark library for ``indexer_topk`` and the click command ``bench_command``.

``kreg bench indexer_topk`` (the lead attaches :data:`bench_command`) and
``benchmarks/bench_indexer_topk.py`` run it. Importing this module imports neither torch nor
Triton; both load inside the functions that need them.

Inputs (:func:`make_inputs`): scores ~ N(0, 1) from a seeded generator, ``[rows, keys]`` in the
chosen dtype; lengths = keys for every row, or with ``--ragged`` a causal ramp
``lengths[r] = ceil((r + 1) * keys / rows)`` (row r of a prefill chunk sees r-proportional keys).

Providers (``--providers``, comma separated):

* ``torch-topk`` / ``torch-topk-unsorted``: ``torch.topk(scores, k, sorted=True/False)`` over the
  whole row (the anchors; they ignore lengths and ties order, so they are checked as a set
  only where the row is full and reported, never failing the run).
* ``reference``: the exact torch reference (timed too).
* ``triton``: the Triton kernels at :func:`triton_kernels.default_config` for the shape.
* ``geometry=SLICE_KEYSxMAX_SLICESxWARPS[:key=val...]``: the Triton kernels at a forced config,
  e.g. ``geometry=1024x64x4`` (the MI355X policy's geometry) or
  ``geometry=131072x1x4:SEARCH_BITS=2``, or keys alone: ``geometry=FUSED=0:GROUP=32``; keys
  not given come from ``resolve_config`` (the shape's defaults).
* ``auto`` and implementation names (optionally ``:measure``): through
  ``registry.dispatch("indexer_topk", scores, lengths, k=k)`` under ``registry.override``.

Every kreg provider's output is compared entry by entry with the reference on every run; any
difference makes the command exit 1. Timed providers alternate in one window
(``registry._timing.interleaved_median_ms``, CUDA events): plain launches, or with
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

__all__ = ["BenchCase", "bench_command", "make_inputs", "parse_geometry", "run_case"]

_ANCHORS = ("torch-topk", "torch-topk-unsorted")


@dataclass
class BenchCase:
    rows: int = 64
    keys: int = 131072
    k: int = 2048
    dtype: str = "float32"
    ragged: bool = False
    seed: int = 0

    def label(self) -> str:
        return f"{self.rows}x{self.keys}{' causal' if self.ragged else ''} {self.dtype} k={self.k}"


def make_inputs(case: BenchCase, device: Any = None) -> tuple[Any, Any]:
    import torch

    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator(device=dev).manual_seed(case.seed)
    scores = torch.randn(case.rows, case.keys, generator=g, device=dev).to(
        getattr(torch, case.dtype))
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


def _provider_fn(name: str, scores: Any, lengths: Any, k: int) -> Any:
    import torch

    if name == "torch-topk":
        return lambda: torch.topk(scores, k, dim=1, sorted=True).indices
    if name == "torch-topk-unsorted":
        return lambda: torch.topk(scores, k, dim=1, sorted=False).indices
    if name == "reference":
        from backends.indexer_topk.reference import indexer_topk_reference
        return lambda: indexer_topk_reference(scores, lengths, k)
    if name == "triton" or name.startswith("geometry="):
        from backends.indexer_topk import triton_kernels as tk
        rows, n = scores.shape
        cfg: dict[str, int] = {} if name == "triton" else parse_geometry(name.split("=", 1)[1])
        tk.validate_config(tk.resolve_config(cfg, rows, n, k), k, n)
        return lambda: tk.indexer_topk_triton(scores, lengths, k, config=cfg)
    try:
        import registry
    except ImportError as e:   # pragma: no cover - registry is part of this repo
        raise click.ClickException(f"provider {name!r} needs the registry: {e}") from None
    impl = name

    def call() -> Any:
        if impl == "auto":
            return registry.dispatch("indexer_topk", scores, lengths, k=k)
        with registry.override("indexer_topk", impl):
            return registry.dispatch("indexer_topk", scores, lengths, k=k)
    return call


def _anchor_report(got: Any, want: Any, lengths: Any, n: int) -> str:
    """torch.topk as a set on full rows (order and tie choice may differ)."""
    import torch

    full = (lengths == n).nonzero().flatten()
    if full.numel() == 0:
        return "n/a"
    g = torch.sort(got[full].to(torch.int64), dim=1).values
    w = torch.sort(want[full].to(torch.int64), dim=1).values
    same = (g == w).all(dim=1)
    return "same set" if bool(same.all()) else f"differs on {int((~same).sum())} rows (ties)"


def run_case(case: BenchCase, providers: list[str], *, warmup: int = 5, iters: int = 50,
             baseline: str | None = None, device: Any = None,
             progress: Any = None, graphs: bool = False) -> dict[str, Any]:
    """Time and check every provider on one case; returns a JSON-able dict.

    ``graphs``: time CUDA-graph replays of each provider (GPU time without host launch cost);
    a provider that cannot be captured is reported with its error and not timed."""
    import torch

    from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches
    from registry._timing import graphed, interleaved_median_ms

    scores, lengths = make_inputs(case, device)
    want = indexer_topk_reference(scores, lengths, case.k)
    fns: dict[str, Any] = {}
    result: dict[str, Any] = {"case": case.label(), "rows": case.rows, "keys": case.keys,
                              "k": case.k, "dtype": case.dtype, "ragged": case.ragged,
                              "providers": {}}
    for name in providers:
        entry: dict[str, Any] = {}
        result["providers"][name] = entry
        try:
            fn = _provider_fn(name, scores, lengths, case.k)
            got = fn()
        except Exception as e:
            # An anchor that cannot run (k > keys for torch.topk) is reported, not a failure.
            entry.update(error=f"{type(e).__name__}: {e}",
                         exact=None if name in _ANCHORS else False)
            continue
        if name in _ANCHORS:
            entry["check"] = _anchor_report(got, want, lengths, case.keys)
            entry["exact"] = None
        else:
            bad = topk_mismatches(got, want)
            entry["exact"] = not bad
            if bad:
                entry["mismatches"] = bad[:4]
        fns[name] = fn
        if progress is not None:
            progress(name)
    if graphs and torch.cuda.is_available():
        for name in list(fns):
            try:
                fns[name] = graphed(fns[name])
            except Exception as e:   # e.g. a provider that synchronizes
                result["providers"][name]["error"] = f"not capturable in a CUDA graph: {e}"
                del fns[name]
    result["graphs"] = bool(graphs and torch.cuda.is_available())
    times = interleaved_median_ms(fns, warmup=warmup, iters=iters) if fns else {}
    base = baseline if baseline in times else (providers[0] if providers[0] in times else None)
    for name, ms in times.items():
        entry = result["providers"][name]
        entry["us"] = round(ms * 1e3, 2)
        if base is not None:
            entry["ratio"] = round(ms / times[base], 3)
    result["baseline"] = base
    return result


def _plot(results: list[dict[str, Any]], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise click.ClickException("--plot needs matplotlib: pip install matplotlib") from None
    names = sorted({n for r in results for n, e in r["providers"].items() if "us" in e})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(results)), 4))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        ys = [r["providers"].get(n, {}).get("us", 0) for r in results]
        ax.bar([x + i * width for x in range(len(results))], ys, width, label=n)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(results))])
    ax.set_xticklabels([r["case"].split(" ")[0] + (" causal" if r["ragged"] else "")
                        for r in results], rotation=20)
    ax.set_ylabel("us (median)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
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
@click.option("--graphs", is_flag=True,
              help="time CUDA-graph replays (GPU time without host launch cost)")
def bench_command(rows: list[int], keys: list[int], ragged: bool, dtype: str, k: int,
                  warmup: int, iters: int, providers: str, baseline: str, as_json: bool,
                  plot: str | None, seed: int, graphs: bool) -> None:
    """Time indexer_topk providers against torch.topk; exact check on every run."""
    names = [p.strip() for p in providers.split(",") if p.strip()]
    if not names:
        raise click.BadParameter("--providers is empty")
    cases = [BenchCase(rows=r, keys=n, k=k, dtype=dtype, ragged=ragged, seed=seed)
             for r in rows for n in keys]
    results = []
    with click.progressbar(length=len(cases) * len(names), label="indexer_topk",
                           file=sys.stderr) as bar:
        for case in cases:
            results.append(run_case(case, names, warmup=warmup, iters=iters, baseline=baseline,
                                    progress=lambda _n: bar.update(1), graphs=graphs))
    failed = [(r["case"], n) for r in results for n, e in r["providers"].items()
              if e.get("exact") is False]
    if as_json:
        click.echo(json.dumps(results, indent=1))
    else:
        for r in results:
            how = "CUDA-graph replays" if r.get("graphs") else "plain launches"
            click.echo(f"{r['case']}  (baseline {r['baseline']}, {how})")
            for n, e in r["providers"].items():
                if "error" in e:
                    click.echo(f"  {n:<36} ERROR {e['error'][:100]}")
                    continue
                chk = e.get("check") or ("exact" if e.get("exact") else "MISMATCH")
                click.echo(f"  {n:<36} {e.get('us', float('nan')):>10.1f} us  "
                           f"x{e.get('ratio', float('nan')):<7} {chk}")
                for m in e.get("mismatches", []):
                    click.echo(f"      {m}")
    if plot:
        _plot(results, plot)
    if failed:
        click.echo(f"indexer_topk: {len(failed)} provider run(s) not exact: {failed}", err=True)
        sys.exit(1)
