"""A deliberately BROKEN copy of acme_kreg (kreg's tests install it to see the conformance kit
catch it): its kernel drops the last valid index of every row.

Requirements, by kind:

* capability (never waived; the kernel is invalid outside them): Triton can run here (a GPU, or
  the interpreter on a CPU), head dims up to 256, float16/bfloat16/float32 inputs;
* envelope (where ACME measured a win; ``acme_broken.sparse_prefill_blocked:measure`` waives
  them): an NVIDIA sm_89 device (L20, L40S, RTX 4090), prefill batches of at least 1,024 rows.

Priority 100, the vendor tier: above the generic table (10), below entries the local tuning
store measured on this exact machine (200).
"""

from __future__ import annotations

from registry import DeviceFacts, Implementation, Workload, hookimpl
from registry.requirements import (
    ENVELOPE,
    arch_in,
    field_at_least,
    field_at_most,
    field_in,
    triton_runtime,
    vendor_in,
    when,
)

__all__ = ["BLOCKED_GEOMETRY", "REQUIREMENTS", "blocked_config", "kreg_implementations"]

PRIORITY = 100

#: BLOCK_N, num_warps, num_stages of the blocked geometry; BLOCK_M follows the group size.
BLOCKED_GEOMETRY = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2}

REQUIREMENTS = (
    triton_runtime(),
    field_at_most("head_dim", 256),
    field_in("dtype", ("float16", "bfloat16", "float32")),
    vendor_in("nvidia", kind=ENVELOPE),
    arch_in("sm_89", kind=ENVELOPE),
    when("kind", "prefill", field_at_least("total_q", 1024, kind=ENVELOPE)),
    when("kind", "chunk", field_at_least("total_q", 1024, kind=ENVELOPE)),
)


def blocked_config(facts: DeviceFacts, workload: Workload) -> dict[str, int]:
    group = workload.group_size  # type: ignore[attr-defined]
    block_m = max(16, 1 << max(0, group - 1).bit_length())
    return {"BLOCK_M": block_m, **BLOCKED_GEOMETRY}


@hookimpl
def kreg_implementations() -> list[Implementation]:
    return [
        Implementation(op="sparse_prefill", name="acme_broken.sparse_prefill_blocked",
                       priority=PRIORITY, requirements=REQUIREMENTS, config=blocked_config,
                       kernel="acme_kreg_broken.kernels:sparse_prefill_blocked",
                       description="BROKEN: drops the last valid index of every row"),
    ]
