"""Human text for decisions: one formatter for ``explain``, ``kreg explain`` and error traces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from registry._decision import Candidate, Decision

__all__ = ["CONFIG_KEY_ORDER", "format_candidates", "format_config", "format_config_short",
           "format_decision"]

# The order config keys are printed in, everywhere a config is shown (explain, the INFO line,
# `kreg tuning list`, `explain --live`, the recorder, check-mode violations): the launch
# geometry first in this order, then every other key sorted by name. A config's own key order
# varies with where it came from (a policy's dict, a JSON store, the daemon's wire form), so it
# is never used.
CONFIG_KEY_ORDER = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def _ordered(config: Mapping[str, Any]) -> list[tuple[str, Any]]:
    head = [(k, config[k]) for k in CONFIG_KEY_ORDER if k in config]
    tail = sorted((str(k), v) for k, v in config.items() if k not in CONFIG_KEY_ORDER)
    return head + tail


def format_config(config: Mapping[str, Any] | None) -> str:
    """``BLOCK_M=8 BLOCK_N=16 num_warps=4 num_stages=3 ENGINE=gluon``; ``-`` for none."""
    if not config:
        return "-"
    return " ".join(f"{k}={v}" for k, v in _ordered(config))


def format_config_short(config: Mapping[str, Any] | None) -> str:
    """The values alone in the same order, ``(8,16,4,3)``: the form DESIGN.md pins for the INFO
    log line; ``-`` for none."""
    if not config:
        return "-"
    return "(" + ",".join(str(v) for _, v in _ordered(config)) + ")"


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
             f"-> {d.implementation}  config: {format_config(d.config)}",
             f"   because {d.reason}"]
    if d.fallback:
        lines.append("   (fallback: the torch reference runs; no kernel qualifies here)")
    tail = f" (order class {d.order_class})" if d.order_class else ""
    lines.append(f"   guarantees: {', '.join(d.guarantees) or 'none declared'}{tail}"
                 + (f"; required: {', '.join(d.required)}" if d.required else ""))
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
