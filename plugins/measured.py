"""Serves what ``kreg tune`` measured on this exact device and software; priority 200.

Entries come from the tuning store (``$KREG_HOME/tuning.json``), read when the registry loads
(process start, or ``registry.reset_registry()``). An entry applies only to the device it was
measured on (name, arch and multiprocessor count) with the same torch, Triton and runtime
versions, and only to workloads of its shape (every workload field except the point fields).

Between measured points the rule is the floor: a workload takes the config of the largest
measured point at or below it (in every point field), the way the seed's cutoff took the lowest
measured row count where its family wins and held it upwards. Outside the measured range (below
the lowest point or above the highest) the entry does not apply.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from registry import DeviceFacts, Implementation, Workload, hookimpl
from registry._store import DeviceIdentity, Software, TuningEntry, TuningStore
from registry.requirements import CAPABILITY, ENVELOPE, grid_bound, predicate, triton_runtime, when

logger = logging.getLogger(__name__)

PRIORITY = 200

# Per op: the workload fields that form the measured axis (points), the fields that are not part
# of a bucket's shape (covered by their own envelope check), and the kernel the configs drive.
POINT_FIELDS: dict[str, tuple[str, ...]] = {
    "sparse_prefill": ("total_q",),
    "indexer_topk": ("num_rows", "max_keys"),
}
UNMATCHED_FIELDS: dict[str, tuple[str, ...]] = {
    "sparse_prefill": ("total_q", "num_requests", "max_q"),
    "indexer_topk": ("num_rows", "max_keys"),
}
KERNELS: dict[str, str] = {
    "sparse_prefill": "backends.sparse_prefill.triton_kernels:sparse_prefill_triton",
    "indexer_topk": "backends.indexer_topk.triton_kernels:indexer_topk_triton",
}


def identity_of(facts: DeviceFacts) -> tuple[DeviceIdentity, Software]:
    return (DeviceIdentity(name=facts.name, arch=facts.arch, sm_count=facts.sm_count),
            Software(torch=facts.torch_version, triton=facts.triton_version,
                     runtime=facts.runtime_version))


class MeasuredTable:
    """The store's entries for one op, and the lookups the requirements make."""

    def __init__(self, op: str, entries: Sequence[TuningEntry]) -> None:
        self.op = op
        self.entries = [e for e in entries if e.op == op]
        self.points = POINT_FIELDS[op]
        self.unmatched = UNMATCHED_FIELDS[op]

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

    def point(self, data: dict[str, Any]) -> tuple[int, ...]:
        return tuple(int(data[f]) for f in self.points)

    def serving(self, facts: DeviceFacts, workload: Workload) -> tuple[
            TuningEntry | None, str]:
        """The entry the floor rule picks, or None, with the range in words."""
        good, _ = self.candidates(facts, workload)
        if not good:
            return None, "no entry"
        want = self.point(workload.model_dump())
        pts = [self.point(dict(e.bucket)) for e in good]
        hi = tuple(max(p[i] for p in pts) for i in range(len(want)))
        lo = tuple(min(p[i] for p in pts) for i in range(len(want)))
        names = ", ".join(self.points)
        rng = f"measured {names} from {_fmt(lo)} to {_fmt(hi)}"
        below = [(p, e) for p, e in zip(pts, good, strict=True)
                 if all(p[i] <= want[i] for i in range(len(want)))]
        if not below or any(want[i] > hi[i] for i in range(len(want))):
            return None, rng
        point, entry = max(below, key=lambda pe: pe[0])
        return entry, f"{rng}; served by the point {_fmt(point)}"

    # -- requirements ---------------------------------------------------------------------------

    def entry_check(self, facts: DeviceFacts, workload: Workload) -> tuple[bool, str, str]:
        good, why = self.candidates(facts, workload)
        required = f"an entry from `kreg tune {self.op}` on this device and software"
        if good:
            return True, f"{len(good)} entries for this device and software", required
        if why:
            uniq = sorted(set(why))
            return False, f"{len(why)} entries ignored: " + " | ".join(uniq[:3]), required
        return False, "none for this device and workload shape", required

    def range_check(self, facts: DeviceFacts, workload: Workload) -> tuple[bool, str, str]:
        entry, words = self.serving(facts, workload)
        names = ", ".join(self.points)
        got = _fmt(self.point(workload.model_dump()))
        if words == "no entry":  # tuning_entry already says so; one failed line is enough
            return True, f"n/a ({names} = {got}; no entry)", "inside the measured range"
        return entry is not None, f"{names} = {got} ({words})", "inside the measured range"

    def config(self, facts: DeviceFacts, workload: Workload) -> dict[str, Any] | None:
        entry, _ = self.serving(facts, workload)
        return None if entry is None else dict(entry.config)


def _fmt(p: tuple[int, ...]) -> str:
    return str(p[0]) if len(p) == 1 else "(" + ", ".join(map(str, p)) + ")"


def implementations_from(entries: Sequence[TuningEntry]) -> list[Implementation]:
    out = []
    for op, kernel in KERNELS.items():
        table = MeasuredTable(op, entries)
        reqs = [triton_runtime(),
                predicate("tuning_entry", CAPABILITY, table.entry_check),
                predicate("measured_range", ENVELOPE, table.range_check)]
        if op == "sparse_prefill":
            # Tuned on uniform batches: keep skewed batches off, as the seed's grid bound does.
            reqs.append(when("kind", "chunk", grid_bound(2)))
        out.append(Implementation(op=op, name=f"measured.{op}", priority=PRIORITY,
                                  requirements=tuple(reqs), config=table.config, kernel=kernel,
                                  description="configs kreg tune measured on this device"))
    return out


@hookimpl
def kreg_implementations() -> list[Implementation]:
    return implementations_from(TuningStore().load())
