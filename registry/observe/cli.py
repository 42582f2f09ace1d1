"""``kreg stats``: the check-mode counters that processes persisted to ``$KREG_HOME/stats.json``.

A process running with ``KREG_CHECK=<fraction>`` (or after ``registry.check(rate)``) writes its
counters there at most once a second while they change, at once on a violation, and at exit. A
running process's own counters, without the file: ``registry.stats()``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import click

from registry._format import format_config
from registry.observe import Stats, clear_persisted, read_persisted, stats_path


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(procs: dict[int, Stats]) -> list[str]:
    lines: list[str] = []
    header = ("op", "implementation", "config", "dispatches", "checked", "violations", "errors")
    for pid, st in sorted(procs.items(), key=lambda kv: kv[1].updated, reverse=True):
        lines.append(f"pid {pid}  rate {st.rate:g}  seed {st.seed}  updated {_when(st.updated)}"
                     f"  violations {st.violations}")
        rows = [(c.op, c.implementation, format_config(c.config), str(c.dispatches), str(c.checked),
                 str(c.violations), str(c.errors)) for c in st.counters]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for i, row in enumerate([header, *rows]):
            cells = [row[j].ljust(widths[j]) if j < 3 else row[j].rjust(widths[j])
                     for j in range(len(row))]
            lines.append("  " + "  ".join(cells).rstrip())
            if i and st.counters[i - 1].last_violation:
                c = st.counters[i - 1]
                wl = " ".join(f"{k}={v}" for k, v in (c.last_workload or {}).items())
                lines.append(f"      last violation on [{wl}]: {c.last_violation}")
        lines.append("")
    return lines


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print {pid: counters} as JSON.")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The kreg home to read (default: $KREG_HOME, else ~/.cache/kreg).")
@click.option("--clear", is_flag=True, help="Delete the persisted counters.")
@click.option("--fail-on-violation", is_flag=True,
              help="Exit 1 when any persisted counter has a violation (for CI).")
def stats(as_json: bool, home: Path | None, clear: bool, fail_on_violation: bool) -> None:
    """Check-mode counters per (implementation, config), as persisted by processes that ran
    with KREG_CHECK=<fraction> (from $KREG_HOME/stats.json).

    Check mode re-runs that fraction of dispatches through the op's reference and compares;
    a running process's own counters are registry.stats().
    """
    path = stats_path(home)
    if clear:
        removed = clear_persisted(home)
        click.echo(f"removed {path}" if removed else f"nothing to remove: no {path}")
        return
    procs = read_persisted(home)
    if as_json:
        click.echo(json.dumps({str(p): s.model_dump(mode="json") for p, s in procs.items()},
                              indent=2))
    elif not procs:
        click.echo(f"no check-mode counters in {path}: run with KREG_CHECK=<fraction> (or call "
                   "registry.check(rate)) to collect them")
    else:
        click.echo(f"check-mode counters from {path}")
        click.echo("")
        for line in _table(procs):
            click.echo(line)
    if fail_on_violation and any(s.violations for s in procs.values()):
        raise SystemExit(1)
