"""The ``kreg tune indexer_topk`` tuner (the protocol is in registry/_tune.py).

Grid axes: ``rows`` (1, 64, 1024, 4096), ``keys`` (8192, 131072, 524288), ``k`` (2048),
``dtype`` (float32). Candidates: the measured default for the shape and its neighbours (slice
count halved and doubled, GROUP halved and doubled, 4 and 8 warps). Every candidate's output is
compared entry by entry with the exact reference before it is timed; a difference is a failure.
"""

from __future__ import annotations

import itertools
from typing import Any

FAMILY = "generic.indexer_topk_radix"
PLOT_AXIS = "num_rows"

DEFAULTS: dict[str, list[str]] = {"rows": ["1", "64", "1024", "4096"],
                                  "keys": ["8192", "131072", "524288"], "k": ["2048"],
                                  "dtype": ["float32"]}


def cases(grid: dict[str, list[str]]) -> list[Any]:
    from backends.indexer_topk.bench import BenchCase
    from registry.errors import ConfigError

    unknown = set(grid) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"indexer_topk tuning has no axis {sorted(unknown)}; axes: "
                          f"{', '.join(DEFAULTS)}")
    axes = {**DEFAULTS, **grid}
    try:
        rows, keys, ks = ([int(v) for v in axes[a]] for a in ("rows", "keys", "k"))
    except ValueError as exc:
        raise ConfigError(f"indexer_topk tuning axis values must be integers: {exc}") from None
    return [BenchCase(rows=r, keys=n, k=k, dtype=dt)
            for r, n, k, dt in itertools.product(rows, keys, ks, axes["dtype"])]


def label(case: Any) -> str:
    return case.label()


def bucket(case: Any) -> dict[str, Any]:
    return {"k": case.k, "num_rows": case.rows, "max_keys": case.keys, "dtype": case.dtype}


def _fmt(cfg: dict[str, Any]) -> str:
    return (f"s{cfg['SLICE_KEYS']}x{cfg['MAX_SLICES']} g{cfg['GROUP']}x{cfg['GROUP_BLOCK']} "
            f"w{cfg['num_warps']}")


def baseline(case: Any) -> str:
    from backends.indexer_topk.config import default_config

    return _fmt(default_config(case.rows, case.keys, case.k))


def candidates(case: Any, facts: Any) -> list[tuple[str, dict[str, Any] | None, str]]:
    from backends.indexer_topk.config import default_config, validate_config
    from registry.errors import ConfigError

    base = default_config(case.rows, case.keys, case.k, facts.sm_count)
    space = [base]
    for slices in (base["SLICE_KEYS"] // 2, base["SLICE_KEYS"] * 2):
        space.append({**base, "SLICE_KEYS": slices})
    for group in (base["GROUP"] // 2, base["GROUP"] * 2):
        space.append({**base, "GROUP": group})
    space.append({**base, "num_warps": 8 if base["num_warps"] == 4 else 4})
    out: list[tuple[str, dict[str, Any] | None, str]] = []
    seen: set[str] = set()
    for cfg in space:
        lab = _fmt(cfg)
        if lab in seen:
            continue
        seen.add(lab)
        try:
            validate_config(cfg, case.k, case.keys)
        except ConfigError as exc:
            out.append((lab, None, str(exc)))
            continue
        out.append((lab, cfg, ""))
    return out


def measure(case: Any, configs: dict[str, dict[str, Any]], *, warmup: int, iters: int,
            include_auto: bool = False) -> dict[str, dict[str, Any]]:
    import torch

    from backends.indexer_topk.bench import make_inputs
    from backends.indexer_topk.reference import indexer_topk_reference
    from backends.indexer_topk.triton_kernels import indexer_topk_triton
    from registry._timing import interleaved_median_ms

    scores, lengths = make_inputs(case)
    ref = indexer_topk_reference(scores, lengths, case.k)
    res: dict[str, dict[str, Any]] = {}
    fns = {}
    runs = {lab: (lambda c=cfg: indexer_topk_triton(scores, lengths, case.k, config=c))
            for lab, cfg in configs.items()}
    if include_auto:
        import registry

        runs["auto"] = lambda: registry.dispatch("indexer_topk", scores, lengths, k=case.k)
    for lab, fn in runs.items():
        try:
            out = fn()
        except Exception as exc:  # a config that fails to compile is scored, not fatal
            res[lab] = {"ms": None, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            continue
        diff = int((out != ref).sum())
        res[lab] = {"ms": None, "ok": diff == 0, "error": None, "max_abs_err": float(diff)}
        if diff == 0:
            fns[lab] = fn
    del torch
    for lab, ms in interleaved_median_ms(fns, warmup=warmup, iters=iters).items():
        res[lab]["ms"] = ms
    return res
