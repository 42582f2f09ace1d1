"""The sliced exact top-2048 geometry for the MI355X (gfx950, 256 CUs), from the seed.

Every row selects on up to 64 slices, a slice per 1,024 keys; measured for k = 2048 only.
"""

from __future__ import annotations

from backends.indexer_topk import EXACT
from registry import Implementation, hookimpl
from registry.requirements import arch_in, device_in, field_eq, triton_runtime, vendor_in

PRIORITY = 100

MI355X = ("AMD Instinct MI355X", 256)
MI355X_TOPK_CONFIG: dict[str, int] = {"SLICE_KEYS": 1024, "MAX_SLICES": 64, "num_warps": 4}

REQUIREMENTS = (
    vendor_in("amd"),
    arch_in("gfx950"),
    triton_runtime(),
    field_eq("k", 2048),
    device_in(MI355X),
)


@hookimpl
def kreg_configs(op: str) -> dict[str, dict[str, int]] | None:
    """The seed's MI355X geometry (the kernel fills the keys it leaves out per shape)."""
    return {"sliced": dict(MI355X_TOPK_CONFIG)} if op == "indexer_topk" else None


@hookimpl
def kreg_implementations() -> list[Implementation]:
    return [
        Implementation(op="indexer_topk", name="amd_mi355x.indexer_topk_sliced",
                       priority=PRIORITY, requirements=REQUIREMENTS, config=MI355X_TOPK_CONFIG,
                       contract=EXACT,
                       kernel="backends.indexer_topk.triton_kernels:indexer_topk_triton",
                       description="MI355X sliced radix select: 1,024-key slices, up to 64"),
    ]
