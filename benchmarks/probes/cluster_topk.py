"""Issue #25 probe: the cluster radix select of ``cluster_topk.cu`` against kreg's ``auto``.

Not a product path. Builds ``cluster_topk.cu`` with nvcc (sm_90a) into a shared library, loads it
with ctypes, checks it entry by entry against kreg's exact reference (poisoned outputs; every
distribution; short, ragged and strided rows; NaN, -0.0, fewer valid keys than k; bf16), then
times it against ``registry.dispatch`` (kreg's default path) in one interleaved window of CUDA
graph replays a point, and prints a table last.

    python3 benchmarks/probes/cluster_topk.py [--rows 1,64,1024,4096] [--dists ...] [--iters 20]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def build(so: str) -> ctypes.CDLL:
    src = os.path.join(HERE, "cluster_topk.cu")
    if not os.path.exists(so) or os.path.getmtime(so) < os.path.getmtime(src):
        t = time.time()
        subprocess.run(["nvcc", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
                        "-shared", "-Xcompiler", "-fPIC", "-o", so, src], check=True)
        print(f"built {so} in {time.time() - t:.1f} s", flush=True)
    lib = ctypes.CDLL(so)
    lib.cluster_topk.restype = ctypes.c_int
    lib.cluster_topk.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib


def make_op(lib, agg: int, stop: int = 0, filt: int = 0):
    import torch

    def op(scores, lengths, k, out=None):
        rows, n = scores.shape
        assert scores.stride(1) == 1
        if out is None:
            out = torch.empty((rows, k), dtype=torch.int32, device=scores.device)
        dt = {torch.float32: 0, torch.bfloat16: 1}[scores.dtype]
        lp = lengths.data_ptr() if lengths is not None else None
        rc = lib.cluster_topk(scores.data_ptr(), dt, agg, scores.stride(0), rows, n, lp, k,
                              out.data_ptr(), stop, filt, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"cluster_topk rc={rc}")
        return out
    return op


def check(op, name: str) -> int:
    import torch

    from backends.indexer_topk.distributions import make_scores
    from backends.indexer_topk.reference import indexer_topk_reference

    bad = 0
    cases = []
    for dist in ("randn", "ties", "zeros", "recent", "lowbits", "relu", "ramp", "quant256",
                 "fp8"):
        cases.append((dist, 3, 131072, 2048, None, torch.float32, 0))
    cases += [("randn", 5, 131072, 2048, "ragged", torch.float32, 0),
              ("randn", 4, 5000, 2048, None, torch.float32, 0),
              ("randn", 4, 1500, 2048, None, torch.float32, 0),      # fewer valid than k
              ("ties", 4, 131072, 2048, "ragged", torch.float32, 0),
              ("randn", 3, 131072, 2048, None, torch.float32, 64),   # strided rows
              ("nan", 3, 131072, 2048, None, torch.float32, 0),
              ("randn", 3, 131072, 2048, None, torch.bfloat16, 0),
              ("ties", 3, 131072, 2048, None, torch.bfloat16, 0),
              ("randn", 3, 131072, 1, None, torch.float32, 0),
              ("randn", 3, 131072, 4096, None, torch.float32, 0),
              ("randn", 2, 100000, 2048, None, torch.float32, 0)]
    for seed, (dist, rows, n, k, lens, dtype, pad) in enumerate(cases):
        if dist == "nan":
            s = make_scores("randn", rows, n, seed=seed)
            s[:, ::97] = float("nan")
            s[:, 5::101] = float("inf")
            s[:, 7::103] = -0.0
            s[0, :] = float("nan")
        else:
            s = make_scores(dist, rows, n, seed=seed)
        if pad:   # a strided view: rows of n keys inside rows of n + pad
            full = torch.full((rows, n + pad), 7.0, dtype=dtype, device="cuda")
            full[:, :n] = s.to(dtype)
            s = full[:, :n]
        else:
            s = s.to(dtype).cuda()
        if lens == "ragged":
            lengths = torch.randint(0, n + 1, (rows,), dtype=torch.int32)
            lengths[0] = n
            lengths[1] = 10
            lengths = lengths.cuda()
        else:
            lengths = torch.full((rows,), n, dtype=torch.int32, device="cuda")
        ref = indexer_topk_reference(s, lengths, k)
        out = torch.full((rows, k), 0x77777777, dtype=torch.int32, device="cuda")
        op(s, lengths, k, out)
        torch.cuda.synchronize()
        rows_bad = int((out != ref).any(dim=1).sum())
        if rows_bad:
            bad += 1
            r = int((out != ref).any(dim=1).nonzero()[0])
            j = int((out[r] != ref[r]).nonzero()[0])
            print(f"  MISMATCH {name} {dist} rows={rows} n={n} k={k} lens={lens} {dtype} "
                  f"stride={s.stride(0)}: {rows_bad} rows; row {r} entry {j}: "
                  f"{out[r, j-2:j+3].tolist()} vs {ref[r, j-2:j+3].tolist()}", flush=True)
    print(f"check {name}: {len(cases)} cases, {bad} mismatching", flush=True)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,64,1024,4096")
    ap.add_argument("--dists", default="randn,ties,zeros,recent,lowbits,relu,ramp")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--so", default="/tmp/cluster_topk.so")
    ap.add_argument("--no-auto", action="store_true")
    ap.add_argument("--variants", default="cl0,cl2,f2",
                    help="clA: full radix passes, AGG=A; fA: the sampled filter first")
    ap.add_argument("--phases", default="", help="rows for a phase split (stop after each)")
    a = ap.parse_args()
    import torch

    import registry
    from backends.indexer_topk.distributions import make_scores
    from registry.tuning.timing import interleaved_median_ms

    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    lib = build(a.so)
    def variant(name: str, stop: int = 0):
        return make_op(lib, int(name[-1]), stop, 1 if name.startswith("f") else 0)

    ops = {v: variant(v) for v in a.variants.split(",")}
    bad = sum(check(op, name) for name, op in ops.items())
    k, n = 2048, 131072
    for rows in [int(r) for r in a.phases.split(",") if r]:
        for dist in ("randn", "zeros"):
            s = make_scores(dist, min(rows, 1024), n).cuda().repeat((rows + 1023) // 1024, 1)
            s = s[:rows].contiguous()
            lengths = torch.full((rows,), n, dtype=torch.int32, device="cuda")
            o = torch.empty((rows, k), dtype=torch.int32, device="cuda")
            staged = {f"{v}s{st}": variant(v, st)
                      for v in a.variants.split(",") for st in (1, 2, 3, 0)}
            fns = {nm: (lambda op=op, s=s, ln=lengths, o=o: op(s, ln, k, o))
                   for nm, op in staged.items()}
            fns["copy"] = lambda s=s: s.clone()
            t = interleaved_median_ms(fns, warmup=3, iters=a.iters, graphs=True)
            print("phases", dist, rows, {m: round(v * 1000, 1) for m, v in t.items()},
                  flush=True)
    rows_list = [int(r) for r in a.rows.split(",")]
    table = []
    for dtn in a.dtypes.split(","):
        dtype = getattr(torch, dtn)
        for dist in a.dists.split(","):
            base = make_scores(dist, min(1024, max(rows_list)), n).to(dtype).cuda()
            for rows in rows_list:
                reps = (rows + base.shape[0] - 1) // base.shape[0]
                s = base.repeat(reps, 1)[:rows].contiguous()
                lengths = torch.full((rows,), n, dtype=torch.int32, device="cuda")
                from backends.indexer_topk.reference import indexer_topk_reference
                ref = indexer_topk_reference(s, lengths, k)
                outs = {nm: torch.empty((rows, k), dtype=torch.int32, device="cuda")
                        for nm in ops}
                fns = {nm: (lambda op=op, o=outs[nm], s=s, ln=lengths: op(s, ln, k, o))
                       for nm, op in ops.items()}
                if not a.no_auto:
                    fns["auto"] = (lambda s=s, ln=lengths:
                                   registry.dispatch("indexer_topk", s, ln, k=k))
                for nm, f in fns.items():
                    got = f()
                    torch.cuda.synchronize()
                    if not torch.equal(got, ref):
                        print(f"  MISMATCH timing input {nm} {dist} {rows}", flush=True)
                        bad += 1
                t = interleaved_median_ms(fns, warmup=3, iters=a.iters, graphs=True)
                table.append((dtn, dist, rows, t))
                print(dtn, dist, rows, {m: round(v * 1000, 1) for m, v in t.items()}, flush=True)
    names = list(ops)
    print("\n| dtype | dist | rows | " + " | ".join(f"{m} us" for m in names)
          + " | auto us | auto / best cl |")
    print("|---|---|---:|" + "---:|" * (len(names) + 2))
    for dtn, dist, rows, t in table:
        best = min(t[m] for m in names)
        au = t.get("auto", float("nan"))
        cells = " | ".join(f"{t[m] * 1e3:.1f}" for m in names)
        print(f"| {dtn} | {dist} | {rows} | {cells} | {au * 1e3:.1f} | {au / best:.2f} |")
    print(f"mismatches: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
