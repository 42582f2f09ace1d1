"""Helpers shared by the unit tests."""

from __future__ import annotations

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
