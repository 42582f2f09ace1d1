"""The ``kreg`` command. Formatting only: every answer comes from ``registry``.

Subsystems with many options (bench, tune, tuning, daemon) keep their click commands beside their
code and are imported only when invoked, so ``kreg explain --device PROFILE`` stays fast.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from typing import Any

import click

# name -> "module:attribute" of a click command, imported on first use.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "daemon": ("registry.daemon.cli:daemon", "run, stop or query the local dispatch daemon"),
    "tune": ("registry.tuning.cli:tune", "sweep configs on this device; winners go to the store"),
    "tuning": ("registry.tuning.cli:tuning", "list, show, export, import or clear tuning entries"),
    "stats": ("registry.observe.cli:stats", "check-mode counters of running processes"),
    "lock": ("registry.lock.cli:lock", "lock decisions to a lockfile (--diff: compare two)"),
    "verify": ("registry.lock.cli:verify", "re-derive a lockfile's decisions; say what changed"),
}


def _load(path: str) -> click.Command:
    module, _, attr = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise click.ClickException(f"this kreg installation lacks {path} ({exc})") from None
    return obj  # type: ignore[no-any-return]


class LazyGroup(click.Group):
    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            return _load(self.lazy[name][0])
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy:
                rows.append((name, self.lazy[name][1]))
            else:
                cmd = super().get_command(ctx, name)
                if cmd is not None and not cmd.hidden:
                    rows.append((name, cmd.get_short_help_str(limit=70)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, lazy=LAZY_COMMANDS)
@click.option("-v", "--verbose", count=True, help="Log decisions (-v) or everything (-vv).")
def main(verbose: int) -> None:
    """kreg: which kernel runs, and why."""
    if verbose:
        logging.basicConfig(level=logging.INFO if verbose == 1 else logging.DEBUG,
                            format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _errors(fn: Any) -> Any:
    """Turn kreg's errors into a one-paragraph message and exit status 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from registry.errors import KregError

        try:
            return fn(*args, **kwargs)
        except KregError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None

    return wrapper


def _parse_value(text: str) -> Any:
    low = text.strip()
    if low.lower() in ("none", "null"):
        return None
    try:
        return int(low)
    except ValueError:
        pass
    if "," in low and low.startswith("(") and low.endswith(")"):
        return tuple(int(p) for p in low[1:-1].split(","))
    return low


def _parse_pairs(items: tuple[str, ...], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise click.BadParameter(f"{part!r} is not FIELD=VALUE", param_hint=what)
            out[key.strip()] = _parse_value(value)
    return out


@main.command()
@click.argument("op")
@click.option("--device", "device", default=None, metavar="PROFILE",
              help="A shipped device profile (see `kreg profiles`); default: this machine.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Change a device fact for a what-if, e.g. --set triton_version=3.6.0.")
@click.option("--workload", "-w", "workload", multiple=True, metavar="FIELD=VALUE,...",
              help="The workload's fields (see `kreg ops`).")
@click.option("--override", "override", default=None, metavar="IMPL[:measure]",
              help="Explain under an override, as KREG_SELECT_<OP> would set it.")
@click.option("--live", is_flag=True, help="Show recent decisions of running processes (daemon).")
@click.option("--pid", type=int, default=None, help="With --live: only this process.")
@click.option("--json", "as_json", is_flag=True, help="Print the Decision as JSON.")
@click.option("--all-checks", is_flag=True, help="Show every check, not only failed ones.")
@_errors
def explain(op: str, device: str | None, sets: tuple[str, ...], workload: tuple[str, ...],
            override: str | None, live: bool, pid: int | None, as_json: bool,
            all_checks: bool) -> None:
    """Show which implementation of OP runs and every candidate's verdict.

    \b
    kreg explain sparse_prefill --device rtx-5090 \\
        -w kind=chunk,topk=2051,head_dim=256,group_size=6,num_kv_heads=1 \\
        -w total_q=8192,num_requests=1,max_q=8192,dtype=bfloat16
    """
    import registry

    if live:
        from registry.daemon.cli import show_live

        show_live(op=None if op == "all" else op, pid=pid, as_json=as_json)
        return
    reg = registry.get_registry()
    facts = reg.resolve_device(device)
    changes = _parse_pairs(sets, "--set")
    if changes:
        facts = facts.what_if(**changes)
    fields = _parse_pairs(workload, "--workload")
    if override:
        with registry.override(op, override):
            decision = registry.select(op, fields, facts)
    else:
        decision = registry.select(op, fields, facts)
    if as_json:
        click.echo(decision.model_dump_json(indent=2))
    else:
        click.echo(decision.explain(verbose=all_checks))


@main.command()
@click.option("--json", "as_json", is_flag=True)
@_errors
def plugins(as_json: bool) -> None:
    """Loaded plugins, their ops and implementations, and load failures."""
    import registry

    records = registry.plugins()
    if as_json:
        click.echo(json.dumps([vars(r) for r in records], indent=2))
        return
    for rec in records:
        state = "loaded" if rec.loaded and not rec.error else (
            f"skipped ({rec.skipped_reason})" if rec.skipped_reason else "FAILED")
        click.echo(f"{rec.name}  [{state}]  {rec.source}")
        if rec.error:
            click.echo(f"    error: {rec.error}")
        for op in rec.ops:
            click.echo(f"    op  {op}")
        reg = registry.get_registry()
        for name in rec.implementations:
            impl = next(i for d in reg.impls.values() for n, i in d.items() if n == name)
            click.echo(f"    impl {name} (op {impl.op}, priority {impl.priority})")
            if impl.description:  # what it is, and what it lacks here (a hosted library's)
                click.echo(f"         {impl.description}")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@_errors
def devices(as_json: bool) -> None:
    """This machine's device facts (what selection sees here)."""
    import registry

    facts = registry.probe()
    if as_json:
        click.echo(facts.model_dump_json(indent=2))
        return
    click.echo(facts.describe())
    for key, value in facts.model_dump().items():
        click.echo(f"  {key:<19} {value}")


@main.command()
@click.option("--json", "as_json", is_flag=True)
def profiles(as_json: bool) -> None:
    """The shipped device profiles (for `kreg explain --device`)."""
    import registry

    profs = registry.profiles()
    if as_json:
        click.echo(json.dumps({n: f.model_dump(mode="json") for n, f in profs.items()}, indent=2))
        return
    width = max(len(n) for n in profs)
    for name, facts in profs.items():
        click.echo(f"{name.ljust(width)}  {facts.describe()}")


@main.command()
@_errors
def ops() -> None:
    """The registered ops, their workload fields and implementations."""
    import registry

    reg = registry.get_registry()
    for name in registry.ops():
        spec = reg.spec(name)
        click.echo(f"{name}: {spec.doc}")
        for field, info in spec.workload_model.model_fields.items():
            click.echo(f"    {field:<13} {info.description or ''}")
        for impl in registry.implementations(name):
            click.echo(f"  impl {impl.name} (priority {impl.priority}) {impl.description}")
            contract = (impl.contract.describe() if isinstance(impl.contract, registry.Contract)
                        else "depends on the config (kreg explain shows the chosen one's)")
            click.echo(f"       guarantees: {contract}")


class OpBenchGroup(click.Group):
    """``kreg bench OP``: one subcommand per registered op whose ``OpSpec.bench`` names a click
    command (a plugin's own op included); the registry is loaded only when this group is used."""

    def _benches(self) -> dict[str, str]:
        import registry

        reg = registry.get_registry()
        return {name: reg.spec(name).bench for name in registry.ops() if reg.spec(name).bench}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self._benches())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        path = self._benches().get(name)
        return _load(path) if path else None

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if self.get_command(ctx, name) is None:
            benches = self._benches()
            import registry

            known = ", ".join(sorted(benches)) or "(none)"
            why = ("it has no bench command (OpSpec.bench)" if name in registry.ops()
                   else "no loaded plugin defines it (see `kreg plugins`)")
            raise click.UsageError(f"no bench for op {name!r}: {why}; ops with one: {known}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, f"benchmark {n} providers") for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Ops"):
                formatter.write_dl(rows)


@main.group(cls=OpBenchGroup)
def bench() -> None:
    """Time providers of an op side by side, checked against the reference."""


if __name__ == "__main__":
    main()
