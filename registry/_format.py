"""Human text for decisions: one formatter for ``explain``, ``kreg explain`` and error traces."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from registry._decision import Candidate, Decision

__all__ = ["format_candidates", "format_decision"]


def _cfg(config: dict[str, object] | None) -> str:
    if not config:
        return "-"
    return " ".join(f"{k}={v}" for k, v in config.items())


def _passed(n: int) -> str:
    if n == 0:
        return "no requirements"
    return "1 check passed" if n == 1 else f"all {n} checks passed"


def format_candidates(candidates: list[Candidate], chosen: str | None,
                      verbose: bool = False) -> list[str]:
    """The candidate table: verdict, priority and the failed (or, verbose, every) check."""
    width = max([len(c.implementation) for c in candidates] + [len("candidate")])
    lines = [f"  {'candidate'.ljust(width)}  prio  verdict   reasons"]
    order = sorted(candidates, key=lambda c: (c.implementation != chosen, not c.eligible,
                                              -c.priority, c.implementation))
    for c in order:
        if c.implementation == chosen:
            verdict = "CHOSEN"
        elif c.eligible:
            verdict = "eligible"
        else:
            verdict = "rejected"
        shown = c.checks if verbose else [k for k in c.checks if not k.passed]
        reasons = [str(k) if k.passed else f"{k} [{k.kind}]" for k in shown]
        if not reasons:
            reasons = [_passed(len(c.checks))]
        head = f"  {c.implementation.ljust(width)}  {c.priority:>4}  {verdict:<8}  "
        lines.append(head + reasons[0])
        pad = " " * len(head)
        lines.extend(pad + r for r in reasons[1:])
    return lines


def format_decision(d: Decision, verbose: bool = False) -> str:
    where = d.facts.profile or "this machine"
    lines = [f"{d.op} on {where}: {d.facts.describe()}",
             "workload: " + " ".join(f"{k}={v}" for k, v in d.workload.items()),
             f"-> {d.implementation}  config: {_cfg(d.config)}",
             f"   because {d.reason}"]
    if d.fallback:
        lines.append("   (fallback: the torch reference runs; no kernel qualifies here)")
    if d.override is not None:
        o = d.override
        state = "honoured" if o.honoured else "NOT honoured"
        why = f": {o.reason}" if o.reason else ""
        lines.append(f"override: {o.source}={o.value} ({state}{why})")
    else:
        lines.append("override: none")
    if d.cached or d.source != "local":
        lines.append(f"source: {d.source}{' (cached)' if d.cached else ''}")
    for note in d.notes:
        lines.append(f"note: {note}")
    lines.append("")
    lines.extend(format_candidates(d.candidates, d.implementation, verbose=verbose))
    return "\n".join(lines)
