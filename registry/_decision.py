"""Decisions: the chosen implementation and config, with every candidate's verdicts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from registry._facts import DeviceFacts
from registry.requirements import Check

__all__ = ["Candidate", "Decision", "OverrideInfo"]


class Candidate(BaseModel):
    """One implementation of the op and its verdict for this (device, workload)."""

    model_config = ConfigDict(frozen=True)

    implementation: str
    plugin: str
    priority: int
    eligible: bool
    checks: list[Check]
    config: dict[str, Any] | None = None
    rank: int | None = None  # position among the eligible ones (0 = chosen unless overridden)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]


class OverrideInfo(BaseModel):
    """The override in force for this op and whether it was honoured."""

    model_config = ConfigDict(frozen=True)

    value: str  # as written: "auto", "impl", "impl:measure"
    source: str  # "KREG_SELECT_SPARSE_PREFILL" or "registry.override()"
    implementation: str | None = None
    measure: bool = False
    honoured: bool = True
    reason: str = ""


class Decision(BaseModel):
    """What ``select`` chose and why. Frozen; ``model_dump_json()`` is its wire form."""

    model_config = ConfigDict(frozen=True)

    op: str
    implementation: str
    config: dict[str, Any] | None
    fallback: bool
    reason: str
    candidates: list[Candidate]
    override: OverrideInfo | None = None
    facts: DeviceFacts
    workload: dict[str, Any]
    cached: bool = False
    source: Literal["local", "daemon", "adopted"] = "local"
    notes: list[str] = []
    # The chosen implementation's contract for the chosen config (registry/_contract.py), and
    # the guarantees the caller required (KREG_REQUIRE_<OP>, registry.require()).
    guarantees: list[str] = []
    order_class: str | None = None
    required: list[str] = []

    @property
    def chosen(self) -> Candidate:
        for c in self.candidates:
            if c.implementation == self.implementation:
                return c
        raise LookupError(self.implementation)  # unreachable for a well-formed decision

    def config_short(self) -> str:
        from registry._format import format_config_short

        return format_config_short(self.config)

    def one_line(self) -> str:
        """``sparse_prefill -> nvidia_sm120.sparse_prefill_tuned (8,16,4,3) because ...``"""
        cfg = self.config_short()
        cfg = "" if cfg == "-" else " " + cfg
        return f"{self.op} -> {self.implementation}{cfg} because {self.reason}"

    def explain(self, verbose: bool = False) -> str:
        from registry._format import format_decision

        return format_decision(self, verbose=verbose)
