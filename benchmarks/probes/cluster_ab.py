"""A/B of the cluster kernel (``backends/indexer_topk/cuda/cluster_topk.cu``) against patched
copies of its source (one a ``--patch``, named by the file's stem), beside the Triton kernels, in
one interleaved window of CUDA-graph replays a point; every output checked entry by entry against
the reference first. Prints a table last (each variant's time over the source's).

    python3 benchmarks/probes/cluster_ab.py --patch X.patch [--patch Y.patch] \\
        [--rows 1,2,16] [--dists randn,lowbits,zeros,ties] [--dtype bfloat16] [--iters 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def apply_patch(text: str, diff: str) -> str:
    """``text`` with a one-file unified diff's hunks applied (each hunk's old lines must occur
    exactly once)."""
    hunks: list[tuple[list[str], list[str]]] = []
    for line in diff.splitlines():
        if line.startswith("@@"):
            hunks.append(([], []))
        elif hunks and line[:1] in (" ", "-", "+") and not line.startswith(("---", "+++")):
            old, new = hunks[-1]
            if line[0] in " -":
                old.append(line[1:])
            if line[0] in " +":
                new.append(line[1:])
    for old, new in hunks:
        a, b = "\n".join(old) + "\n", "\n".join(new) + "\n"
        if text.count(a) != 1:
            raise SystemExit(f"patch hunk does not apply once: {old[:2]}")
        text = text.replace(a, b)
    return text


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--patch", action="append", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", default="1,2,16")
    ap.add_argument("--dists", default="randn,lowbits,zeros,ties,recent,relu,ramp")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    import torch

    from backends.indexer_topk import cluster
    from backends.indexer_topk.distributions import make_scores
    from backends.indexer_topk.reference import indexer_topk_reference
    from backends.indexer_topk.triton_kernels import indexer_topk_triton
    from registry.tuning.timing import interleaved_median_ms

    tmp = Path(tempfile.mkdtemp())
    nvcc = cluster.nvcc()
    assert nvcc, "no nvcc"
    libs = {"head": cluster.load_library(cluster.build(tmp / "head.so"))}
    for patch in a.patch:
        name = Path(patch).stem
        src = tmp / name / "cluster_topk.cu"
        src.parent.mkdir()
        src.write_text(apply_patch(cluster.SOURCE.read_text(), Path(patch).read_text()))
        subprocess.run([nvcc, *cluster.NVCC_FLAGS, "-o", str(tmp / f"{name}.so"), str(src)],
                       check=True)
        libs[name] = cluster.load_library(tmp / f"{name}.so")
    variants = [m for m in libs if m != "head"]
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
                       cluster._launch(s, ln, k, o, 0, lib)) for m in libs}
            fns["triton"] = lambda s=s, ln=ln: indexer_topk_triton(s, ln, k, config={})
            for m, f in fns.items():
                if not torch.equal(f(), want):
                    print("MISMATCH", m, dist, rows, flush=True)
                    bad += 1
            t = interleaved_median_ms(fns, warmup=3, iters=a.iters, graphs=True)
            table.append((dist, rows, t))
            print(dist, rows, {m: round(v * 1e3, 1) for m, v in t.items()}, flush=True)
    print("\n| dist | rows | head us | triton us | "
          + " | ".join(f"{m} us | {m} / head" for m in variants) + " |")
    print("|---|---:|---:|---:|" + "---:|---:|" * len(variants))
    for dist, rows, t in table:
        print(f"| {dist} | {rows} | {t['head'] * 1e3:.1f} | {t['triton'] * 1e3:.1f} | "
              + " | ".join(f"{t[m] * 1e3:.1f} | {t[m] / t['head']:.3f}" for m in variants)
              + " |")
    print(f"mismatches: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
