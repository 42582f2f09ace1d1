"""The selector: a pure function of (facts, workload, implementations, override).

Preference is data: the sort key of an eligible candidate is ``(-priority, name)``. Higher
priority wins; among equal priorities the lexicographically smaller name wins, and the decision
says so. Nothing here probes a device, reads the environment or imports torch.

Nothing a plugin contributes can take selection down: a requirement that raises, a priority that
is not an integer, a config resolver that raises or returns something other than a mapping of
``str`` to JSON values, each disqualifies that one candidate with a failed check naming the
plugin and the error, and the next candidate is chosen. An exception raised inside kreg's own
code (the requirement library) is blamed on kreg, not on the plugin using it.
"""

from __future__ import annotations

import math
import numbers
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry._contract import GUARANTEES, Contract
from registry._decision import Candidate, Decision, OverrideInfo
from registry._facts import DeviceFacts
from registry._format import format_candidates
from registry._spec import Implementation
from registry._workload import Workload
from registry.errors import (
    NoEligibleImplementationError,
    OverrideError,
    StrictModeError,
    UnknownImplementationError,
)
from registry.requirements import Check

__all__ = ["OverrideRequest", "parse_override", "priority_of", "select_pure", "sort_key"]

# kreg's own code: an exception whose innermost frame is here is kreg's bug, not a plugin's.
_KREG_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class OverrideRequest:
    value: str
    source: str
    implementation: str | None  # None for "auto"
    measure: bool = False


def parse_override(op: str, raw: str, source: str, known: Iterable[str]) -> OverrideRequest | None:
    """Parse ``auto | <implementation> | <implementation>:measure``; None means auto.

    An unknown implementation name is an error at once, listing the known names.
    """
    value = raw.strip()
    if value in ("", "auto"):
        return None
    name, sep, suffix = value.partition(":")
    if sep and suffix != "measure":
        raise OverrideError(
            f"{source}={raw!r}: unknown suffix {':' + suffix!r}; the grammar is "
            f"auto | <implementation> | <implementation>:measure")
    known = sorted(known)
    if name not in known:
        raise UnknownImplementationError(
            f"{source}={raw!r}: no implementation {name!r} for op {op!r}; known: "
            f"{', '.join(known) or '(none)'}")
    return OverrideRequest(value=value, source=source, implementation=name, measure=bool(sep))


def priority_of(impl: Implementation) -> int | None:
    """``impl.priority`` as an int, or None when it is not an integer (a plugin's bug: the
    candidate is then disqualified, never sorted by it)."""
    p = impl.priority
    if type(p) is int:  # the common case, first: this runs per candidate per selection
        return p
    if isinstance(p, bool):
        return None
    if isinstance(p, numbers.Integral):
        return int(p)
    if isinstance(p, float) and math.isfinite(p) and float(p).is_integer():
        return int(p)
    return None


def sort_key(impl: Implementation) -> tuple[float, str]:
    """``(-priority, name)``; a candidate without an integer priority sorts last."""
    p = priority_of(impl)
    return (-p if p is not None else math.inf, impl.name)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _blame(exc: BaseException, plugin: str) -> str:
    """Who to blame for ``exc``: kreg when its innermost frame is kreg's own code (the
    requirement library), else the plugin."""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        try:
            inside = Path(last.filename).resolve().is_relative_to(_KREG_DIR)
        except (OSError, ValueError):
            inside = False
        if inside:
            where = f"registry/{Path(last.filename).name}:{last.lineno}"
            return (f"a bug in kreg ({where}, evaluating plugin {plugin!r}'s candidate), not in "
                    f"plugin {plugin!r}: please report it")
    return f"a bug in plugin {plugin!r}"


def _contract_check(impl: Implementation, facts: DeviceFacts, workload: Workload,
                    required: frozenset[str]) -> Check:
    """The ``contract`` check of a required guarantee set: the implementation's contract for the
    config it would run here (capability: a requirement of the caller, never waived)."""
    want = ", ".join(g for g in GUARANTEES if g in required)
    try:
        config = impl.resolve_config(facts, workload, invariant="batch_invariant" in required)
        contract = impl.contract_for(config)
    except Exception as exc:  # a broken resolver or contract disqualifies only its candidate
        return Check(name="contract", kind="capability", passed=False,
                     observed=f"contract raised {type(exc).__name__}: {exc}",
                     required=f"{want} (a contract that evaluates: a bug in plugin "
                              f"{impl.plugin!r})")
    missing = [g for g in GUARANTEES if g in required and g not in contract.names]
    observed = contract.describe()
    if missing:
        observed += f"; lacks {', '.join(missing)}"
    return Check(name="contract", kind="capability", passed=not missing, observed=observed,
                 required=want)


def _assess(impl: Implementation, facts: DeviceFacts, workload: Workload,
            waive_envelope: bool,
            required: frozenset[str] = frozenset()) -> tuple[bool, list[Check]]:
    checks = []
    if priority_of(impl) is None:
        checks.append(Check(name="priority", kind="capability", passed=False,
                            observed=f"{impl.priority!r:.60} ({type(impl.priority).__name__})",
                            required=f"an integer priority (a bug in plugin {impl.plugin!r})"))
    try:
        requirements = tuple(impl.requirements)
    except Exception as exc:
        requirements = ()
        checks.append(Check(name="requirements", kind="capability", passed=False,
                            observed=f"not iterable ({_short(exc)})",
                            required=f"a tuple of Requirement (a bug in plugin {impl.plugin!r})"))
    for req in requirements:
        try:
            c = req.check(facts, workload)
            if not isinstance(c, Check):
                raise TypeError(f"check() returned {type(c).__name__}, not a Check")
        except (Exception, SystemExit) as exc:  # a buggy requirement disqualifies its candidate
            name = getattr(req, "name", None)
            c = Check(name=name if isinstance(name, str) else f"{req!r:.60}",
                      kind="capability", passed=False,
                      observed=f"requirement raised {_short(exc)}",
                      required=f"a requirement that evaluates ({_blame(exc, impl.plugin)})")
        if not c.passed and waive_envelope and c.kind == "envelope":
            c = c.model_copy(update={"waived": True})
        checks.append(c)
    if required:
        checks.append(_contract_check(impl, facts, workload, required))
    return all(c.ok for c in checks), checks


_JSON_SCALARS = (str, int, float, bool, type(None))


def _json_value(v: Any, depth: int = 0) -> bool:
    if isinstance(v, _JSON_SCALARS):
        return not (isinstance(v, float) and not math.isfinite(v))
    if isinstance(v, (list, tuple)) and depth < 4:
        return all(_json_value(x, depth + 1) for x in v)
    return False


def _config_of(impl: Implementation, facts: DeviceFacts, workload: Workload,
               invariant: bool = False) -> tuple[dict[str, Any] | None, Check | None]:
    """The candidate's config, or a failed check naming the plugin when its resolver raises or
    returns something other than None or a mapping of str -> JSON value. ``invariant``: the
    config it runs while ``batch_invariant`` is required (``Implementation.invariant_config``)."""
    problem = None
    config: dict[str, Any] | None = None
    source = impl.invariant_config if invariant and impl.invariant_config else impl.config
    try:
        raw = source(facts, workload) if callable(source) else source
        if raw is not None and not isinstance(raw, Mapping):
            problem = f"the config resolver returned {type(raw).__name__} {raw!r:.60}"
        elif raw is not None:
            config = dict(raw)
            bad = [k for k, v in config.items() if not isinstance(k, str) or not _json_value(v)]
            if bad:
                k = bad[0]
                problem = (f"config entry {k!r:.40}: {config[k]!r:.40} is not a str key with a "
                           f"JSON value (a number, a string, a bool, None or a list of them)")
                config = None
    except (Exception, SystemExit) as exc:
        problem = f"the config resolver raised {_short(exc)}"
        blame = _blame(exc, impl.plugin)
    else:
        blame = f"a bug in plugin {impl.plugin!r}"
    if problem is None:
        return config, None
    return None, Check(name="config", kind="capability", passed=False, observed=problem,
                       required=f"a config: None or a mapping of str -> JSON value ({blame})")


def select_pure(op: str, facts: DeviceFacts, workload: Workload,
                implementations: Sequence[Implementation],
                override: OverrideRequest | None = None, *, strict: bool = False,
                required: frozenset[str] = frozenset()) -> Decision:
    """Choose an implementation for ``workload`` on ``facts``; every candidate gets a verdict.

    ``required``: guarantees every candidate's contract must hold (``KREG_REQUIRE_<OP>``), a
    capability check named ``contract``. Raises NoEligibleImplementationError (with the full
    trace) when nothing qualifies, and StrictModeError under ``strict`` when an override is not
    honoured or the reference is chosen.
    """
    impls = sorted(implementations, key=sort_key)
    invariant = "batch_invariant" in required
    # [implementation, eligible, checks]; a candidate whose config fails to resolve when it is
    # about to be chosen becomes ineligible here, with the failed check.
    assessed: list[list[Any]] = []
    for impl in impls:
        waive = bool(override and override.measure and override.implementation == impl.name)
        ok, checks = _assess(impl, facts, workload, waive, required)
        assessed.append([impl, ok, checks])
    configs: dict[str, dict[str, Any] | None] = {}

    def settle(impl: Implementation) -> bool:
        """Resolve ``impl``'s config; False (and ``impl`` disqualified) when it fails."""
        cfg, bad = _config_of(impl, facts, workload, invariant)
        if bad is None:
            configs[impl.name] = cfg
            return True
        for entry in assessed:
            if entry[0] is impl:
                entry[1] = False
                entry[2] = [*entry[2], bad]
        return False

    def eligible() -> list[Implementation]:
        return [impl for impl, ok, _ in assessed if ok]

    def candidates(chosen: Implementation | None) -> list[Candidate]:
        rank = {impl.name: i for i, impl in enumerate(eligible())}
        out = []
        for impl, ok, checks in assessed:
            mine = chosen is not None and impl.name == chosen.name
            out.append(Candidate(implementation=impl.name, plugin=impl.plugin,
                                 priority=priority_of(impl) or 0, eligible=ok, checks=checks,
                                 config=configs.get(impl.name) if mine else None,
                                 rank=rank.get(impl.name)))
        return out

    notes: list[str] = []
    info: OverrideInfo | None = None
    chosen: Implementation | None = None
    reason = ""
    if override is not None:
        target = next((i for i in impls if i.name == override.implementation), None)
        honoured = target is not None and target in eligible() and settle(target)
        target_checks: list[Check] = next((cs for i, _, cs in assessed if i is target), [])
        why = ""
        if honoured and target is not None:
            chosen = target
            waived = [c.name for c in target_checks if c.waived]
            reason = "override " + override.value
            if waived:
                reason += " (envelope waived: " + ", ".join(waived) + ")"
        else:
            failed = [c for c in target_checks if not c.ok]
            why = "; ".join(str(c) for c in failed) or "not registered for this op"
            if failed and not override.measure and all(c.kind == "envelope" for c in failed):
                why += (f" (only envelope checks fail: {override.implementation}:measure would "
                        "waive them)")
            if strict:
                raise StrictModeError(
                    f"KREG_STRICT=1: override {override.source}={override.value} cannot be "
                    f"honoured for {op} on {facts.describe()}: {why}")
        info = OverrideInfo(value=override.value, source=override.source,
                            implementation=override.implementation, measure=override.measure,
                            honoured=honoured, reason=why)
    if chosen is None:
        chosen = next((impl for impl in eligible() if impl.name in configs or settle(impl)),
                      None)
        if chosen is None:
            trace = "\n".join(format_candidates(candidates(None), None))
            raise NoEligibleImplementationError(
                f"no implementation of {op} can run workload [{workload.short()}] on "
                f"{facts.describe()}; every candidate's verdict:\n{trace}\n"
                f"fix: install a plugin that covers this device and workload, or change the "
                f"workload (the reference plugin runs anywhere torch does)")
        now = eligible()
        runner_up = now[1] if len(now) > 1 else None
        if runner_up is not None and priority_of(runner_up) == priority_of(chosen):
            notes.append(f"tie at priority {chosen.priority} between {chosen.name} and "
                         f"{runner_up.name}, broken by name order")
        from registry._format import _passed

        reason = (f"highest priority ({chosen.priority}) of {len(now)} eligible; "
                  f"{_passed(len(chosen.requirements))}")
        if info is not None:
            reason += f"; override {info.value} not honoured"
    if chosen.fallback and strict:
        raise StrictModeError(
            f"KREG_STRICT=1: {op} would fall back to the torch reference {chosen.name} on "
            f"{facts.describe()} for [{workload.short()}]; unset KREG_STRICT or install a "
            f"kernel that covers this workload")
    cands = candidates(chosen)
    config = configs.get(chosen.name)
    contract = Contract()
    try:
        contract = chosen.contract_for(config)
    except Exception as exc:  # shown, never fatal: nothing was required of it
        notes.append(f"{chosen.name}'s contract raised {type(exc).__name__}: {exc}")
    if chosen.describe_config is not None:
        try:
            notes.append(f"path: {chosen.describe_config(config)}")
        except Exception as exc:  # shown, never fatal
            notes.append(f"{chosen.name}'s describe_config raised {type(exc).__name__}: {exc}")
    return Decision(op=op, implementation=chosen.name, config=config,
                    fallback=bool(chosen.fallback), reason=reason, candidates=cands,
                    override=info, facts=facts, workload=workload.model_dump(), notes=notes,
                    guarantees=[g for g in GUARANTEES if g in contract.names],
                    order_class=contract.order_class,
                    required=[g for g in GUARANTEES if g in required])
