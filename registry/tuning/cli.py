"""Click commands ``kreg tune`` and ``kreg tuning`` (imported only when invoked)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from registry._format import format_config
from registry.errors import KregError
from registry.tuning.store import TuningStore

F = TypeVar("F", bound=Callable[..., Any])


def _errors(fn: F) -> F:
    """kreg's errors (a store that cannot be read or written, a bad setting) as a message and
    exit status 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KregError as exc:
            name = next(c.__name__ for c in type(exc).__mro__ if not c.__name__.startswith("_"))
            raise click.ClickException(f"{name}: {exc}") from None

    return wrapper  # type: ignore[return-value]


def _grid(items: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise click.BadParameter(f"{item!r} is not FIELD=V1,V2,...", param_hint="--grid")
        out[key.strip()] = [v.strip() for v in values.split(",") if v.strip()]
    return out


@click.command()
@click.argument("op")
@click.option("--grid", "grid", multiple=True, metavar="FIELD=V1,V2,...",
              help="A grid axis, e.g. --grid total_q=32,512,8192 (see the op's tuner for axes).")
@click.option("--dry-run", is_flag=True, help="List what would be measured, measure nothing.")
@click.option("--no-resume", is_flag=True, help="Measure points already in the store again.")
@click.option("--warmup", default=5, show_default=True)
@click.option("--iters", default=30, show_default=True)
@click.option("--min-gain", "min_gain", type=float, default=None, metavar="FRACTION",
              help="Keep the baseline (the table) unless a config beats it by more than this "
                   "fraction  [default: 0.03]")
@click.option("--plot", "plot", type=click.Path(dir_okay=False), default=None,
              help="Draw the crossover chart (time against the point per config) to a PNG.")
@click.option("--json", "as_json", is_flag=True)
@_errors
def tune(op: str, grid: tuple[str, ...], dry_run: bool, no_resume: bool, warmup: int,
         iters: int, min_gain: float | None, plot: str | None, as_json: bool) -> None:
    """Sweep OP's valid configs on this device; write each workload bucket's winner to the
    store."""
    import registry
    from registry.tuning.tune import DEFAULT_MIN_GAIN, load_tuner
    from registry.tuning.tune import tune as run_tune

    min_gain = DEFAULT_MIN_GAIN if min_gain is None else min_gain
    if not 0.0 <= min_gain < 1.0:
        raise click.BadParameter(f"{min_gain} is not a fraction in [0, 1); e.g. 0.03 keeps the "
                                 f"baseline unless a config is more than 3% faster",
                                 param_hint="--min-gain")

    from registry.tuning.tune import cannot_run_here

    tuner = load_tuner(op)
    facts = registry.probe()
    cases = tuner.cases(_grid(grid))
    store = TuningStore()
    # Up front, dry run too: a device where the tuned kernel cannot run measures nothing.
    blocked = {tuner.label(c): why for c in cases
               if (why := cannot_run_here(op, tuner.bucket(c), facts))}
    if cases and len(blocked) == len(cases):
        reasons = sorted(set(blocked.values()))
        raise click.ClickException(
            f"no candidate of {op} can run on {facts.describe()}: " + " | ".join(reasons)
            + f" (all {len(cases)} points); nothing to measure")
    if blocked:
        click.echo(f"# {len(blocked)} of {len(cases)} points cannot run here and are not "
                   f"measured: " + " | ".join(sorted(set(blocked.values()))), err=True)
    if not dry_run:
        store.ensure_writable()  # before measuring for minutes, not after
    import shlex

    command = "kreg tune " + shlex.join([op, *[f"--grid={g}" for g in grid],
                                         f"--warmup={warmup}", f"--iters={iters}",
                                         f"--min-gain={min_gain:g}"])
    click.echo(f"# tuning {op} on {facts.describe()}; store {store.path}", err=True)
    with click.progressbar(length=len(cases), label="points", file=sys.stderr) as bar:
        results = run_tune(op, _grid(grid), facts=facts, store=store, dry_run=dry_run,
                           resume=not no_resume, warmup=warmup, iters=iters,
                           on_point=lambda r: bar.update(1), command=command,
                           min_gain=min_gain)
    if as_json:
        click.echo(json.dumps([{**vars(r), "timings": {k: m.as_json()
                                                         for k, m in r.timings.items()}}
                               for r in results], indent=2, default=str))
    else:
        for r in results:
            pruned = [f"{lab} ({note})" for lab, cfg, note in r.candidates if cfg is None]
            valid = [lab for lab, cfg, _ in r.candidates if cfg is not None]
            head = f"{r.label}: {r.status}" + (f" ({r.note})" if r.note else "")
            if r.unconfirmed:
                head += f"; kept the baseline {r.winner}"
            elif r.winner and r.fastest and r.winner != r.fastest and r.winner != r.baseline:
                head += (f"; winner {r.winner} (the smallest worst ratio over the bucket's "
                         f"points; here the fastest was {r.fastest})")
            elif r.winner and r.fastest and r.winner != r.fastest:
                fast, kept = r.timings[r.fastest].ms or 0.0, r.timings[r.winner].ms or 0.0
                head += (f"; kept the baseline {r.winner} {kept:.4f} ms: "
                         f"the fastest, {r.fastest} {fast:.4f} ms, was only "
                         f"{kept / fast:.3f}x faster (--min-gain {min_gain:g})")
            elif r.winner:
                sp = r.speedup
                head += f"; winner {r.winner} {r.timings[r.winner].ms:.4f} ms"
                if sp:
                    head += f" ({sp:.3f}x vs baseline {r.baseline})"
            click.echo(head)
            if r.status == "dry-run":
                click.echo(f"    would measure {len(valid)}: {', '.join(valid)}")
            for p in pruned:
                click.echo(f"    pruned {p}")
            for lab, t in sorted(r.timings.items(), key=lambda kv: kv[1].ms or 1e30):
                if t.status == "error":
                    click.echo(f"    {lab:<28} failed: {t.detail[:120]}")
                elif t.status == "violation":
                    click.echo(f"    {lab:<28} PAST BOUND: {t.detail[:120]}")
                elif t.ms is not None:
                    click.echo(f"    {lab:<28} {t.ms:.4f} ms")
    if plot:
        _plot(results, plot, tuner)
    violations = [v for r in results for v in r.violations]
    if violations:
        raise click.ClickException("accuracy violations: " + "; ".join(violations))
    failed = [r.label for r in results if r.status in ("no candidate ran", "cannot run here")]
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(results)} points measured nothing "
                                   f"({', '.join(failed[:5])}{', ...' if len(failed) > 5 else ''})"
                                   f"; see each point's lines above")


def _plot(results: list[Any], path: str, tuner: Any) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise click.ClickException("--plot needs matplotlib: pip install 'kreg[plot]'") from None
    point_field = getattr(tuner, "PLOT_AXIS", None)
    groups = _panels(results, point_field)
    if not groups:
        raise click.ClickException("nothing measured to plot")
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 4 * len(groups)), squeeze=False)
    for ax, (shape, series) in zip(axes[:, 0], groups.items(), strict=True):
        for lab, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p for p, _ in pts], [m for _, m in pts], marker="o", label=lab)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(point_field)
        ax.set_ylabel("ms")
        ax.set_title(shape, fontsize=8)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    click.echo(f"wrote {path}", err=True)


def _panels(results: list[Any], point_field: str | None
            ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{panel title: {config label: [(point, ms), ...]}}``: one panel per workload shape.
    Fields that move with the plot axis (max_q, equal to total_q) are not part of the shape,
    else no panel would ever join two points."""
    measured = [r for r in results if r.timings and point_field in r.bucket]
    tied = _covarying(measured, point_field)
    groups: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for r in measured:
        shape = " ".join(f"{k}={v}" for k, v in r.bucket.items()
                         if k != point_field and k not in tied)
        for lab, t in r.timings.items():
            if t.ms:
                groups.setdefault(shape, {}).setdefault(lab, []).append(
                    (r.bucket[point_field], t.ms))
    return groups


def _covarying(results: list[Any], axis: str | None) -> set[str]:
    """Bucket fields that vary, and are a function of the plot axis across ``results``."""
    out: set[str] = set()
    fields = {k for r in results for k in r.bucket} - {axis}
    for f in fields:
        seen: dict[Any, Any] = {}
        functional = True
        for r in results:
            a, v = r.bucket.get(axis), r.bucket.get(f)
            if seen.setdefault(a, v) != v:
                functional = False
                break
        if functional and len({repr(r.bucket.get(f)) for r in results}) > 1:
            out.add(f)
    return out


@click.group()
def tuning() -> None:
    """List, show, export, import or clear the tuning store's entries."""


def _entries(op: str | None) -> list[Any]:
    return [e for e in TuningStore().load() if op is None or e.op == op]


@tuning.command("list")
@click.option("--op", default=None)
@click.option("--json", "as_json", is_flag=True)
@_errors
def list_(op: str | None, as_json: bool) -> None:
    """One line per entry: its index, op, family, device, software, point and config."""
    entries = _entries(op)
    if as_json:
        click.echo(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return
    if not entries:
        click.echo(f"no entries in {TuningStore().path}")
    for i, e in enumerate(entries):
        bucket = " ".join(f"{k}={v}" for k, v in e.bucket.items())
        click.echo(f"[{i}] {e.op} {e.family} on {e.device.name} ({e.device.sm_count} SMs; triton "
                   f"{e.software.triton}) {bucket} -> {format_config(e.config)}")


@tuning.command()
@click.argument("index", type=int)
@_errors
def show(index: int) -> None:
    """Everything about entry INDEX (from `kreg tuning list`), every candidate's time included."""
    entries = _entries(None)
    if not 0 <= index < len(entries):
        raise click.ClickException(f"no entry {index}; the store has {len(entries)} "
                                   f"(indices 0..{len(entries) - 1}; see kreg tuning list)")
    click.echo(json.dumps(entries[index].model_dump(mode="json"), indent=2))


@tuning.command("export")
@click.argument("dest", type=click.Path(dir_okay=False))
@click.option("--op", default=None)
@_errors
def export(dest: str, op: str | None) -> None:
    """Write the entries as a table a vendor plugin can ship (see docs/PLUGINS.md)."""
    n = TuningStore().export_table(Path(dest), op=op)
    click.echo(f"exported {n} entries to {dest}")


@tuning.command("import")
@click.argument("src", type=click.Path(exists=True, dir_okay=False))
@_errors
def import_(src: str) -> None:
    """Merge an exported table into the store (validated first; a bad table changes nothing)."""
    n = TuningStore().import_table(Path(src))
    click.echo(f"imported {n} entries from {src}")


@tuning.command()
@click.option("--op", default=None, help="Only this op's entries.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@_errors
def clear(op: str | None, yes: bool) -> None:
    """Remove entries (all, or one op's). Asks first unless --yes."""
    store = TuningStore()
    n = len(_entries(op))
    if not n:
        click.echo("nothing to clear")
        return
    if not yes:
        click.confirm(f"remove {n} entries from {store.path}?", abort=True)
    removed = store.remove(lambda e: op is None or e.op == op)
    click.echo(f"removed {removed} entries")
