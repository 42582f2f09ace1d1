"""What the sparse_prefill kernels guarantee per config (registry/_contract.py).

* **deterministic** — every config: no floating-point atomics (DENSE and UNION count and mark with
  integer atomics, which commute), a fixed reduction tree per config; the same inputs give the
  same bits.
* **batch_invariant** — a config whose programs each compute one query row: every Triton config
  except DENSE and UNION tiles (whether a tile of rows takes the dense or the union path depends
  on its neighbouring rows), and both Gluon engines (one row a program). Selection must not
  switch configs with the batch size either: that is what requiring ``batch_invariant`` adds
  (``OpSpec.batch_reference``).
* **order class** — the config keys that can change the order of a row's sums. The others are
  proven not to (tests/kernels/test_sparse_prefill_contract.py: configs of one class give the
  same bits): ``OFFS32`` (offset width), ``REVERSE_ROWS`` (program order), ``MAXNREG`` (register
  cap), ``num_stages`` (pipelining), ``CHUNK_MODE`` (where the page table is translated).
  ``num_warps`` and the tile sizes stay in the class: they set the
  reduction trees of the tile's max and sum.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from registry import Contract

__all__ = ["ORDER_NEUTRAL", "kernel_contract", "order_class"]

ORDER_NEUTRAL = frozenset({"OFFS32", "REVERSE_ROWS", "MAXNREG", "num_stages", "CHUNK_MODE"})


def order_class(config: Mapping[str, Any] | None) -> str:
    """The config's accumulation-order class: ``triton BLOCK_M=8 BLOCK_N=16 ...`` (sorted)."""
    cfg = dict(config or {})
    engine = str(cfg.pop("ENGINE", "triton"))
    keys = sorted(k for k in cfg if k not in ORDER_NEUTRAL)
    return " ".join([engine, *(f"{k}={cfg[k]}" for k in keys)])


def kernel_contract(config: Mapping[str, Any] | None) -> Contract:
    """The contract of the Triton/Gluon kernels run with ``config``."""
    cfg = config or {}
    tiles = bool(cfg.get("DENSE") or cfg.get("UNION"))
    return Contract(deterministic=True, batch_invariant=not tiles,
                    order_class=order_class(config))
