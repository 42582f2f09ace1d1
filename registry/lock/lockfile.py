"""The decision lockfile: its schema, how it is built, read, compared and verified.

Pure logic over a :class:`~registry.Registry`: nothing here reads the environment (the caller
passes the registry, the devices and the workloads), imports click, or writes outside the
path it is given. docs/LOCKFILE.md is the format's reference; the short form:

* a lock is the decision of every (device, op, workload) it was asked for, with what decided it
  (the chosen candidate's checks, the failed checks of every candidate ranked above it, the
  plugins involved and their versions, the device's facts and software);
* :func:`build_lock` makes one, :func:`dump_lock` writes it byte-identically for the same inputs
  (sorted keys, no timestamps, no absolute paths), :func:`load_lock` reads one back or raises
  ConfigError naming the file and the fix;
* :func:`compare_entries` says, in explain's words, why two entries of one key differ;
  :func:`diff_locks` compares two lockfiles and :func:`verify_lock` re-derives every locked
  decision under the current registry (a :func:`diff_locks` against a rebuilt lock).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from registry._facts import DeviceFacts, looks_like_path
from registry._format import format_config
from registry.errors import ConfigError, KregError, StrictModeError, UnknownDeviceError
from registry.requirements import Check

if TYPE_CHECKING:
    from registry._decision import Decision
    from registry._registry import Registry

__all__ = [
    "FORMAT",
    "LOCAL",
    "SCHEMA_VERSION",
    "DeviceIdentity",
    "DeviceInput",
    "DiffReport",
    "Drift",
    "ImplInfo",
    "LockContext",
    "LockDriftError",
    "LockEntry",
    "LockError",
    "LockPinError",
    "LockedCandidate",
    "LockedCheck",
    "LockedDevice",
    "LockedOverride",
    "Lockfile",
    "PluginInfo",
    "Reason",
    "Side",
    "Software",
    "build_lock",
    "canonical",
    "compare_entries",
    "diff_locks",
    "dump_lock",
    "entry_from_decision",
    "entry_id",
    "identity_of",
    "load_lock",
    "parse_lock",
    "registry_info",
    "resolve_devices",
    "verify_lock",
    "workload_text",
]

#: The ``format`` field of every lockfile.
FORMAT = "kreg-lock"
#: The schema this kreg writes and reads; a file of any other version is refused with the fix.
SCHEMA_VERSION = 1
#: The device label of this machine (``--device`` left out, or ``--device local``).
LOCAL = "local"


# ---------------------------------------------------------------------------------------------
# errors


class LockError(KregError, RuntimeError):
    """A decision departs from the lockfile named by ``KREG_LOCK`` (message: file, key, fix)."""


class LockDriftError(LockError, StrictModeError):
    """``KREG_LOCK`` in verify mode under ``KREG_STRICT=1``: a decision differs from its lock."""


class LockPinError(LockError):
    """``KREG_LOCK`` in pin mode: the locked implementation is missing or not eligible."""


# ---------------------------------------------------------------------------------------------
# schema


class _M(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LockedCheck(Check):
    """One check's verdict, as explain shows it (``Check``'s fields and words; a lockfile is
    read strictly: an unknown field is an error)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class LockedCandidate(_M):
    """A candidate ranked above the chosen one: why it did not win (its failed checks)."""

    implementation: str
    plugin: str
    priority: int
    eligible: bool
    failed: list[LockedCheck]


class LockedOverride(_M):
    source: str
    value: str
    honoured: bool
    reason: str = ""


class Software(_M):
    torch: str | None
    triton: str | None
    runtime: str | None


class DeviceIdentity(_M):
    """What KREG_LOCK matches a running device on: the hardware, not its software."""

    vendor: str
    name: str
    arch: str
    sm_count: int


class LockEntry(_M):
    """One locked decision: (device, op, workload) -> implementation and config, and why."""

    id: str
    device: str
    op: str
    workload: dict[str, Any]
    implementation: str
    plugin: str
    priority: int
    config: dict[str, Any] | None
    fallback: bool
    reason: str
    override: LockedOverride | None
    checks: list[LockedCheck]
    passed_over: list[LockedCandidate]
    plugins: dict[str, str | None]
    software: Software
    facts_fingerprint: str


class LockedDevice(_M):
    source: Literal["profile", "local", "file"]
    set: dict[str, Any]
    facts: dict[str, Any]
    fingerprint: str
    identity: DeviceIdentity


class PluginInfo(_M):
    status: str  # "loaded", "skipped (in KREG_DISABLE_PLUGINS)", "failed: ..."
    source: str
    distribution: str | None
    version: str | None


class ImplInfo(_M):
    plugin: str
    priority: int


class Lockfile(_M):
    format: Literal["kreg-lock"]
    schema_version: int
    digest: str
    kreg: str | None
    ops: list[str]
    devices: dict[str, LockedDevice]
    plugins: dict[str, PluginInfo]
    implementations: dict[str, dict[str, ImplInfo]]
    entries: list[LockEntry]

    def entry_map(self) -> dict[tuple[str, str, str], LockEntry]:
        return {(e.device, e.op, canonical(e.workload)): e for e in self.entries}


# ---------------------------------------------------------------------------------------------
# canonical forms


def canonical(data: Any) -> str:
    """Compact JSON with sorted keys: the form digests and comparisons use."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False, default=str)


def _jsonable(data: Any) -> Any:
    return json.loads(canonical(data))


def entry_id(device: str, op: str, workload: Mapping[str, Any]) -> str:
    """The 12-hex id of a (device label, op, workload) key (stable across runs and machines)."""
    return hashlib.sha256(canonical([device, op, dict(workload)]).encode()).hexdigest()[:12]


def workload_text(workload: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in workload.items())


def identity_of(facts: DeviceFacts | Mapping[str, Any]) -> DeviceIdentity:
    data = facts.model_dump() if isinstance(facts, DeviceFacts) else facts
    return DeviceIdentity(vendor=str(data["vendor"]), name=str(data["name"]),
                          arch=str(data["arch"]), sm_count=int(data["sm_count"]))


def _digest(doc: Mapping[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "digest"}
    return "sha256:" + hashlib.sha256(canonical(body).encode()).hexdigest()


def _sort_value(v: Any) -> tuple[int, Any]:
    if v is None:
        return (2, "")
    if isinstance(v, bool):
        return (1, str(v))
    if isinstance(v, (int, float)):
        return (0, v)
    return (1, str(v))


# ---------------------------------------------------------------------------------------------
# the registry's side: plugins, implementations, devices


def _distributions() -> dict[str, tuple[str | None, str | None]]:
    """Entry-point name -> (distribution, version) of the ``kreg`` group."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for ep in sorted(importlib.metadata.entry_points(group="kreg"), key=lambda e: e.name):
        if ep.name in out:
            continue
        dist = getattr(ep, "dist", None)
        out[ep.name] = (getattr(dist, "name", None), getattr(dist, "version", None))
    return out


def _registered_distribution(reg: Registry, name: str) -> tuple[str | None, str | None]:
    """A plugin registered at run time: the distribution of its module, where one is known."""
    obj = reg.pm.get_plugin(name)
    module = getattr(obj, "__name__", None) if obj is not None else None
    if not isinstance(module, str):
        module = type(obj).__module__ if obj is not None else None
    if not module:
        return None, None
    try:
        dists = importlib.metadata.packages_distributions().get(module.split(".")[0]) or []
        if dists:
            return dists[0], importlib.metadata.version(dists[0])
    except Exception:  # metadata is best effort: a missing version is recorded as None
        pass
    return None, None


def registry_info(reg: Registry) -> tuple[dict[str, PluginInfo], dict[str, dict[str, ImplInfo]]]:
    """The plugin set (status, distribution and version) and the registered implementations."""
    dists = _distributions()
    plugins: dict[str, PluginInfo] = {}
    for name, rec in sorted(reg.plugins.items()):
        if rec.skipped_reason:
            status = f"skipped ({rec.skipped_reason})"
        elif rec.error:
            status = f"failed: {rec.error}"
        else:
            status = "loaded" if rec.loaded else "not loaded"
        dist, version = dists.get(name) or _registered_distribution(reg, name)
        plugins[name] = PluginInfo(status=status, source=rec.source, distribution=dist,
                                   version=version)
    impls = {op: {n: ImplInfo(plugin=i.plugin, priority=i.priority)
                  for n, i in sorted(found.items())}
             for op, found in sorted(reg.impls.items())}
    return plugins, impls


def _kreg_version() -> str | None:
    try:
        return importlib.metadata.version("kreg")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class DeviceInput:
    """One device to lock or verify: its label, where its facts come from, the facts (after
    ``sets``) and the ``--set`` what-ifs applied to them."""

    label: str
    source: Literal["profile", "local", "file"]
    facts: DeviceFacts
    sets: Mapping[str, Any] = field(default_factory=dict)


def resolve_devices(reg: Registry, names: Sequence[str],
                    sets: Mapping[str, Any] | None = None) -> list[DeviceInput]:
    """``--device`` values (profile names: shipped, a plugin's or KREG_PROFILES'; ``local``; or
    .toml/.json profile files, as ``kreg explain --device`` takes them; none: this machine) as
    DeviceInputs with ``sets`` applied. Labels must be unique."""
    sets = dict(sets or {})
    out: list[DeviceInput] = []
    for name in names or [LOCAL]:
        source: Literal["profile", "local", "file"]
        if name == LOCAL:
            facts, label, source = reg.resolve_device(None), LOCAL, "local"
        elif looks_like_path(name):
            # A profile file (.toml or .json, as `kreg explain --device` takes), read by the
            # registry's one resolver.
            facts = reg.resolve_device(name)
            label, source = facts.profile or Path(name).stem, "file"
        else:
            try:   # shipped, plugin (kreg_profiles) and KREG_PROFILES profiles
                facts = reg.resolve_device(name)
            except UnknownDeviceError as exc:
                raise UnknownDeviceError(f"{exc}; or `local` for this machine") from None
            label, source = name, "profile"
        if sets:
            facts = _with_sets(facts, sets, label)
        if any(d.label == label for d in out):
            raise ConfigError(f"device {label!r} is given twice; each device is locked once")
        out.append(DeviceInput(label=label, source=source, facts=facts, sets=sets))
    return out


def _with_sets(facts: DeviceFacts, sets: Mapping[str, Any], label: str) -> DeviceFacts:
    """``facts`` with ``--set`` what-ifs, in the spelling of ``kreg explain --set``
    (``DeviceFacts.with_settings``: every field, ``compute_capability=10.0``, ``extra.KEY``)."""
    def text(v: Any) -> str:
        return ".".join(map(str, v)) if isinstance(v, tuple) else "none" if v is None else str(v)

    try:
        changed = facts.with_settings([f"{k}={text(v)}" for k, v in sets.items()])
    except ConfigError as exc:
        raise ConfigError(f"{exc} (on {label}); `kreg devices` shows the fields and their "
                          f"values") from None
    # The what-if's own profile name ("h200 with ...") is explain's header; a lock keeps the
    # device's facts as they were named.
    return changed.what_if(profile=facts.profile)


def _locked_device(dev: DeviceInput) -> LockedDevice:
    return LockedDevice(source=dev.source, set=_jsonable(dict(dev.sets)),
                        facts=dev.facts.model_dump(mode="json"),
                        fingerprint=dev.facts.fingerprint, identity=identity_of(dev.facts))


# ---------------------------------------------------------------------------------------------
# building


def _check(c: Any) -> LockedCheck:
    return LockedCheck(name=c.name, kind=c.kind, passed=c.passed, observed=c.observed,
                       required=c.required, waived=c.waived)


def _op_plugin(reg: Registry, op: str) -> str | None:
    """The plugin that defines ``op`` (its workload model and requirements count too)."""
    return next((n for n, rec in sorted(reg.plugins.items()) if op in rec.ops), None)


def entry_from_decision(reg: Registry, decision: Decision, device: str,
                        plugins: Mapping[str, PluginInfo]) -> LockEntry:
    """The lock entry of one decision made for device label ``device``.

    ``passed_over`` holds every candidate the selector ranks above the chosen one (its order:
    ``(-priority, name)``) with its failed checks: what would have to change for it to win.
    """
    order = sorted(decision.candidates, key=lambda c: (-c.priority, c.implementation))
    chosen = decision.chosen
    above = []
    for cand in order:
        if cand.implementation == chosen.implementation:
            break
        above.append(LockedCandidate(implementation=cand.implementation, plugin=cand.plugin,
                                     priority=cand.priority, eligible=cand.eligible,
                                     failed=[_check(c) for c in cand.checks if not c.passed]))
    involved = {chosen.plugin, *(c.plugin for c in above)}
    owner = _op_plugin(reg, decision.op)
    if owner:
        involved.add(owner)
    o = decision.override
    wl = _jsonable(decision.workload)
    facts = decision.facts
    return LockEntry(
        id=entry_id(device, decision.op, wl), device=device, op=decision.op, workload=wl,
        implementation=decision.implementation, plugin=chosen.plugin, priority=chosen.priority,
        config=None if decision.config is None else _jsonable(decision.config),
        fallback=decision.fallback, reason=decision.reason,
        override=None if o is None else LockedOverride(source=o.source, value=o.value,
                                                       honoured=o.honoured, reason=o.reason),
        checks=[_check(c) for c in chosen.checks], passed_over=above,
        plugins={p: (plugins[p].version if p in plugins else None) for p in sorted(involved)},
        software=Software(torch=facts.torch_version, triton=facts.triton_version,
                          runtime=facts.runtime_version),
        facts_fingerprint=facts.fingerprint)


def _assemble(reg: Registry, ops: Iterable[str], devices: Sequence[DeviceInput],
              plugins: Mapping[str, PluginInfo], impls: Mapping[str, Mapping[str, ImplInfo]],
              entries: Iterable[LockEntry]) -> Lockfile:
    """The document, entries sorted by device label, op, then workload values in the workload
    model's field order (numbers numerically): the same whatever order the inputs came in."""

    def order(e: LockEntry) -> tuple[Any, ...]:
        spec = reg.ops.get(e.op)
        fields = list(spec.workload_model.model_fields) if spec is not None else sorted(e.workload)
        return (e.device, e.op, tuple(_sort_value(e.workload.get(f)) for f in fields),
                canonical(e.workload))

    doc: dict[str, Any] = {
        "format": FORMAT, "schema_version": SCHEMA_VERSION, "digest": "", "kreg": _kreg_version(),
        "ops": sorted(set(ops)),
        "devices": {d.label: _locked_device(d).model_dump(mode="json") for d in devices},
        "plugins": {n: p.model_dump(mode="json") for n, p in sorted(plugins.items())},
        "implementations": {op: {n: i.model_dump(mode="json") for n, i in sorted(found.items())}
                            for op, found in sorted(impls.items())},
        "entries": [e.model_dump(mode="json") for e in sorted(entries, key=order)],
    }
    doc["digest"] = _digest(doc)
    return Lockfile.model_validate(doc)


def build_lock(reg: Registry, ops: Sequence[str], devices: Sequence[DeviceInput],
               workloads: Iterable[tuple[str, Mapping[str, Any]]]) -> Lockfile:
    """Decide every (device, op, workload) with ``reg`` and return the lock.

    Workloads are validated (and completed with their defaults) by the op's model and
    de-duplicated. A decision that raises is re-raised as the same error type, prefixed with
    the device, op and workload.
    """
    for op in ops:
        reg.spec(op)  # UnknownOpError naming the known ops
    plugins, impls = registry_info(reg)
    wanted: dict[tuple[str, str], dict[str, Any]] = {}
    for op, wl in workloads:
        full = reg.workload(op, wl).model_dump(mode="json")
        wanted.setdefault((op, canonical(full)), full)
    entries = []
    for dev in devices:
        for (op, _), wl in wanted.items():
            try:
                decision = reg.select(op, wl, dev.facts)
            except KregError as exc:
                raise type(exc)(f"{dev.label} / {op} [{workload_text(wl)}]: {exc}") from None
            entries.append(entry_from_decision(reg, decision, dev.label, plugins))
    return _assemble(reg, ops, devices, plugins, impls, entries)


def _leaf(v: Any) -> bool:
    return not isinstance(v, (dict, list)) or not v


def _flat(v: Any) -> bool:
    """An object or array of scalars (or of arrays of scalars): written on one line."""
    values = v.values() if isinstance(v, dict) else v
    return all(_leaf(x) or (isinstance(x, list) and all(_leaf(y) for y in x)) for x in values)


def _layout(v: Any, level: int) -> str:
    if _leaf(v) or _flat(v):
        return json.dumps(v, sort_keys=True, separators=(", ", ": "), ensure_ascii=False,
                          allow_nan=False)
    pad, end = "  " * (level + 1), "  " * level
    if isinstance(v, dict):
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {_layout(v[k], level + 1)}"
                 for k in sorted(v)]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    return "[\n" + ",\n".join(pad + _layout(x, level + 1) for x in v) + "\n" + end + "]"


def dump_lock(lock: Lockfile) -> bytes:
    """The file's bytes: JSON with sorted keys, indented by 2, every object or array of scalars
    (a check, a workload, a config, a device's facts) on one line; UTF-8, a final newline."""
    return (_layout(lock.model_dump(mode="json"), 0) + "\n").encode("utf-8")


# ---------------------------------------------------------------------------------------------
# reading

_FIX = "re-create it with `kreg lock` (docs/LOCKFILE.md)"


def parse_lock(text: str, name: str) -> Lockfile:
    """A lockfile from its text; ``name`` is how messages name the file."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"lockfile {name}: not JSON ({exc}); it is damaged or not a lockfile: "
                          f"{_FIX}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"lockfile {name}: not a kreg lockfile (no \"format\": \"{FORMAT}\"); "
                          f"pass the file `kreg lock -o` wrote, or {_FIX}")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ConfigError(f"lockfile {name}: schema_version {version!r}, but this kreg reads "
                          f"schema_version {SCHEMA_VERSION}; re-create it with this kreg's "
                          f"`kreg lock` (docs/LOCKFILE.md), or use the kreg that wrote it")
    try:
        lock = Lockfile.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}"
                             for e in exc.errors()[:3])
        more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
        raise ConfigError(f"lockfile {name}: malformed ({problems}{more}); {_FIX}") from None
    if _digest(doc) != lock.digest:
        raise ConfigError(f"lockfile {name}: digest mismatch (the file was edited or damaged "
                          f"after `kreg lock` wrote it); {_FIX}")
    return lock


def load_lock(path: str | os.PathLike[str]) -> Lockfile:
    """Read a lockfile; every problem is a ConfigError naming the file and the fix."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"lockfile {path}: no such file; write one with `kreg lock OP... "
                          f"--device PROFILE... --workloads FILE -o {path}`") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"lockfile {path}: cannot be read ({why}); check the path and its "
                          f"permissions, or {_FIX}") from None
    return parse_lock(text, str(path))


# ---------------------------------------------------------------------------------------------
# comparing


class Reason(BaseModel):
    """One reason a locked decision changed, in explain's words (``text``) and as data."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["fact", "plugin", "override", "check", "implementation", "priority", "config",
                  "device", "error"]
    subject: str
    before: str | None = None
    after: str | None = None
    check_kind: Literal["capability", "envelope"] | None = None
    text: str

    @property
    def device_level(self) -> bool:
        """Said once per device in text output: facts, plugins, overrides, the device."""
        return self.kind in ("fact", "plugin", "override", "device")


class Side(BaseModel):
    model_config = ConfigDict(frozen=True)

    implementation: str
    config: dict[str, Any] | None
    reason: str


class Drift(BaseModel):
    """One key whose decision differs between the two sides, or is on one side only."""

    model_config = ConfigDict(frozen=True)

    device: str
    op: str
    workload: dict[str, Any]
    id: str
    status: Literal["changed", "error", "added", "removed"]
    before: Side | None
    after: Side | None
    error: str | None = None
    reasons: list[Reason]


class DiffReport(BaseModel):
    """:func:`diff_locks` and :func:`verify_lock`: every drift, and per device label (``*``:
    the plugin set) what changed even where no decision did."""

    model_config = ConfigDict(frozen=True)

    old: str
    new: str
    checked: int
    skipped: int = 0
    devices: list[str]
    drifts: list[Drift]
    changes: dict[str, list[Reason]]

    @property
    def ok(self) -> bool:
        return not self.drifts


@dataclass
class LockContext:
    """What a comparison reads of a side that is not a whole lockfile (the runtime check)."""

    devices: dict[str, LockedDevice]
    plugins: dict[str, PluginInfo]
    implementations: dict[str, dict[str, ImplInfo]]


def _show(v: Any) -> str:
    if isinstance(v, list):
        return "(" + ", ".join(map(str, v)) + ")"
    return "-" if v is None else str(v)


def _identity_word(i: DeviceIdentity) -> str:
    return f"{i.name} ({i.arch}, {i.sm_count} multiprocessors)"


def _fact(key: str, before: Any, after: Any, new: LockedDevice) -> Reason:
    via = " (--set)" if key in new.set else ""
    return Reason(kind="fact", subject=key, before=_show(before), after=_show(after),
                  text=f"fact {key}: {_show(before)} -> {_show(after)}{via}")


def _fact_reasons(old: LockedDevice | None, new: LockedDevice | None) -> list[Reason]:
    if old is None or new is None:
        return []
    out: list[Reason] = []
    a, b = old.facts, new.facts
    for key in sorted((set(a) | set(b)) - {"profile"}):  # the label names the profile
        if key == "extra":
            ea, eb = a.get("extra") or {}, b.get("extra") or {}
            out.extend(_fact(f"extra.{k}", ea.get(k), eb.get(k), new)
                       for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k))
        elif a.get(key) != b.get(key):
            out.append(_fact(key, a.get(key), b.get(key), new))
    return out


def _plugin_word(p: PluginInfo | None) -> str:
    if p is None:
        return "absent"
    if p.status == "loaded" and p.version:
        return f"loaded ({p.distribution or '?'} {p.version})"
    return p.status


def _plugin_reasons(names: Iterable[str], old: Mapping[str, PluginInfo],
                    new: Mapping[str, PluginInfo]) -> list[Reason]:
    out = []
    for name in sorted(set(names)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if a is not None and b is not None and a.status == b.status:
            what = f"version {a.version or '-'} -> {b.version or '-'}"
        else:
            what = f"{_plugin_word(a)} when locked, now {_plugin_word(b)}"
        out.append(Reason(kind="plugin", subject=name, before=_plugin_word(a),
                          after=_plugin_word(b), text=f"plugin {name}: {what}"))
    return out


def _override_word(o: LockedOverride | None) -> str:
    if o is None:
        return "none"
    state = "honoured" if o.honoured else "NOT honoured"
    return f"{o.source}={o.value} ({state}{': ' + o.reason if o.reason else ''})"


def _override_reasons(old: LockEntry, new: LockEntry | None) -> list[Reason]:
    a = old.override
    b = new.override if new is not None else None
    if a == b:
        return []
    if b is not None:
        text = f"override in force: {_override_word(b)}"
        if a is not None:
            text += f"; when locked: {_override_word(a)}"
        subject = b.source
    else:
        text = f"override {_override_word(a)} was in force when locked, none now"
        subject = a.source if a is not None else ""
    return [Reason(kind="override", subject=subject, before=_override_word(a),
                   after=_override_word(b), text=text)]


def _flip(impl: str, before: LockedCheck | None, after: LockedCheck) -> Reason:
    """A check whose verdict changed, said as explain says checks."""
    was = "failed" if before is None or not before.ok else (
        "waived (:measure)" if before.waived else "passed")
    now = "waived (:measure)" if after.waived else ("passed" if after.passed else "failed")
    prev = before.observed if before is not None else "absent"
    shown = after.observed if after.ok else f"{after.observed}, requires {after.required}"
    return Reason(kind="check", subject=f"{impl}/{after.name}", before=prev,
                  after=after.observed, check_kind=after.kind,
                  text=f"{impl}: check {after.name} [{after.kind}] {was} -> {now}: "
                       f"{prev} -> {shown}")


def compare_entries(old_lock: Lockfile | LockContext, old: LockEntry,
                    new_lock: Lockfile | LockContext, new: LockEntry | None,
                    error: str | None = None) -> list[Reason]:
    """Why ``new`` (the same key, re-derived or from another lockfile) differs from ``old``:
    which fact, plugin or override changed, which check flipped, which implementation came,
    went or changed priority. ``new`` is None when re-deriving raised ``error``."""
    dev_then, dev_now = old_lock.devices.get(old.device), new_lock.devices.get(old.device)
    reasons = []
    if dev_then is not None and dev_now is not None and dev_then.identity != dev_now.identity:
        then, now = _identity_word(dev_then.identity), _identity_word(dev_now.identity)
        reasons.append(Reason(
            kind="device", subject=old.device, before=then, after=now,
            text=f"device {old.device} was {then} when locked, here it is {now}: verify on that "
                 f"device, or pass --device FILE with its facts"))
    reasons += _fact_reasons(dev_then, dev_now)
    involved = set(old.plugins) | (set(new.plugins) if new is not None else set())
    reasons += _plugin_reasons(involved, old_lock.plugins, new_lock.plugins)
    reasons += _override_reasons(old, new)
    if new is None:
        reasons.append(Reason(kind="error", subject=old.implementation, text=error or "error"))
        return reasons
    o_name, n_name = old.implementation, new.implementation
    old_impls = old_lock.implementations.get(old.op, {})
    new_impls = new_lock.implementations.get(old.op, {})
    for name in dict.fromkeys([o_name, n_name]):
        a, b = old_impls.get(name), new_impls.get(name)
        if a is not None and b is not None and a.priority != b.priority:
            reasons.append(Reason(kind="priority", subject=name, before=str(a.priority),
                                  after=str(b.priority),
                                  text=f"{name}: priority {a.priority} -> {b.priority}"))
    if o_name == n_name:
        if canonical(old.config) != canonical(new.config):
            reasons.append(Reason(kind="config", subject=o_name,
                                  before=format_config(old.config),
                                  after=format_config(new.config),
                                  text=f"{o_name}: config {format_config(old.config)} -> "
                                       f"{format_config(new.config)}"))
        before = {c.name: c for c in old.checks}
        for c in new.checks:
            b0 = before.get(c.name)
            if b0 is None or b0.ok != c.ok:
                reasons.append(_flip(o_name, b0, c))
            elif b0.observed != c.observed:
                reasons.append(Reason(kind="check", subject=f"{o_name}/{c.name}",
                                      before=b0.observed, after=c.observed, check_kind=c.kind,
                                      text=f"{o_name}: check {c.name} [{c.kind}] observed "
                                           f"{b0.observed} -> {c.observed}"))
        return reasons
    # The implementation changed: why the locked one lost, why the new one won.
    if o_name not in new_impls:
        reasons.append(Reason(kind="implementation", subject=o_name, before="registered",
                              after="not registered",
                              text=f"{o_name} (locked; plugin {old.plugin}) is not registered "
                                   f"now"))
    now_above = {c.implementation: c for c in new.passed_over}
    then_above = {c.implementation: c for c in old.passed_over}
    if o_name in now_above:  # the locked one still outranks the new choice: it lost eligibility
        passed = {c.name: c for c in old.checks}
        for c in now_above[o_name].failed:
            if not c.ok and (passed.get(c.name) is None or passed[c.name].ok):
                reasons.append(_flip(o_name, passed.get(c.name), c))
        if now_above[o_name].eligible and new.override is None:
            reasons.append(Reason(kind="implementation", subject=o_name,
                                  text=f"{o_name} is still eligible but not chosen"))
    if n_name not in old_impls:
        reasons.append(Reason(kind="implementation", subject=n_name, before="not registered",
                              after="registered",
                              text=f"{n_name} is new (plugin {new.plugin}, priority "
                                   f"{new.priority}) and eligible"))
    elif n_name in then_above:  # it outranked the locked one then: it became eligible
        was = {c.name: c for c in then_above[n_name].failed}
        flipped = [_flip(n_name, was[c.name], c) for c in new.checks
                   if c.name in was and not was[c.name].ok and c.ok]
        reasons += flipped
        if not flipped and then_above[n_name].eligible and new.override is None:
            reasons.append(Reason(kind="implementation", subject=n_name,
                                  text=f"{n_name} was eligible when locked and is chosen now"))
    return reasons


def _side(e: LockEntry) -> Side:
    return Side(implementation=e.implementation, config=e.config, reason=e.reason)


def _changes(old: Lockfile, new: Lockfile, labels: Sequence[str]) -> dict[str, list[Reason]]:
    out: dict[str, list[Reason]] = {}
    for label in labels:
        found = _fact_reasons(old.devices.get(label), new.devices.get(label))
        if found:
            out[label] = found
    plugins = _plugin_reasons(set(old.plugins) | set(new.plugins), old.plugins, new.plugins)
    if plugins:
        out["*"] = plugins
    return out


def diff_locks(old: Lockfile, new: Lockfile, *, old_name: str = "old", new_name: str = "new",
               errors: Mapping[tuple[str, str, str], str] | None = None,
               devices: Sequence[str] | None = None) -> DiffReport:
    """Every key whose decision differs between ``old`` and ``new``, with the reasons, in the
    order of ``old``'s entries (then ``new``'s added ones).

    ``errors`` holds keys ``(device, op, canonical workload)`` whose re-derivation raised
    (verify); ``devices`` limits the comparison to those labels (default: both files' devices).
    """
    errors = dict(errors or {})
    labels = list(devices) if devices is not None else list(
        dict.fromkeys([*old.devices, *new.devices]))
    a, b = old.entry_map(), new.entry_map()
    keys = list(dict.fromkeys([*a, *b]))
    keys.sort(key=lambda k: labels.index(k[0]) if k[0] in labels else len(labels))
    drifts: list[Drift] = []
    checked = 0
    for key in keys:
        if key[0] not in labels:
            continue
        oe, ne = a.get(key), b.get(key)
        if oe is None:
            assert ne is not None
            drifts.append(Drift(device=ne.device, op=ne.op, workload=ne.workload, id=ne.id,
                                status="added", before=None, after=_side(ne), reasons=[]))
            continue
        checked += 1
        if ne is None and key not in errors:
            drifts.append(Drift(device=oe.device, op=oe.op, workload=oe.workload, id=oe.id,
                                status="removed", before=_side(oe), after=None, reasons=[]))
            continue
        if ne is not None and ne.implementation == oe.implementation and \
                canonical(ne.config) == canonical(oe.config):
            continue
        reasons = compare_entries(old, oe, new, ne, errors.get(key))
        drifts.append(Drift(device=oe.device, op=oe.op, workload=oe.workload, id=oe.id,
                            status="changed" if ne is not None else "error", before=_side(oe),
                            after=None if ne is None else _side(ne), error=errors.get(key),
                            reasons=reasons))
    return DiffReport(old=old_name, new=new_name, checked=checked, devices=labels,
                      drifts=drifts, changes=_changes(old, new, labels))


# ---------------------------------------------------------------------------------------------
# verifying


def _current_device(reg: Registry, label: str, locked: LockedDevice,
                    given: Mapping[str, DeviceInput], sets: Mapping[str, Any]) -> DeviceInput:
    """Device ``label`` as it is now: the ``--device`` given for it, else its shipped profile,
    this machine, or (a device read from a file) its locked facts. The lock-time what-ifs are
    applied again (a file's locked facts already hold them), then ``sets``."""
    source = locked.source
    if label in given:
        facts, again = given[label].facts, dict(locked.set)
    elif source == "profile":
        try:
            facts = reg.resolve_device(label)
        except UnknownDeviceError:
            raise UnknownDeviceError(f"device profile {label!r} is not known to this kreg "
                                     f"(known: {', '.join(sorted(reg.profiles()))}); pass "
                                     f"--device FILE with its facts") from None
        again = dict(locked.set)
    elif source == "local":
        facts, again = reg.resolve_device(None), dict(locked.set)
    else:
        facts, again = DeviceFacts.model_validate(locked.facts), {}
    both = {**again, **dict(sets)}
    if both:
        facts = _with_sets(facts, both, label)
    return DeviceInput(label=label, source=source, facts=facts, sets={**locked.set, **sets})


def verify_lock(reg: Registry, lock: Lockfile, *, name: str = "lockfile",
                devices: Sequence[str] = (), sets: Mapping[str, Any] | None = None) -> DiffReport:
    """Re-derive every locked decision (of the ``devices`` given, default all) with ``reg`` and
    report each that changed, with why.

    ``devices`` are ``--device`` values (profile names, ``local``, DeviceFacts files); each must
    be a device of the lock. ``sets`` are what-ifs applied on top of the lock's own.
    """
    sets = dict(sets or {})
    given: dict[str, DeviceInput] = {}
    for dev in resolve_devices(reg, devices) if devices else []:
        if dev.label not in lock.devices:
            raise ConfigError(f"device {dev.label!r} is not in lockfile {name} (it locks: "
                              f"{', '.join(lock.devices)}); pass one of those to --device")
        given[dev.label] = dev
    labels = list(given) if given else list(lock.devices)
    current: dict[str, DeviceInput] = {}
    bad: dict[str, str] = {}
    for label in labels:
        try:
            current[label] = _current_device(reg, label, lock.devices[label], given, sets)
        except KregError as exc:
            bad[label] = f"{type(exc).__name__}: {exc}"
    plugins, impls = registry_info(reg)
    errors: dict[tuple[str, str, str], str] = {}
    entries: list[LockEntry] = []
    for e in lock.entries:
        if e.device not in labels:
            continue
        key = (e.device, e.op, canonical(e.workload))
        if e.device in bad:
            errors[key] = bad[e.device]
            continue
        try:
            decision = reg.select(e.op, e.workload, current[e.device].facts)
        except KregError as exc:
            errors[key] = f"{type(exc).__name__}: {exc}"
            continue
        ne = entry_from_decision(reg, decision, e.device, plugins)
        if canonical(ne.workload) != key[2]:  # the op's model now adds a field with a default
            ne = ne.model_copy(update={"workload": e.workload, "id": e.id})
        entries.append(ne)
    rebuilt = _assemble(reg, lock.ops, list(current.values()), plugins, impls, entries)
    report = diff_locks(lock, rebuilt, old_name=name, new_name="now", errors=errors,
                        devices=labels)
    return report.model_copy(
        update={"skipped": sum(1 for e in lock.entries if e.device not in labels)})
