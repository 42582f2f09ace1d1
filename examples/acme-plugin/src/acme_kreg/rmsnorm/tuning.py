"""``kreg tune acme_rmsnorm``: the tuner protocol of registry/tuning/tune.py.

Measures ``ROWS`` x ``num_warps`` (and every config a plugin offers, ``kreg_configs``) per row
count; the winners go to the tuning store, where the ``measured`` plugin serves them by the
op's point field (rows: the floor rule between measured row counts).
"""

from __future__ import annotations

from typing import Any

FAMILY = "acme.rmsnorm_triton"
PLOT_AXIS = "rows"
DEFAULTS = {"rows": ["64", "4096"], "cols": ["1024"], "dtype": ["float32"]}


def cases(grid: dict[str, list[str]]) -> list[dict[str, Any]]:
    axes = {**DEFAULTS, **grid}
    return [{"rows": int(r), "cols": int(c), "dtype": d}
            for r in axes["rows"] for c in axes["cols"] for d in axes["dtype"]]


def label(case: dict[str, Any]) -> str:
    return f"{case['rows']}x{case['cols']} {case['dtype']}"


def bucket(case: dict[str, Any]) -> dict[str, Any]:
    return dict(case)


def candidates(case: dict[str, Any], facts: Any) -> list[tuple[str, dict[str, Any] | None, str]]:
    import registry

    out: list[tuple[str, dict[str, Any] | None, str]] = [
        (f"r{rows}w{w}", {"ROWS": rows, "num_warps": w}, "")
        for rows in (1, 4) for w in (1, 4)]
    out += [(name, dict(cfg), "")
            for name, cfg in registry.get_registry().offered_configs("acme_rmsnorm").items()]
    return out


def baseline(case: dict[str, Any], facts: Any) -> str:
    from acme_kreg import rmsnorm_table_config

    cfg = rmsnorm_table_config(case["rows"], case["cols"])
    return f"r{cfg['ROWS']}w{cfg['num_warps']}"


def inputs(case: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    import torch

    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, case["dtype"])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return (torch.randn(case["rows"], case["cols"], generator=g).to(dev, dt),
            torch.randn(case["cols"], generator=g).to(dev, dt)), {}
