"""Selection regret: the time of what ``auto`` picks over the fastest candidate at each point.

    python benchmarks/bench_regret.py sparse_prefill [--grid AXIS=V1,V2 ...] [--top 4]

For every grid point of the op's tuner, one interleaved window times ``auto`` (registry.dispatch,
as a framework calls it), the table config (``baseline``), the ``--top`` fastest configs the
tuning store recorded at that point (all of the point's candidates when it has no entry), and
every other implementation that can run the point (``implementation_candidates``: FlashInfer's,
a vendor's), the candidates ``kreg tune`` measured beside the configs.

Regret is ``t(selection) / min(t) - 1``. When the config ``auto`` ran equals one of the timed
candidates' configs, ``t(selection)`` is that candidate's time: the same kernel timed twice in one
window differs only by noise, and the candidate's time is the one comparable with the others
(regret is then 0 exactly when the selection is the fastest candidate); a measured decision that
names another implementation (``implementation=NAME``) matches that implementation's candidate.
Otherwise it is auto's own time. Columns: ``picked ms`` is the time regret uses (JSON
``selection_ms``, with ``matched``: the candidate label, or null when auto's config is none of
them); ``auto ms (dispatch)`` is auto's own time through ``registry.dispatch`` in the same window
(JSON ``auto_ms``). The run fails when regret exceeds 2% anywhere, when the selection is slower than
the table by more than the same 2% noise allowance, or when auto did not run or was past the
error bound.

Points that share a workload bucket (grid axes selection cannot see, such as indexer_topk's
score ``dist``) get one selection between them, so their per-point regrets are the cost of the
distribution, not of the selection: for such a bucket the run judges, after its points, the
**selection regret** ``W(picked) / min W - 1``, where ``W(c)`` is candidate c's worst ratio to
each point's fastest (the minimax rule ``kreg tune`` stores by), and the picked config's worst
ratio against the table's; a bucket of one point is judged by its regret as above. The JSON
rows of a shared bucket carry ``bucket_points``, ``selection_regret`` and ``worst_ratio``
(label -> W).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import registry
from registry.tuning import TuningStore, identity_of
from registry.tuning.tune import (
    IMPLEMENTATION_KEY,
    implementation_candidates,
    load_tuner,
    measure_point,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("op")
    ap.add_argument("--grid", action="append", default=[], metavar="AXIS=V1,V2")
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--limit", type=float, default=0.02)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()
    grid = {g.split("=", 1)[0]: g.split("=", 1)[1].split(",") for g in args.grid}
    tuner = load_tuner(args.op)
    facts = registry.probe()
    device, software = identity_of(facts)
    stored = {repr(sorted(e.bucket.items())): e for e in TuningStore().load()
              if e.op == args.op and e.device == device and e.software == software}
    rows: list[dict[str, Any]] = []
    print(f"# {args.op} on {facts.describe()}", flush=True)
    head = f"{'point':<44} {'auto picks':<52} {'picked ms':>9} {'best ms':>9} {'table ms':>9} " \
           f"{'regret':>7} {'vs table':>8} {'auto ms (dispatch)':>18}"
    print(head)
    worst = 0.0
    bad = False
    cases = tuner.cases(grid)
    shares: dict[str, int] = {}
    for case in cases:
        key = repr(sorted(tuner.bucket(case).items()))
        shares[key] = shares.get(key, 0) + 1
    groups: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for case in cases:
        cands = {lab: cfg for lab, cfg, _ in tuner.candidates(case, facts) if cfg is not None}
        others = {name: cfg for name, cfg, _ in implementation_candidates(
            args.op, tuner.bucket(case), facts, family=tuner.FAMILY) if cfg is not None}
        base = tuner.baseline(case, facts)
        entry = stored.get(repr(sorted(tuner.bucket(case).items())))
        if entry is not None:
            keep = sorted(entry.timings_ms, key=entry.timings_ms.__getitem__)[:args.top]
            cands = {lab: cfg for lab, cfg in cands.items() if lab in keep or lab == base}
        res = measure_point(args.op, case, cands, warmup=args.warmup, iters=args.iters,
                            include_auto=True, tuner=tuner, implementations=others)
        ok = {lab: t.ms for lab, t in res.items() if t.ok and t.ms}
        dec = registry.get_registry().last_decisions
        chosen = next((d for k, d in dec.items() if k[0] == args.op), None)
        # Name what auto ran by the candidate label it equals (e.g. 8x32x4x2:pre:rev:split2:r96,
        # or flashinfer.sparse_prefill when a measured entry names that implementation).
        routed = None if chosen is None else (chosen.config or {}).get(
            IMPLEMENTATION_KEY, chosen.implementation)
        same = [routed] if routed in others else [
            lab for lab, cfg in cands.items()
            if chosen is not None and dict(chosen.config or {}) == dict(cfg)]
        picked = "?" if chosen is None else chosen.implementation.split(".")[0] + " " + (
            same[0] if same else chosen.config_short())
        best = min(v for k, v in ok.items() if k != "auto")
        matched = next((lab for lab in same if lab in ok), None)
        auto_ms = ok.get("auto")
        sel_ms = ok[matched] if matched is not None else auto_ms
        if auto_ms is None or sel_ms is None:   # auto failed or was past the error bound
            bad = True
            why = res["auto"].detail if "auto" in res else "not measured"
            print(f"{tuner.label(case):<44} {picked:<52} auto did not run within the "
                  f"error bound: {why}  FAIL", flush=True)
            rows.append({"point": tuner.label(case), "auto": picked, "matched": matched,
                         "selection_ms": None, "auto_ms": None, "best_ms": best,
                         "table_ms": ok.get(base), "regret": None, "vs_table": None,
                         "all_ms": ok,
                         "auto_result": res["auto"].as_json() if "auto" in res else None})
            registry.invalidate()
            continue
        regret = sel_ms / best - 1
        vs_table = sel_ms / ok[base] if base in ok else float("nan")
        key = repr(sorted(tuner.bucket(case).items()))
        shared = shares[key] > 1   # judged with its bucket's other points, below
        if not shared:
            worst = max(worst, regret)
        flag = not shared and (regret > args.limit or vs_table > 1 + args.limit)
        bad |= flag
        row = {"point": tuner.label(case), "auto": picked, "matched": matched,
               "selection_ms": sel_ms, "auto_ms": auto_ms, "best_ms": best,
               "table_ms": ok.get(base), "regret": regret, "vs_table": vs_table, "all_ms": ok}
        rows.append(row)
        groups.setdefault(key, []).append((row, base))
        print(f"{tuner.label(case):<44} {picked:<52} {sel_ms:>9.4f} {best:>9.4f} "
              f"{ok.get(base, float('nan')):>9.4f} {regret:>6.1%} {vs_table:>7.3f}x "
              f"{auto_ms:>18.4f}{'  FAIL' if flag else ''}", flush=True)
        if shared and len(groups[key]) == shares[key]:
            sel, vs = _judge_bucket(groups[key])
            worst = max(worst, sel)
            flag = sel > args.limit or vs > 1 + args.limit
            bad |= flag
            print(f"{'  ' + str(shares[key]) + ' points, one selection:':<44} selection regret "
                  f"{sel:.1%} (worst-ratio rule), {vs:.3f}x the table's worst ratio"
                  f"{'  FAIL' if flag else ''}", flush=True)
        registry.invalidate()
    print(f"worst regret {worst:.2%} (limit {args.limit:.0%})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 1 if bad else 0


def _judge_bucket(points: list[tuple[dict[str, Any], str]]) -> tuple[float, float]:
    """(selection regret, picked worst ratio / the table's) over the points of one bucket,
    among the candidates timed at every point; the rows get the bucket's figures."""
    times = [{k: v for k, v in row["all_ms"].items() if k != "auto"} for row, _ in points]
    common = set(times[0]).intersection(*times[1:])
    best = [min(t.values()) for t in times]
    ratio = {lab: max(t[lab] / b for t, b in zip(times, best, strict=True)) for lab in common}
    # the picked config's worst ratio: its matched candidate's times, else auto's own
    picked = [row["selection_ms"] / b for (row, _), b in zip(points, best, strict=True)]
    w_pick = max(picked)
    sel = w_pick / min(ratio.values(), default=w_pick) - 1
    base = points[0][1]
    vs = w_pick / ratio[base] if base in ratio else float("nan")
    for row, _ in points:
        row.update(bucket_points=len(points), selection_regret=sel, worst_ratio=ratio)
    return sel, vs


if __name__ == "__main__":
    sys.exit(main())
