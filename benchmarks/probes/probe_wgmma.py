"""Probe: variants of the wgmma kernel (``ENGINE="gluon_wgmma"``) side by side.

A variant is a copy of ``backends/sparse_prefill/gluon_kernels.py`` with a changed kernel (e.g.
``git show REV:backends/sparse_prefill/gluon_kernels.py > /tmp/prev.py``), launched through the
product's wrapper with its ``sparse_prefill_gluon`` in place of the installed one, optionally
with config keys changed. Each is checked against the fp32 reference (the output poisoned with
NaN first) and timed next to the table geometry and the installed kernel, in one window per
case (CUDA-graph replays, interleaved).

    python benchmarks/probes/probe_wgmma.py --alt prev=/tmp/prev.py \\
        --alt r104=/tmp/var.py@MAXNREG=104 [--kv 32768] [--groups 12,6] [--rows 8192,16384]
"""
from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _load(path: str, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"probe_variant_{name}", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _with_launcher(mod: Any, fn: Any) -> Any:
    """``fn`` run with ``mod.sparse_prefill_gluon`` in place of the installed launcher."""
    from backends.sparse_prefill import gluon_kernels as gk

    def run() -> Any:
        orig = gk.sparse_prefill_gluon
        gk.sparse_prefill_gluon = mod.sparse_prefill_gluon
        try:
            return fn()
        finally:
            gk.sparse_prefill_gluon = orig
    return run


def _parse_alt(spec: str) -> tuple[str, str, dict[str, int]]:
    """``NAME=PATH[@KEY=VAL;KEY=VAL]`` -> (name, path, config overrides)."""
    name, rest = spec.split("=", 1)
    path, _, keys = rest.partition("@")
    over = {k: int(v) for k, v in (kv.split("=") for kv in keys.split(";") if kv)}
    return name, path, over


def main() -> None:
    import argparse

    import torch

    from backends.sparse_prefill import triton_kernels as tk
    from backends.sparse_prefill.bench import BenchCase, make_inputs, probe_grid, probe_header
    from backends.sparse_prefill.reference import sparse_prefill_reference
    from plugins.generic import sparse_prefill_table_config
    from registry.tuning.timing import interleaved_median_ms

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default="32768", help="KV lengths (comma list)")
    ap.add_argument("--groups", default="12,6", help="group sizes (comma list)")
    ap.add_argument("--rows", default="8192,16384", help="query rows (comma list)")
    ap.add_argument("--alt", action="append", default=[],
                    help="NAME=PATH[@KEY=VAL;...]: a variant kernels file (repeatable)")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    alts = [(name, _load(path, name), over) for name, path, over in map(_parse_alt, args.alt)]
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
                "wg": partial(tk.sparse_prefill_triton, q, k, v, idx, config=wg, **kw)}
            for name, mod, over in alts:
                variants[name] = _with_launcher(mod, partial(
                    tk.sparse_prefill_triton, q, k, v, idx, config={**wg, **over}, **kw))
            errs, res = {}, {}
            for name, fn in list(variants.items()):
                poison = torch.full_like(q, float("nan"))
                del poison  # the caching allocator hands this block to the output
                try:
                    out = fn()
                    torch.cuda.synchronize()
                except Exception as exc:  # a variant that does not build is reported
                    print(f"  {name}: {type(exc).__name__}: {str(exc)[:400]}")
                    del variants[name]
                    continue
                errs[name] = (out.float() - ref).abs().max().item()
            res = interleaved_median_ms(variants, warmup=3, iters=args.iters, graphs=True)
            print(f"\nprefill g{g} KV {kv}, {rows} rows: table / 1.3 = "
                  f"{res['table'] / 1.3:.4f} ms")
            for name, ms in res.items():
                print(f"  {name:16s} {ms:8.4f} ms  table/x {res['table'] / ms:5.3f}  "
                      f"wg/x {res['wg'] / ms:5.3f}  err {errs[name]:.2e}")


if __name__ == "__main__":
    main()
