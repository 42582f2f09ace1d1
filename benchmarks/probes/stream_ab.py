"""The streaming kernel (``backends/indexer_topk/cuda/stream_topk.cu``) beside the Triton kernels
and compile-time variants of itself (``--variant NAME=-DSTREAM_CAP=4096,-DSTREAM_UNROLL=4``),
in one interleaved window of CUDA-graph replays a point; every output checked entry by entry
against the reference first, and each case's extra row reads (the kernel's ``stats``) printed.
Prints a table last (us; each variant's time over the product build's). A variant whose name
starts with ``stop`` is a phase probe (``stop1=-DSTREAM_STOP=1``: the kernel up to the sample's
threshold; ``stop2=-DSTREAM_STOP=2``: up to the end of the stream): timed, not checked.

    python3 benchmarks/probes/stream_ab.py [--variant ...] [--rows 64,1024,4096] \\
        [--dists randn,ties,...] [--dtype bfloat16] [--iters 15] [--cluster]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


GEOMETRIES = (0, 1, 2, 4)   # the kernel's `wide` values


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", default="64,1024,4096")
    ap.add_argument("--dists", default="randn,ties,zeros,recent,lowbits,relu,ramp")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--cluster", action="store_true", help="time the cluster kernel too")
    ap.add_argument("--geometries", action="store_true",
                    help="time every CTA geometry of the product build (w0: 256 threads, three "
                         "CTAs an SM; w1: 512 threads, one CTA an SM; w2 / w4: a cluster of two "
                         "/ four 512-thread CTAs a row) beside its own choice")
    a = ap.parse_args()
    import torch

    from backends.indexer_topk import cluster, stream
    from backends.indexer_topk.distributions import make_scores
    from backends.indexer_topk.reference import indexer_topk_reference
    from backends.indexer_topk.triton_kernels import indexer_topk_triton
    from registry.tuning.timing import interleaved_median_ms

    tmp = Path(tempfile.mkdtemp())
    nvcc = cluster.nvcc()
    assert nvcc, "no nvcc"
    builds = {}   # every variant's nvcc at once (the product's build beside them)
    for spec in a.variant:
        name, _, flags = spec.partition("=")
        builds[name] = subprocess.Popen([nvcc, *cluster.NVCC_FLAGS, *flags.split(","), "-o",
                                         str(tmp / f"{name}.so"), str(stream.SOURCE)])
    libs = {"stream": stream.load_library(stream.build())}
    for name, proc in builds.items():
        if proc.wait() != 0:
            raise SystemExit(f"variant {name}: nvcc failed")
        libs[name] = stream.load_library(tmp / f"{name}.so")
    variants = [m for m in libs if m != "stream"]
    variants += [f"w{w}" for w in GEOMETRIES] if a.geometries else []
    dtype = getattr(torch, a.dtype)
    print(torch.cuda.get_device_name(), torch.__version__, a.dtype, flush=True)
    n, k, bad, table = 131072, 2048, 0, []
    for dist in a.dists.split(","):
        for rows in (int(r) for r in a.rows.split(",")):
            s = make_scores(dist, rows, n, seed=rows, dtype=dtype).cuda()
            ln = torch.full((rows,), n, dtype=torch.int32, device="cuda")
            want = indexer_topk_reference(s, ln, k)
            outs = {m: torch.empty((rows, k), dtype=torch.int32, device="cuda") for m in libs}
            fns = {m: (lambda o=outs[m], lib=libs[m], s=s, ln=ln:
                       stream._launch(s, ln, k, o, 0, lib)) for m in libs}
            for w in (GEOMETRIES if a.geometries else ()):
                outs[f"w{w}"] = torch.empty((rows, k), dtype=torch.int32, device="cuda")
                fns[f"w{w}"] = (lambda o=outs[f"w{w}"], s=s, ln=ln, w=w:
                                stream._launch(s, ln, k, o, 0, libs["stream"], wide=w))
            fns["triton"] = lambda s=s, ln=ln: indexer_topk_triton(s, ln, k, config={})
            if a.cluster and rows <= 256:
                fns["cluster"] = lambda s=s, ln=ln: cluster.indexer_topk_cluster(s, ln, k)
            retries = {}
            for m, f in list(fns.items()):
                try:
                    if m in libs:
                        st = torch.zeros(1, dtype=torch.int32, device="cuda")
                        got = stream._launch(s, ln, k, outs[m], 0, libs[m], stats=st)
                        retries[m] = int(st.item())
                    else:
                        got = f()
                except Exception as e:  # a variant that cannot run: named, not timed
                    print("FAILED", m, dist, rows, f"{type(e).__name__}: {e}", flush=True)
                    del fns[m]
                    bad += 1
                    continue
                if not torch.equal(got, want) and not m.startswith("stop"):
                    # (a "stop..." variant is a phase probe, -DSTREAM_STOP=1/2: its output is
                    # not the answer; timed only)
                    print("MISMATCH", m, dist, rows, flush=True)
                    bad += 1
            t = interleaved_median_ms(fns, warmup=3, iters=a.iters, graphs=True)
            table.append((dist, rows, t, retries))
            print(dist, rows, {m: round(v * 1e3, 1) for m, v in t.items()}, "retries", retries,
                  flush=True)
    extra = ["cluster"] if a.cluster else []
    print("\n| dist | rows | stream us | triton us | stream / triton | retries | "
          + "".join(f"{m} us | " for m in extra)
          + "".join(f"{m} us | {m} / stream | " for m in variants))
    print("|---|---:|---:|---:|---:|---:|" + "---:|" * len(extra) + "---:|---:|" * len(variants))
    for dist, rows, t, r in table:
        print(f"| {dist} | {rows} | {t['stream'] * 1e3:.1f} | {t['triton'] * 1e3:.1f} | "
              f"{t['stream'] / t['triton']:.3f} | {r['stream']} | "
              + "".join(f"{t[m] * 1e3:.1f} | " if m in t else "- | " for m in extra)
              + "".join(f"{t[m] * 1e3:.1f} | {t[m] / t['stream']:.3f} | " if m in t else "- | - | "
                        for m in variants))
    print(f"mismatches: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
