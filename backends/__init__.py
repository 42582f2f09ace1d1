"""The ops (``indexer_topk``, ``sparse_prefill``): references, kernels, benches.

:func:`flashinfer_for_bench` is shared by the ops' benches: their raw FlashInfer providers
(``flashinfer-topk``, ``flashinfer-paged``) import FlashInfer through it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["flashinfer_for_bench"]


def flashinfer_for_bench(provider: str) -> Any:
    """``import flashinfer`` for the bench provider ``provider``, or a ``click.ClickException``
    that names the provider and how to get FlashInfer (a usage error, never a traceback)."""
    import importlib

    import click

    try:
        return importlib.import_module("flashinfer")
    except Exception as exc:
        raise click.ClickException(
            f"--providers {provider}: flashinfer is not importable ({type(exc).__name__}: "
            f"{exc}); install it (pip install 'kreg[flashinfer]') or drop the provider") from None
