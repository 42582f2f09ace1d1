"""The sliced exact top-2048 geometry for the MI355X (gfx950, 256 CUs), from the seed.

Every row selects on up to 64 slices, a slice per 1,024 keys; measured for k = 2048 only.
"""

from __future__ import annotations

from backends.indexer_topk import EXACT
from backends.indexer_topk.config import describe_path
from backends.indexer_topk.conformance import Case, topk_call
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


#: The conformance kit's cases (``pytest --kreg-conformance amd_mi355x``), at k = 2048 (its
#: capability), besides the op's ``k2048`` case: judged on the MI355X profile and run here.
CONFORMANCE_CASES = (
    Case("k2048_ties", "tie-heavy rows at k = 2048 (ties by position), 2049 and 2048 valid keys",
         topk_call(3, 3000, 2048, "ties", lambda r, n, k: [n, k + 1, k])),
    Case("k2048_nan_inf", "NaN below -inf, +-inf as values, all-NaN rows, at k = 2048",
         topk_call(4, 2600, 2048, "nan_inf", lambda r, n, k: [n, n, n, k + 3])),
    Case("k2048_past_64_slices", "a row of 70,000 keys: more than MAX_SLICES x SLICE_KEYS",
         topk_call(1, 70000, 2048, "ties")),
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
                       contract=EXACT, describe_config=describe_path,
                       kernel="backends.indexer_topk.triton_kernels:indexer_topk_triton",
                       description="MI355X sliced radix select: 1,024-key slices, up to 64",
                       conformance_profiles=("mi355x",),
                       conformance_cases="plugins.amd_mi355x:CONFORMANCE_CASES"),
    ]
