from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import registry


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("KREG_SELECT_SPARSE_PREFILL", "KREG_SELECT_INDEXER_TOPK", "KREG_STRICT",
                "KREG_DISABLE_PLUGINS", "KREG_DAEMON", "KREG_CHECK", "KREG_LOCK", "KREG_LOCK_MODE",
                "KREG_PROFILES", "KREG_REQUIRE_SPARSE_PREFILL", "KREG_REQUIRE_INDEXER_TOPK"):
        monkeypatch.delenv(var, raising=False)
    # kreg's own plugins only, whatever else is installed (tests/conftest.py).
    monkeypatch.setenv("KREG_PLUGINS", os.environ.get("KREG_PLUGINS", ""))
    registry.invalidate()  # the registry reads KREG_* when invalidated, not per call
    yield
    registry.invalidate()


@pytest.fixture
def fresh() -> Iterator[registry.Registry]:
    """A fresh default registry loaded from the entry points; restored afterwards."""
    reg = registry.reset_registry()
    yield reg
    registry.reset_registry()
