"""``registry.agree()``: ranks compare their decisions through torch.distributed.

Every rank digests its decisions (``Registry.last_decisions``, what dispatch runs, and the
decision cache's entries for this machine's own devices) to ``{(op, workload): (implementation,
config)}``, and the digests are all-gathered with ``all_gather_object``. A key decided
differently on two ranks is a divergence: a different device or software version, a plugin set
that differs, an override on one rank, a tuning-store entry on one node. Left alone, ranks would
run different kernels for the same shapes (different rounding, different speed, a straggler).

``adopt=True`` pins rank 0's choice on every rank: for each divergent key the local dispatch
entry is re-bound to rank 0's implementation and config (``Implementation.bind``) and its
recorded decision replaced by a copy with ``source="adopted"``. A rank adopts only what it can
run: an implementation it does not have, or whose *capability* requirements fail here, is left
alone and reported (envelope requirements are waived, as ``:measure`` would). The pins live in
the dispatch map: anything that invalidates the registry (a plugin registered, an override
entered or left, ``registry.invalidate()``) drops them, after which ``agree`` should run again.

The key leaves out the device index (rank i usually drives cuda:i) but the workload holds every
decision-relevant field, so equal keys ask the same question.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from registry._decision import Decision
from registry._format import format_config

__all__ = ["AgreeReport", "Divergence", "OutputDivergence", "agree", "digest"]

Choice = tuple[str, dict[str, Any] | None]


def _key(decision: Decision) -> str:
    return decision.op + " " + json.dumps(decision.workload, sort_keys=True, default=str)


def _local_decisions() -> dict[str, list[tuple[tuple[Any, ...], Decision, str]]]:
    """key -> [(registry key, decision, where)] for this rank; where is dispatch or select."""
    from registry._default import get_registry

    reg = get_registry()
    out: dict[str, list[tuple[tuple[Any, ...], Decision, str]]] = {}
    with reg._lock:
        dispatched = list(reg.last_decisions.items())
        own = {f.fingerprint for f in reg._facts.values()}
        selected = [(k, d) for k, d in reg._decisions.items() if d.facts.fingerprint in own]
    for rkey, decision in dispatched:
        out.setdefault(_key(decision), []).append((rkey, decision, "dispatch"))
    for rkey, decision in selected:
        out.setdefault(_key(decision), []).append((rkey, decision, "select"))
    return out


def digest() -> dict[str, Choice]:
    """This rank's decisions: ``"op {workload json}" -> (implementation, config)``."""
    out: dict[str, Choice] = {}
    for key, entries in _local_decisions().items():
        # Dispatch entries first: they are what runs.
        _, decision, _ = sorted(entries, key=lambda e: e[2] != "dispatch")[0]
        out[key] = (decision.implementation, decision.config)
    return out


@dataclass
class Divergence:
    """One key decided differently across ranks; ``choices[rank]`` is None where a rank has no
    decision for it."""

    key: str
    choices: dict[int, Choice | None]
    adopted: bool = False
    not_adopted: dict[int, str] = field(default_factory=dict)

    @property
    def op(self) -> str:
        return self.key.split(" ", 1)[0]

    @property
    def workload(self) -> dict[str, Any]:
        return dict(json.loads(self.key.split(" ", 1)[1]))

    def __str__(self) -> str:
        wl = " ".join(f"{k}={v}" for k, v in self.workload.items())
        lines = [f"{self.op} [{wl}]"]
        for rank, choice in sorted(self.choices.items()):
            if choice is None:
                lines.append(f"  rank {rank}: (no decision)")
                continue
            impl, cfg = choice
            lines.append(f"  rank {rank}: {impl}  config: {format_config(cfg)}")
        for rank, why in sorted(self.not_adopted.items()):
            lines.append(f"  rank {rank} kept its own: {why}")
        if self.adopted:
            lines.append("  -> rank 0's choice adopted")
        return "\n".join(lines)


@dataclass
class OutputDivergence:
    """One replicated dispatch whose output digests differ across ranks."""

    op: str
    seq: int
    # rank -> (implementation and config that ran, digest); None where the rank has no record
    outputs: dict[int, tuple[str, tuple[int, int]] | None]

    @property
    def ranks(self) -> dict[tuple[int, int] | None, list[int]]:
        """Digest -> the ranks that produced it."""
        out: dict[tuple[int, int] | None, list[int]] = {}
        for rank, rec in sorted(self.outputs.items()):
            out.setdefault(None if rec is None else rec[1], []).append(rank)
        return out

    def __str__(self) -> str:
        lines = [f"{self.op} dispatch #{self.seq}: outputs differ across ranks"]
        for n, (digest, ranks) in enumerate(self.ranks.items()):
            if digest is None:
                lines.append(f"  ranks {ranks}: (not recorded)")
                continue
            ran = next(rec[0] for r in ranks if (rec := self.outputs[r]) is not None)
            lines.append(f"  ranks {ranks}: output digest #{n} from {ran}")
        return "\n".join(lines)


@dataclass
class AgreeReport:
    """What ``registry.agree()`` found (identical on every rank, except ``rank``)."""

    rank: int
    world_size: int
    keys: int  # distinct keys decided on at least one rank
    divergences: list[Divergence]
    adopt: bool = False
    pinned: int = 0  # local entries this rank re-bound to rank 0's choice
    # agree(outputs=True): replicated dispatches compared, and those whose outputs differ
    outputs_compared: int = 0
    output_divergences: list[OutputDivergence] = field(default_factory=list)

    @property
    def agreed(self) -> bool:
        return not self.divergences and not self.output_divergences

    def __bool__(self) -> bool:
        return self.agreed

    def __str__(self) -> str:
        head = (f"registry.agree: {self.world_size} ranks, {self.keys} decision keys, "
                f"{len(self.divergences)} divergent")
        if self.adopt:
            head += f"; rank {self.rank} pinned {self.pinned} entries to rank 0's choice"
        if self.outputs_compared or self.output_divergences:
            head += (f"; {self.outputs_compared} replicated outputs compared, "
                     f"{len(self.output_divergences)} differ")
        return "\n".join([head, *(str(d) for d in self.divergences),
                          *(str(d) for d in self.output_divergences)])


def agree(group: Any = None, adopt: bool = False, outputs: bool = False,
          strict: bool | None = None) -> AgreeReport:
    """All-gather every rank's decision digest over ``group`` (default: the world), report each
    divergence, and with ``adopt=True`` pin rank 0's choices. ``outputs=True`` also compares
    the output digests recorded since the last call (``registry.record_outputs``) and reports
    each replicated dispatch whose outputs differ; under KREG_STRICT=1 (or ``strict=True``) such
    a divergence raises :class:`~registry.errors.StrictModeError` on every rank. A collective:
    every rank of the group must call it."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        from registry.errors import ConfigError

        raise ConfigError("registry.agree() is a torch.distributed collective: call "
                          "torch.distributed.init_process_group(...) on every rank first")
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    mine = digest()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    digests: list[dict[str, Choice]] = [
        {k: (v[0], v[1]) for k, v in d.items()} for d in gathered]
    keys = sorted(set().union(*digests))
    divergences = []
    for key in keys:
        choices: dict[int, Choice | None] = {r: digests[r].get(key) for r in range(world)}
        present = {json.dumps(c, sort_keys=True, default=str) for c in choices.values()
                   if c is not None}
        if len(present) > 1:
            divergences.append(Divergence(key=key, choices=choices))
    report = AgreeReport(rank=rank, world_size=world, keys=len(keys), divergences=divergences,
                         adopt=adopt)
    if outputs:
        _compare_outputs(report, group, strict)
    if adopt:
        _adopt(report, digests[0])
        # Every rank learns who could not adopt, so the report reads the same everywhere.
        refusals: list[Any] = [None] * world
        mine_refused = {d.key: d.not_adopted.get(rank) for d in divergences
                        if rank in d.not_adopted}
        dist.all_gather_object(refusals, mine_refused, group=group)
        for d in divergences:
            for r, refused in enumerate(refusals):
                if d.key in refused:
                    d.not_adopted[r] = refused[d.key]
            d.adopted = d.choices.get(0) is not None and not d.not_adopted
    return report


def _compare_outputs(report: AgreeReport, group: Any, strict: bool | None) -> None:
    import torch.distributed as dist

    from registry._default import get_registry
    from registry.errors import ConfigError, StrictModeError
    from registry.observe.digests import active

    rec = active()
    mine = rec.collect() if rec is not None else None
    gathered: list[Any] = [None] * report.world_size
    dist.all_gather_object(gathered, mine, group=group)
    missing = [r for r, g in enumerate(gathered) if g is None]
    if missing:
        raise ConfigError(f"registry.agree(outputs=True): ranks {missing} record no outputs; "
                          f"call registry.record_outputs(...) on every rank before dispatching")
    keys = sorted(set().union(*gathered))
    report.outputs_compared = len(keys)
    for key in keys:
        per_rank = {r: g.get(key) for r, g in enumerate(gathered)}
        if len({None if v is None else v[1] for v in per_rank.values()}) > 1:
            report.output_divergences.append(OutputDivergence(key[0], key[1], per_rank))
    strict = get_registry().strict if strict is None else strict
    if strict and report.output_divergences:
        raise StrictModeError(
            f"KREG_STRICT=1: {len(report.output_divergences)} replicated dispatches gave "
            f"different outputs across ranks:\n" + "\n".join(
                str(d) for d in report.output_divergences[:8])
            + "\nfix: require deterministic implementations (KREG_REQUIRE_<OP>="
              "deterministic,batch_invariant) or find the rank whose software differs")


def _adopt(report: AgreeReport, rank0: dict[str, Choice]) -> None:
    from registry._default import get_registry

    reg = get_registry()
    local = _local_decisions()
    for div in report.divergences:
        target = rank0.get(div.key)
        if target is None or report.rank == 0:
            continue
        impl_name, config = target
        for rkey, decision, where in local.get(div.key, []):
            if (decision.implementation, decision.config) == (impl_name, config):
                continue
            why = _cannot_run(decision, impl_name)
            if why:
                div.not_adopted[report.rank] = why
                continue
            impl = reg.implementation(decision.op, impl_name)
            adopted = decision.model_copy(update={
                "implementation": impl_name, "config": config, "fallback": impl.fallback,
                "source": "adopted",
                "reason": f"adopted from rank 0 by registry.agree() (this rank had chosen "
                          f"{decision.implementation}: {decision.reason})",
                "notes": [*decision.notes, f"rank {report.rank} pinned to rank 0's choice"]})
            with reg._lock:
                if where == "dispatch":
                    reg.pin(rkey, adopted)  # survives invalidation, until reg.unpin()
                else:
                    reg._decisions[rkey] = adopted.model_copy(update={"cached": True})
                    reg._lru.cache_clear()  # the next select() finds the pinned decision
            report.pinned += 1


def _cannot_run(decision: Decision, impl_name: str) -> str | None:
    """Why this rank must not run ``impl_name`` for the decision's workload, or None."""
    from registry._default import get_registry
    from registry.errors import KregError

    try:
        get_registry().implementation(decision.op, impl_name)
    except KregError:
        return f"{impl_name} is not installed here"
    cand = next((c for c in decision.candidates if c.implementation == impl_name), None)
    if cand is None:
        return f"{impl_name} was not a candidate here"
    failed = [str(c) for c in cand.checks if not c.passed and c.kind == "capability"]
    if failed:
        return f"{impl_name} fails capability checks here: {'; '.join(failed)}"
    return None
