"""Probe: where the time of a DENSE sparse_prefill call goes (prefill, 8192 rows).

A DENSE call runs four launches: row statistics (``_row_stats``), per-slot counts of the dense
tiles' rows (``_count_slots``), the dense kernel (``_dense_fwd``) and the gathering kernel, which
skips the dense tiles. This probe times, in one interleaved window (CUDA-graph replays), the
table geometry, the H200 family, the family with each ``--dense`` threshold (the whole call), and
for the first threshold the prefixes of the call: statistics alone, statistics + counts, and
statistics + counts + dense kernel (so each launch's share is a difference of two columns).
Every whole call's output is checked against the family's.

    python benchmarks/probes/probe_dense_sparse.py [--kv 8192] [--groups 6,12] [--dense 250,200]
        [--tile 128x32x8x3]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_case(kv: int, g: int, dense: list[int], tile: str, iters: int) -> dict[str, float]:
    import torch
    import triton

    from backends.sparse_prefill import triton_kernels as tk
    from backends.sparse_prefill.bench import BenchCase, make_inputs
    from plugins.generic import sparse_prefill_table_config
    from plugins.nvidia_hopper import H200_PREFILL_CONFIGS
    from registry.tuning.timing import interleaved_median_ms

    x = make_inputs(BenchCase(kind="prefill", group_size=g, kv_len=kv, total_q=8192))
    q, k, v, idx, kw = x["q"], x["k"], x["v"], x["indices"], x["kwargs"]
    lens = kw["lengths"]
    fam = H200_PREFILL_CONFIGS[("prefill", g)]
    table = sparse_prefill_table_config(g, 8192)

    def call(cfg: dict[str, Any]) -> Callable[[], Any]:
        return lambda: tk.sparse_prefill_triton(q, k, v, idx, config=cfg, **kw)

    fns: dict[str, Callable[[], Any]] = {"table": call(table), "family": call(fam)}
    for n in dense:
        fns[f"family:dense{n}"] = call({**fam, "DENSE": n, "DENSE_TILE": tile})
    want = fns["family"]()
    for name, fn in fns.items():
        err = (fn().float() - want.float()).abs().max().item()
        if not err <= 2e-2:
            raise SystemExit(f"g{g} KV {kv} {name}: max abs err {err} against the family")
    total_q, topk, num_slots = q.shape[0], idx.shape[1], k.shape[0]
    bm = int(tile.split("x")[0])
    rp = bm // triton.next_power_of_2(g)
    lo = torch.empty((total_q,), device=q.device, dtype=torch.int32)
    hi, nv = torch.empty_like(lo), torch.empty_like(lo)
    cnt = torch.empty((total_q, (num_slots + 1) // 2), device=q.device, dtype=torch.int32)
    out = torch.empty_like(q)
    flag = torch.empty((-(-total_q // rp),), device=q.device, dtype=torch.int32)
    var = {**tk.DEFAULT_VARIANT, **fam, "DENSE": dense[0], "DENSE_TILE": tile}

    def stats() -> None:
        tk._row_stats[(total_q,)](idx, lens, lo, hi, nv, num_slots, topk, idx.stride(0),
                                  HAS_LENS=True, BLOCK=tk._DENSE_COUNT_BLOCK, num_warps=4)

    def stats_count() -> None:
        stats()
        tk._count_slots[(total_q,)](idx, lens, lo, hi, nv, cnt, flag, num_slots, topk, 0,
                                    total_q, dense[0], idx.stride(0), cnt.stride(0),
                                    HAS_LENS=True, RP=rp, RP_P=triton.next_power_of_2(rp),
                                    BLOCK=tk._DENSE_COUNT_BLOCK, num_warps=4)

    def dense_part() -> None:
        tk._dense(q, k, v, idx, lens, True, out, q.shape[2] ** -0.5 * tk._LOG2E, var, None,
                  256)

    fns[f"stats (dense{dense[0]})"] = stats
    fns[f"stats+counts (dense{dense[0]})"] = stats_count
    fns[f"stats+counts+dense kernel (dense{dense[0]})"] = dense_part
    return interleaved_median_ms(fns, warmup=3, iters=iters, graphs=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default="8192")
    ap.add_argument("--groups", default="6,12")
    ap.add_argument("--dense", default="250,200")
    ap.add_argument("--tile", default="128x32x8x3")
    ap.add_argument("--iters", type=int, default=15)
    a = ap.parse_args()
    from backends.sparse_prefill.bench import probe_grid, probe_header

    print(probe_header("graph replays, ms (x = table / provider)"))
    dense = [int(x) for x in a.dense.split(",")]
    for kv, g in probe_grid(a.kv, a.groups):
        res = run_case(kv, g, dense, a.tile, a.iters)
        print(f"\nKV {kv}, group {g}")
        for name, ms in res.items():
            print(f"  {name:48s} {ms:8.4f}  x {res['table'] / ms:5.2f}")


if __name__ == "__main__":
    main()
