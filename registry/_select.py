"""The selector: a pure function of (facts, workload, implementations, override).

Preference is data: the sort key of an eligible candidate is ``(-priority, name)``. Higher
priority wins; among equal priorities the lexicographically smaller name wins, and the decision
says so. Nothing here probes a device, reads the environment or imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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

__all__ = ["OverrideRequest", "parse_override", "select_pure", "sort_key"]


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


def sort_key(impl: Implementation) -> tuple[int, str]:
    return (-impl.priority, impl.name)


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
            required: frozenset[str] = frozenset()) -> tuple[bool, list]:  # type: ignore[type-arg]
    checks = []
    for req in impl.requirements:
        try:
            c = req.check(facts, workload)
        except Exception as exc:  # a buggy requirement disqualifies its candidate, nothing more
            c = Check(name=req.name, kind="capability", passed=False,
                      observed=f"requirement raised {type(exc).__name__}: {exc}",
                      required="a requirement that evaluates (a bug in plugin "
                               f"{impl.plugin!r})")
        if not c.passed and waive_envelope and c.kind == "envelope":
            c = c.model_copy(update={"waived": True})
        checks.append(c)
    if required:
        checks.append(_contract_check(impl, facts, workload, required))
    return all(c.ok for c in checks), checks


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
    assessed: list[tuple[Implementation, bool, list]] = []  # type: ignore[type-arg]
    for impl in impls:
        waive = bool(override and override.measure and override.implementation == impl.name)
        ok, checks = _assess(impl, facts, workload, waive, required)
        assessed.append((impl, ok, checks))
    eligible = [impl for impl, ok, _ in assessed if ok]
    rank = {impl.name: i for i, impl in enumerate(eligible)}

    def candidates(chosen: Implementation | None) -> list[Candidate]:
        out = []
        for impl, ok, checks in assessed:
            config = impl.resolve_config(facts, workload, invariant) \
                if ok and impl is chosen else None
            out.append(Candidate(implementation=impl.name, plugin=impl.plugin,
                                 priority=impl.priority, eligible=ok, checks=checks,
                                 config=config, rank=rank.get(impl.name)))
        return out

    notes: list[str] = []
    info: OverrideInfo | None = None
    chosen: Implementation | None = None
    reason = ""
    if override is not None:
        target = next((i for i in impls if i.name == override.implementation), None)
        target_checks = next((cs for i, _, cs in assessed if i is target), [])
        honoured = target is not None and target in eligible
        why = ""
        if honoured:
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
        if not eligible:
            trace = "\n".join(format_candidates(candidates(None), None))
            raise NoEligibleImplementationError(
                f"no implementation of {op} can run workload [{workload.short()}] on "
                f"{facts.describe()}; every candidate's verdict:\n{trace}\n"
                f"fix: install a plugin that covers this device and workload, or change the "
                f"workload (the reference plugin runs anywhere torch does)")
        chosen = eligible[0]
        runner_up = eligible[1] if len(eligible) > 1 else None
        if runner_up is not None and runner_up.priority == chosen.priority:
            notes.append(f"tie at priority {chosen.priority} between {chosen.name} and "
                         f"{runner_up.name}, broken by name order")
        from registry._format import _passed

        reason = (f"highest priority ({chosen.priority}) of {len(eligible)} eligible; "
                  f"{_passed(len(chosen.requirements))}")
        if info is not None:
            reason += f"; override {info.value} not honoured"
    if chosen.fallback and strict:
        raise StrictModeError(
            f"KREG_STRICT=1: {op} would fall back to the torch reference {chosen.name} on "
            f"{facts.describe()} for [{workload.short()}]; unset KREG_STRICT or install a "
            f"kernel that covers this workload")
    cands = candidates(chosen)
    config = next(c.config for c in cands if c.implementation == chosen.name)
    contract = Contract()
    try:
        contract = chosen.contract_for(config)
    except Exception as exc:  # shown, never fatal: nothing was required of it
        notes.append(f"{chosen.name}'s contract raised {type(exc).__name__}: {exc}")
    return Decision(op=op, implementation=chosen.name, config=config, fallback=chosen.fallback,
                    reason=reason, candidates=cands, override=info, facts=facts,
                    workload=workload.model_dump(), notes=notes,
                    guarantees=[g for g in GUARANTEES if g in contract.names],
                    order_class=contract.order_class,
                    required=[g for g in GUARANTEES if g in required])
