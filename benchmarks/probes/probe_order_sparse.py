"""Probe: does gathering each row's K/V in slot order make sparse_prefill faster?

The programs that run at the same time (one wave: 132 SMs x resident programs) each walk their
row's selected slots. In the benchmark's affine walk (and in an indexer's top-k, which comes out
in score order) those slots are in no particular order, so at KV 32K/128K (32-128 MiB of K/V per
head; the H200's L2 holds 50 MiB) a wave touches all of the KV at every moment. If every row
walks its slots in ascending order, a wave sweeps the KV together. This probe times, in one
interleaved window (CUDA-graph replays, 8192 rows), the table geometry, the H200 family, the
family with ``SLOT_ORDER=1`` (the ordering pre-pass inside the timed call), the family on
indices sorted exactly ahead of time (kernel only: the bound), the pre-pass alone, and
``--extra`` geometries; every output is checked against the family's.

    python benchmarks/probes/probe_order_sparse.py [--kind prefill] [--kv 8192,32768,131072]
        [--groups 6,12] [--extra GEOM,...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_case(kind: str, kv: int, g: int, extra: list[str], iters: int,
             order_variants: list[str]) -> dict[str, float]:
    """Median ms of every provider of one (kind, KV length, group) case at 8192 rows."""
    import torch

    from backends.sparse_prefill import triton_kernels as tk
    from backends.sparse_prefill.bench import BenchCase, make_inputs, parse_geometry
    from plugins.generic import sparse_prefill_table_config
    from plugins.nvidia_hopper import H200_PREFILL_CONFIGS
    from registry.tuning.timing import interleaved_median_ms

    x = make_inputs(BenchCase(kind=kind, group_size=g, kv_len=kv, total_q=8192))
    q, k, v, idx, kw = x["q"], x["k"], x["v"], x["indices"], x["kwargs"]
    lens, ns = kw["lengths"], k.shape[0]
    fam = H200_PREFILL_CONFIGS[(kind, g)]
    cfgs = {"table": sparse_prefill_table_config(g, 8192), "family": fam,
            "family:ord1": {**fam, "SLOT_ORDER": 1}}
    for gs in extra:
        cfg = parse_geometry(gs)
        if cfg["BLOCK_M"] >= g:
            cfgs[gs] = cfg
    fns: dict[str, Callable[[], Any]] = {
        n: (lambda c=c: tk.sparse_prefill_triton(q, k, v, idx, config=c, **kw))
        for n, c in cfgs.items()}
    if kind == "prefill":
        j = torch.arange(idx.shape[1], device=idx.device)
        ok = (j[None, :] < lens[:, None]) & (idx >= 0) & (idx < ns)
        sidx = torch.where(ok, idx, torch.full_like(idx, 2**31 - 1)).sort(dim=1).values
        skw = {**kw, "lengths": ok.sum(1, dtype=torch.int32)}
        fns["family, exact sort ahead"] = lambda: tk.sparse_prefill_triton(
            q, k, v, sidx, config=fam, **skw)
        fns["ord1 pre-pass alone"] = lambda: tk._order_rows(idx, lens, ns)
        want = tk._order_rows(idx, lens, ns)
        for ov in order_variants:  # BLOCKxWARPS of the pre-pass, one pass
            bl, nw = map(int, ov.split("x"))
            got = tk._order_rows(idx, lens, ns, block=bl, num_warps=nw)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), ov
            fns[f"ord1 pre-pass alone {ov}"] = (
                lambda bl=bl, nw=nw: tk._order_rows(idx, lens, ns, block=bl, num_warps=nw))
    ref = fns["family"]().float()
    for name, fn in fns.items():
        if "alone" not in name:
            err = (fn().float() - ref).abs().max().item()
            assert err <= 2e-2, f"{name}: max-abs {err} against the family"
    return interleaved_median_ms(fns, warmup=3, iters=iters, graphs=True)


def main() -> int:
    import torch
    import triton

    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="prefill")
    ap.add_argument("--kv", default="8192,32768,131072")
    ap.add_argument("--groups", default="6,12")
    ap.add_argument("--extra", default="", help="comma-separated geometries (those with "
                                                 "BLOCK_M below the group are skipped)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--order-variants", default="", help="BLOCKxWARPS,... of the pre-pass")
    a = ap.parse_args()
    rows: list[tuple[int, int, str, float, float]] = []
    for kv in map(int, a.kv.split(",")):
        for g in map(int, a.groups.split(",")):
            ms = run_case(a.kind, kv, g, list(filter(None, a.extra.split(","))), a.iters,
                          list(filter(None, a.order_variants.split(","))))
            print(f"{a.kind} kv={kv} g={g}: "
                  + ", ".join(f"{n} {t:.3f}" for n, t in ms.items()), flush=True)
            rows += [(kv, g, n, t, ms["table"] / t) for n, t in ms.items()]
            torch.cuda.empty_cache()
    print(f"\n{a.kind}, 8192 rows: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    print(f"{'kv':>7} {'g':>3} {'provider':<48} {'ms':>8} {'table/x':>8}")
    for kv, g, name, t, r in rows:
        print(f"{kv:>7} {g:>3} {name:<48} {t:8.3f} {r:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
