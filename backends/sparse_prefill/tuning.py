"""The ``kreg tune sparse_prefill`` tuner (the protocol is in registry/tuning/tune.py).

The search space comes from the registry, never from the plugins' modules: the table config the
FAMILY implementation resolves for the point, every config a plugin offers through the
``kreg_configs`` hook, and (``small``/``full``) a geometry grid crossed with the variant keys of
the plain Triton configs on offer.

Grid axes (``--grid AXIS=V1,V2``): ``kind`` (prefill, chunk), ``group_size`` (6, 12),
``kv_heads`` (1), ``kv_len`` (8192), ``total_q`` (32 .. 8192), ``topk`` (2051), ``head_dim``
(256), ``dtype`` (bfloat16), ``space`` (``tiny``: the table and the measured families only;
``small``: those and a neighbourhood of them; ``full``: every BLOCK_M x BLOCK_N x warps x
stages x variant). Inputs are
the bench's (``bench.make_inputs``): one request per point for chunk, so entries describe uniform
batches (the measured plugin keeps skewed batches off them with the grid bound).

A point's bucket (:func:`bucket`) is the workload ``registry.dispatch`` derives from those
inputs, ``kv_len`` included (``num_slots`` for prefill, which is ``max(kv_len, total_q)``; the
page table's reach for chunk), so each KV length of the grid gets its own entry and the measured
plugin serves a config per KV length.
"""

from __future__ import annotations

import itertools
from typing import Any

from backends.sparse_prefill.compare import max_abs_error as metric

__all__ = ["FAMILY", "PLOT_AXIS", "baseline", "bucket", "candidates", "cases", "expected", "inputs",
           "label", "metric"]

FAMILY = "generic.sparse_prefill_table"
PLOT_AXIS = "total_q"

DEFAULTS: dict[str, list[str]] = {
    "kind": ["prefill", "chunk"], "group_size": ["6", "12"], "kv_heads": ["1"],
    "kv_len": ["8192"], "total_q": ["32", "64", "128", "256", "512", "1024", "2048", "8192"],
    "topk": ["2051"], "head_dim": ["256"], "dtype": ["bfloat16"], "space": ["small"],
}
_INT_AXES = ("group_size", "kv_heads", "kv_len", "total_q", "topk", "head_dim")


def cases(grid: dict[str, list[str]]) -> list[Any]:
    from backends.sparse_prefill.bench import BenchCase
    from registry.errors import ConfigError

    unknown = set(grid) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"sparse_prefill tuning has no axis {sorted(unknown)}; axes: "
                          f"{', '.join(DEFAULTS)}")
    axes = {**DEFAULTS, **grid}
    try:
        ints = {a: [int(v) for v in axes[a]] for a in _INT_AXES}
    except ValueError as exc:
        raise ConfigError(f"sparse_prefill tuning axis values must be integers: {exc}") from None
    out = []
    for kind, g, hkv, kv, tq, topk, d, dt, space in itertools.product(
            axes["kind"], ints["group_size"], ints["kv_heads"], ints["kv_len"], ints["total_q"],
            ints["topk"], ints["head_dim"], axes["dtype"], axes["space"]):
        if kind == "chunk" and tq > kv:
            continue  # one request cannot have more rows than its context
        case = BenchCase(kind=kind, group_size=g, kv_heads=hkv, kv_len=kv if kind == "chunk"
                         else max(kv, tq), total_q=tq, topk=topk, head_dim=d, dtype=dt)
        case.extra["space"] = space
        out.append(case)
    return out


def label(case: Any) -> str:
    return str(case.label())


def bucket(case: Any) -> dict[str, Any]:
    """The workload dispatch derives from ``make_inputs(case)`` (kv_len included)."""
    from backends.sparse_prefill.bench import workload_of

    return workload_of(case)


def _fmt(cfg: dict[str, Any]) -> str:
    from backends.sparse_prefill.bench import format_geometry

    return str(format_geometry(cfg))


def _table_config(case: Any, facts: Any) -> dict[str, Any]:
    """What the FAMILY implementation (the table) resolves for the case on ``facts``."""
    import registry

    reg = registry.get_registry()
    impl = reg.implementation("sparse_prefill", FAMILY)
    cfg = impl.resolve_config(facts, reg.workload("sparse_prefill", bucket(case)))
    return dict(cfg or {})


def baseline(case: Any, facts: Any) -> str:
    return _fmt(_table_config(case, facts))


_GEOMETRY = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def _space(case: Any, facts: Any) -> list[dict[str, Any]]:
    import registry

    # Every config a loaded plugin offers (hook kreg_configs: the measured families of
    # nvidia_hopper and nvidia_sm120, and any vendor's), beside the table's for this point.
    offered = list(registry.get_registry().offered_configs("sparse_prefill").values())
    # Issue 26's union tiles (UNION=300) over every plain Triton family config on offer, at the
    # tile shapes measured fastest on top-k rows (session 18: 128 lines x 64 slots for group 6,
    # 64 x 32 for group 12, beside the default 128 x 32): candidates wherever a family config
    # runs (chunk rows need translated slots); the policy takes one of them at measured cells.
    # Their pre-pass is the one CUDA kernel on sm_90 (faster on every cell measured: session
    # 45, docs/notes/sparse_prefill.md), the Triton kernels elsewhere.
    prep = ({"UNION_PREP": "cuda"} if facts is not None and facts.vendor == "nvidia"
            and facts.arch == "sm_90" else {})
    unions = [{**cfg, "UNION": 300, **({"DENSE_TILE": tile} if tile else {}), **prep,
               **({"CHUNK_MODE": "pretranslate"} if case.kind == "chunk" else {})}
              for cfg in offered if not (cfg.get("DENSE") or cfg.get("UNION")
                                         or cfg.get("SLOT_ORDER")
                                         or cfg.get("ENGINE", "triton") != "triton")
              for tile in ("", "128x64x8x2", "64x32x4x3")]
    # and over the dense-tile configs on offer (prefill), the union tiles at their own geometry
    # (UNION_TILE, the dense tiles' 128 lines): each path at its measured tile shape
    dense_unions = [{**cfg, "UNION": 300, "UNION_TILE": "128x64x8x2", **prep}
                    for cfg in offered if cfg.get("DENSE") and not cfg.get("UNION")
                    and case.kind == "prefill" and cfg.get("ENGINE", "triton") == "triton"
                    and str(cfg.get("DENSE_TILE", "128x32x8x3")).startswith("128x")]
    # each also with UNION_DENSE=80: the union pre-pass first, DENSE's tiles whose union is at
    # most 80% of their span to the union path (issue 26, session 46)
    unions += dense_unions + [{**cfg, "UNION_DENSE": 80} for cfg in dense_unions]
    # (not on tiles of the group's heads exactly, TILE_HEADS="group": 1.2-1.6x slower than
    # these on the H100, session 43, docs/notes/sparse_prefill.md)
    base = [_table_config(case, facts), *offered, *unions]
    # The neighbourhood grid crosses geometries with the variant keys of the plain Triton
    # family configs on offer (not the dense, union, slot-ordered or Gluon ones).
    variants: list[dict[str, Any]] = [{}]
    for cfg in offered:
        if (cfg.get("DENSE") or cfg.get("UNION") or cfg.get("SLOT_ORDER")
                or cfg.get("ENGINE", "triton") != "triton"):
            continue
        var = {k: v for k, v in cfg.items() if k not in _GEOMETRY}
        if var not in variants:
            variants.append(var)
    bms: tuple[int, ...]
    bns: tuple[int, ...]
    ws: tuple[int, ...]
    ss: tuple[int, ...]
    if case.extra.get("space") == "full":
        bms, bns, ws, ss = (8, 16, 32), (16, 32, 64, 128), (1, 2, 4, 8), (1, 2, 3, 4)
    elif case.extra.get("space") != "tiny":
        bms, bns, ws, ss = (8, 16), (16, 32, 64), (2, 4), (2, 3)
    else:   # the table and the offered configs only
        variants, bms, bns, ws, ss = [], (), (), (), ()
    grid = [{"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, **var}
            for bm, bn, w, s, var in itertools.product(bms, bns, ws, ss, variants)]
    seen, out = set(), []
    for cfg in base + grid:
        if case.kind == "prefill":   # the chunk translation mode does nothing for prefill rows
            cfg = {k: v for k, v in cfg.items() if k != "CHUNK_MODE"}
        elif ((cfg.get("SLOT_ORDER") or cfg.get("DENSE") or cfg.get("UNION")
               or cfg.get("ENGINE", "triton") != "triton")
              and cfg.get("CHUNK_MODE") != "pretranslate"):
            continue  # chunk entries are positions until translated: nothing to order or count
            # (and the Gluon kernels take slot ids)
        key = tuple(sorted(cfg.items()))
        if key not in seen:
            seen.add(key)
            out.append(dict(cfg))
    return out


def _sm80_plus(facts: Any) -> bool:
    arch = str(facts.arch)
    return (facts.vendor == "nvidia" and arch.startswith("sm_") and arch[3:].isdigit()
            and int(arch[3:]) >= 80)


def _engine_refusal(cfg: dict[str, Any], facts: Any) -> str:
    """Why this device cannot run the config's Gluon engine ("" when it can or is unknown)."""
    engine = cfg.get("ENGINE", "triton")
    if facts is None or engine == "triton":
        return ""
    if engine == "gluon" and not _sm80_plus(facts):
        return f"ENGINE='gluon' runs on NVIDIA sm_80+ only (this is {facts.vendor} {facts.arch})"
    if engine == "gluon_wgmma" and not (facts.vendor == "nvidia" and facts.arch == "sm_90"):
        return (f"ENGINE='gluon_wgmma' runs on NVIDIA sm_90 only (wgmma; this is "
                f"{facts.vendor} {facts.arch})")
    return ""


def candidates(case: Any, facts: Any) -> list[tuple[str, dict[str, Any] | None, str]]:
    from backends.sparse_prefill.config import validate_config
    from registry.errors import ConfigError

    out: list[tuple[str, dict[str, Any] | None, str]] = []
    for cfg in _space(case, facts):
        try:
            validate_config(cfg, case.group_size, case.head_dim)
        except ConfigError as exc:
            out.append((_fmt(cfg), None, str(exc)))
            continue
        why = _engine_refusal(cfg, facts)
        if why:
            out.append((_fmt(cfg), None, why))
            continue
        out.append((_fmt(cfg), cfg, ""))
    return out


def inputs(case: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The bench's inputs for the point: ``(q, k, v, indices)`` and the call's keywords."""
    from backends.sparse_prefill.bench import make_inputs

    inp = make_inputs(case)
    return (inp["q"], inp["k"], inp["v"], inp["indices"]), dict(inp["kwargs"])


def expected(case: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The fp32 reference: every config is judged against the higher-precision result."""
    import torch

    from backends.sparse_prefill.reference import sparse_prefill_reference

    return sparse_prefill_reference(*args, out_dtype=torch.float32, **kwargs)

