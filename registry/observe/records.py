"""What observation produces: launches, violations and the check-mode counters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from registry._format import format_config

__all__ = ["Counter", "Launch", "Stats", "Violation"]


@dataclass(frozen=True, slots=True)
class Launch:
    """One dispatch as it ran: ``config`` and ``workload`` are read-only mappings."""

    op: str
    implementation: str
    config: Mapping[str, Any]
    workload: Mapping[str, Any]
    fallback: bool = False

    def __str__(self) -> str:
        return f"{self.op} -> {self.implementation} ({format_config(self.config)})"


@dataclass(frozen=True, slots=True)
class Violation:
    """One comparison outside the op's bound."""

    seq: int
    op: str
    implementation: str
    config: Mapping[str, Any]
    workload: Mapping[str, Any]
    message: str

    def __str__(self) -> str:
        wl = " ".join(f"{k}={v}" for k, v in self.workload.items())
        return f"{self.implementation} ({format_config(self.config)}) on [{wl}]: {self.message}"


class Counter(BaseModel):
    """Check-mode counters of one (op, implementation, config)."""

    op: str
    implementation: str
    config: dict[str, Any] | None = None
    dispatches: int = Field(default=0, description="dispatches seen while check mode was on")
    checked: int = Field(default=0, description="re-run through the reference and compared")
    violations: int = Field(default=0, description="comparisons outside the op's bound")
    errors: int = Field(default=0, description="checks that could not run (a raise)")
    skipped: int = Field(default=0, description="sampled inside CUDA graph capture: not compared")
    last_violation: str | None = None
    last_workload: dict[str, Any] | None = None


class Stats(BaseModel):
    """Check-mode counters of one process."""

    pid: int
    rate: float
    seed: int
    updated: float = Field(description="time.time() of the last change")
    counters: list[Counter] = []

    @property
    def violations(self) -> int:
        return sum(c.violations for c in self.counters)

    @property
    def checked(self) -> int:
        return sum(c.checked for c in self.counters)

    def counter(self, implementation: str, config: Mapping[str, Any] | None = None) -> Counter:
        """The counter of ``implementation`` (and ``config`` when given); LookupError if none."""
        for c in self.counters:
            if c.implementation == implementation and (config is None
                                                       or dict(c.config or {}) == dict(config)):
                return c
        raise LookupError(f"no check-mode counter for {implementation} "
                          f"{'' if config is None else dict(config)}; have: "
                          f"{', '.join(c.implementation for c in self.counters) or '(none)'}")
