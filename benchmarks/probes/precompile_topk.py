"""Compile every candidate of ``kreg tune indexer_topk`` before the tune, in parallel.

    python3 benchmarks/probes/precompile_topk.py [--rows 1,64,1024,4096] [--keys 131072]
        [--k 2048] [--workers 16] [--list]

The tuner compiles its candidates one after another (about 12 a point, three kernels each:
gmax, the row or stage kernels, the tie kernel): at the full default grid about 40 distinct
configs, more than a 10-minute device call holds (session 17). This runs each (shape, config)
once, on random scores of the point's shape, in ``--workers`` processes that share
``TRITON_CACHE_DIR``, so that the tune that follows finds every kernel compiled. Distributions
do not change what is compiled (they are data), so one input a shape serves them all. Each
output's first 64 rows are checked against the exact reference (a precompile that computes a
wrong answer is reported, the exit status 1). ``--list`` prints the (shape, config) pairs and
exits (no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _pairs(rows: list[int], keys: list[int], k: int) -> list[tuple[int, int, str, dict]]:
    """(rows, keys, label, config) for every valid candidate of every point, once each."""
    import registry
    from backends.indexer_topk import tuning
    from backends.indexer_topk.bench import BenchCase

    facts = registry.probe()
    out, seen = [], set()
    for r in rows:
        for n in keys:
            case = BenchCase(rows=r, keys=n, k=k, dtype="float32", dist="randn")
            for lab, cfg, _ in tuning.candidates(case, facts):
                if cfg is None or (r, n, lab) in seen:
                    continue
                seen.add((r, n, lab))
                out.append((r, n, lab, cfg))
    return out


CHECK_ROWS = 64  # rows a worker checks against the reference per shape


def _worker(spec: str) -> int:
    """Run the (rows, keys, label, config) pairs of ``spec`` (JSON) once each."""
    import torch

    from backends.indexer_topk import triton_kernels as tk
    from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches

    job = json.loads(spec)
    dev = "cuda" if torch.cuda.is_available() else "cpu"   # cpu: TRITON_INTERPRET=1 (tests)
    bad = 0
    inputs: dict[tuple[int, int], tuple] = {}
    for r, n, lab, cfg in job["pairs"]:
        if (r, n) not in inputs:
            g = torch.Generator(device=dev).manual_seed(r * 7 + n)
            s = torch.randn((r, n), generator=g, device=dev)
            ln = torch.full((r,), n, dtype=torch.int32, device=dev)
            # rows are independent: the reference of the first CHECK_ROWS judges the config
            # (the reference of a whole 4096-row shape allocates ~4 GiB tensors; 16 workers
            # at once ran the GPU out of memory, session 18)
            c = min(r, CHECK_ROWS)
            inputs[(r, n)] = (s, ln, indexer_topk_reference(s[:c], ln[:c], job["k"]))
        s, ln, want = inputs[(r, n)]
        t0 = time.time()
        got = tk.indexer_topk_triton(s, ln, job["k"], config=cfg)
        mm = topk_mismatches(got[:want.shape[0]], want)
        bad += bool(mm)
        # one write a line: the workers share the pipe, and print() writes the text and its
        # newline apart, so two workers' lines could run together (a CI run saw it)
        sys.stdout.write(f"{r}x{n} {lab}: {time.time() - t0:.1f}s "
                         f"{'exact' if not mm else mm[0]}\n")
        sys.stdout.flush()
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,64,1024,4096")
    ap.add_argument("--keys", default="131072")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return _worker(a.worker)
    pairs = _pairs([int(x) for x in a.rows.split(",")], [int(x) for x in a.keys.split(",")],
                   a.k)
    if a.list:
        for r, n, lab, _ in pairs:
            print(f"{r}x{n} {lab}")
        print(f"{len(pairs)} (shape, config) pairs")
        return 0
    t0 = time.time()
    w = max(1, min(a.workers, len(pairs)))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker",
                               json.dumps({"k": a.k, "pairs": pairs[i::w]})], env=os.environ)
             for i in range(w)]
    rcs = [p.wait() for p in procs]
    print(f"precompiled {len(pairs)} (shape, config) pairs in {w} processes, "
          f"{time.time() - t0:.0f}s; failed workers: {sum(rc != 0 for rc in rcs)}")
    return 1 if any(rcs) else 0


if __name__ == "__main__":
    sys.exit(main())
