"""The one measuring harness: check every candidate against the reference, then time the good
ones interleaved in one window. ``kreg bench OP`` and ``kreg tune OP`` both go through
:func:`measure`, for every op, and get one record type back (:class:`Measurement`).

For each candidate, in order:

1. **poison**: a block the size of the expected output is filled with NaN (integers: the most
   negative value) and freed just before the candidate's first run, so a kernel that leaves part
   of its output unwritten returns garbage rather than the last candidate's correct answer (the
   caching allocator hands the block back to the next allocation of that size);
2. **run once and judge**: the op's ``compare(actual, expected)`` (``OpSpec.compare``) returns
   None or the violation in words. A raise (a compile failure, a refused config, a kernel
   error) scores the candidate as ``error`` and the others go on; nothing here aborts the run;
3. **time**: the candidates that passed (and the unjudged anchors, e.g. ``torch.topk``) run
   round-robin in one window (:func:`registry.tuning.timing.interleaved_median_ms`), as CUDA
   graph replays when asked; a candidate that cannot be captured (its host work synchronizes,
   e.g. FlashInfer's ``plan()``) is timed with plain launches in the same window, its
   ``timing`` says so and it gets no ratio; a slow reference can take its own short window
   instead (``timed="isolated"``), and its time is then not comparable as a ratio.

The JSON form of a bench run (``kreg bench OP --json``) is :func:`bench_report`, the same
top-level schema for every op (docs/BENCHMARKS.md, "JSON schema").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "BENCH_SCHEMA",
    "CaseResult",
    "Measurement",
    "Trial",
    "bench_report",
    "format_table",
    "measure",
    "registry_candidates",
]

BENCH_SCHEMA = "kreg.bench/1"

Status = Literal["ok", "violation", "error", "unjudged"]


@dataclass
class Trial:
    """One thing to measure: ``run()`` returns the op's output for the harness's inputs."""

    label: str
    run: Callable[[], Any]
    # What runs, in words (an implementation and its config, or "torch.topk"): a provider
    # label is a request, this is what served it.
    runs: str = ""
    # False for anchors (another library's op with a looser contract, e.g. torch.topk's tie
    # order): timed and reported through ``describe``, never a failure.
    judged: bool = True
    # "window": timed round-robin with the others; "isolated": in its own short window (a slow
    # reference); "no": checked only.
    timed: Literal["window", "isolated", "no"] = "window"
    describe: Callable[[Any], str] | None = None
    implementation: str | None = None
    config: dict[str, Any] | None = None


@dataclass
class Measurement:
    """The one record of the harness, for bench tables, tuner results and their JSON."""

    label: str
    runs: str
    status: Status
    detail: str = ""           # the violation or error in words, or an anchor's note
    error: float | None = None  # the op's error measure, when it has one (see ``metric``)
    ms: float | None = None
    ratio: float | None = None  # ms / the baseline's ms in the same window
    # "graphs", "plain", "isolated", "plain: not capturable in a CUDA graph (...)" (timed plainly
    # in a graph window), or why it was not timed
    timing: str = ""
    implementation: str | None = None
    config: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """Passed the check (anchors count as ok: they are never judged)."""
        return self.status in ("ok", "unjudged")

    @property
    def failed(self) -> bool:
        return self.status in ("violation", "error")

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("ms", "ratio", "error"):
            value = out[key]
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None if math.isnan(value) else str(value)
        return out


def _poison(expected: Any) -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return
    if not isinstance(expected, torch.Tensor) or expected.numel() == 0:
        return
    block = torch.empty_like(expected)
    if block.is_floating_point():
        block.fill_(float("nan"))
    elif block.dtype != torch.bool:
        block.fill_(torch.iinfo(block.dtype).min)
    del block


def measure(candidates: Sequence[Trial], *, expected: Any,
            compare: Callable[[Any, Any], str | None],
            metric: Callable[[Any, Any], float] | None = None, warmup: int = 5,
            iters: int = 30, graphs: bool = False,
            baseline: str | None = None) -> list[Measurement]:
    """Check, then time ``candidates``; one :class:`Measurement` each, in their order.

    ``expected`` is the reference's output on the same inputs (a higher-precision one is fine:
    ``compare`` decides). ``metric(actual, expected)``, when given, fills ``error`` (the op's
    error measure: max-abs error, differing entries). ``baseline`` names the label the
    ``ratio`` column divides by (windowed candidates only).
    """
    from registry.tuning.timing import graphed, interleaved_median_ms, isolated_median_ms

    out: dict[str, Measurement] = {}
    windowed: dict[str, Callable[[], Any]] = {}
    isolated: dict[str, Callable[[], Any]] = {}
    for cand in candidates:
        if cand.label in out:
            raise ValueError(f"two candidates are labelled {cand.label!r}; labels must be unique")
        rec = Measurement(label=cand.label, runs=cand.runs or cand.label, status="ok",
                          implementation=cand.implementation, config=cand.config)
        out[cand.label] = rec
        try:
            _poison(expected)
            got = cand.run()
        except Exception as exc:  # a failed candidate is scored, never fatal
            rec.status, rec.detail = "error", f"{type(exc).__name__}: {exc}"
            continue
        if not cand.judged:
            rec.status = "unjudged"
            rec.detail = cand.describe(got) if cand.describe is not None else ""
        else:
            try:
                message = compare(got, expected)
                if metric is not None:
                    rec.error = metric(got, expected)
            except Exception as exc:  # a comparison that cannot run is the candidate's failure
                rec.status, rec.detail = "error", f"comparison raised {type(exc).__name__}: {exc}"
                continue
            if message is not None:
                rec.status, rec.detail = "violation", message
                continue
        if cand.timed == "window":
            windowed[cand.label] = cand.run
        elif cand.timed == "isolated":
            isolated[cand.label] = cand.run
    on_gpu = _cuda()
    uncapturable: dict[str, str] = {}
    if graphs and on_gpu:
        for label in list(windowed):
            try:
                windowed[label] = graphed(windowed[label])
            except Exception as exc:  # e.g. a provider whose host work synchronizes
                # Timed with plain launches in the same window: what it costs where it can run
                # (eager code); its time then includes its host work, the others' does not.
                uncapturable[label] = f"{type(exc).__name__}: {exc}"
    how = "graphs" if graphs and on_gpu else "plain"
    for label, ms in interleaved_median_ms(windowed, warmup=warmup, iters=iters).items():
        out[label].ms, out[label].timing = ms, how
        if label in uncapturable:
            out[label].timing = f"plain: not capturable in a CUDA graph ({uncapturable[label]})"
    for label, fn in isolated.items():
        out[label].ms, out[label].timing = isolated_median_ms(fn, warmup=1, iters=3), "isolated"
    base = out.get(baseline or "")
    if base is not None and base.ms and base.timing == how:
        for rec in out.values():
            if rec.ms is not None and rec.timing == how:
                rec.ratio = rec.ms / base.ms
    return list(out.values())


def _cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


def registry_candidates(op: str, names: Sequence[str], call: Callable[[], Any],
                        workload: Mapping[str, Any],
                        inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
                        ) -> list[Trial]:
    """``auto`` and implementation names (``impl`` or ``impl:measure``) as candidates that run
    ``call`` (``registry.dispatch(op, ...)`` on the harness's inputs) as a framework would.
    ``auto+GUARANTEE[+...]`` (``auto+batch_invariant``) is what ``auto`` runs under
    ``registry.require(op, GUARANTEE, ...)``, what requiring the guarantees costs: the decision
    is made once under the requirement and its kernel is called on ``inputs`` (``(args,
    kwargs)``; entering the requirement per call would re-decide every call and time that).

    A named implementation must be the one that serves: when the override cannot be honoured
    for this workload (an ineligible implementation), the candidate fails with the reason
    rather than timing another kernel under its label. With ``inputs`` its decision (made once
    under the override) is bound once and called as dispatch's hit path would call it; without,
    ``call`` runs under the override. An unknown name raises ``UnknownImplementationError`` at
    once (a typo, not a measurement).
    """
    import registry
    from registry import format_config

    out = []
    for name in names:
        if name.startswith("auto+"):
            if inputs is None:
                raise ValueError(f"{name}: the bench passes no inputs, so the required "
                                 f"decision's kernel cannot be called")
            wanted = name.split("+")[1:]
            with registry.require(op, *wanted):
                d = registry.select(op, dict(workload))
            bound = registry.get_registry().implementation(op, d.implementation).bind(d.config)
            def required(bound: Callable[..., Any] = bound,
                         inputs: tuple[tuple[Any, ...], dict[str, Any]] = inputs) -> Any:
                return bound(*inputs[0], **inputs[1])

            out.append(Trial(label=name, run=required, implementation=d.implementation,
                             config=d.config,
                             runs=f"{d.implementation} {format_config(d.config)}"))
            continue
        if name == "auto":
            d = registry.select(op, dict(workload))
            out.append(Trial(label=name, run=call, implementation=d.implementation,
                                 config=d.config,
                                 runs=f"{d.implementation} {format_config(d.config)}"))
            continue
        with registry.override(op, name):
            d = registry.select(op, dict(workload))
        if d.override is not None and not d.override.honoured:
            why = d.override.reason

            def refused(why: str = why, name: str = name) -> Any:
                raise LookupError(f"{name} cannot serve this workload: {why}")

            out.append(Trial(label=name, run=refused, runs="-"))
            continue

        run: Callable[[], Any]
        if inputs is not None:
            # The overridden decision's kernel, bound once, as dispatch's hit path would call it
            # under KREG_SELECT_<OP>=name: entering the override per call would invalidate and
            # re-decide every call, host time that plain timings (a kernel that cannot be
            # captured) would count.
            bound = registry.get_registry().implementation(op, d.implementation).bind(d.config)

            def run(bound: Callable[..., Any] = bound,
                    inputs: tuple[tuple[Any, ...], dict[str, Any]] = inputs) -> Any:
                return bound(*inputs[0], **inputs[1])
        else:
            def run(name: str = name) -> Any:
                with registry.override(op, name):
                    return call()

        out.append(Trial(label=name, run=run, implementation=d.implementation,
                             config=d.config,
                             runs=f"{d.implementation} {format_config(d.config)}"))
    return out


@dataclass
class CaseResult:
    """One bench case: its label, the op's workload for it, the input recipe beyond the
    workload (seeds, index patterns, request lengths) and the measurements of every provider."""

    case: str
    workload: dict[str, Any]
    measurements: list[Measurement]
    params: dict[str, Any] = field(default_factory=dict)
    baseline: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"case": self.case, "workload": self.workload, "params": self.params,
                "baseline": self.baseline,
                "results": [m.as_json() for m in self.measurements], "extra": self.extra}


def bench_report(op: str, results: Sequence[CaseResult], *, graphs: bool) -> dict[str, Any]:
    """``kreg bench OP --json``: ``{"schema", "op", "device", "graphs", "cases": [...]}``, each
    case ``{"case", "workload", "params", "baseline", "results": [Measurement...], "extra"}``
    (``extra``: the op's own per-case figures, e.g. indexer_topk's HBM floor and scratch)."""
    return {"schema": BENCH_SCHEMA, "op": op, "device": bench_device(),
            "graphs": graphs and _cuda(), "cases": [r.as_json() for r in results]}


def bench_device() -> dict[str, Any]:
    """What a bench ran on: the device's name and arch, torch, Triton and the GPU runtime (the
    ``device`` of :func:`bench_report`)."""
    import registry

    facts = registry.probe()
    return {"name": facts.name, "arch": facts.arch, "torch": facts.torch_version,
            "triton": facts.triton_version, "runtime": facts.runtime_version}


def bench_header(op: str, *, graphs: bool, note: str = "") -> str:
    """The first line of a ``kreg bench OP`` table: the op, the device and software it ran on
    (so that a pasted table cannot be credited to another GPU), and how it was timed."""
    d = bench_device()
    how = "CUDA-graph replays" if graphs and _cuda() else "plain launches"
    runtime = f", {d['runtime']}" if d["runtime"] else ""
    return (f"# {op} on {d['name']} ({d['arch']}), torch {d['torch']}, triton {d['triton']}"
            f"{runtime}; {how}" + (f"; {note}" if note else ""))


def format_table(results: Sequence[CaseResult], *, unit: Literal["ms", "us"] = "ms",
                 error_name: str = "err") -> str:
    """The bench table: one row per (case, provider), in one format for every op."""
    scale, fmt = (1.0, "{:.4f}") if unit == "ms" else (1e3, "{:.1f}")
    width = max([len(r.case) for r in results] + [4])
    pwidth = max([len(m.label) for r in results for m in r.measurements] + [8])
    head = (f"{'case':<{width}}  {'provider':<{pwidth}}  {unit:>9}  {'ratio':>7}  "
            f"{error_name:>9}  check     runs")
    lines = [head, "-" * len(head)]
    for r in results:
        for m in r.measurements:
            t = fmt.format(m.ms * scale) if m.ms is not None else "-"
            ratio = f"{m.ratio:.3f}" if m.ratio is not None else "-"
            err = f"{m.error:.3g}" if m.error is not None else "-"
            check = {"ok": "ok", "unjudged": "anchor", "violation": "FAIL",
                     "error": "ERROR"}[m.status]
            line = (f"{r.case:<{width}}  {m.label:<{pwidth}}  {t:>9}  {ratio:>7}  {err:>9}  "
                    f"{check:<8}  {m.runs}")
            if m.detail:
                line += f"  [{m.detail[:160]}]"
            if m.timing and m.timing not in ("graphs", "plain", "isolated"):
                line += f"  ({m.timing[:100]})"
            lines.append(line)
        if r.extra.get("note"):
            lines.append(f"{'':<{width}}  # {r.extra['note']}")
    bases = sorted({r.baseline for r in results if r.baseline})
    if bases:
        lines.append(f"ratio = {unit} / {unit} of the baseline ({', '.join(bases)}) in the same "
                     "window (lower is faster)")
    return "\n".join(lines)
