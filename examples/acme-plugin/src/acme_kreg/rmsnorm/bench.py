"""``kreg bench acme_rmsnorm``: providers checked against the reference, then timed side by
side, through kreg's one harness (registry.tuning.measure)."""

from __future__ import annotations

import json
import sys

import click


@click.command("acme_rmsnorm")
@click.option("--rows", default="64,1024", show_default=True, help="Row counts, one case each.")
@click.option("--cols", default=1024, show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--providers", default="reference,auto,acme.rmsnorm_triton", show_default=True,
              help="reference, auto (what dispatch picks) or implementation names.")
@click.option("--warmup", default=2, show_default=True)
@click.option("--iters", default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The bench report (kreg.bench/1).")
def bench_command(rows: str, cols: int, dtype: str, providers: str, warmup: int, iters: int,
                  as_json: bool) -> None:
    """Time acme_rmsnorm providers, checked against the reference."""
    import registry
    from acme_kreg.rmsnorm import reference
    from acme_kreg.rmsnorm.tuning import inputs
    from registry.tuning import Trial, measure
    from registry.tuning.measure import (
        CaseResult,
        bench_header,
        bench_report,
        format_table,
        registry_candidates,
    )

    names = [p for p in providers.split(",") if p]
    spec = registry.get_registry().spec("acme_rmsnorm")
    results = []
    for n in (int(r) for r in rows.split(",")):
        case = {"rows": n, "cols": cols, "dtype": dtype}
        (x, w), _ = inputs(case)
        trials = [Trial("reference", lambda x=x, w=w: reference(x, w), runs="torch")]
        trials += registry_candidates(
            "acme_rmsnorm", [p for p in names if p != "reference"],
            lambda x=x, w=w: registry.dispatch("acme_rmsnorm", x, w), case)
        ms = measure(trials, expected=reference(x, w), compare=spec.load_compare(),
                     warmup=warmup, iters=iters, baseline="reference")
        results.append(CaseResult(case=f"{n}x{cols} {dtype}", workload=case, measurements=ms,
                                  baseline="reference"))
    if as_json:
        click.echo(json.dumps(bench_report("acme_rmsnorm", results, graphs=False)))
    else:
        click.echo(bench_header("acme_rmsnorm", graphs=False))
        click.echo(format_table(results))
    if any(m.failed for r in results for m in r.measurements):
        sys.exit(1)
