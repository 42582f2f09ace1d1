"""Requirements: named, composable predicates over (DeviceFacts, Workload) with readable verdicts.

Two kinds (DESIGN.md):

* ``capability`` — the kernel is invalid or untested outside it (architecture, head dim, top-k
  width, rank shape, version floor). Never waived.
* ``envelope`` — the measured-performance envelope (exact device set, row thresholds, grid
  bounds). Waived by a ``<implementation>:measure`` override, to measure an unlisted device.

Every check reports what it observed and what it required, in words, so ``kreg explain`` reads
"sm_count: 170, requires one of {188}" rather than "False".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from registry._facts import DeviceFacts
from registry._workload import Workload
from registry.versions import parse_version

__all__ = [
    "CAPABILITY",
    "ENVELOPE",
    "Check",
    "Requirement",
    "arch_in",
    "device_in",
    "field_at_least",
    "field_at_most",
    "field_eq",
    "field_in",
    "fields_in",
    "grid_bound",
    "predicate",
    "rows_per_request_at_least",
    "sm_count_in",
    "triton_runtime",
    "vendor_in",
    "version_at_least",
    "when",
]

Kind = Literal["capability", "envelope"]
CAPABILITY: Kind = "capability"
ENVELOPE: Kind = "envelope"

Verdict = tuple[bool, str, str]  # (passed, observed, required)


class Check(BaseModel):
    """One requirement's verdict for one candidate."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: Kind
    passed: bool
    observed: str
    required: str
    waived: bool = False

    @property
    def ok(self) -> bool:
        """Passed, or failed but waived by a ``:measure`` override."""
        return self.passed or self.waived

    def __str__(self) -> str:
        if self.passed:
            return f"{self.name}: {self.observed}"
        tail = " (waived by :measure)" if self.waived else ""
        return f"{self.name}: {self.observed}, requires {self.required}{tail}"


@dataclass(frozen=True)
class Requirement:
    """A named predicate; ``fn(facts, workload) -> (passed, observed, required)``."""

    name: str
    kind: Kind
    # The workload argument is the op's own Workload subclass (SparsePrefillWorkload, ...):
    # typed Any so that a predicate can declare the subclass whose fields it reads.
    fn: Callable[[DeviceFacts, Any], Verdict]
    description: str = ""

    def check(self, facts: DeviceFacts, workload: Workload) -> Check:
        passed, observed, required = self.fn(facts, workload)
        return Check(name=self.name, kind=self.kind, passed=bool(passed), observed=observed,
                     required=required)


def _fmt_set(values: Iterable[Any]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def predicate(name: str, kind: Kind, fn: Callable[[DeviceFacts, Any], Verdict],
              description: str = "") -> Requirement:
    """A custom requirement (for vendor plugins whose condition the library lacks)."""
    return Requirement(name, kind, fn, description)


# ---------------------------------------------------------------------------------------------
# device facts

def vendor_in(*vendors: str, kind: Kind = CAPABILITY) -> Requirement:
    want = tuple(vendors)
    req = want[0] if len(want) == 1 else "one of " + _fmt_set(want)
    return Requirement("vendor", kind, lambda f, w: (f.vendor in want, f.vendor, req))


def arch_in(*archs: str, kind: Kind = CAPABILITY) -> Requirement:
    """Exact architecture match: ``arch_in('sm_120')`` excludes ``sm_121``."""
    want = tuple(archs)
    req = want[0] if len(want) == 1 else "one of " + _fmt_set(want)
    return Requirement("arch", kind, lambda f, w: (f.arch in want, f.arch, req))


def device_in(*devices: tuple[str, int], kind: Kind = ENVELOPE) -> Requirement:
    """An exact device set: (name as the driver reports it, multiprocessor count) pairs."""
    want = frozenset(devices)
    req = "one of " + _fmt_set(f"{n} ({c} SMs)" for n, c in sorted(want))

    def fn(f: DeviceFacts, w: Workload) -> Verdict:
        return (f.name, f.sm_count) in want, f"{f.name} ({f.sm_count} SMs)", req

    return Requirement("device", kind, fn)


def sm_count_in(*counts: int, kind: Kind = ENVELOPE) -> Requirement:
    want = frozenset(counts)
    req = "one of " + _fmt_set(sorted(want))
    return Requirement("sm_count", kind, lambda f, w: (f.sm_count in want, str(f.sm_count), req))


_SOFTWARE = {"triton": "triton_version", "torch": "torch_version", "runtime": "runtime_version"}


def version_at_least(component: str, floor: str, kind: Kind = CAPABILITY) -> Requirement:
    """A version floor with release semantics (3.10 > 3.9) on triton, torch or runtime."""
    if component not in _SOFTWARE:
        raise ValueError(f"version_at_least: component must be one of {sorted(_SOFTWARE)}")
    attr = _SOFTWARE[component]
    floor_t = parse_version(floor)
    req = f">= {floor}"

    def fn(f: DeviceFacts, w: Workload) -> Verdict:
        have = getattr(f, attr)
        if not have:
            return False, "not installed", req
        try:
            have_t = parse_version(have)
        except ValueError:
            return False, f"unparsable version {have!r}", req
        n = max(len(have_t), len(floor_t))
        ok = have_t + (0,) * (n - len(have_t)) >= floor_t + (0,) * (n - len(floor_t))
        return ok, have, req

    return Requirement(component, kind, fn)


def triton_runtime() -> Requirement:
    """Triton can run here: a CUDA or ROCm GPU with Triton, or the interpreter on a CPU.

    Under the interpreter, bfloat16 workloads are refused: its bfloat16 ``tl.dot`` is broken
    (triton #11584).
    """

    def fn(f: DeviceFacts, w: Workload) -> Verdict:
        req = "Triton with a CUDA/ROCm GPU, or TRITON_INTERPRET=1 (float32/float16 only)"
        if not f.triton_version:
            return False, "triton not installed", req
        if f.vendor in ("nvidia", "amd"):
            return True, f"triton {f.triton_version} on {f.vendor}", req
        if f.extra.get("triton_interpret") == "1":
            dtype = getattr(w, "dtype", None)
            if dtype == "bfloat16":
                return False, "interpreter with bfloat16 (its bf16 tl.dot is broken)", req
            return True, "triton interpreter (TRITON_INTERPRET=1)", req
        return False, "cpu without TRITON_INTERPRET=1", req

    return Requirement("triton_runtime", CAPABILITY, fn)


# ---------------------------------------------------------------------------------------------
# workload fields

def field_eq(field: str, value: Any, kind: Kind = CAPABILITY) -> Requirement:
    req = f"= {value}"
    return Requirement(field, kind, lambda f, w: (getattr(w, field) == value,
                                                  str(getattr(w, field)), req))


def field_in(field: str, values: Iterable[Any], kind: Kind = CAPABILITY) -> Requirement:
    want = tuple(values)
    req = "one of " + _fmt_set(want)
    return Requirement(field, kind, lambda f, w: (getattr(w, field) in want,
                                                  str(getattr(w, field)), req))


def field_at_least(field: str, minimum: int | float, kind: Kind = ENVELOPE) -> Requirement:
    req = f">= {minimum}"
    return Requirement(field, kind, lambda f, w: (getattr(w, field) >= minimum,
                                                  str(getattr(w, field)), req))


def field_at_most(field: str, maximum: int | float, kind: Kind = CAPABILITY) -> Requirement:
    req = f"<= {maximum}"
    return Requirement(field, kind, lambda f, w: (getattr(w, field) <= maximum,
                                                  str(getattr(w, field)), req))


def fields_in(fields: tuple[str, ...], allowed: Iterable[tuple[Any, ...]], *, name: str,
              kind: Kind = CAPABILITY) -> Requirement:
    """A joint condition on several fields, e.g. the rank shape (group_size, num_kv_heads)."""
    want = frozenset(tuple(a) for a in allowed)
    label = "(" + ", ".join(fields) + ")"
    req = f"{label} in " + _fmt_set("(" + ", ".join(map(str, a)) + ")" for a in sorted(want))

    def fn(f: DeviceFacts, w: Workload) -> Verdict:
        got = tuple(getattr(w, x) for x in fields)
        return got in want, label + " = (" + ", ".join(map(str, got)) + ")", req

    return Requirement(name, kind, fn)


def rows_per_request_at_least(minimum: int, kind: Kind = ENVELOPE, *, rows: str = "total_q",
                              requests: str = "num_requests") -> Requirement:
    """Average rows per request: ``w.<rows> >= minimum * w.<requests>`` (exact integers).

    The field names default to sparse_prefill's; an op with a batch of requests under other
    names passes its own.
    """
    req = f">= {minimum} on average"

    def fn(f: DeviceFacts, w: Workload) -> Verdict:
        total, n = getattr(w, rows), max(1, getattr(w, requests))
        avg = total / n
        shown = f"{avg:g}" if avg != int(avg) else str(int(avg))
        return total >= minimum * n, f"{shown} ({total} rows / {n} requests)", req

    return Requirement("rows_per_request", kind, fn)


def grid_bound(factor: int = 2, kind: Kind = ENVELOPE, *, rows: str = "total_q",
               requests: str = "num_requests", longest: str = "max_q") -> Requirement:
    """Grid utilization: ``w.<longest> * w.<requests> <= factor * w.<rows>``.

    Keeps a batch of one long request padded by short ones off a geometry measured on uniform
    batches. The field names default to sparse_prefill's (``max_q``, ``num_requests``,
    ``total_q``).
    """
    req = f"{longest} * {requests} <= {factor} * {rows}"

    def fn(f: DeviceFacts, w: Workload) -> Verdict:
        mq, n, t = getattr(w, longest), getattr(w, requests), getattr(w, rows)
        return mq * n <= factor * t, f"{mq} * {n} = {mq * n} vs {factor} * {t} = {factor * t}", req

    return Requirement("grid_bound", kind, fn)


def when(field: str, value: Any, inner: Requirement) -> Requirement:
    """``inner`` applies only to workloads whose ``field`` equals ``value``; others pass."""

    def fn(f: DeviceFacts, w: Workload) -> Verdict:
        got = getattr(w, field)
        if got != value:
            return True, f"n/a ({field}={got})", f"{inner.name} only when {field}={value}"
        passed, observed, required = inner.fn(f, w)
        return passed, observed, required

    return Requirement(f"{inner.name} [{field}={value}]", inner.kind, fn, inner.description)
