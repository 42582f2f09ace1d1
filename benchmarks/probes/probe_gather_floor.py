"""Probe: the gather floor of sparse_prefill, a kernel that only gathers (prefill, 8192 rows).

Every selected entry of sparse_prefill moves one K row and one V row (2 x head_dim bf16) from L2
or HBM into an SM; the softmax and the two products are extra work on top. This probe times a
Triton kernel that does only the gathers (one program per row, BLOCK_N entries a step, the K and
V rows summed into a register tile, one [head_dim] sum stored per row so nothing is dead code)
at several (BLOCK_N, warps) shapes, next to the table geometry and the H200 family, in one
interleaved window (CUDA-graph replays): the fastest shape is the floor any kernel that gathers
the same bytes works against, and ``table / 1.3`` against it says how close to that floor the
1.3x goal asks a kernel to run.

    python benchmarks/probes/probe_gather_floor.py [--kv 8192,32768] [--groups 6]

``--total-q`` (default 8192) takes a list: per-row times (ms per 1000 rows) that stay flat
across row counts that fill a whole number of waves (8 one-warp programs an SM: 1056 on 132
SMs, e.g. 7392, 8448) and ones that do not (8192) say that wave quantization costs nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton
import triton.language as tl


@triton.jit
def _gather_only(K, V, IDX, LENS, OUT, num_slots, topk, s_kt, s_it, HEAD_DIM: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(LENS + r), 0), topk)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for start in range(0, n, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        t = tl.load(IDX + r * s_it + j, mask=j < n, other=-1)
        ok = (t >= 0) & (t < num_slots)
        off = tl.where(ok, t, 0) * s_kt
        k = tl.load(K + off[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(V + off[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(OUT + r * HEAD_DIM + offs_d, tl.sum(acc, 0))


def run_case(kv: int, g: int, shapes: list[str], iters: int,
             total_q: int = 8192) -> dict[str, float]:
    import torch

    from backends.sparse_prefill import triton_kernels as tk
    from backends.sparse_prefill.bench import BenchCase, make_inputs
    from plugins.generic import sparse_prefill_table_config
    from plugins.nvidia_hopper import H200_PREFILL_CONFIGS
    from registry.tuning.timing import interleaved_median_ms

    x = make_inputs(BenchCase(kind="prefill", group_size=g, kv_len=kv, total_q=total_q))
    q, k, v, idx, kw = x["q"], x["k"], x["v"], x["indices"], x["kwargs"]
    out = torch.empty((q.shape[0], k.shape[2]), device=q.device, dtype=torch.float32)
    table = sparse_prefill_table_config(g, 8192)
    fam = H200_PREFILL_CONFIGS[("prefill", g)]
    fns = {"table": lambda: tk.sparse_prefill_triton(q, k, v, idx, config=table, **kw),
           "family (no DENSE)": lambda: tk.sparse_prefill_triton(q, k, v, idx, config=fam, **kw)}
    for shape in shapes:
        bn, w = map(int, shape.split("x"))
        fns[f"gather only {bn}x{w}w"] = (
            lambda bn=bn, w=w: _gather_only[(q.shape[0],)](
                k, v, idx, kw["lengths"], out, k.shape[0], idx.shape[1], k.stride(0),
                idx.stride(0), HEAD_DIM=k.shape[2], BLOCK_N=bn, num_warps=w))
    return interleaved_median_ms(fns, warmup=3, iters=iters, graphs=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default="8192,32768")
    ap.add_argument("--groups", default="6")
    ap.add_argument("--shapes", default="16x1,32x1,16x2,32x2,32x4,64x4,64x8")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--total-q", default="8192")
    a = ap.parse_args()
    from backends.sparse_prefill.bench import probe_grid, probe_header

    print(probe_header("graph replays, ms"))
    for kv, g in probe_grid(a.kv, a.groups):
        for tq in (int(x) for x in a.total_q.split(",")):
            res = run_case(kv, g, a.shapes.split(","), a.iters, tq)
            floor = min(ms for n, ms in res.items() if n.startswith("gather only"))
            print(f"\nKV {kv}, group {g}, {tq} rows: table / 1.3 = {res['table'] / 1.3:.4f} ms; "
                  f"the fastest gather-only time is {floor / (res['table'] / 1.3):.1%} of it")
            for name, ms in res.items():
                print(f"  {name:28s} {ms:8.4f}  floor/x {floor / ms:6.1%}  "
                      f"{ms / tq * 1000:.4f} ms per 1000 rows")


if __name__ == "__main__":
    main()
