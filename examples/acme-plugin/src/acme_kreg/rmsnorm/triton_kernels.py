"""The Triton kernel of ``acme_rmsnorm``: ``ROWS`` rows a program, the row in one block.

Config keys: ``ROWS`` (rows a program, >= 1) and ``num_warps`` (1, 2, 4 or 8). Runs on NVIDIA
and AMD GPUs and, under ``TRITON_INTERPRET=1``, on a CPU (float32 / float16).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from registry.errors import ConfigError

__all__ = ["rmsnorm_triton", "validate_config"]


@triton.jit
def _rmsnorm(X, W, OUT, rows, cols, eps, s_x, s_o, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    for i in tl.static_range(ROWS):
        r = pid * ROWS + i
        if r < rows:
            x = tl.load(X + r * s_x + offs, mask=mask, other=0.0).to(tl.float32)
            inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / cols + eps)
            tl.store(OUT + r * s_o + offs, (x * inv * w).to(OUT.dtype.element_ty), mask=mask)


def validate_config(config: Any) -> None:
    """Raise ConfigError naming the key when ``config`` cannot run."""
    if not isinstance(config, dict) or set(config) != {"ROWS", "num_warps"}:
        raise ConfigError(f"acme_rmsnorm config {config!r}: expected keys ROWS and num_warps")
    if not isinstance(config["ROWS"], int) or config["ROWS"] < 1:
        raise ConfigError(f"ROWS={config['ROWS']!r}: expected a positive int")
    if config["num_warps"] not in (1, 2, 4, 8):
        raise ConfigError(f"num_warps={config['num_warps']!r}: expected 1, 2, 4 or 8")


def rmsnorm_triton(x: Any, w: Any, eps: float = 1e-6, *, config: dict[str, Any]) -> Any:
    import torch

    validate_config(config)
    if x.dim() != 2 or w.shape != (x.shape[1],) or w.dtype != x.dtype:
        raise ConfigError(f"acme_rmsnorm: x [rows, cols] and w [cols] of one dtype (got "
                          f"{tuple(x.shape)} {x.dtype}, {tuple(w.shape)} {w.dtype})")
    rows, cols = x.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    out = torch.empty_like(x)
    if rows == 0:
        return out
    grid = (triton.cdiv(rows, config["ROWS"]),)
    _rmsnorm[grid](x, w.contiguous(), out, rows, cols, float(eps), x.stride(0), out.stride(0),
                   BLOCK=triton.next_power_of_2(cols), ROWS=config["ROWS"],
                   num_warps=config["num_warps"])
    return out
