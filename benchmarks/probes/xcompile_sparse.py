"""Cross-compile the sparse_prefill kernels for sm_90 with this machine's Triton (no GPU): every
launch the wrapper makes for each shipped config and seed shape is captured (not run), bound by
Triton's own launch binder (the same signature, specializations and constexprs a real launch
gets) and compiled; each kernel's SASS is normalized (addresses, the function name) and hashed.

    python3 benchmarks/probes/xcompile_sparse.py [--out digests.json] [--sass DIR]
        [--wgmma] [--geometry BMxBNxWxS[:opt...]]...

Run it on two trees and diff the JSON (``--compare A.json B.json``): equal digests mean the same
machine code. ``--wgmma`` compiles only the row-tile kernels (DENSE's and UNION's) and exits 1
when one's loop runs its wgmma serialized: ptxas then waits for every wgmma before the next
(its warning C7515, which Triton does not show; e.g. a loop that may run zero times leaves a
path defining the accumulators), which made those kernels 2-8% slower on the H200.

The configs: the H200 family (``plugins/nvidia_hopper.py``: prefill, wgmma, Gluon,
long-KV, dense, union), the shipped tuning table (``docs/tables/*.json``), the generic table
geometries and the sm120 plugin's, each at its bucket's kind and group; shapes at the seed's
head dim 256 and top-k 2051 (CPU tensors, never read).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)


def _sass(cubin: bytes) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout


def normalize(sass: str) -> str:
    """The instructions alone: no addresses, encodings, headers or the function's name."""
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*/\*", line)
        if m:
            out.append(re.sub(r"\s+", " ", m.group(1)))
    return "\n".join(out)


class Capture:
    """Replaces ``run`` of every JIT function of the given modules; records each launch."""

    def __init__(self, *modules: Any) -> None:
        from triton.runtime.jit import JITFunction

        self.launches: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self._saved: list[tuple[Any, Any]] = []
        for mod in modules:
            for obj in vars(mod).values():
                if isinstance(obj, JITFunction) or type(obj).__name__ == "GluonJITFunction":
                    self._saved.append((obj, obj.__dict__.get("run")))
                    obj.run = self._grab(obj)

    def _grab(self, fn: Any) -> Any:
        def run(*args: Any, grid: Any = None, warmup: bool = False, **kw: Any) -> None:
            self.launches.append((fn, args, kw))
        return run

    def restore(self) -> None:
        for obj, saved in self._saved:
            if saved is None:
                del obj.run
            else:
                obj.run = saved


def compile_launch(fn: Any, args: tuple[Any, ...], kw: dict[str, Any], target: Any) -> Any:
    """``triton.compile`` of one captured launch, bound as JITFunction.run binds it."""
    import triton
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kw = dict(kw)
    kw.setdefault("debug", False)
    bound, spec, options = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, options)
    if type(fn).__name__ == "GluonJITFunction":
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    src = Source(fn, signature, constexprs, attrs)
    return triton.compile(src, target=target, options=options.__dict__)


def wgmma_waits(norm: str) -> tuple[int, int]:
    """(wgmma instructions, how many of them are followed by a wait before the next one) in a
    normalized SASS listing: a pipelined loop waits once a group (1-2 per step), a serialized
    one after every wgmma."""
    lines = norm.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("HGMMA")]
    waits = sum(1 for a, b in itertools.pairwise(at)
                if any(line.startswith("WARPGROUP.DEPBAR") for line in lines[a:b]))
    return len(at), waits


#: the row-tile kernels --wgmma checks (their tables, their kernels)
ROW_TILE_TABLES = ("H200_DENSE_CONFIGS", "H200_UNION_CONFIGS")
ROW_TILE_KERNELS = ("_dense_fwd", "_union_fwd", "_union_ws")


def shipped_configs() -> list[tuple[str, str, int, int, dict[str, Any]]]:
    """(label, kind, group, kv_len, config) for every config kreg ships for sparse_prefill."""
    import glob

    import plugins.nvidia_hopper as hopper

    out: list[tuple[str, str, int, int, dict[str, Any]]] = []
    for name in ("H200_PREFILL_CONFIGS", "H200_WGMMA_CONFIGS", "H200_GLUON_CONFIGS",
                 "H200_LONG_KV_CONFIGS", "H200_DENSE_CONFIGS", "H200_UNION_CONFIGS"):
        for (kind, group), cfg in getattr(hopper, name, {}).items():
            kv = 131072 if "LONG" in name else 8192
            out.append((f"{name}[{kind},{group}]", kind, group, kv, dict(cfg)))
    import plugins.nvidia_sm120 as sm120
    from plugins.generic import sparse_prefill_table_config

    for group in (6, 12):
        for total_q in (64, 1024, 8192):   # the generic table's geometries
            out.append((f"generic.table[g{group},q{total_q}]", "prefill", group, 8192,
                        sparse_prefill_table_config(group, total_q)))
            out.append((f"generic.table[chunk,g{group},q{total_q}]", "chunk", group, 8192,
                        sparse_prefill_table_config(group, total_q)))
    for group, cfg in sm120.SM120_PREFILL_CONFIGS.items():
        for kind in ("prefill", "chunk"):
            out.append((f"SM120_PREFILL_CONFIGS[{kind},{group}]", kind, group, 8192, dict(cfg)))
    for path in sorted(glob.glob("docs/tables/*.json")):
        with open(path) as f:
            text = f.read()
        entries = json.loads(text)["entries"] if text.lstrip().startswith("{") else [
            json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]
        for e in entries:
            if e.get("op", "sparse_prefill") != "sparse_prefill" or "bucket" not in e:
                continue
            b = e["bucket"]
            if "group_size" not in b:
                continue
            out.append((f"{os.path.basename(path)}[{b['kind']},{b['group_size']},"
                        f"{b['kv_len']},{b['total_q']}]", b["kind"], b["group_size"],
                        b["kv_len"], dict(e["config"])))
    seen, uniq = set(), []
    for lab, kind, group, kv, cfg in out:
        key = (kind, group, kv >= 65536, json.dumps(cfg, sort_keys=True))
        if key not in seen:
            seen.add(key)
            uniq.append((lab, kind, group, kv, cfg))
    return uniq


def inputs(kind: str, group: int, kv_len: int, rows: int = 2048, topk: int = 2051,
           d: int = 256) -> tuple[tuple[Any, ...], dict[str, Any]]:
    import torch

    q = torch.zeros(rows, group, d, dtype=torch.bfloat16)
    k = torch.zeros(kv_len, 1, d, dtype=torch.bfloat16)
    v = torch.zeros(kv_len, 1, d, dtype=torch.bfloat16)
    idx = torch.zeros(rows, topk, dtype=torch.int32)
    lens = torch.full((rows,), topk, dtype=torch.int32)
    kw: dict[str, Any] = {"kind": kind, "lengths": lens}
    if kind == "chunk":
        page = 64
        kw.update(cu_seqlens_q=torch.tensor([0, rows], dtype=torch.int32),
                  prefix_lens=torch.tensor([kv_len - rows], dtype=torch.int32),
                  page_table=torch.arange(kv_len // page, dtype=torch.int32)[None],
                  page_size=page, max_q=rows)
    return (q, k, v, idx), kw


def extra_configs(specs: list[str], groups: tuple[int, ...] = (6, 12)
                  ) -> list[tuple[str, str, int, int, dict[str, Any]]]:
    """``--geometry`` candidates (the bench's ``BMxBNxWxS[:opt...]``, e.g. with ``:xh``) at
    prefill and chunk (``:pre`` added where the config needs translated slots), groups 6 and
    12, KV 8K: compiled like the shipped configs, before any GPU runs them."""
    from backends.sparse_prefill.bench import parse_geometry

    out = []
    for spec in specs:
        cfg = parse_geometry(spec)
        for kind in ("prefill", "chunk"):
            c = dict(cfg)
            if kind == "chunk" and (c.get("UNION") or c.get("DENSE")):
                if c.get("DENSE"):
                    continue   # DENSE runs on prefill rows only
                c["CHUNK_MODE"] = "pretranslate"
            for group in groups:
                out.append((f"extra[{kind},{group}] {spec}", kind, group, 8192, c))
    return out


def digests(sass_dir: str = "", wgmma: bool = False, extra: list[str] | None = None
            ) -> dict[str, str]:
    from triton.backends.compiler import GPUTarget

    from backends.sparse_prefill import gluon_kernels, triton_kernels, union_ws
    from backends.sparse_prefill.triton_kernels import sparse_prefill_triton

    mods = [triton_kernels, gluon_kernels, union_ws]
    try:
        from backends.sparse_prefill import tile_kernels
        mods.append(tile_kernels)
    except ImportError:
        pass
    target = GPUTarget("cuda", 90, 32)
    gluon_kernels.check_gluon = lambda q, engine="gluon": None   # no GPU here: nothing runs
    union_ws.unsupported = lambda *a: None   # (UNION_ENGINE="gluon_ws" on CPU tensors)
    cap = Capture(*mods)
    out: dict[str, str] = {}
    try:
        for lab, kind, group, kv, cfg in shipped_configs() + extra_configs(extra or []):
            if wgmma and not lab.startswith((*ROW_TILE_TABLES, "extra")):
                continue
            cap.launches.clear()
            args, kw = inputs(kind, group, kv)
            try:
                sparse_prefill_triton(*args, config=cfg, **kw)
            except Exception as exc:   # a config the wrapper refuses: recorded, not compiled
                out[lab] = f"refused: {type(exc).__name__}: {exc}"
                print(f"{lab:60s} refused: {exc}", flush=True)
                continue
            for i, (fn, fargs, fkw) in enumerate(cap.launches):
                name = f"{lab} #{i} {fn.fn.__name__}"
                if wgmma and fn.fn.__name__ not in ROW_TILE_KERNELS:
                    continue
                try:
                    ck = compile_launch(fn, fargs, fkw, target)
                    sass = _sass(ck.asm["cubin"])
                    norm = normalize(sass)
                    out[name] = hashlib.sha256(norm.encode()).hexdigest()[:16] + \
                        f" {norm.count(chr(10)) + 1} instr"
                    if wgmma:
                        n, w = wgmma_waits(norm)
                        serial = n < 8 or w > n // 4
                        out[name] = f"{'SERIALIZED' if serial else 'pipelined'}: {n} wgmma, " \
                                    f"{w} followed by a wait, {ck.metadata.shared} B smem"
                    if sass_dir:
                        os.makedirs(sass_dir, exist_ok=True)
                        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
                        with open(os.path.join(sass_dir, safe + ".sass"), "w") as f:
                            f.write(norm)
                except Exception as exc:
                    out[name] = f"FAILED: {type(exc).__name__}: {str(exc)[-300:]}"
                print(f"{name:80s} {out[name]}", flush=True)
    finally:
        cap.restore()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="", help="write the digests to this JSON file")
    ap.add_argument("--sass", default="", help="a folder for each launch's normalized SASS")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="diff two digest files")
    ap.add_argument("--wgmma", action="store_true",
                    help="the row-tile kernels only: exit 1 unless their wgmma run pipelined")
    ap.add_argument("--geometry", action="append", default=[],
                    help="also compile this bench geometry (BMxBNxWxS[:opt...], e.g. "
                         "8x16x1x2:rev:split2:v2:lean:o32:union300:dt128x64x8x2:xh) at both "
                         "kinds and groups 6 and 12; repeatable")
    a = ap.parse_args()
    if a.compare:
        with open(a.compare[0]) as f:
            da = json.load(f)
        with open(a.compare[1]) as f:
            db = json.load(f)
        same = sum(1 for key in da if db.get(key) == da[key])
        diff = sorted(key for key in set(da) | set(db) if da.get(key) != db.get(key))
        for key in diff:
            print(f"DIFFERS {key}\n    {da.get(key)}\n    {db.get(key)}")
        print(f"{same} launches identical, {len(diff)} differ or are missing on one side")
        return 1 if diff else 0
    sys.path.insert(0, os.getcwd())
    import click

    from backends.sparse_prefill.bench import parse_geometry

    for spec in a.geometry:
        try:
            parse_geometry(spec)
        except click.BadParameter as exc:
            ap.error(f"--geometry: {exc.message}")
    res = digests(a.sass, a.wgmma, a.geometry)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)
    bad = [k for k, v in res.items() if v.startswith("FAILED")]
    print(f"{len(res)} launches, {len(bad)} failed to compile")
    if a.wgmma:
        serial = [k for k, v in res.items() if v.startswith("SERIALIZED")]
        print(f"{len(res) - len(serial) - len(bad)} row-tile launches pipelined, "
              f"{len(serial)} serialized")
        bad += serial
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
