"""The ``kreg tune indexer_topk`` tuner (the protocol is in registry/tuning/tune.py).

Grid axes: ``rows`` (1, 64, 1024, 4096), ``keys`` (8192, 131072, 524288), ``k`` (2048),
``dtype`` (float32), ``dist`` (randn, ties, zeros, recent, lowbits, relu, ramp: each candidate
is measured on every distribution and an entry keeps the config of smallest worst ratio over
them; ``ramp`` keeps out configs without the minimum bound, 16-bit maxima, which take 2-4x the
time there, as ``lowbits`` does for their full-row gathers).
Candidates: the default for the shape, its gmax slices halved and doubled,
the fused path's default and its neighbours (the other of 4 and 8 row-program warps, 1024-key
compaction and placement steps, 96 registers and no cap, GROUP doubled with GROUP2 halved: the
same bound groups, the other of 32- and 16-bit group maxima, half the programs a row), the
four-launch path's default (FUSED=0), and every config a plugin offers (``kreg_configs``).
Labels: ``x2`` two programs a row, ``b16`` 16-bit maxima.
Every candidate's output is compared entry by entry with the exact reference (the op's
compare) before it is timed; a difference is a failure.
"""

from __future__ import annotations

import itertools
from typing import Any

from backends.indexer_topk.compare import differing_entries as metric

__all__ = ["FAMILY", "PLOT_AXIS", "baseline", "bucket", "candidates", "cases", "inputs",
           "label", "metric"]

FAMILY = "generic.indexer_topk_radix"
PLOT_AXIS = "num_rows"

# ``dist``: the score distributions every candidate is measured on. They are not part of the
# workload (selection cannot see scores), so the points of one shape merge into one entry by
# minimax regret (registry/tuning/tune.py): a config that wins on randn and loses 10x on ties
# has a worst ratio of 10 and is never stored.
DEFAULTS: dict[str, list[str]] = {"rows": ["1", "64", "1024", "4096"],
                                  "keys": ["8192", "131072", "524288"], "k": ["2048"],
                                  "dtype": ["float32"],
                                  "dist": ["randn", "ties", "zeros", "recent", "lowbits",
                                           "relu", "ramp"]}


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
    from backends.indexer_topk.distributions import DISTRIBUTIONS

    bad = [d for d in axes["dist"] if d not in DISTRIBUTIONS]
    if bad:
        raise ConfigError(f"indexer_topk tuning: unknown dist {bad}; known: "
                          f"{', '.join(DISTRIBUTIONS)}")
    return [BenchCase(rows=r, keys=n, k=k, dtype=dt, dist=d)
            for r, n, k, dt, d in itertools.product(rows, keys, ks, axes["dtype"],
                                                    axes["dist"])]


def label(case: Any) -> str:
    return str(case.label())


def bucket(case: Any) -> dict[str, Any]:
    return {"k": case.k, "num_rows": case.rows, "max_keys": case.keys, "dtype": case.dtype}


def _fmt(cfg: dict[str, Any]) -> str:
    if not cfg.get("FUSED"):
        return (f"4-launch s{cfg['SLICE_KEYS']} g{cfg['GROUP']}x{cfg['GROUP_BLOCK']} "
                f"w{cfg['num_warps']}")
    # Every key the candidates vary: a label shared by two configs would drop one of them.
    split, bits = cfg.get("ROW_SPLIT", 1), cfg.get("GMAX_BITS", 32)
    return (f"fused s{cfg['SLICE_KEYS']} g{cfg['GROUP']}x{cfg['GROUP2']} "
            f"w{cfg['SEARCH_WARPS']} p{cfg['PLACE_KEYS']} c{cfg['COMPACT_TILE']} "
            f"r{cfg.get('MAX_REGS', 0)}{f' x{split}' if split != 1 else ''}"
            f"{f' b{bits}' if bits != 32 else ''}{' one' if cfg.get('ONE_PASS') else ''}")


def baseline(case: Any, facts: Any) -> str:
    """The default config's label on this device (its SM count sizes the row split)."""
    from backends.indexer_topk.config import default_config

    return _fmt(default_config(case.rows, case.keys, case.k, facts.sm_count))


def candidates(case: Any, facts: Any) -> list[tuple[str, dict[str, Any] | None, str]]:
    from backends.indexer_topk.config import default_config, resolve_config, validate_config
    from registry.errors import ConfigError

    base = default_config(case.rows, case.keys, case.k, facts.sm_count)
    fused = default_config(case.rows, case.keys, case.k, facts.sm_count, fused=True)
    space = [base]
    for slices in (base["SLICE_KEYS"] // 2, base["SLICE_KEYS"] * 2):
        space.append({**base, "SLICE_KEYS": slices})
    space.append(fused)
    space.append({**fused, "SEARCH_WARPS": 12 - fused["SEARCH_WARPS"]})   # the other of 4, 8
    step = 1024 if fused["PLACE_KEYS"] > 1024 else 2048     # the other of the two step sizes
    space.append({**fused, "PLACE_KEYS": max(step, fused["GROUP"]), "COMPACT_TILE": step})
    for regs in (96, 0):                                      # a tighter cap, and none
        space.append({**fused, "MAX_REGS": regs})
    if fused["GROUP2"] > 1:
        space.append({**fused, "GROUP": fused["GROUP"] * 2, "GROUP2": fused["GROUP2"] // 2,
                      "PLACE_KEYS": max(fused["PLACE_KEYS"], fused["GROUP"] * 2)})
    # the other of 32, 16 (16-bit maxima need the gmax launch)
    space.append({**fused, "GMAX_BITS": 48 - fused["GMAX_BITS"], "ONE_PASS": 0})
    if fused["ROW_SPLIT"] == 1:     # the other of one launch and two
        space.append({**fused, "ONE_PASS": 1 - fused["ONE_PASS"], "GMAX_BITS": 32})
    if fused["ROW_SPLIT"] > 1:
        space.append({**fused, "ROW_SPLIT": fused["ROW_SPLIT"] // 2})   # fewer programs a row
    space.append(default_config(case.rows, case.keys, case.k, facts.sm_count, fused=False))
    # Every config a loaded plugin offers (hook kreg_configs: amd_mi355x's geometry, a vendor's),
    # completed for the shape the way the kernel completes it.
    import registry

    for cfg in registry.get_registry().offered_configs("indexer_topk").values():
        space.append(resolve_config(cfg, case.rows, case.keys, case.k, facts.sm_count))
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


def inputs(case: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The bench's inputs for the point: ``(scores, lengths)`` and ``k``."""
    from backends.indexer_topk.bench import make_inputs

    scores, lengths = make_inputs(case)
    return (scores, lengths), {"k": case.k}

