"""Shared test set-up.

Without a GPU, Triton kernels run under the interpreter; TRITON_INTERPRET must be set before
Triton is first imported, so it is set here, at collection start.

The tests select with kreg's own plugins, whatever else is installed: a third-party plugin in
the environment (``pip install examples/acme-plugin``) would otherwise change what the policy
tests see. ``KREG_PLUGINS`` is set here, before any registry exists, to the entry points of the
``kreg`` distribution itself (``IN_TREE_PLUGINS``); tests of third-party plugins load them
explicitly (``register_plugin``, or a subprocess with its own environment).
"""

from __future__ import annotations

import importlib.metadata
import os

import pytest


def _in_tree_plugins() -> str:
    eps = importlib.metadata.entry_points(group="kreg")
    return ",".join(sorted({ep.name for ep in eps
                            if ep.dist is not None and ep.dist.name == "kreg"}))


IN_TREE_PLUGINS = _in_tree_plugins()
os.environ["KREG_PLUGINS"] = IN_TREE_PLUGINS


def pytest_configure(config: pytest.Config) -> None:
    # A conformance run (pytest --kreg-conformance PLUGIN) means kreg's plugins and PLUGIN.
    named = [p.strip() for raw in config.getoption("kreg_conformance", None) or []
             for p in raw.split(",") if p.strip()]
    if named:
        os.environ["KREG_PLUGINS"] = ",".join(sorted({*IN_TREE_PLUGINS.split(","), *named}))


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


HAS_GPU = _has_gpu()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
