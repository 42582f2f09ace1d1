"""Where the union path's time goes (issue 26): the GPU time of every kernel a sparse_prefill
call launches, per config, from torch.profiler over several calls (kernel time, launch gaps
excluded), beside the call's CUDA-graph replay time.

    python3 benchmarks/probes/union_phases.py --kind prefill --group-size 6 --kv-len 8192 \
        --indices topk --configs "h200,geometry=8x16x1x2:rev:split2:v2:lean:o32:union300"

Providers are `kreg bench sparse_prefill`'s (``h200``, ``table``, ``geometry=...``,
``config=...``); ``--old PATHS`` (copies of an earlier ``tile_kernels.py`` and/or
``triton_kernels.py``, comma-separated) adds each provider again as ``NAME@old``, run with those
modules (an earlier ``triton_kernels.py`` alone runs on the current row tiles), or only the
``NAME@old`` ones ``--configs`` names; ``@old`` is
the only suffix a provider takes, and any other ends the probe before GPU work. Every output is
checked against the fp32 reference first (the bench's rule); then all providers are timed in one
interleaved window of CUDA-graph replays (``registry.tuning.measure``), and each is profiled: one
line per (provider, kernel) with launches and GPU us per op call and its share.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.getcwd())

#: a provider's suffixes (module doc)
_SUFFIXES = {"old"}


def case_args(ap: argparse.ArgumentParser) -> None:
    """The bench case's options (kind, group, KV length, rows), shared with union_sizes.py."""
    ap.add_argument("--kind", default="prefill")
    ap.add_argument("--group-size", type=int, default=6)
    ap.add_argument("--kv-len", type=int, default=8192)
    ap.add_argument("--total-q", type=int, default=8192)


def main() -> int:
    import torch

    from backends.sparse_prefill.bench import BenchCase, index_overlap, make_inputs, parse_provider
    from backends.sparse_prefill.compare import max_abs_error
    from backends.sparse_prefill.reference import sparse_prefill_reference
    from backends.sparse_prefill.triton_kernels import sparse_prefill_triton

    ap = argparse.ArgumentParser()
    case_args(ap)
    ap.add_argument("--indices", default="topk")
    ap.add_argument("--overlap", type=float, default=0.95)
    ap.add_argument("--configs", required=True, help="comma-separated bench providers")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--old", default="", help="earlier kernel files to compare")
    a = ap.parse_args()
    for prov in a.configs.split(","):
        if set(prov.split("@")[1:]) - _SUFFIXES:
            ap.error(f"--configs: {prov!r} has an unknown suffix; expected any of "
                     f"{', '.join('@' + s for s in sorted(_SUFFIXES))} after the provider")
    for prov in a.configs.split(","):
        if "old" in prov.split("@")[1:] and not a.old:
            ap.error(f"--configs: {prov!r} runs the earlier kernels, which --old PATHS names "
                     f"(copies of an earlier tile_kernels.py and/or triton_kernels.py)")
    import importlib.util
    import inspect

    import backends.sparse_prefill.triton_kernels as tk
    from registry.tuning import Trial, measure

    new_rows = tk.row_tiles
    old_rows = old_entry = None
    for n, path in enumerate(a.old.split(",") if a.old else []):
        spec = importlib.util.spec_from_file_location(f"kreg_old_kernels{n}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if hasattr(mod, "sparse_prefill_triton"):
            old_entry = mod
        else:
            old_rows = mod.row_tiles
    if old_entry is not None:  # the earlier entry point, on the earlier row tiles if given
        if old_rows is not None:
            old_entry.row_tiles = old_rows
        old_rows = new_rows
    elif old_rows is not None:  # the current entry point on the earlier row tiles
        rows0 = old_rows
        takes_chunk = "chunk_ids" in inspect.signature(rows0).parameters

        def old_rows(*args, chunk_ids=None, rows0=rows0):  # type: ignore[no-redef]
            if chunk_ids is None:
                return rows0(*args)
            if not takes_chunk:
                raise SystemExit("--old: that tile_kernels.py has no position-space union")
            return rows0(*args, chunk_ids=chunk_ids)
    case = BenchCase(kind=a.kind, group_size=a.group_size, kv_len=a.kv_len, total_q=a.total_q,
                     indices=a.indices, overlap=a.overlap)
    inp = make_inputs(case, "cuda")
    q, k, v, idx, kw = inp["q"], inp["k"], inp["v"], inp["indices"], inp["kwargs"]
    print(f"# {case.label()} {index_overlap(case, inp)}", flush=True)
    ref = sparse_prefill_reference(q, k, v, idx, out_dtype=torch.float32, **kw)
    provs = a.configs.split(",")
    if old_rows is not None and not any("old" in p.split("@")[1:] for p in provs):
        provs += [p + "@old" for p in provs]   # unless --configs names its @old ones
    calls = {}
    for prov in provs:
        base, *flags = prov.split("@")
        old = "old" in flags
        kind, cfg = parse_provider(base, case)
        if kind != "triton":
            print(f"{prov}: not a Triton config ({kind}), skipped")
            continue

        def call(cfg=cfg, rows=old_rows if old else new_rows,
                 entry=old_entry.sparse_prefill_triton if old and old_entry is not None
                 else sparse_prefill_triton):
            tk.row_tiles = rows
            try:
                return entry(q, k, v, idx, config=dict(cfg), **kw)
            finally:
                tk.row_tiles = new_rows

        err = max_abs_error(call().float(), ref)
        print(f"{prov}: max err {err:.2e}", flush=True)
        calls[prov] = call
    import registry

    trials = [Trial(p, fn, runs=p) for p, fn in calls.items()]
    res = measure(trials, expected=ref,
                  compare=registry.get_registry().spec("sparse_prefill").load_compare(),
                  metric=max_abs_error, warmup=3, iters=12, graphs=True, baseline=provs[0])
    print(f"{'provider':84s} {'ms':>8s} {'x':>6s} status")
    for m in res:
        print(f"{m.label[:84]:84s} {m.ms if m.ms is not None else float('nan'):8.3f} "
              f"{m.ratio if m.ratio is not None else float('nan'):6.3f} {m.status} {m.timing}",
              flush=True)
    for prov, call in calls.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(a.iters):
                call()
            torch.cuda.synchronize()
        tot: dict[str, float] = defaultdict(float)
        cnt: dict[str, int] = defaultdict(int)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                tot[ev.name] += ev.device_time
                cnt[ev.name] += 1
        ksum = sum(tot.values()) / a.iters
        print(f"{prov}: kernels {ksum:.1f} us", flush=True)
        for name, t in sorted(tot.items(), key=lambda x: -x[1]):
            print(f"    {name[:60]:60s} x{cnt[name] / a.iters:4.1f} {t / a.iters:9.1f} us "
                  f"{100 * t / a.iters / max(ksum, 1e-9):5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
