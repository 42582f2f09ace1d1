"""ACME's own op, ``acme_rmsnorm``: ``out[r] = x[r] / sqrt(mean(x[r]**2) + eps) * w``.

Everything kreg needs is reached through :data:`SPEC`, the op's ``OpSpec`` (returned by the
plugin's ``kreg_ops`` hook): the workload model and call key, the reference implementation's
name, the error bound, the conformance cases, the bench command, the tuner, the kernel the
tuner's configs drive, the measured axis, and the module registering the torch custom op.

The call: ``registry.dispatch("acme_rmsnorm", x, w, eps=1e-6)``; ``x`` ``[rows, cols]``
(float32, float16 or bfloat16, rows contiguous), ``w`` ``[cols]`` of x's dtype; the output has
x's shape and dtype and is computed in float32.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from registry import OpSpec, Workload
from registry.errors import WorkloadError

__all__ = ["OP", "SPEC", "RmsnormWorkload", "call_key", "error_bound", "reference"]

OP = "acme_rmsnorm"


class RmsnormWorkload(Workload):
    """What selection sees of one call: shapes and dtype, never values."""

    op = OP

    rows: int = Field(ge=0, description="x.shape[0]")
    cols: int = Field(ge=1, le=65536, description="x.shape[1] (the normalized axis)")
    dtype: Literal["float32", "float16", "bfloat16"] = Field(description="x.dtype")


def call_key(x: Any, w: Any, eps: float = 1e-6) -> tuple[Any, ...]:
    """``(op, device index, rows, cols, dtype)``: from attributes only (the dispatch hot path:
    no device read, no validation beyond what the key needs)."""
    try:
        rows, cols = x.shape
    except (AttributeError, ValueError):
        raise WorkloadError("acme_rmsnorm expects x, a 2-D tensor [rows, cols]") from None
    return (OP, x.get_device(), rows, cols, str(x.dtype).removeprefix("torch."))


def reference(x: Any, w: Any, eps: float = 1e-6) -> Any:
    """The torch reference (float32 math), what every kernel is compared with."""
    import torch

    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * inv * w.float()).to(x.dtype)


def error_bound(dtype: str) -> float:
    """Max-abs error against the reference, per dtype (the output's rounding)."""
    return {"float32": 1e-4, "float16": 1e-2, "bfloat16": 6e-2}[dtype]


SPEC = OpSpec(
    name=OP, workload_model=RmsnormWorkload, call_key=call_key,
    # An implementation's name ('<plugin>.<impl>'), registered by kreg_implementations below,
    # never a 'module:function'.
    reference="acme.rmsnorm_reference",
    error_bound=error_bound,
    conformance="acme_kreg.rmsnorm.conformance",
    bench="acme_kreg.rmsnorm.bench:bench_command",
    tuner="acme_kreg.rmsnorm.tuning",
    tuned_kernel="acme_kreg.rmsnorm.triton_kernels:rmsnorm_triton",
    point_fields=("rows",),
    custom_op="acme_kreg.rmsnorm.torch_op",
    doc="out[r] = x[r] / sqrt(mean(x[r]**2) + eps) * w (ACME's own op)",
)
