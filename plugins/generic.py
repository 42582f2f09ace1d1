"""Portable Triton kernels with table geometry; priority 10.

``sparse_prefill_table`` is the H20/L20-style table of the sm120 seed: the head tile is
``max(16, next_power_of_2(group_size))`` and the rest depends on total_q only.
"""

from __future__ import annotations

from backends.indexer_topk import EXACT, IndexerTopkWorkload
from backends.indexer_topk.config import describe_path
from backends.sparse_prefill import SparsePrefillWorkload
from backends.sparse_prefill.guarantees import kernel_contract as sparse_kernel_contract
from registry import DeviceFacts, Implementation, hookimpl
from registry.requirements import field_at_most, triton_runtime

PRIORITY = 10

# (total_q upper bound, BLOCK_N, num_warps, num_stages); the last row covers everything above.
SPARSE_PREFILL_TABLE: tuple[tuple[int | None, int, int, int], ...] = (
    (32, 32, 8, 2),
    (64, 64, 8, 2),
    (128, 64, 4, 2),
    (512, 32, 4, 2),
    (None, 16, 1, 2),
)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def sparse_prefill_table_config(group_size: int, total_q: int) -> dict[str, int]:
    """The table geometry for a workload: what every device gets without a tuned family."""
    block_m = max(16, next_power_of_2(group_size))
    for bound, block_n, warps, stages in SPARSE_PREFILL_TABLE:
        if bound is None or total_q <= bound:
            return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps,
                    "num_stages": stages}
    raise AssertionError("unreachable: the table's last row has no bound")


def _table(f: DeviceFacts, w: SparsePrefillWorkload) -> dict[str, int]:
    return sparse_prefill_table_config(w.group_size, w.total_q)


def _radix(f: DeviceFacts, w: IndexerTopkWorkload) -> dict[str, int]:
    # The shape-dependent default: enough slices to give the device ~2 programs per
    # multiprocessor, groups sized so a row has ~2k group maxima (backends/indexer_topk/config.py).
    from backends.indexer_topk.config import default_config

    return default_config(w.num_rows, w.max_keys, w.k, max(1, f.sm_count))


@hookimpl
def kreg_implementations() -> list[Implementation]:
    return [
        Implementation(op="sparse_prefill", name="generic.sparse_prefill_table", priority=PRIORITY,
                       requirements=(triton_runtime(), field_at_most("head_dim", 256)),
                       config=_table, contract=sparse_kernel_contract,
                       kernel="backends.sparse_prefill.triton_kernels:sparse_prefill_triton",
                       description="portable Triton kernel, geometry from the total_q table"),
        Implementation(op="indexer_topk", name="generic.indexer_topk_radix", priority=PRIORITY,
                       requirements=(triton_runtime(),), config=_radix, contract=EXACT,
                       describe_config=describe_path,
                       kernel="backends.indexer_topk.triton_kernels:indexer_topk_triton",
                       description="portable sliced radix select, exact"),
    ]
