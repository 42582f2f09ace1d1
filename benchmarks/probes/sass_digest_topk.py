"""A digest of the generated code of every indexer_topk launch of every shipped config, to show
that a change of the kernel source did not change what runs (no GPU needed).

For each config (the generic default of each shape, the MI355X policy's config as that device
resolves it, every entry of the shipped tuning tables, every point of the tuner's space at each
shape) and each shape (rows x keys, fp32, plus one bf16 shape), the launches the wrapper makes
are captured (not run, as in ``xcompile_topk.py``), compiled for the target, and one JSON line
is written per launch: config, shape, launch index, kernel, the sha256 of the normalized code
(SASS for sm_90: function names and the cubin's headers dropped; AMDGCN for gfx950: names,
``.loc``/``.file`` lines, comments and metadata dropped), instruction count and registers.
Identical launches are compiled once.

    python3 benchmarks/probes/sass_digest_topk.py --out after.jsonl [--target sm90|gfx950]
    PYTHONPATH=/path/to/old/tree python3 benchmarks/probes/sass_digest_topk.py --out before.jsonl
    python3 benchmarks/probes/sass_digest_topk.py --compare before.jsonl after.jsonl

``--compare`` matches the lines by (config, shape, launch, kernel) and prints how many are
identical (digest, registers and shared memory) and every one that differs or exists on one
side only; exit status 1 when any does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from xcompile_topk import _usage, capture_launches, compile_launch

TABLES = Path("docs") / "tables"


def _cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")


def normalized_sass(cubin: bytes) -> str:
    """The cubin's SASS without what a rename or a moved line changes: the ``Function :``
    headers, the dump's file headers, and every symbol name (``(name)`` operands)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
    keep = []
    for line in sass.splitlines():
        s = line.strip()
        if not s or s.startswith(("Function :", "code for", "Fatbin", "arch =", "code version",
                                  "host =", "compile_size", "producer", "identifier",
                                  ".headerflags", "=====")):
            continue
        keep.append(re.sub(r"`\([^)]*\)", "`(SYM)", s))
    return "\n".join(keep)


def normalized_amdgcn(asm: str) -> str:
    """AMDGCN's code without names and debug information: the instructions and branch labels
    of the function bodies in ``.text`` (each function's label to its ``.Lfunc_end``, without the
    ``.loc`` / ``.cfi`` directives, the debug-range labels ``.Ltmp*`` and comments) and the
    kernel descriptor's ``.amdhsa_*`` resource lines; the debug sections, which hold the
    source path and the names of the inlined functions, are left out."""
    keep, body, text = [], False, False
    for line in asm.splitlines():
        s = re.sub(r"\s*(;|//).*$", "", line.strip())
        if not s:
            continue
        if s.startswith((".text", ".section", ".amdgpu_metadata")):
            text = s.startswith(".text")
            body = False
            continue
        if text and re.match(r"[A-Za-z_][\w.$]*:$", s):
            body = True               # a function's label
            keep.append("FUNC:")
            continue
        if s.startswith(".Lfunc_end"):
            body = False
            continue
        if body:
            if not s.startswith((".loc", ".cfi", ".Ltmp", ".Lfunc_begin", ".file")):
                keep.append(s)
        elif s.startswith(".amdhsa_") and not s.startswith((".amdhsa_kernel",
                                                             ".amdhsa_kernarg_size")):
            keep.append(s)
    # Symbols (noinline callees' mangled names carry their constexpr values) as one name.
    return re.sub(r"[\w.]*triton_kernels\.\w+", "SYM", "\n".join(keep))


def kernarg_size(asm: str) -> int:
    """The AMDGCN kernel's argument block in bytes (left out of the code's digest)."""
    m = re.search(r"\.amdhsa_kernarg_size\s+(\d+)", asm)
    return int(m.group(1)) if m else -1


def _configs(rows_list: list[int], keys: int) -> list[tuple[str, dict[str, Any], list[int],
                                                           int]]:
    """(label, config, rows it is compiled at, SM count it is resolved for)."""
    import registry
    from backends.indexer_topk import tuning
    from backends.indexer_topk.bench import BenchCase
    from backends.indexer_topk.config import default_config
    from plugins.amd_mi355x import MI355X, MI355X_TOPK_CONFIG

    out: list[tuple[str, dict[str, Any], list[int], int]] = []
    for rows in rows_list:
        out.append(("generic", default_config(rows, keys, 2048, 132), [rows], 132))
    out.append(("mi355x", dict(MI355X_TOPK_CONFIG), rows_list, MI355X[1]))
    for path in sorted(TABLES.glob("*.json")):
        for e in registry.load_table(path):
            if e.op != "indexer_topk":
                continue
            b = e.bucket
            label = f"table:{path.stem}:{b['num_rows']}x{b['max_keys']}:{b['dtype']}"
            out.append((label, dict(e.config), rows_list, 132))
    facts = types.SimpleNamespace(sm_count=132)
    for rows in rows_list:
        case = BenchCase(rows=rows, keys=keys, k=2048, dtype="float32", dist="randn")
        for lab, cfg, _err in tuning.candidates(case, facts):
            if cfg is not None:
                out.append((f"tuner:{rows}:{lab}", dict(cfg), [rows], 132))
    return out


def digest(args: argparse.Namespace) -> int:
    from backends.indexer_topk import triton_kernels as tk

    hip = args.target == "gfx950"
    print(f"# kernels from {tk.__file__}", file=sys.stderr, flush=True)
    rows_list = [int(x) for x in args.rows.split(",")]
    done: dict[str, dict[str, Any]] = {}
    bad = 0
    with open(args.out, "w") as out:
        for label, cfg, at_rows, sms in _configs(rows_list, args.keys):
            # Each config at its rows in fp32, and in bf16 at the bf16 shape's rows.
            shapes = [(r, "float32") for r in at_rows]
            if args.bf16_rows in at_rows:
                shapes.append((args.bf16_rows, "bfloat16"))
            keys = args.keys
            for rows, dtype in shapes:
                launches = capture_launches(tk, rows, keys, dtype, cfg, sm_count=sms, hip=hip)
                for i, launch in enumerate(launches):
                    key = hashlib.sha256(repr(launch.key()).encode()).hexdigest()
                    rec = done.get(key)
                    if rec is None:
                        try:
                            ck = compile_launch(launch, args.target)
                        except Exception as exc:   # a failure is a result: record it
                            bad += 1
                            rec = {"digest": "FAILED", "error": str(exc)[-800:]}
                        else:
                            if hip:
                                text = normalized_amdgcn(ck.asm["amdgcn"])
                                m = re.search(r"\.vgpr_count:\s+(\d+)", ck.asm["amdgcn"])
                                regs = f"vgpr {m.group(1)}" if m else "?"
                                extra = {"kernarg": kernarg_size(ck.asm["amdgcn"])}
                            else:
                                text = normalized_sass(ck.asm["cubin"])
                                regs = _usage(ck.asm["cubin"])
                                extra = {}
                            rec = {"digest": hashlib.sha256(text.encode()).hexdigest(),
                                   "instructions": text.count("\n") + 1, "regs": regs,
                                   "shared": ck.metadata.shared, **extra}
                        done[key] = rec
                    line = {"config": label, "shape": f"{rows}x{keys}:{dtype}", "launch": i,
                            "kernel": launch.name, **rec}
                    out.write(json.dumps(line, sort_keys=True) + "\n")
                    out.flush()
                    print(f"{label:60s} {rows:5d}x{keys} {dtype:8s} #{i} {launch.name:15s} "
                          f"{rec['digest'][:16]}", flush=True)
    print(f"# {len(done)} distinct compiles, {bad} failed", file=sys.stderr)
    return 1 if bad else 0


def compare(before: str, after: str) -> int:
    def load(p: str) -> dict[tuple[str, str, int, str], dict[str, Any]]:
        recs = {}
        with open(p) as f:
            for line in f:
                r = json.loads(line)
                recs[(r["config"], r["shape"], r["launch"], r["kernel"])] = r
        return recs

    a, b = load(before), load(after)

    def sig(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["digest"], r.get("regs"), r.get("shared")

    same = [key for key in a if key in b and sig(a[key]) == sig(b[key])
            and a[key]["digest"] != "FAILED"]
    differ = [key for key in a if key in b and key not in same]
    args = [key for key in same if a[key].get("kernarg") != b[key].get("kernarg")]
    only_a = sorted(set(a) - set(b))
    only_b = sorted(set(b) - set(a))
    configs = {key[0] for key in a} | {key[0] for key in b}
    print(f"{len(a)} launches before, {len(b)} after, {len(configs)} configs; identical: "
          f"{len(same)}; different: {len(differ)}; only before: {len(only_a)}; only after: "
          f"{len(only_b)}; distinct digests: {len({a[k]['digest'] for k in same})}; identical "
          f"code with another argument-block size: {len(args)}")
    for key in args:
        print("SAME CODE, ARGUMENTS", key, a[key].get("kernarg"), "->", b[key].get("kernarg"))
    for key in differ:
        print("DIFFERENT", key, a[key].get("instructions"), "->", b[key].get("instructions"),
              a[key].get("error", ""), b[key].get("error", ""))
    for key in only_a:
        print("ONLY BEFORE", key)
    for key in only_b:
        print("ONLY AFTER", key)
    return 0 if not (differ or only_a or only_b) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="sass_digest.jsonl")
    ap.add_argument("--target", default="sm90", choices=("sm90", "gfx950"))
    ap.add_argument("--rows", default="1,64,1024,4096")
    ap.add_argument("--keys", type=int, default=131072)
    ap.add_argument("--bf16-rows", type=int, default=1024,
                    help="rows of the one bf16 shape (0: none)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    return digest(args)


if __name__ == "__main__":
    sys.exit(main())
