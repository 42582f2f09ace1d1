"""Serves what ``kreg tune`` measured on this exact device and software; priority 200.

Entries come from the tuning store (``$KREG_HOME/tuning.json``), read when the registry loads
(process start, or ``registry.reset_registry()``). An entry applies only to the device it was
measured on (name, arch and multiprocessor count) with the same torch, Triton and runtime
versions, and only to workloads of its shape (every workload field except the point fields).

Between measured points the rule is the floor: a workload takes the config of the largest
measured point at or below it (in every point field), the way the seed's cutoff took the lowest
measured row count where its family wins and held it upwards. Outside the measured range (below
the lowest point or above the highest, in any point field) the entry does not apply.

Every op whose ``OpSpec`` names a tuner is served, with the point fields its spec declares
(``OpSpec.point_fields``: ``sparse_prefill`` (kv_len, total_q), ``indexer_topk`` (num_rows,
max_keys)) and the kernel its tuner drives (``OpSpec.tuned_kernel``); a plugin's own op gets
measured entries the same way. The best config of a sparse_prefill point depends on the KV
length (on the H200 the table geometry wins at KV 8K where the measured family wins at 32K and
128K), so entries are kept per kv_len and the floor applies to kv_len as to total_q: a workload
at KV 48K takes the configs measured at 32K.

A workload whose ``kv_len`` is None (a ``registry.select`` dict without it) is **not served** by
entries that name a kv_len: the plugin does not guess a KV length, the ``measured_range`` check
fails with the reason, and the call falls to the next implementation (a vendor family inside
its envelope, or the table), exactly as without a tuning store. Every measured config beat the
table only at the KV length it was measured at, so guessing one could pick a config slower than
the table; passing ``kv_len`` (``dispatch`` always derives it) gets the measured config.

Entries written before sparse_prefill workloads had ``kv_len`` (older kreg versions and the
tables they exported) have no kv_len in their bucket. They load as before and serve any
kv_len, None included, by the floor on total_q alone, as they did when written, until entries
of the same shape that name a kv_len exist on this device and software: those supersede them
(re-run ``kreg tune``), and ``explain`` says so.

An entry records which implementation won (``TuningEntry.family``): the op tuner's family (its
configs drive ``OpSpec.tuned_kernel``, as every entry did before ``kreg tune`` measured whole
implementations), or another implementation of the op (a vendor's, FlashInfer's), measured as
one candidate beside the configs, whose entry's config then names it: ``{"implementation": NAME,
**its config}``. An entry without that key is a config of the tuned kernel, whatever its family
(old stores and exported tables are served as before). An entry naming an implementation is
served with that config: ``explain`` shows the name in it, the ``tuning_entry`` check says by
how much it won (the entry's ``timings_ms``) and fails, as a capability, when that
implementation cannot run here (not loaded, or one of its capability checks fails: FlashInfer not
importable); dispatch binds that implementation's own kernel with its config
(``Implementation.route``, at bind time: the dispatch hit path calls the target kernel directly),
and the decision's guarantees are the target's. The target is looked up in the process's
registry (``registry.get_registry()``), the one whose store this plugin reads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from registry import Contract, DeviceFacts, Implementation, OpSpec, Workload, hookimpl
from registry.errors import KernelUnavailableError
from registry.requirements import CAPABILITY, ENVELOPE, predicate
from registry.tuning import TuningEntry, TuningStore, identity_of
from registry.tuning.tune import IMPLEMENTATION_KEY

logger = logging.getLogger(__name__)

PRIORITY = 200

class MeasuredTable:
    """The store's entries for one op, and the lookups the requirements make."""

    def __init__(self, spec: OpSpec, entries: Sequence[TuningEntry]) -> None:
        self.op = spec.name
        self.entries = [e for e in entries if e.op == spec.name]
        self.points = spec.point_fields
        self.later = spec.later_point_fields
        self.unmatched = spec.shape_free_fields
        self.spec = spec

    def _shape(self, data: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in data.items() if k not in self.unmatched}

    def candidates(self, facts: DeviceFacts, workload: Workload) -> tuple[
            list[TuningEntry], list[str]]:
        """Entries of this shape measured on exactly this device and software, and why the
        others of this shape on this device name do not apply."""
        device, software = identity_of(facts)
        shape = self._shape(workload.model_dump())
        good, why = [], []
        for e in self.entries:
            if self._shape(dict(e.bucket)) != shape:
                continue
            reasons = []
            if e.device != device:
                reasons.append(f"measured on {e.device.name} ({e.device.arch}, "
                               f"{e.device.sm_count} SMs)")
            for part in ("torch", "triton", "runtime"):
                have, want = getattr(software, part), getattr(e.software, part)
                if have != want:
                    reasons.append(f"measured with {part} {want}, running {have}")
            if reasons:
                why.append("; ".join(reasons))
            else:
                good.append(e)
        return good, why

    def point(self, data: dict[str, Any], fields: Sequence[str] | None = None) -> tuple[
            int, ...]:
        return tuple(int(data[f]) for f in (self.points if fields is None else fields))

    def _axes(self, good: Sequence[TuningEntry]) -> tuple[tuple[str, ...], list[TuningEntry],
                                                          str]:
        """The point fields the floor rule uses and the entries it uses them on: the entries
        that name every point field; when none of this shape do, the older entries that lack a
        later field (they serve any value of it). Also a note for ``explain``."""
        full = [e for e in good if all(f in e.bucket for f in self.points)]
        older = [e for e in good if not all(f in e.bucket for f in self.points)]
        if full or not self.later:
            note = f"; {len(older)} older entries without " \
                f"{'/'.join(self.later)} superseded" if older and self.later else ""
            return self.points, full, note
        fields = tuple(f for f in self.points if f not in self.later)
        usable = [e for e in older if all(f in e.bucket for f in fields)]
        missing = "/".join(self.later)
        return fields, usable, (f"; entries measured before {missing} was recorded: "
                                f"they serve any {missing}")

    def serving(self, facts: DeviceFacts, workload: Workload) -> tuple[
            TuningEntry | None, str]:
        """The entry the floor rule picks, or None, with the range in words."""
        good, _ = self.candidates(facts, workload)
        if not good:
            return None, "no entry"
        fields, usable, note = self._axes(good)
        if not usable:
            return None, "no entry with " + ", ".join(self.points) + note
        data = workload.model_dump()
        pts = [self.point(dict(e.bucket), fields) for e in usable]
        hi = tuple(max(p[i] for p in pts) for i in range(len(fields)))
        lo = tuple(min(p[i] for p in pts) for i in range(len(fields)))
        if len(fields) == 1:
            rng = f"measured {fields[0]} from {lo[0]} to {hi[0]}"
        else:
            rng = "measured " + ", ".join(f"{f} from {lo[i]} to {hi[i]}"
                                          for i, f in enumerate(fields))
        unknown = [f for f in fields if data.get(f) is None]
        if unknown:
            names = ", ".join(unknown)
            return None, (f"{rng}{note}; {names} not given (None): these entries are "
                          f"measured per {names} and none is guessed; pass {names}")
        want = self.point(data, fields)
        outside = [f"{f} {want[i]} " + (f"below the lowest measured {lo[i]}" if want[i] < lo[i]
                                         else f"above the highest measured {hi[i]}")
                   for i, f in enumerate(fields) if not lo[i] <= want[i] <= hi[i]]
        if outside:
            return None, f"{rng}; " + ", ".join(outside) + note
        below = [(p, e) for p, e in zip(pts, usable, strict=True)
                 if all(p[i] <= want[i] for i in range(len(want)))]
        if not below:
            return None, f"{rng}; no measured point at or below it in every field{note}"
        point, entry = max(below, key=lambda pe: pe[0])
        return entry, f"{rng}; served by the point {_fmt(point, fields)}{note}"

    # -- requirements ---------------------------------------------------------------------------

    def entry_check(self, facts: DeviceFacts, workload: Workload) -> tuple[bool, str, str]:
        good, why = self.candidates(facts, workload)
        required = f"an entry from `kreg tune {self.op}` on this device and software"
        if good:
            seen = f"{len(good)} entries for this device and software"
            entry, _ = self.serving(facts, workload)
            target = None if entry is None else self.target(entry)
            if entry is None or target is None:
                return True, seen, required
            required += f", whose winner {target} can run here"
            problem = _cannot_run(self.op, target, facts, workload)
            if problem:
                return False, f"{seen}; the point's winner {problem}", required
            return True, f"{seen}; the point's winner: {_won_by(entry, target)}", required
        if why:
            uniq = sorted(set(why))
            return False, f"{len(why)} entries ignored: " + " | ".join(uniq[:3]), required
        return False, "none for this device and workload shape", required

    def range_check(self, facts: DeviceFacts, workload: Workload) -> tuple[bool, str, str]:
        entry, words = self.serving(facts, workload)
        data = workload.model_dump()
        got = ", ".join(f"{f} = {data.get(f)}" for f in self.points)
        if words == "no entry":  # tuning_entry already says so; one failed line is enough
            return True, f"n/a ({got}; no entry)", "inside the measured range"
        return entry is not None, f"{got} ({words})", "inside the measured range"

    def config(self, facts: DeviceFacts, workload: Workload) -> dict[str, Any] | None:
        """The serving entry's config (``{"implementation": NAME, ...}`` for an entry another
        implementation won: see :meth:`route`)."""
        entry, _ = self.serving(facts, workload)
        return None if entry is None else dict(entry.config)

    # -- entries that name another implementation -----------------------------------------------

    @staticmethod
    def target(entry: TuningEntry) -> str | None:
        """The implementation ``entry`` routes to, or None (a config of the tuned kernel)."""
        name = entry.config.get(IMPLEMENTATION_KEY)
        return None if name is None else str(name)

    def route(self, config: Mapping[str, Any] | None) -> tuple[Implementation,
                                                               dict[str, Any]] | None:
        """``Implementation.route``: the named implementation and its own config, or None."""
        if not config or IMPLEMENTATION_KEY not in config:
            return None
        name = str(config[IMPLEMENTATION_KEY])
        impl = _loaded(self.op, name)
        if impl is None:
            raise KernelUnavailableError(
                f"measured.{self.op}: the tuning entry names {name}, which is not loaded; "
                f"re-run `kreg tune {self.op}` or enable the plugin that provides it")
        return impl, {k: v for k, v in config.items() if k != IMPLEMENTATION_KEY}

    def contract(self, config: Mapping[str, Any] | None) -> Contract:
        """The guarantees of what runs: the named implementation's for its config, else the
        tuned kernel's (``OpSpec.kernel_contract``)."""
        if config and IMPLEMENTATION_KEY in config:
            impl = _loaded(self.op, str(config[IMPLEMENTATION_KEY]))
            rest = {k: v for k, v in config.items() if k != IMPLEMENTATION_KEY}
            return Contract() if impl is None else impl.contract_for(rest)
        c = self.spec.kernel_contract
        if c is None:
            return Contract()
        return c if isinstance(c, Contract) else c(config)


def _loaded(op: str, name: str) -> Implementation | None:
    import registry

    return registry.get_registry().impls.get(op, {}).get(name)


def _cannot_run(op: str, name: str, facts: DeviceFacts, workload: Workload) -> str:
    """Why implementation ``name`` cannot run ``workload`` on ``facts`` ("" when it can): not
    loaded, or a capability check fails (its envelope does not matter: the entry measured it)."""
    impl = _loaded(op, name)
    if impl is None:
        return f"{name} is not loaded"
    failed = []
    for req in impl.requirements:
        if req.kind != CAPABILITY:
            continue
        try:
            c = req.check(facts, workload)
        except Exception as exc:  # a buggy requirement disqualifies the route, nothing more
            return f"{name}: its requirement {req.name} raised {type(exc).__name__}: {exc}"
        if not c.passed:
            failed.append(str(c))
    return f"{name} cannot run here: {'; '.join(failed)}" if failed else ""


def _won_by(entry: TuningEntry, name: str) -> str:
    """``NAME MS ms, Nx faster than the next (LABEL MS ms; N candidates measured)``, from the
    entry's timings."""
    mine = entry.timings_ms.get(name)
    others = {lab: ms for lab, ms in entry.timings_ms.items() if lab != name}
    if mine is None:
        return f"{name} (no time recorded)"
    if not others:
        return f"{name} {mine:.4g} ms, the only candidate measured"
    if mine <= 0:
        return f"{name} {mine:.4g} ms ({len(entry.timings_ms)} candidates measured)"
    nxt = min(others, key=lambda lab: others[lab])
    ratio = others[nxt] / mine
    how = (f"{ratio:.3g}x faster than the next" if ratio >= 1 else
           f"{1 / ratio:.3g}x slower than the fastest here, kept by minimax regret over the "
           f"entry's points")
    return (f"{name} {mine:.4g} ms, {how} ({nxt} {others[nxt]:.4g} ms; "
            f"{len(entry.timings_ms)} candidates measured)")


def _fmt(p: tuple[int, ...], fields: Sequence[str]) -> str:
    if len(p) == 1:
        return str(p[0])
    return "(" + ", ".join(f"{f}={v}" for f, v in zip(fields, p, strict=True)) + ")"


def implementations_from(entries: Sequence[TuningEntry],
                         ops: Mapping[str, OpSpec]) -> list[Implementation]:
    out = []
    for name, spec in sorted(ops.items()):
        if not spec.tuner:
            continue
        table = MeasuredTable(spec, entries)
        reqs = (predicate("tuning_entry", CAPABILITY, table.entry_check),
                predicate("measured_range", ENVELOPE, table.range_check),
                *spec.measured_requirements)
        out.append(Implementation(op=name, name=f"measured.{name}", priority=PRIORITY,
                                  requirements=reqs, config=table.config,
                                  kernel=spec.tuned_kernel, contract=table.contract,
                                  route=table.route,
                                  description="what kreg tune measured on this device: configs "
                                              "of the tuned kernel, or the implementation that "
                                              "won (config implementation=NAME)"))
    return out


@hookimpl
def kreg_implementations(ops: Mapping[str, OpSpec]) -> list[Implementation]:
    return implementations_from(TuningStore().load(), ops)
