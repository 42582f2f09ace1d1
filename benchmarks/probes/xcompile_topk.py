"""Cross-compile the indexer_topk kernels for sm_90 with this machine's Triton (no GPU): the
launches the wrapper makes for each shape are captured (not run) and compiled, and registers,
spills and shared memory printed per kernel.

    python3 benchmarks/probes/xcompile_topk.py [--rows 1,64,1024,4096] [--keys 131072]
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)


def _usage(cubin: bytes) -> str:
    """REG / STACK / local bytes of a cubin, from the cuobjdump Triton ships."""
    import re
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                             text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
    return f"regs {m.group(1):>3s} stack {m.group(2):>4s} local {m.group(4):>4s}" if m else res


def _local_per_function(cubin: bytes, path: str) -> str:
    """Writes the SASS to ``path``; returns 'function: instructions, STL/LDL' per function."""
    import re
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(sass)
    parts, name, n, loc = [], None, 0, 0
    for line in sass.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            if name:
                parts.append(f"{name[:28]}: {n} instr, {loc} STL/LDL")
            name, n, loc = m.group(1), 0, 0
        elif re.search(r"/\*[0-9a-f]{4,}\*/", line):
            n += 1
            loc += bool(re.search(r"\b(STL|LDL)\b", line))
    if name:
        parts.append(f"{name[:28]}: {n} instr, {loc} STL/LDL")
    return "; ".join(parts)


def main() -> int:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from backends.indexer_topk import triton_kernels as tk

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,64,1024,4096")
    ap.add_argument("--keys", type=int, default=131072)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--config", default="", help="KEY=VAL:KEY=VAL over the defaults")
    ap.add_argument("--inline-tiers", action="store_true",
                    help="the rare tiers inlined in the row / select kernels (_TIE_LAUNCH off)")
    ap.add_argument("--sass", default="", help="a folder: each kernel's SASS written there, and "
                    "its local-memory instructions (STL/LDL) counted per function")
    a = ap.parse_args()
    cfg = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in a.config.split(":") if kv}
    captured = []
    kernels = [tk._gmax_kernel, tk._row_kernel, tk._select_kernel, tk._place_kernel,
               tk._bound_kernel] + [getattr(tk, n) for n in ("_tie_kernel",) if hasattr(tk, n)]
    if a.inline_tiers:
        tk._TIE_LAUNCH = False

    def grab(fn):
        def run(*args, grid=None, warmup=False, **kw):
            captured.append((fn, args, kw))
        return run

    for fn in kernels:
        fn.run = grab(fn)
    tpt = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16",
           torch.int32: "*i32"}
    bad = 0
    for rows in [int(x) for x in a.rows.split(",")]:
        captured.clear()
        s = torch.zeros(rows, a.keys, dtype=getattr(torch, a.dtype))
        ln = torch.full((rows,), a.keys, dtype=torch.int32)
        tk.indexer_topk_triton(s, ln, 2048, config=cfg)
        for fn, args, kw in captured:
            names = list(inspect.signature(fn.fn).parameters)
            opts = {k: kw.pop(k) for k in ("num_warps", "maxnreg") if k in kw}
            const = {k: v for k, v in kw.items()}
            sig, attrs = {}, {}
            for i, (n, v) in enumerate(zip(names, args, strict=False)):
                if isinstance(v, torch.Tensor):
                    sig[n] = tpt[v.dtype]
                    attrs[(i,)] = [["tt.divisibility", 16]]
                else:
                    sig[n] = "i32" if -2**31 <= int(v) < 2**31 else "i64"
                    if int(v) % 16 == 0 and int(v) != 0:
                        attrs[(i,)] = [["tt.divisibility", 16]]
            for n in names[len(args):]:
                if n in const:
                    sig[n] = "constexpr"
            for n in names:
                if n not in sig:   # constexpr left at its default
                    sig[n] = "constexpr"
                    const[n] = inspect.signature(fn.fn).parameters[n].default
            try:
                ck = triton.compile(ASTSource(fn, sig, const, attrs),
                                    target=GPUTarget("cuda", 90, 32), options=opts)
                print(f"rows {rows:5d} {fn.fn.__name__:15s} {_usage(ck.asm['cubin'])} "
                      f"shared {ck.metadata.shared:6d} {opts}", flush=True)
                if a.sass:
                    print("    " + _local_per_function(ck.asm["cubin"], os.path.join(
                        a.sass, f"{fn.fn.__name__}_{rows}.sass")), flush=True)
            except Exception as e:
                bad += 1
                print(f"rows {rows:5d} {fn.fn.__name__:15s} FAILED: {str(e)[-1500:]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
