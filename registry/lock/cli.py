"""Click commands ``kreg lock`` and ``kreg verify`` (imported only when invoked).

Both decide with a bare :class:`~registry.Registry` (entry-point plugins, the tuning store, the
``KREG_SELECT_<OP>`` overrides and ``KREG_PLUGINS`` / ``KREG_DISABLE_PLUGINS`` of this shell;
no daemon, no ``KREG_LOCK``), so a lock says what selection decides here, not what a running
process was told. Exit status: 0 nothing changed, 1 a decision changed (verify, diff), 2 an
error (bad input, unreadable lockfile), always one message and never a traceback.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from registry._format import format_config
from registry.errors import KregError
from registry.lock.lockfile import (
    DiffReport,
    Drift,
    Lockfile,
    build_lock,
    diff_locks,
    dump_lock,
    load_lock,
    resolve_devices,
    verify_lock,
    workload_text,
)

if TYPE_CHECKING:
    from registry._registry import Registry

F = TypeVar("F", bound=Callable[..., Any])

_LINE_FORMAT = ('each line must be one JSON object with an "op" key, e.g. {"op": '
                '"sparse_prefill", "kind": "chunk", "total_q": 8192, ...} (docs/LOCKFILE.md)')


class Failure(click.ClickException):
    """An error: one message, exit status 2 (1 means "a decision changed")."""

    exit_code = 2


def _errors(fn: F) -> F:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KregError as exc:
            raise Failure(f"{type(exc).__name__}: {exc}") from None

    return wrapper  # type: ignore[return-value]


def _registry() -> Registry:
    from registry._registry import Registry

    reg = Registry()
    reg.strict = False  # record decisions as they are; strictness is the deployment's
    return reg


@contextmanager
def _quiet() -> Iterator[None]:
    """Without ``kreg -v``, the registry's own warnings (an override not honoured for some
    workload) stay out of the output: the report says the same, per key."""
    log = logging.getLogger("registry")
    if logging.getLogger().handlers:  # `kreg -v`, or a host that configured logging
        yield
        return
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# ---------------------------------------------------------------------------------------------
# inputs


def _value(text: str) -> Any:
    low = text.strip()
    if low.lower() in ("none", "null"):
        return None
    try:
        return int(low)
    except ValueError:
        pass
    if "," in low and low.startswith("(") and low.endswith(")"):
        try:
            return tuple(int(p) for p in low[1:-1].split(","))
        except ValueError:
            pass
    return low


def _pairs(items: Sequence[str], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise click.BadParameter(f"{part!r} is not FIELD=VALUE", param_hint=what)
            out[key.strip()] = _value(value)
    return out


Axis = tuple[tuple[str, ...], list[Any]]


def _grid(items: Sequence[str]) -> list[Axis]:
    """``--grid total_q=512,1024`` (one field) or ``--grid total_q,max_q=512,1024`` (fields
    that take the same value together)."""
    axes: list[Axis] = []
    for item in items:
        keys, sep, values = item.partition("=")
        fields = tuple(k.strip() for k in keys.split(",") if k.strip())
        vals = [_value(v) for v in values.split(",") if v.strip()]
        if not sep or not fields or not vals:
            raise click.BadParameter(f"{item!r} is not FIELD=V1,V2,... or FIELD,FIELD=V1,V2,...",
                                     param_hint="--grid")
        axes.append((fields, vals))
    return axes


def _expand(reg: Registry, op: str, base: dict[str, Any], axes: Sequence[Axis]) -> Iterator[
        dict[str, Any]]:
    fields = set(reg.spec(op).workload_model.model_fields)
    mine = [a for a in axes if set(a[0]) <= fields]
    for combo in itertools.product(*(vals for _, vals in mine)):
        wl = dict(base)
        for (names, _), value in zip(mine, combo, strict=True):
            wl.update(dict.fromkeys(names, value))
        yield wl


def read_workloads(reg: Registry, path: str, ops: Sequence[str],
                   axes: Sequence[Axis] = ()) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """The workloads of ``ops`` in a JSON-lines file (blank lines and ``#`` lines skipped), each
    expanded over the ``--grid`` axes its op has; also how many lines were for other ops."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "no such file"
        raise Failure(f"workloads file {path}: {what}; pass --workloads FILE, a JSON-lines "
                      f"file: {_LINE_FORMAT}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise Failure(f"workloads file {path}: cannot be read ({why})") from None
    out: list[tuple[str, dict[str, Any]]] = []
    other = 0
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            obj = json.loads(s)
        except ValueError as exc:
            msg = getattr(exc, "msg", str(exc))
            col = getattr(exc, "colno", None)
            raise Failure(f"{path}:{n}: not valid JSON ({msg}{f' at column {col}' if col else ''}"
                          f"); {_LINE_FORMAT}") from None
        if not isinstance(obj, dict):
            raise Failure(f"{path}:{n}: a JSON {type(obj).__name__} is not a workload; "
                          f"{_LINE_FORMAT}")
        op = obj.pop("op", None)
        if not isinstance(op, str):
            raise Failure(f"{path}:{n}: no \"op\" key; {_LINE_FORMAT}")
        if op not in reg.ops:
            raise Failure(f"{path}:{n}: unknown op {op!r}; known ops: "
                          f"{', '.join(sorted(reg.ops)) or '(none: see kreg plugins)'}")
        if op not in ops:
            other += 1
            continue
        for wl in _expand(reg, op, obj, axes):
            try:
                reg.workload(op, wl)
            except KregError as exc:
                raise Failure(f"{path}:{n}: {type(exc).__name__}: {exc}") from None
            out.append((op, wl))
    return out, other


def _short_to_dict(text: str) -> dict[str, Any]:
    """A journal's ``kind=chunk topk=2051 ... kv_len=None`` back to fields."""
    out: dict[str, Any] = {}
    for part in text.split():
        key, sep, value = part.partition("=")
        if sep:
            out[key] = _value(value)
    return out


def journal_workloads(reg: Registry, ops: Sequence[str]) -> tuple[list[tuple[str, dict[str, Any]]],
                                                                   int]:
    """Every valid workload of ``ops`` the daemon's decision journals hold
    (``$KREG_HOME/journal/decisions-*.jsonl`` and their rotations); also how many records of
    those ops no longer validate (skipped)."""
    from registry._knobs import knobs
    from registry.daemon.journal import read_journal

    out: list[tuple[str, dict[str, Any]]] = []
    bad = 0
    for path in sorted((knobs.home / "journal").glob("decisions-*.jsonl")):
        for rec in read_journal(path):
            op, wl = rec.get("op"), rec.get("workload")
            if op not in ops or not isinstance(wl, (str, dict)):
                continue
            fields = _short_to_dict(wl) if isinstance(wl, str) else dict(wl)
            try:
                reg.workload(str(op), fields)
            except KregError:
                bad += 1
                continue
            out.append((str(op), fields))
    return out, bad


def _write(data: bytes, output: str) -> None:
    if output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    dest = Path(output)
    try:
        fd, tmp = tempfile.mkstemp(dir=dest.parent if str(dest.parent) else ".",
                                   prefix=f".{dest.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # an ordinary file, not mkstemp's owner-only one
        os.replace(tmp, dest)
    except OSError as exc:
        raise Failure(f"cannot write lockfile {output}: {exc.strerror}; check that its "
                      f"directory exists and is writable") from None


# ---------------------------------------------------------------------------------------------
# reports


def _side(label: str, side: Any, width: int) -> list[str]:
    if side is None:
        return [f"    {label.ljust(width)}  (none)"]
    return [f"    {label.ljust(width)}  {side.implementation}  config: "
            f"{format_config(side.config)}"]


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def format_report(report: DiffReport, before: str, after: str, title: str) -> str:
    """The report in explain's words, device by device."""
    n = len(report.drifts)
    lines = [f"{title}: {_count(report.checked, 'locked decision')} on "
             f"{_count(len(report.devices), 'device')}: "
             + ("no decision changed" if not n else f"{n} changed")]
    if report.skipped:
        lines[0] += f" ({report.skipped} of other devices not checked)"
    width = max(len(before), len(after))
    by_device: dict[str, list[Drift]] = {}
    for d in report.drifts:
        by_device.setdefault(d.device, []).append(d)
    for device in report.devices:
        drifts = by_device.get(device)
        if not drifts:
            continue
        lines.append("")
        lines.append(f"{device}:")
        seen: list[str] = []
        for d in drifts:
            for r in d.reasons:
                if r.device_level and r.text not in seen:
                    seen.append(r.text)
        lines.extend(f"  {t}" for t in seen)
        for d in drifts:
            tag = {"added": f" (only in {after})", "removed": f" (only in {before})"}.get(
                d.status, "")
            lines.append(f"  {d.op} [{workload_text(d.workload)}] (entry {d.id}){tag}")
            lines.extend(_side(before, d.before, width))
            if d.error is not None:
                lines.append(f"    {after.ljust(width)}  error: {d.error}")
            else:
                lines.extend(_side(after, d.after, width))
                if d.after is not None and d.status == "changed":
                    lines.append(f"    {''.ljust(width)}  because {d.after.reason}")
            why = [r.text for r in d.reasons if not r.device_level and r.kind != "error"]
            for i, text in enumerate(why):
                lines.append(f"    {('why' if i == 0 else '').ljust(width)}  {text}")
    quiet = {k: v for k, v in report.changes.items()
             if k == "*" or k not in by_device}
    if quiet:
        lines.append("")
        lines.append("changed, but no locked decision of these moved:" if n else
                     "changed, but no locked decision moved:")
        for label, reasons in quiet.items():
            where = "plugins" if label == "*" else label
            lines.extend(f"  {where}: {r.text}" for r in reasons)
    return "\n".join(lines)


def _emit(report: DiffReport, as_json: bool, before: str, after: str, title: str) -> None:
    if as_json:
        data = report.model_dump(mode="json")
        data["ok"] = report.ok
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.echo(format_report(report, before, after, title))
    sys.exit(0 if report.ok else 1)


def _diff(old: str, new: str, as_json: bool, devices: Sequence[str]) -> None:
    a, b = load_lock(old), load_lock(new)
    labels = None
    if devices:
        unknown = [d for d in devices if d not in a.devices and d not in b.devices]
        if unknown:
            raise Failure(f"--device {', '.join(unknown)}: not in {old} or {new} (they lock: "
                          f"{', '.join(dict.fromkeys([*a.devices, *b.devices]))})")
        labels = list(devices)
    report = diff_locks(a, b, old_name=old, new_name=new, devices=labels)
    _emit(report, as_json, "old", "new", f"{old} -> {new}")


# ---------------------------------------------------------------------------------------------
# commands


@click.command()
@click.argument("ops", nargs=-1, metavar="OP...")
@click.option("--device", "devices", multiple=True, metavar="PROFILE",
              help="A shipped profile (see `kreg profiles`), `local`, or a DeviceFacts JSON "
                   "file; repeat for several. Default: this machine.")
@click.option("--workloads", "workloads", default=None, metavar="FILE",
              help='JSON lines, one workload per line with an "op" key.')
@click.option("--grid", "grid", multiple=True, metavar="FIELD[,FIELD]=V1,V2,...",
              help="Expand every workload line over these values (fields joined by a comma "
                   "take the same value), e.g. --grid total_q,max_q=512,1024,8192.")
@click.option("--from-journal", is_flag=True,
              help="Also lock every workload of OP the daemon's decision journal has seen.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Change a device fact for a what-if, as `kreg explain --set` does.")
@click.option("-o", "--output", default="-", metavar="LOCKFILE",
              help="Where to write the lockfile (default: stdout).")
@click.option("--diff", "diff", nargs=2, default=None, metavar="OLD NEW",
              help="Compare two lockfiles instead: what an upgrade changes, device by device.")
@click.option("--json", "as_json", is_flag=True, help="With --diff: the report as JSON.")
@_errors
def lock(ops: tuple[str, ...], devices: tuple[str, ...], workloads: str | None,
         grid: tuple[str, ...], from_journal: bool, sets: tuple[str, ...], output: str,
         diff: tuple[str, str] | None, as_json: bool) -> None:
    """Decide OP on every device and workload; write the decisions and why to a lockfile.

    \b
    kreg lock sparse_prefill --device rtx-pro-6000-blackwell-server --device h200 \\
        --workloads workloads.jsonl -o kreg.lock
    kreg lock --diff old.lock new.lock

    Exit status: 0 written (--diff: nothing changed), 1 (--diff) a decision changed, 2 error.
    """
    if diff is not None:
        if ops or workloads or grid or from_journal or sets:
            raise click.UsageError("--diff OLD NEW compares two lockfiles; it takes no OP, "
                                   "--workloads, --grid, --from-journal or --set")
        _diff(diff[0], diff[1], as_json, devices)
        return
    if not ops:
        raise click.UsageError("give the ops to lock, e.g. `kreg lock sparse_prefill "
                               "--workloads FILE` (see `kreg ops`)")
    if workloads is None and not from_journal:
        raise click.UsageError("give the workloads: --workloads FILE (JSON lines, one workload "
                               "per line with an \"op\" key) and/or --from-journal")
    reg = _registry()
    for op in ops:
        reg.spec(op)  # UnknownOpError naming the known ops
    axes = _grid(grid)
    known = {f for op in ops for f in reg.spec(op).workload_model.model_fields}
    for fields, _ in axes:
        unknown = [f for f in fields if f not in known]
        if unknown:
            raise click.BadParameter(f"{', '.join(unknown)} is not a workload field of "
                                     f"{', '.join(ops)} (see `kreg ops`)", param_hint="--grid")
    found: list[tuple[str, dict[str, Any]]] = []
    notes = []
    if workloads is not None:
        lines, other = read_workloads(reg, workloads, ops, axes)
        found += lines
        if other:
            notes.append(f"{other} lines of {workloads} are for other ops")
        for op in ops:
            if not any(o == op for o, _ in lines) and not from_journal:
                raise Failure(f"workloads file {workloads} has no workload of op {op!r}; add "
                              f"lines with \"op\": \"{op}\" or leave {op} out")
    if from_journal:
        seen, bad = journal_workloads(reg, ops)
        found += seen
        notes.append(f"{len(seen)} journal records" + (f" ({bad} no longer valid, skipped)"
                                                       if bad else ""))
    if not found:
        raise Failure("no workloads to lock: the workloads file and the journal hold none of "
                      f"{', '.join(ops)}")
    devs = resolve_devices(reg, devices, _pairs(sets, "--set"))
    with _quiet():
        built: Lockfile = build_lock(reg, ops, devs, found)
    _write(dump_lock(built), output)
    where = "stdout" if output == "-" else output
    tail = f" ({'; '.join(notes)})" if notes else ""
    click.echo(f"locked {_count(len(built.entries), 'decision')} "
               f"({_count(len(devs), 'device')}, "
               f"{_count(len(built.entries) // max(1, len(devs)), 'workload')} each) to "
               f"{where}{tail}; {built.digest}", err=True)


@click.command()
@click.argument("lockfile", metavar="LOCKFILE")
@click.argument("new", required=False, metavar="[NEW]")
@click.option("--device", "devices", multiple=True, metavar="PROFILE",
              help="Verify only this device of the lock (a profile name, `local`, or a "
                   "DeviceFacts JSON file standing for its device); repeat for several.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Change a device fact for a what-if, as `kreg explain --set` does.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (for CI).")
@_errors
def verify(lockfile: str, new: str | None, devices: tuple[str, ...], sets: tuple[str, ...],
           as_json: bool) -> None:
    """Re-derive every decision LOCKFILE holds; report each that changed, and why.

    With NEW, compare the two lockfiles instead (as `kreg lock --diff`).
    Exit status: 0 no decision changed, 1 one did, 2 error.
    """
    if new is not None:
        if sets:
            raise click.UsageError("--set applies when re-deriving; with two lockfiles there is "
                                   "nothing to re-derive")
        _diff(lockfile, new, as_json, devices)
        return
    lock_doc = load_lock(lockfile)
    reg = _registry()
    with _quiet():
        report = verify_lock(reg, lock_doc, name=lockfile, devices=devices,
                             sets=_pairs(sets, "--set"))
    _emit(report, as_json, "locked", "now", f"kreg verify {lockfile}")
