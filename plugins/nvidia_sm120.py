"""The sm120 tuned sparse-prefill family (RTX PRO 6000 Blackwell Server Edition), as measured.

Every gate of the seed, declared: the family was measured on the 188-SM Server Edition with
Triton 3.7.1, top-k 2051, head dim 256, the TP rank shapes (group 6 / 1 KV head, group 12 / 1 or
2 KV heads), at >= 8,192 rows for ordinary prefill (its lowest measured point) and, for chunk
prefill, >= 512 rows per request on average (the crossover lies in (256, 512]) under a
grid-utilization bound. Unmeasured sm_120 parts (RTX 5090, Workstation Edition) stay on the table
unless ``KREG_SELECT_SPARSE_PREFILL=nvidia_sm120.sparse_prefill_tuned:measure`` waives the
envelope; sm_121 (GB10) is a different architecture and is never eligible.
"""

from __future__ import annotations

from backends.sparse_prefill import SparsePrefillWorkload
from backends.sparse_prefill.conformance import Case, chunk_call, prefill_call
from backends.sparse_prefill.guarantees import kernel_contract
from registry import DeviceFacts, Implementation, hookimpl
from registry.requirements import (
    ENVELOPE,
    arch_in,
    device_in,
    field_at_least,
    field_eq,
    fields_in,
    grid_bound,
    rows_per_request_at_least,
    triton_runtime,
    vendor_in,
    version_at_least,
    when,
)

PRIORITY = 100

SM120_SERVER = ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 188)

# group_size -> tuned geometry (measured, seed tables "Kernel measurements" and "ablations").
SM120_PREFILL_CONFIGS: dict[int, dict[str, int]] = {
    6: {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 4, "num_stages": 3},
    12: {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 2, "num_stages": 3},
}

REQUIREMENTS = (
    # capability: invalid or untested outside these
    vendor_in("nvidia"),
    arch_in("sm_120"),
    version_at_least("triton", "3.7"),
    triton_runtime(),
    field_eq("topk", 2051),
    field_eq("head_dim", 256),
    fields_in(("group_size", "num_kv_heads"), [(6, 1), (12, 1), (12, 2)], name="rank_shape"),
    # envelope: where the measurements say the family wins
    device_in(SM120_SERVER),
    when("kind", "prefill", field_at_least("total_q", 8192, kind=ENVELOPE)),
    when("kind", "chunk", rows_per_request_at_least(512)),
    when("kind", "chunk", grid_bound(2)),
)



def _rows(topk: int, total_q: int) -> list[int]:
    """Rows crossing 16-entry tiles (37, 19, 5 valid entries) and an empty one: the seed's
    top-k without the interpreter's cost of full rows (``seed_full_row`` has one)."""
    return [37, 0, 19, 5][:total_q]


#: The conformance kit's cases for the family (``pytest --kreg-conformance nvidia_sm120``): the
#: seed's tuples (top-k 2051, head dim 256, the rank shapes) at the kit's small sizes, judged on
#: the Server Edition profile and run here, so both tuned geometries execute on a CPU too.
CONFORMANCE_CASES = (
    Case("seed_g6", "the seed tuple at group 6 / 1 KV head (BLOCK_M 8): rows of 37, 0, 19 and 5 "
         "valid entries", prefill_call(total_q=4, group=6, hkv=1, d=256, topk=2051,
                                       num_slots=64, lengths=_rows)),
    Case("seed_g12x2", "the seed tuple at group 12 / 2 KV heads (BLOCK_M 16; head j reads KV head "
         "j // 12)", prefill_call(total_q=4, group=12, hkv=2, d=256, topk=2051, num_slots=64,
                                  lengths=_rows)),
    Case("seed_chunk_g12", "chunk rows after cached prefixes (page size 4, prefixes not multiples "
         "of it) at the seed's top-k and head dim", chunk_call(
             q_rows=(2, 2), prefixes=(5, 9), page_size=4, group=12, hkv=1, d=256, topk=2051,
             lengths=_rows)),
    Case("seed_full_row", "one row of all 2051 entries, lengths omitted (129 tiles of 16)",
         prefill_call(total_q=1, group=6, hkv=1, d=256, topk=2051, num_slots=64)),
)


def _config(f: DeviceFacts, w: SparsePrefillWorkload) -> dict[str, int]:
    return dict(SM120_PREFILL_CONFIGS[w.group_size])


@hookimpl
def kreg_configs(op: str) -> dict[str, dict[str, int]] | None:
    """The seed's two tuned geometries, named ``family.g<group>``."""
    if op != "sparse_prefill":
        return None
    return {f"family.g{g}": dict(cfg) for g, cfg in SM120_PREFILL_CONFIGS.items()}


@hookimpl
def kreg_implementations() -> list[Implementation]:
    return [
        Implementation(op="sparse_prefill", name="nvidia_sm120.sparse_prefill_tuned",
                       priority=PRIORITY, requirements=REQUIREMENTS, config=_config,
                       kernel="backends.sparse_prefill.triton_kernels:sparse_prefill_triton",
                       contract=kernel_contract,
                       description="sm120 Server Edition tuned geometry (seed family)",
                       conformance_profiles=("rtx-pro-6000-blackwell-server",),
                       conformance_cases="plugins.nvidia_sm120:CONFORMANCE_CASES"),
    ]
