"""The ``kreg`` command. Formatting only: every answer comes from ``registry``.

Subsystems with many options (bench, tune, tuning, daemon) keep their click commands beside their
code and are imported only when invoked, so ``kreg explain --device PROFILE`` stays fast.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
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


# A comma separates two FIELD=VALUE items only where the next one starts (``a=1,b=2``), so a
# value may hold commas (``--set compute_capability=10,0``).
_ITEM_SPLIT = re.compile(r",(?=\s*[A-Za-z_][\w.]*\s*=)")


def _items(raw: tuple[str, ...]) -> list[str]:
    return [part.strip() for item in raw for part in _ITEM_SPLIT.split(item) if part.strip()]


def _parse_pairs(items: tuple[str, ...], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in _items(items):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"{part!r} is not FIELD=VALUE", param_hint=what)
        if key in out:
            raise click.BadParameter(f"field {key!r} is given twice ({out[key]!r} and "
                                     f"{_parse_value(value)!r}); give each field once",
                                     param_hint=what)
        out[key] = _parse_value(value)
    return out


@main.command()
@click.argument("op", required=False)
@click.option("--device", "device", default=None, metavar="PROFILE|FILE",
              help="A device profile (see `kreg profiles`) or a profile file (.toml or .json, "
                   "docs/PLUGINS.md \"Device profiles\"); default: this machine.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Change a device fact for a what-if: any DeviceFacts field "
                   "(--set triton_version=3.6.0, --set compute_capability=10.0, "
                   "--set name='NVIDIA B200'), --set extra.KEY=VALUE, --set profile=NAME.")
@click.option("--workload", "-w", "workload", multiple=True, metavar="FIELD=VALUE,...",
              help="The workload's fields (see `kreg ops`); each field once.")
@click.option("--override", "override", default=None, metavar="IMPL[:measure]",
              help="Explain under an override, as KREG_SELECT_<OP> would set it.")
@click.option("--live", is_flag=True,
              help="Show recent decisions of running processes (daemon); OP optional.")
@click.option("--pid", type=int, default=None, help="With --live: only this process.")
@click.option("--json", "as_json", is_flag=True, help="Print the Decision as JSON.")
@click.option("--all-checks", is_flag=True, help="Show every check, not only failed ones.")
@_errors
def explain(op: str | None, device: str | None, sets: tuple[str, ...],
            workload: tuple[str, ...], override: str | None, live: bool, pid: int | None,
            as_json: bool, all_checks: bool) -> None:
    """Show which implementation of OP runs and every candidate's verdict.

    \b
    kreg explain sparse_prefill --device rtx-5090 \\
        -w kind=chunk,topk=2051,head_dim=256,group_size=6,num_kv_heads=1 \\
        -w total_q=8192,num_requests=1,max_q=8192,dtype=bfloat16
    kreg explain sparse_prefill --device ./b200.toml -w ...    # a profile file
    kreg explain sparse_prefill --device h200 --set compute_capability=10.0 -w ...
    kreg explain --live [OP] [--pid N]                         # what running processes chose
    """
    import registry
    from registry.errors import StrictModeError

    if pid is not None and not live:
        raise click.UsageError("--pid selects the process whose live decisions to show: it "
                               "needs --live (kreg explain --live --pid N)")
    if live:
        given = [name for name, value in (("--device", device), ("--set", sets),
                                          ("-w", workload), ("--override", override),
                                          ("--all-checks", all_checks)) if value]
        if given:
            raise click.UsageError(f"--live shows the decisions running processes made; "
                                   f"{', '.join(given)} do not apply to it")
        from registry.daemon.cli import show_live

        show_live(op=None if op in (None, "all") else op, pid=pid, as_json=as_json)
        return
    if op is None:
        raise click.UsageError("missing OP: kreg explain OP -w FIELD=VALUE,... (`kreg ops` "
                               "lists the ops and their fields), or kreg explain --live")
    reg = registry.get_registry()
    if sets:
        # The hooks see the changed facts: enrichment runs after --set (keys it sets win).
        facts = reg.enrich(reg.resolve_device(device, enrich=False).with_settings(_items(sets)))
    else:
        facts = reg.resolve_device(device)
    fields = _parse_pairs(workload, "--workload")
    try:
        if override:
            with registry.override(op, override):
                decision = registry.select(op, fields, facts)
        else:
            decision = registry.select(op, fields, facts)
    except StrictModeError as exc:
        without = reg.decide_local(op, facts, fields, override)
        raise click.ClickException(f"StrictModeError: {exc}\n\nwithout KREG_STRICT=1 the "
                                   f"decision would be:\n{without.explain(verbose=all_checks)}"
                                   ) from None
    if as_json:
        click.echo(decision.model_dump_json(indent=2))
    else:
        click.echo(decision.explain(verbose=all_checks))


def _plugin_state(rec: Any) -> str:
    if rec.failed:
        return "FAILED"
    return "loaded" if rec.loaded else f"skipped ({rec.skipped_reason})"


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--allow-failed", is_flag=True,
              help="Exit 0 even when a plugin failed (the default exit status is 1 then).")
@_errors
def plugins(as_json: bool, allow_failed: bool) -> None:
    """Loaded plugins, their ops and implementations, and every load failure.

    Probes this device and reads every profile first, so a raising kreg_enrich_facts or
    kreg_profiles hook shows as FAILED. Exits 1 when any plugin FAILED, unless --allow-failed.
    """
    import registry
    from registry.errors import KregError

    reg = registry.get_registry()
    problems = []
    for what, call in (("probing this device", registry.probe),
                       ("reading the device profiles", registry.profiles)):
        try:
            call()  # runs kreg_enrich_facts / kreg_profiles on every plugin
        except (KregError, ImportError, OSError) as exc:
            problems.append(f"{what}: {type(exc).__name__}: {exc}")
    records = registry.plugins()
    if as_json:
        click.echo(json.dumps([{**{k: v for k, v in vars(r).items()}, "error": r.error,
                                "state": _plugin_state(r)} for r in records], indent=2))
    else:
        for rec in records:
            click.echo(f"{rec.name}  [{_plugin_state(rec)}]  {rec.source}")
            for error in rec.errors:
                click.echo(f"    error: {error}")
            for note in rec.notes:
                click.echo(f"    note: {note}")
            for op in rec.ops:
                click.echo(f"    op  {op}")
            for name in rec.implementations:
                impl = next(i for d in reg.impls.values() for n, i in d.items() if n == name)
                click.echo(f"    impl {name} (op {impl.op}, priority {impl.priority})")
                if impl.description:  # what it is, and what it lacks here (a hosted library's)
                    click.echo(f"         {impl.description}")
        for problem in problems:
            click.echo(f"error {problem}")
    failed = [r.name for r in records if r.failed]
    if (failed or problems) and not allow_failed:
        if not as_json:
            click.echo(f"{len(failed)} plugin(s) FAILED: {', '.join(failed) or '-'} "
                       f"(exit status 1; --allow-failed exits 0)", err=True)
        sys.exit(1)


def _show_facts(facts: Any) -> None:
    click.echo(facts.describe())
    for key, value in facts.model_dump().items():
        click.echo(f"  {key:<19} {value}")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--toml", "as_toml", is_flag=True,
              help="Print this machine as a profile file (`kreg devices --toml > mine.toml`).")
@_errors
def devices(as_json: bool, as_toml: bool) -> None:
    """This machine's device facts (what selection sees here, enriched by the plugins)."""
    import registry

    if as_toml:  # as probed: the plugins enrich a profile wherever it is loaded
        click.echo(registry.get_registry().resolve_device(None, enrich=False).to_toml(), nl=False)
        return
    facts = registry.probe()
    if as_json:
        click.echo(facts.model_dump_json(indent=2))
        return
    _show_facts(facts)


@main.command()
@click.argument("name", required=False, metavar="[PROFILE|FILE]")
@click.option("--json", "as_json", is_flag=True,
              help="JSON: {name: {source, facts}}; with PROFILE, its facts (a valid profile file).")
@click.option("--toml", "as_toml", is_flag=True,
              help="With PROFILE: print it as a TOML profile file, to copy and edit.")
@_errors
def profiles(name: str | None, as_json: bool, as_toml: bool) -> None:
    """The device profiles for `kreg explain --device`, and where each comes from.

    Sources: shipped (registry/profiles/), plugin NAME (its kreg_profiles hook) or file PATH (a
    KREG_PROFILES directory). With PROFILE (a name or a .toml/.json file): its facts, checked.
    """
    import registry

    reg = registry.get_registry()
    if name is not None:
        if as_toml:  # without its name: a copy is named by its file
            facts = reg.resolve_device(name, enrich=False).what_if(profile=None)
            click.echo(facts.to_toml(), nl=False)
            return
        facts = reg.resolve_device(name)
        if as_json:
            click.echo(facts.model_dump_json(indent=2))
            return
        source = reg.profile_sources().get(name, f"file {name}")
        click.echo(f"profile {facts.profile} ({source})")
        _show_facts(facts)
        return
    if as_toml:
        raise click.UsageError("--toml prints one profile: kreg profiles NAME --toml")
    profs, sources = reg.profiles(), reg.profile_sources()
    if as_json:
        click.echo(json.dumps({n: {"source": sources[n], "facts": f.model_dump(mode="json")}
                               for n, f in profs.items()}, indent=2))
        return
    width = max(len(n) for n in profs)
    swidth = max(len(s) for s in sources.values())
    for pname, facts in profs.items():
        click.echo(f"{pname.ljust(width)}  {sources[pname].ljust(swidth)}  {facts.describe()}")


@main.command()
@_errors
def ops() -> None:
    """The registered ops: who defines each, its tools, workload fields and implementations."""
    import registry

    reg = registry.get_registry()
    for name in registry.ops():
        spec = reg.spec(name)
        click.echo(f"{name}: {spec.doc}")
        tools = [t for t, on in (("kreg bench", spec.bench), ("kreg tune", spec.tuner),
                                 ("conformance cases", spec.conformance),
                                 ("custom op (registry.load_custom_ops())", spec.custom_op))
                 if on]
        click.echo(f"  defined by plugin {reg.op_plugins.get(name, '?')}; reference "
                   f"{spec.reference or '(none)'}; {', '.join(tools) or 'no tools'}")
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
