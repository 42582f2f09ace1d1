"""``kreg tune``: sweep an op's config space on this device and keep the winners.

The op supplies a *tuner* module (``OpSpec.tuner``) with:

* ``FAMILY`` — the implementation family whose kernel the configs drive;
* ``cases(grid) -> list`` — the workload points of a grid (``{option: [values]}``);
* ``label(case)``, ``bucket(case) -> dict`` (the workload fields of the point);
* ``candidates(case, facts) -> [(label, config | None, note)]`` — the valid config space, with
  invalid configs pruned (config None) and the reason in ``note``;
* ``baseline(case, facts) -> label`` — the config this device gets without tuning (the
  table; the same label as that config's candidate, so the tuner can keep it);
* ``inputs(case) -> (args, kwargs)`` — the op's call arguments for the point, on this device;
* optionally ``expected(case, args, kwargs)`` — the output to judge against (default: the op's
  reference implementation on the same inputs; sparse_prefill judges against its fp32
  reference) and ``metric(actual, expected) -> float`` — the error measure shown beside each
  candidate.

Beside the tuner's configs, every other implementation of the op that can run the point is a
candidate, labelled by its name and run with the config it resolves there
(:func:`implementation_candidates`: kreg's kernels, a vendor's, FlashInfer's; capability checks
must pass, envelopes are what is being measured; not the reference, the ``measured`` plugin's
own, nor implementations of the tuned kernel, whose configs reach the tuner through
``kreg_configs``). An entry records the implementation that won in ``TuningEntry.family`` (the
tuner's ``FAMILY`` when a config of the tuned kernel won, as before) and, for another
implementation, in its config too (``{"implementation": NAME, ...}``, :data:`IMPLEMENTATION_KEY`:
an entry without it is a config of the tuned kernel, as every older entry is); the ``measured``
plugin serves either. A point keeps one entry: a new winner of another implementation replaces
the old one.

:func:`measure_point` checks each config on the op's ``OpSpec.tuned_kernel`` (and each other
implementation's bound kernel) with the op's compare, then times the good ones interleaved as
CUDA-graph replays (the one harness, :mod:`registry.tuning.measure`; one that cannot be captured,
such as FlashInfer's planned attention, is timed with plain launches in the same window), and
returns ``{label: Measurement}``.

A bucket's entry is written to the tuning store as soon as every point of it in the grid is
measured, so an interrupted run resumes at the bucket where it stopped (a resumed run skips
buckets already in the store; a bucket cut off part-way is measured again whole, never stored
from some of its points, and one whose point measured nothing is not stored). Points of one
run whose buckets coincide (grid axes the workload cannot see, such as sparse_prefill's
``space``; its KV length was one until the workload gained ``kv_len``) merge into one entry: its
config is the candidate with the smallest worst ratio to each point's fastest (minimax regret
over those points), its ``timings_ms`` the mean over them of the candidates measured at every
one. The baseline keeps the entry unless a candidate beats it by more than ``min_gain`` (a
worst ratio more than that much lower): a win inside timing noise would serve a config the
table does as well, and could serve a slower one (the selection-regret run catches exactly
that on ~0.1 ms kernels). Such a win must also hold in a second window: the winner and the
baseline alone, timed again at every point of the bucket (:func:`_second_window`); when it
does not, the baseline is kept and the point's ``note`` says why. A candidate that fails
to compile or run is scored as failed, not fatal; one past the op's error bound makes the
run exit non-zero.
"""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from registry._facts import DeviceFacts
from registry._format import format_config
from registry._spec import load_object
from registry.errors import ConfigError, WorkloadError
from registry.tuning.measure import Measurement, Trial, measure, registry_candidates
from registry.tuning.store import TuningEntry, TuningStore, identity_of, utc_now

__all__ = ["DEFAULT_MIN_GAIN", "IMPLEMENTATION_KEY", "PointResult", "cannot_run_here",
           "implementation_candidates", "load_tuner", "measure_point", "tune"]

DEFAULT_MIN_GAIN = 0.03

#: The config key by which a measured decision names the implementation that runs (an entry whose
#: ``family`` is not the tuner's): ``{"implementation": "flashinfer.sparse_prefill"}``.
IMPLEMENTATION_KEY = "implementation"


@dataclass
class PointResult:
    label: str
    bucket: dict[str, Any]
    # "measured", "skipped (in store)", "dry-run", "no valid candidate", "no candidate ran",
    # "cannot run here" (``note`` says why: a capability the tuned kernel needs is missing)
    status: str
    candidates: list[tuple[str, dict[str, Any] | None, str]] = field(default_factory=list)
    timings: dict[str, Measurement] = field(default_factory=dict)
    # the config written for this point's bucket (set at the bucket's last point of the grid)
    winner: str | None = None
    baseline: str | None = None
    fastest: str | None = None     # differs from winner when it beat the baseline too narrowly
    note: str = ""
    # A label that won the first window but not the second (``note`` has the figures): the
    # baseline was kept.
    unconfirmed: str | None = None
    # The candidates that are other implementations (labelled by their names), not configs of
    # the tuned kernel.
    implementations: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if not self.winner or not self.baseline:
            return None
        base, win = self.timings.get(self.baseline), self.timings.get(self.winner)
        return base.ms / win.ms if base and win and base.ms and win.ms else None

    @property
    def violations(self) -> list[str]:
        return [f"{label}: {t.detail}" for label, t in self.timings.items()
                if t.status == "violation"]


def load_tuner(op: str) -> Any:
    import registry

    spec = registry.get_registry().spec(op)
    if not spec.tuner:
        raise ConfigError(f"op {op!r} has no tuner; ops with one: " + ", ".join(
            n for n in registry.ops() if registry.get_registry().spec(n).tuner))
    return load_object(spec.tuner)


def cannot_run_here(op: str, bucket: Mapping[str, Any], facts: DeviceFacts) -> str | None:
    """Why no candidate of ``op``'s tuned kernel can run the point ``bucket`` on ``facts`` (the
    capability requirements the op's ``measured`` implementation declares: Triton's runtime,
    for kreg's ops), or None when it can."""
    import registry
    from registry.errors import KregError

    reg = registry.get_registry()
    spec = reg.spec(op)
    try:
        wl = reg.workload(op, bucket)
    except KregError:
        return None  # not a workload this op accepts: the tuner's candidates say why
    failed = []
    for req in spec.measured_requirements:
        if req.kind != "capability":
            continue
        check = req.check(facts, wl)
        if not check.passed:
            failed.append(str(check))
    return "; ".join(failed) or None


def implementation_candidates(op: str, workload: Mapping[str, Any], facts: DeviceFacts, *,
                              family: str | None = None
                              ) -> list[tuple[str, dict[str, Any] | None, str]]:
    """The other implementations of ``op`` as tuning candidates at ``workload`` on ``facts``:
    ``(name, the config it resolves there ({} when not configurable), "")``, or ``(name, None,
    why)`` when it cannot run the point (a failed capability check; its envelope is waived: the
    measurement decides). Left out: ``family`` (the tuner's), fallbacks (the reference), the
    implementations that route to others (the ``measured`` plugin's) and the configurable ones
    whose kernel is the op's tuned kernel (their configs reach the tuner through
    ``kreg_configs``)."""
    import registry

    reg = registry.get_registry()
    spec = reg.spec(op)
    try:
        wl = reg.workload(op, workload)
    except WorkloadError:  # a point that is not a whole workload: no implementation can say
        return []
    out: list[tuple[str, dict[str, Any] | None, str]] = []
    for impl in sorted(reg.implementations(op), key=lambda i: i.name):
        if impl.name == family or impl.fallback or impl.route is not None or (
                impl.configurable and impl.kernel == spec.tuned_kernel):
            continue
        failed = []
        for req in impl.requirements:
            if req.kind == "capability":
                try:
                    c = req.check(facts, wl)
                except Exception as exc:  # a broken requirement prunes its candidate only
                    failed.append(f"{req.name} raised {type(exc).__name__}: {exc}")
                    continue
                if not c.passed:
                    failed.append(str(c))
        if failed:
            out.append((impl.name, None, "; ".join(failed)))
            continue
        try:
            cfg = impl.resolve_config(facts, wl) if impl.configurable else None
        except Exception as exc:
            out.append((impl.name, None, f"its config resolver raised {type(exc).__name__}: "
                                         f"{exc}"))
            continue
        bad = {k: v for k, v in (cfg or {}).items() if not isinstance(v, (int, str))}
        if bad:
            out.append((impl.name, None, f"config values {bad} cannot be stored (int or str)"))
            continue
        out.append((impl.name, dict(cfg or {}), ""))
    return out


def measure_point(op: str, case: Any, configs: Mapping[str, Mapping[str, Any]], *,
                  warmup: int = 5, iters: int = 30, include_auto: bool = False,
                  tuner: Any = None,
                  implementations: Mapping[str, Mapping[str, Any] | None] | None = None
                  ) -> dict[str, Measurement]:
    """Check then time ``configs`` (label -> config) of ``op``'s tuned kernel at one tuning
    point, and ``implementations`` (name -> its config) through each one's bound kernel;
    ``include_auto`` adds ``auto``, ``registry.dispatch`` as a framework calls it, in the same
    window (the selection-regret bench)."""
    import registry

    reg = registry.get_registry()
    spec = reg.spec(op)
    tuner = load_tuner(op) if tuner is None else tuner
    args, kwargs = tuner.inputs(case)
    kernel = load_object(spec.tuned_kernel)
    if hasattr(tuner, "expected"):
        expected = tuner.expected(case, args, kwargs)
    else:
        expected = reg.reference_kernel(op)(*args, **kwargs)
    trials = [Trial(label, functools.partial(kernel, *args, config=dict(cfg), **kwargs),
                    implementation=getattr(tuner, "FAMILY", None), config=dict(cfg))
              for label, cfg in configs.items()]
    for name, cfg in (implementations or {}).items():
        if name in configs:
            raise ValueError(f"candidate label {name!r} is both a config and an implementation")
        bound = reg.implementation(op, name).bind(cfg)
        trials.append(Trial(name, functools.partial(bound, *args, **kwargs), implementation=name,
                            config=dict(cfg or {}), runs=f"{name} {format_config(cfg)}"))
    if include_auto:
        trials += registry_candidates(op, ["auto"], lambda: registry.dispatch(op, *args, **kwargs),
                                      tuner.bucket(case))
    results = measure(trials, expected=expected, compare=spec.load_compare(),
                      metric=getattr(tuner, "metric", None), warmup=warmup, iters=iters,
                      graphs=True)
    return {m.label: m for m in results}


def tune(op: str, grid: dict[str, list[str]], *, facts: DeviceFacts, store: TuningStore,
         dry_run: bool = False, resume: bool = True, warmup: int = 5, iters: int = 30,
         on_point: Callable[[PointResult], None] | None = None,
         command: str | None = None, min_gain: float = DEFAULT_MIN_GAIN) -> list[PointResult]:
    if not 0.0 <= min_gain < 1.0:
        raise ConfigError(f"min_gain={min_gain}: expected a fraction in [0, 1), e.g. 0.03 for "
                          f"3%")
    tuner = load_tuner(op)
    device, software = identity_of(facts)
    command = command or "kreg " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    done: set[str] = set()
    if resume:   # a point is done whichever implementation won it
        for e in store.load():
            if e.op == op and e.device == device and e.software == software:
                done.add(_bucket_key(e.bucket))
    results = []
    merged: dict[str, list[dict[str, float]]] = {}
    cases_of: dict[str, list[Any]] = {}
    all_cases = list(tuner.cases(grid))
    # A bucket's entry is written once every point of it in this grid is measured: one written
    # after its first distribution (indexer_topk) would keep a config that wins there and loses
    # 10x on the next if the run stopped in between, and a resumed run would skip the bucket.
    left: dict[str, int] = {}
    for case in all_cases:
        key = _bucket_key(dict(tuner.bucket(case)))
        left[key] = left.get(key, 0) + 1
    unmeasured: dict[str, str] = {}   # a bucket's first point that measured nothing
    for case in all_cases:
        bucket = dict(tuner.bucket(case))
        key = _bucket_key(bucket)
        left[key] -= 1
        others = implementation_candidates(op, bucket, facts, family=tuner.FAMILY)
        res = PointResult(label=tuner.label(case), bucket=bucket, status="measured",
                          candidates=[*tuner.candidates(case, facts), *others],
                          baseline=tuner.baseline(case, facts),
                          implementations=[name for name, cfg, _ in others if cfg is not None])
        valid = {lab: cfg for lab, cfg, _ in res.candidates if cfg is not None}
        blocked = cannot_run_here(op, bucket, facts)
        if resume and key in done:
            res.status = "skipped (in store)"
        elif blocked:
            res.status, res.note = "cannot run here", blocked
        elif dry_run:
            res.status = "dry-run"
        elif not valid:
            res.status = "no valid candidate"
        else:
            res.timings = measure_point(
                op, case, {lab: c for lab, c in valid.items() if lab not in res.implementations},
                warmup=warmup, iters=iters, tuner=tuner,
                implementations={name: valid[name] for name in res.implementations})
            ok = {lab: t.ms for lab, t in res.timings.items() if t.ok and t.ms}
            if ok:
                res.fastest = min(ok, key=lambda lab: ok[lab])
                merged.setdefault(key, []).append(ok)
                cases_of.setdefault(key, []).append(case)
            else:
                res.status = "no candidate ran"
        if res.status in ("no valid candidate", "no candidate ran"):
            unmeasured.setdefault(key, res.label)
        if key in merged:
            if key in unmeasured:
                if not left[key]:
                    res.note = (f"no entry written: point {unmeasured[key]} of this bucket "
                                f"measured nothing, and an entry must win at every point")
            elif left[key]:
                n = len(merged[key])
                res.note = (f"{n} of {n + left[key]} points of this bucket measured; its entry "
                            f"is written after the last")
            else:
                _write_bucket(res, store, op, tuner, device, software, command, valid,
                              merged[key], cases_of[key], warmup=warmup, iters=iters,
                              min_gain=min_gain)
        results.append(res)
        if on_point is not None:
            on_point(res)
    return results


def _write_bucket(res: PointResult, store: TuningStore, op: str, tuner: Any, device: Any,
                  software: Any, command: str, valid: dict[str, Any],
                  points: list[dict[str, float]], cases: list[Any], *, warmup: int, iters: int,
                  min_gain: float) -> None:
    """The bucket of ``res`` (its last point) is measured at every point: pick its config over
    ``points`` (minimax regret, the baseline unless beaten by more than ``min_gain``), confirm a
    win in a second window, and write the entry. Sets ``res.winner`` (and ``unconfirmed``)."""
    config_label, timings = _merge(points, res.baseline, min_gain)
    if config_label != res.baseline and res.baseline in valid:
        lost = _second_window(op, tuner, cases, config_label, res.baseline, valid,
                              res.implementations, warmup=warmup, iters=iters,
                              min_gain=min_gain)
        if lost:
            res.note, res.unconfirmed = lost, config_label
            config_label = res.baseline
    res.winner = config_label
    family, config = tuner.FAMILY, valid[config_label]
    if config_label in res.implementations:   # the config names the winner
        family, config = config_label, {IMPLEMENTATION_KEY: config_label, **config}
    # One entry a point: a winner of another implementation replaces the old one (the store
    # keys entries by family too).
    store.remove(functools.partial(_other_winner, op=op, device=device, software=software,
                                   family=family, key=_bucket_key(res.bucket)))
    store.put([TuningEntry(op=op, family=family, device=device, software=software,
                           bucket=res.bucket, config=config, timings_ms=timings,
                           command=command, measured_at=utc_now())])


def _second_window(op: str, tuner: Any, cases: list[Any], label: str, baseline: str,
                   valid: Mapping[str, Mapping[str, Any]], implementations: list[str], *,
                   warmup: int, iters: int, min_gain: float) -> str:
    """``""`` when ``label``'s win over ``baseline`` holds in a second window (the two alone,
    timed again at every point of their bucket, judged by :func:`_merge`'s rule); otherwise
    why it did not. One window's order of two configs within a few percent can be noise (a
    40 us kernel measured 5% apart, then 2% the other way), and a stored win that is noise
    serves a slower config than the table's."""
    worst = {label: 1.0, baseline: 1.0}
    for case in cases:
        pair = {lab: valid[lab] for lab in (label, baseline)}
        timed = measure_point(op, case, {lab: c for lab, c in pair.items()
                                         if lab not in implementations},
                              warmup=warmup, iters=iters, tuner=tuner,
                              implementations={lab: c for lab, c in pair.items()
                                               if lab in implementations})
        ms = {lab: t.ms for lab, t in timed.items() if t.ok and t.ms}
        if label not in ms:
            return f"{label} won the first window but failed in the second"
        if baseline not in ms:   # the baseline failed: the win stands
            return ""
        best = min(ms.values())
        for lab in worst:
            worst[lab] = max(worst[lab], ms[lab] / best)
    if worst[baseline] <= worst[label] * (1.0 + min_gain):
        return (f"{label} won the first window, not a second one: worst ratio "
                f"{worst[label]:.3f} there against the baseline's {worst[baseline]:.3f} "
                f"(--min-gain {min_gain:g})")
    return ""


def _merge(points: list[dict[str, float]], baseline: str | None = None,
           min_gain: float = 0.0) -> tuple[str, dict[str, float]]:
    """(label, mean ms) over the points of one bucket, among the labels that ran at every point:
    the minimax-regret label (the smallest worst ratio to each point's fastest), unless
    ``baseline`` ran everywhere and that label's worst ratio is not more than ``min_gain``
    below the baseline's; then the baseline. A single point: its fastest (or the baseline by
    that rule), its timings."""
    common = set(points[0]).intersection(*points[1:])
    if not common:   # nothing ran everywhere: the latest point decides
        last = points[-1]
        common, points = set(last), [last]
    best = [min(p.values()) for p in points]
    worst = {lab: max(p[lab] / b for p, b in zip(points, best, strict=True)) for lab in common}
    mean = {lab: sum(p[lab] for p in points) / len(points) for lab in common}
    label = min(common, key=lambda lab: (worst[lab], mean[lab]))
    if baseline in common and worst[baseline] <= worst[label] * (1.0 + min_gain):
        label = baseline
    return label, mean


def _other_winner(e: TuningEntry, *, op: str, device: Any, software: Any, family: str,
                  key: str) -> bool:
    """``e`` is this point's entry won by another implementation than ``family``."""
    return (e.op == op and e.device == device and e.software == software
            and e.family != family and _bucket_key(e.bucket) == key)


def _bucket_key(bucket: dict[str, Any]) -> str:
    return repr(sorted(bucket.items()))
