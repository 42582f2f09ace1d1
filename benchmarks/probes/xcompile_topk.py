"""Cross-compile the indexer_topk kernels for sm_90 with this machine's Triton (no GPU): the
launches the wrapper makes for each shape are captured (not run) and compiled, and registers,
spills and shared memory printed per kernel.

    python3 benchmarks/probes/xcompile_topk.py [--rows 1,64,1024,4096] [--keys 131072]
        [--config KEY=VAL:...] [--target sm90|gfx950] [--sass DIR]

``capture_launches`` and ``compile_launch`` serve ``sass_digest_topk.py`` too.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from typing import Any

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


class Launch:
    """One captured kernel launch: the JIT function, its positional arguments and keywords
    (constexprs and launch options), and what ``triton.compile`` needs for it."""

    def __init__(self, fn: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
        self.fn, self.args, self.kw = fn, args, dict(kw)
        self.name = fn.fn.__name__

    def source(self) -> tuple[dict[str, str], dict[str, Any], dict[Any, Any], dict[str, Any]]:
        """(signature, constexprs, attributes, options) as the JIT specializes this launch:
        tensors ``tt.divisibility=16`` (the allocator's alignment), ints by range and by
        divisibility by 16, constexprs left out of the call at their defaults."""
        import torch

        tpt = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16",
               torch.int32: "*i32"}
        kw = dict(self.kw)
        params = inspect.signature(self.fn.fn).parameters
        names = list(params)
        opts = {k: kw.pop(k) for k in ("num_warps", "maxnreg", "launch_pdl") if k in kw}
        const = dict(kw)
        sig: dict[str, str] = {}
        attrs: dict[Any, Any] = {}
        for i, (n, v) in enumerate(zip(names, self.args, strict=False)):
            if isinstance(v, torch.Tensor):
                sig[n] = tpt[v.dtype]
                attrs[(i,)] = [["tt.divisibility", 16]]
            else:
                sig[n] = "i32" if -2**31 <= int(v) < 2**31 else "i64"
                if int(v) % 16 == 0 and int(v) != 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        for n in names[len(self.args):]:
            if n in const:
                sig[n] = "constexpr"
        for n in names:
            if n not in sig:   # constexpr left at its default
                sig[n] = "constexpr"
                const[n] = params[n].default
        return sig, const, attrs, opts

    def key(self) -> tuple[Any, ...]:
        sig, const, attrs, opts = self.source()
        return (self.name, sorted(sig.items()), sorted(const.items()),
                sorted((k, repr(v)) for k, v in attrs.items()), sorted(opts.items()))


def capture_launches(tk: Any, rows: int, keys: int, dtype: str, cfg: dict[str, Any], *,
                     sm_count: int | None = None, hip: bool = False,
                     pdl: bool = False) -> list[Launch]:
    """The launches ``tk.indexer_topk_triton`` makes for ``rows x keys`` full rows of
    ``dtype`` under ``cfg``, captured instead of run. ``sm_count``: the device's SMs (CUs) the
    wrapper sizes the keys a config leaves out for (132 otherwise, as without a GPU); ``hip``:
    as on a ROCm build of torch (no ``maxnreg``); ``pdl``: as on a device with programmatic
    dependent launches (the four-launch path's chain)."""
    import torch

    captured: list[Launch] = []

    def grab(fn: Any) -> Any:
        def run(*args: Any, grid: Any = None, warmup: bool = False, **kw: Any) -> None:
            captured.append(Launch(fn, args, kw))
        return run

    kernels = [v for n, v in vars(tk).items() if n.endswith("_kernel") and hasattr(v, "run")]
    saved = [(fn, fn.__dict__.get("run")) for fn in kernels]
    old_sms, old_hip, old_pdl = tk._sm_count, torch.version.hip, tk._pdl_ok
    try:
        if pdl:
            tk._pdl_ok = lambda dev: True
        for fn in kernels:
            fn.run = grab(fn)
        if sm_count is not None:
            tk._sm_count = lambda dev: sm_count
        if hip:
            torch.version.hip = "7.0.0"
        s = torch.zeros(rows, keys, dtype=getattr(torch, dtype))
        ln = torch.full((rows,), keys, dtype=torch.int32)
        tk.indexer_topk_triton(s, ln, 2048, config=cfg)
    finally:
        tk._sm_count = old_sms
        tk._pdl_ok = old_pdl
        torch.version.hip = old_hip
        for fn, run in saved:
            if run is None:
                del fn.run
            else:
                fn.run = run
    return captured


def compile_launch(launch: Launch, target: str = "sm90") -> Any:
    """``triton.compile`` of a captured launch for sm_90 (``"sm90"``) or gfx950 (``"gfx950"``,
    wave 64)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, const, attrs, opts = launch.source()
    if target == "gfx950":
        opts.pop("maxnreg", None)
        gpu = GPUTarget("hip", "gfx950", 64)
    else:
        gpu = GPUTarget("cuda", 90, 32)
    return triton.compile(ASTSource(launch.fn, sig, const, attrs), target=gpu, options=opts)


def main() -> int:
    from backends.indexer_topk import triton_kernels as tk

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,64,1024,4096")
    ap.add_argument("--keys", type=int, default=131072)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--config", default="", help="KEY=VAL:KEY=VAL over the defaults")
    ap.add_argument("--inline-tiers", action="store_true",
                    help="the rare tiers inlined in the row / select kernels (_TIE_LAUNCH off)")
    ap.add_argument("--target", default="sm90", choices=("sm90", "gfx950"),
                    help="gfx950: Triton's AMD backend (wave 64), registers not printed")
    ap.add_argument("--pdl", action="store_true",
                    help="the four-launch path's kernels as on a device with programmatic "
                         "dependent launches (sm_90)")
    ap.add_argument("--sass", default="", help="a folder: each kernel's SASS written there, and "
                    "its local-memory instructions (STL/LDL) counted per function")
    a = ap.parse_args()
    cfg = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in a.config.split(":") if kv}
    if a.inline_tiers:
        tk._TIE_LAUNCH = False
    hip = a.target == "gfx950"
    bad = 0
    for rows in [int(x) for x in a.rows.split(",")]:
        for launch in capture_launches(tk, rows, a.keys, a.dtype, cfg, hip=hip, pdl=a.pdl):
            opts = launch.source()[3]
            try:
                ck = compile_launch(launch, a.target)
                usage = "" if hip else _usage(ck.asm["cubin"])
                print(f"rows {rows:5d} {launch.name:15s} {usage} "
                      f"shared {ck.metadata.shared:6d} {opts}", flush=True)
                if a.sass and not hip:
                    print("    " + _local_per_function(ck.asm["cubin"], os.path.join(
                        a.sass, f"{launch.name}_{rows}.sass")), flush=True)
            except Exception as e:
                bad += 1
                print(f"rows {rows:5d} {launch.name:15s} FAILED: {str(e)[-1500:]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
