"""Probe: the wgmma kernel's ``TAIL_SPLIT`` (rows of the last partial wave cut into shorter
programs, merged by a second kernel) against the uncut kernel, the table and the family.

Every variant is checked against the fp32 reference (output poisoned with NaN first) and timed
in one window per case (CUDA-graph replays, interleaved). ``+N`` variants cut N more rows than
the last partial wave (``gluon_kernels.tail_rows`` patched for that variant only).

    python benchmarks/probe_wgmma_tail.py [--kv 32768] [--groups 12,6]
        [--rows 8192,16384,4096,2048,1024] [--tails 0,2,3,4] [--extra 330,660] [--prev FILE]
"""
from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _patched(extra: int, fn: Any) -> Any:
    """``fn`` run with ``tail_rows`` returning ``extra`` more rows (capped at all of them)."""
    from backends.sparse_prefill import gluon_kernels as gk

    def run() -> Any:
        orig = gk.tail_rows
        gk.tail_rows = lambda tq, hkv, slots, tail: min(tq, orig(tq, hkv, slots, tail) + extra)
        try:
            return fn()
        finally:
            gk.tail_rows = orig
    return run


def _with_module(path: str, fn: Any) -> Any:
    """``fn`` run with the wgmma launcher of the kernels file ``path`` (e.g. a previous
    commit's ``gluon_kernels.py``) in place of the installed one."""
    import importlib.util

    from backends.sparse_prefill import gluon_kernels as gk

    spec = importlib.util.spec_from_file_location("prev_gluon_kernels", path)
    assert spec is not None and spec.loader is not None
    prev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prev)

    def run() -> Any:
        orig = gk.sparse_prefill_gluon
        gk.sparse_prefill_gluon = prev.sparse_prefill_gluon
        try:
            return fn()
        finally:
            gk.sparse_prefill_gluon = orig
    return run


def main() -> None:
    import argparse

    import torch
    import triton

    from backends.sparse_prefill import triton_kernels as tk
    from backends.sparse_prefill.bench import BenchCase, make_inputs, probe_grid, probe_header
    from backends.sparse_prefill.reference import sparse_prefill_reference
    from plugins.generic import sparse_prefill_table_config
    from plugins.nvidia_hopper import family_config
    from registry._timing import interleaved_median_ms

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default="32768", help="KV lengths (comma list)")
    ap.add_argument("--groups", default="12,6", help="group sizes (comma list)")
    ap.add_argument("--rows", default="8192,16384,4096,2048,1024", help="query rows (comma list)")
    ap.add_argument("--tails", default="0,2,3,4", help="TAIL_SPLIT values (comma list)")
    ap.add_argument("--extra", default="330,660",
                    help="with TAIL_SPLIT=2, also cut this many more rows (comma list)")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--prev", default="", help="also time the wgmma kernel of this "
                    "gluon_kernels.py (e.g. from `git show REV:backends/sparse_prefill/"
                    "gluon_kernels.py`) as 'wg prev'")
    args = ap.parse_args()
    print(probe_header("graph replays, ms; err = max |out - fp32 reference|"))
    for kv, g in probe_grid(args.kv, args.groups):
        for rows in (int(x) for x in args.rows.split(",")):
            x = make_inputs(BenchCase(kind="prefill", group_size=g, kv_len=kv, total_q=rows))
            q, k, v, idx, kw = x["q"], x["k"], x["v"], x["indices"], x["kwargs"]
            ref = sparse_prefill_reference(q, k, v, idx, lengths=kw["lengths"],
                                           out_dtype=torch.float32)
            wg = {"BLOCK_M": 8 if g <= 8 else 16, "BLOCK_N": 64, "num_warps": 4,
                  "num_stages": 2, "ENGINE": "gluon_wgmma", "OFFS32": 1, "MAXNREG": 96}
            variants: dict[str, Any] = {
                "table": partial(tk.sparse_prefill_triton, q, k, v, idx,
                                 config=sparse_prefill_table_config(g, rows), **kw),
                "family": partial(tk.sparse_prefill_triton, q, k, v, idx,
                                  config=family_config("prefill", g, kv, rows,
                                                       triton.__version__), **kw)}
            for t in (int(s) for s in args.tails.split(",")):
                variants[f"wg t{t}"] = partial(tk.sparse_prefill_triton, q, k, v, idx,
                                               config={**wg, "TAIL_SPLIT": t}, **kw)
            if args.prev:
                variants["wg prev"] = _with_module(args.prev, partial(
                    tk.sparse_prefill_triton, q, k, v, idx, config=wg, **kw))
            for e in (int(s) for s in args.extra.split(",") if s):
                variants[f"wg t2 +{e}"] = _patched(e, partial(
                    tk.sparse_prefill_triton, q, k, v, idx, config={**wg, "TAIL_SPLIT": 2},
                    **kw))
            errs = {}
            for name, fn in variants.items():
                poison = torch.full_like(q, float("nan"))
                del poison  # the caching allocator hands this block to the output
                out = fn()
                torch.cuda.synchronize()
                errs[name] = (out.float() - ref).abs().max().item()
            res = interleaved_median_ms(variants, warmup=3, iters=args.iters, graphs=True)
            base = res["wg t0"] if "wg t0" in res else res["family"]
            print(f"\nprefill g{g} KV {kv}, {rows} rows: table / 1.3 = "
                  f"{res['table'] / 1.3:.4f} ms")
            for name, ms in res.items():
                print(f"  {name:14s} {ms:8.4f} ms  table/x {res['table'] / ms:5.3f}  "
                      f"t0/x {base / ms:5.3f}  err {errs[name]:.2e}")


if __name__ == "__main__":
    main()
