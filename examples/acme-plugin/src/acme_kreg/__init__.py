"""ACME's kreg plugin: a sparse-prefill geometry for sm_89, an op of its own, a device profile.

* ``acme.sparse_prefill_blocked``: kreg's sparse-prefill Triton kernel with a fixed blocked
  geometry, preferred (priority 100, the vendor tier) on NVIDIA sm_89 parts for batches of at
  least 1,024 rows, where ACME measured it. Requirements, by kind: capability (never waived;
  the kernel is invalid outside them): Triton can run here (a GPU, or the interpreter on a
  CPU), head dims up to 256, float16/bfloat16/float32 inputs; envelope (where ACME measured a
  win; ``acme.sparse_prefill_blocked:measure`` waives them): an NVIDIA sm_89 device, prefill
  and chunk batches of at least 1,024 rows.
* the op ``acme_rmsnorm`` (:mod:`acme_kreg.rmsnorm`): its ``OpSpec`` (hook ``kreg_ops``), its
  torch reference ``acme.rmsnorm_reference`` (priority 0, the fallback) and its Triton kernel
  ``acme.rmsnorm_triton`` (priority 10, a portable kernel with table geometry, below what
  ``kreg tune`` measures on a machine: the ``measured`` plugin serves it at 200). It gets
  ``kreg bench acme_rmsnorm``, ``kreg tune acme_rmsnorm``, the conformance kit and
  ``torch.ops.acme.rmsnorm`` (``registry.load_custom_ops()``) with no edit to kreg.
* the device profile ``l40s`` (``profiles/l40s.toml``, hook ``kreg_profiles``): an sm_89 part
  kreg ships no profile of, so ``kreg explain --device l40s`` works anywhere.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from acme_kreg.rmsnorm import SPEC, RmsnormWorkload
from registry import DeviceFacts, Implementation, OpSpec, Workload, hookimpl
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

__all__ = ["BLOCKED_GEOMETRY", "REQUIREMENTS", "RMSNORM_TABLE", "blocked_config",
           "kreg_configs", "kreg_implementations", "kreg_ops", "kreg_profiles",
           "rmsnorm_table_config"]

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


#: acme_rmsnorm's table: (rows upper bound, ROWS a program, num_warps); the last row covers
#: everything above.
RMSNORM_TABLE: tuple[tuple[int | None, int, int], ...] = ((1024, 1, 4), (None, 4, 4))


def rmsnorm_table_config(rows: int, cols: int) -> dict[str, int]:
    for bound, per_program, warps in RMSNORM_TABLE:
        if bound is None or rows <= bound:
            return {"ROWS": per_program, "num_warps": warps}
    raise AssertionError("unreachable: the table's last row has no bound")


def _rmsnorm_config(facts: DeviceFacts, w: RmsnormWorkload) -> dict[str, int]:
    return rmsnorm_table_config(w.rows, w.cols)


@hookimpl
def kreg_ops() -> list[OpSpec]:
    return [SPEC]


@hookimpl
def kreg_implementations() -> list[Implementation]:
    return [
        Implementation(op="sparse_prefill", name="acme.sparse_prefill_blocked",
                       priority=PRIORITY, requirements=REQUIREMENTS, config=blocked_config,
                       kernel="acme_kreg.kernels:sparse_prefill_blocked",
                       description="ACME blocked geometry (BLOCK_N 64, 4 warps) for sm_89"),
        # The reference OpSpec.reference names: a torch function, eligible wherever torch runs.
        Implementation(op="acme_rmsnorm", name="acme.rmsnorm_reference", priority=0,
                       kernel="acme_kreg.rmsnorm:reference", configurable=False,
                       fallback=True, description="torch reference (float32 math)"),
        Implementation(op="acme_rmsnorm", name="acme.rmsnorm_triton", priority=10,
                       requirements=(triton_runtime(),), config=_rmsnorm_config,
                       kernel="acme_kreg.rmsnorm.triton_kernels:rmsnorm_triton",
                       description="Triton, ROWS rows a program, geometry from the rows table"),
    ]


@hookimpl
def kreg_configs(op: str) -> dict[str, dict[str, Any]] | None:
    """acme_rmsnorm's table geometries, named ``table.<ROWS>rows``: the tuner measures them beside
    its own space, and the conformance kit runs each."""
    if op != "acme_rmsnorm":
        return None
    return {f"table.{per_program}rows": {"ROWS": per_program, "num_warps": warps}
            for _, per_program, warps in RMSNORM_TABLE}


@hookimpl
def kreg_profiles() -> list[Any]:
    """The profiles ACME ships: every file of ``acme_kreg/profiles/`` (in the wheel)."""
    return [files("acme_kreg") / "profiles"]
