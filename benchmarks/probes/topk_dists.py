"""Probe: indexer_topk (default config) against torch.topk on every score distribution.

    python3 benchmarks/probes/topk_dists.py --rows 1,64,1024,4096 --dtypes float32 \
        [--dists randn,ties,...] [--old [NAME=]PATH ...] [--alt NAME=JSON ...] [--out FILE]

For each dtype, distribution and row count (x 131072 keys, k = 2048, full rows): kreg's output
(and each ``--old``'s: another copy of triton_kernels.py, loaded from PATH, e.g. the previous
commit for a before/after in one window; repeat it with names, ``--old head=a.py --old p1=b.py``,
to set several copies against the tree in the same window; ``--alt``: kreg with another config, e.g.
``--alt 'one={"ONE_PASS": 1}'``, for a config A/B in one window) is checked entry by entry
against the torch reference; then
kreg, torch.topk (and old) are timed in one interleaved window of CUDA-graph replays
(``registry._timing.interleaved_median_ms``). Prints one line per point and a table last:
microseconds, the ratio to kreg's randn time at the same shape, and kreg / torch.topk.
Scores come from a CPU generator (``distributions.make_scores``) once per distribution at the
largest row count (or ``--gen-rows`` rows repeated up to it); fewer rows are its first rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time


def main() -> int:
    import torch

    from backends.indexer_topk import triton_kernels as tk
    from backends.indexer_topk.config import resolve_config, scratch_bytes_per_row
    from backends.indexer_topk.distributions import DISTRIBUTIONS, make_scores
    from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches
    from registry.tuning import interleaved_median_ms

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,64,1024,4096")
    ap.add_argument("--keys", type=int, default=131072)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--dists", default=",".join(DISTRIBUTIONS))
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--old", action="append", default=[],
                    help="[NAME=]PATH of another triton_kernels.py (NAME defaults to old)")
    ap.add_argument("--alt", action="append", default=[],
                    help='NAME=JSON: also time kreg with this config, e.g. one={"ONE_PASS": 1}')
    ap.add_argument("--gen-rows", type=int, default=0,
                    help="generate this many rows and repeat them up to the largest row count "
                         "(0: generate every row; the CPU generator takes ~10 s a 4096-row cache)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows_list = [int(x) for x in a.rows.split(",")]
    alts = {}
    for item in a.alt:
        name, sep, blob = item.partition("=")
        if not sep:
            ap.error(f"--alt {item!r}: write NAME=JSON, e.g. one={{\"ONE_PASS\": 1}}")
        alts[name] = json.loads(blob)
    n, k = a.keys, a.k
    olds = {}
    for item in a.old:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = "old", item
        if name in olds or name in ("kreg", "torch") or name in alts:
            ap.error(f"--old {item!r}: the name {name!r} is taken; give each copy its own NAME=")
        spec = importlib.util.spec_from_file_location(f"old_tk_{len(olds)}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        olds[name] = mod
    dev = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name(dev)} torch {torch.__version__} "
          f"triton {__import__('triton').__version__}", flush=True)
    results = []
    bad = 0
    for dt in a.dtypes.split(","):
        dtype = getattr(torch, dt)
        for name in a.dists.split(","):
            t0 = time.time()
            top = max(rows_list)
            gen = min(top, a.gen_rows) if a.gen_rows > 0 else top
            full = make_scores(name, gen, n, seed=1).to(dtype).to(dev)
            if gen < top:
                full = full.repeat(-(-top // gen), 1)[:top].contiguous()
            for rows in rows_list:
                scores = full[:rows]
                lengths = torch.full((rows,), n, dtype=torch.int32, device=dev)
                want = indexer_topk_reference(scores, lengths, k)
                fns = {"kreg": lambda s=scores, ln=lengths: tk.indexer_topk_triton(s, ln, k,
                                                                                   config={}),
                       "torch": lambda s=scores: torch.topk(s, k, dim=1).indices}
                for name_, mod in olds.items():
                    fns[name_] = lambda s=scores, ln=lengths, m=mod: m.indexer_topk_triton(
                        s, ln, k, config={})
                for name_, acfg in alts.items():
                    fns[name_] = lambda s=scores, ln=lengths, c=acfg: tk.indexer_topk_triton(
                        s, ln, k, config=dict(c))
                checks = {}
                for p in ("kreg", *olds, *alts):
                    if p in fns:
                        mm = topk_mismatches(fns[p](), want)
                        checks[p] = "exact" if not mm else mm[0]
                        bad += bool(mm)
                t = interleaved_median_ms(fns, warmup=5, iters=a.iters, graphs=True,
                                          min_window_s=0.05)
                cfg = resolve_config({}, rows, n, k, 132)
                r = {"dtype": dt, "dist": name, "rows": rows,
                     **{p: round(v * 1000, 1) for p, v in t.items()}, "checks": checks,
                     "scratch": scratch_bytes_per_row(cfg, k, n)}
                results.append(r)
                print(json.dumps(r), flush=True)
                del want
            del full
            torch.cuda.empty_cache()
            print(f"# {dt} {name} {time.time() - t0:.1f}s", flush=True)
    base = {(r["dtype"], r["rows"]): r["kreg"] for r in results if r["dist"] == "randn"}
    print("\n| dtype | dist | rows | kreg us | x randn | torch.topk us | kreg/torch |"
          + "".join(f" {n} us | {n}/kreg |" for n in (*olds, *alts))
          + " exact |")
    for r in results:
        b = base.get((r["dtype"], r["rows"]))
        xr = f"{r['kreg'] / b:.2f}" if b else "-"
        print(f"| {r['dtype']} | {r['dist']} | {r['rows']} | {r['kreg']} | {xr} | {r['torch']} | "
              f"{r['kreg'] / r['torch']:.2f} |"
              + "".join(f" {r[n]} | {r[n] / r['kreg']:.3f} |" for n in (*olds, *alts))
              + f" {'yes' if all(v == 'exact' for v in r['checks'].values()) else 'NO'} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    print(f"mismatching points: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
