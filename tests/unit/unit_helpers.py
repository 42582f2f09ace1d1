"""Helpers shared by the unit tests."""

from __future__ import annotations

import os

import pytest

import registry
from registry._facts import DeviceFacts


def seed_workload(**changes: object) -> dict[str, object]:
    wl: dict[str, object] = {"kind": "chunk", "topk": 2051, "head_dim": 256, "group_size": 6,
                             "num_kv_heads": 1, "total_q": 8192, "num_requests": 1,
                             "max_q": 8192, "dtype": "bfloat16"}
    wl.update(changes)
    return wl


def profile(name: str, **changes: object) -> DeviceFacts:
    facts = registry.profiles()[name]
    return facts.what_if(**changes) if changes else facts


def setenv(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    registry.invalidate()


def allow_plugin(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Add ``name`` to the plugin set the tests select with (kreg's own: tests/conftest.py)."""
    current = [p for p in os.environ.get("KREG_PLUGINS", "").split(",") if p]
    monkeypatch.setenv("KREG_PLUGINS", ",".join([*current, name]))
