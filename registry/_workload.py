"""Workloads: the decision-relevant fields of one call of an op.

Each op package in ``backends/`` defines a :class:`Workload` subclass (fields and validators) and
contributes it through the ``kreg_ops`` hook. A workload is built from host-side facts only
(shapes, dtypes, Python arguments); building one never reads device memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from registry.errors import WorkloadError

__all__ = ["MAX_INT", "MAX_STR", "Workload", "make_workload"]

#: Every int field of every workload lies in [-MAX_INT, MAX_INT] (64-bit), every str field has at
#: most MAX_STR characters: kreg's requirement code (averages, products) and the kernels' index
#: arithmetic then never see a number they cannot represent (``total_q=10**400`` is refused here,
#: naming the field, instead of overflowing inside a requirement).
MAX_INT = 2**63 - 1
MAX_STR = 256


class Workload(BaseModel):
    """Base of every op's workload model (frozen, unknown fields forbidden)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: ClassVar[str] = ""

    @model_validator(mode="after")
    def _bounded(self) -> Workload:
        # One call per model, not one per field: this runs on every selection miss.
        for name, value in self.__dict__.items():
            if type(value) is int:
                if -MAX_INT <= value <= MAX_INT:
                    continue
            elif type(value) is str:
                if len(value) <= MAX_STR:
                    continue
            elif not isinstance(value, (int, str, tuple)):
                continue
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, int) and not isinstance(v, bool) and \
                        not -MAX_INT <= v <= MAX_INT:
                    raise ValueError(f"{name}: an integer of {v.bit_length()} bits is outside "
                                     f"the 64-bit range kreg and its kernels compute in "
                                     f"(|value| <= 2**63 - 1)")
                if isinstance(v, str) and len(v) > MAX_STR:
                    raise ValueError(f"{name}: a string of {len(v)} characters; at most "
                                     f"{MAX_STR}")
        return self

    def key(self) -> tuple[Any, ...]:
        """Field values in declaration order: the workload part of every cache key."""
        return tuple(getattr(self, f) for f in type(self).model_fields)

    def short(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.model_dump().items())


def _field_hint(model: type[Workload], loc: tuple[Any, ...]) -> str:
    if not loc:
        return ""
    field = model.model_fields.get(str(loc[0]))
    if field is not None and field.description:
        return f" ({field.description})"
    return ""


def _show(value: Any) -> str:
    """``repr(value)``, at most 80 characters (an int too long for repr says its size)."""
    try:
        text = repr(value)
    except ValueError:  # int -> str conversion limit (4,300 digits)
        if isinstance(value, int):
            return f"<an int of {value.bit_length()} bits>"
        return f"<a {type(value).__name__} holding an int too long to print>"
    return text if len(text) <= 80 else text[:77] + "..."


def make_workload(model: type[Workload], data: Mapping[str, Any] | Workload) -> Workload:
    """Validate ``data`` into ``model``; errors become :class:`WorkloadError` naming each field."""
    if isinstance(data, model):
        return data
    if isinstance(data, Workload):
        raise WorkloadError(f"a {type(data).__name__} was given where a {model.__name__} "
                            f"(op {model.op!r}) is needed")
    if not isinstance(data, Mapping):
        raise WorkloadError(f"workload for op {model.op!r} must be a mapping of field -> value, "
                            f"not {type(data).__name__}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = err.get("loc", ())
            where = ".".join(str(p) for p in loc) or "workload"
            msg = err.get("msg", "invalid")
            if err.get("type") == "extra_forbidden":
                msg = f"unknown field; {model.op} workloads have: {', '.join(model.model_fields)}"
            elif err.get("type") == "missing":
                msg = "required field is missing"
            if not loc:  # a rule over the whole workload: its message names the fields
                problems.append(str(msg).removeprefix("Value error, "))
                continue
            got = _show(err.get("input"))
            problems.append(f"{where}: {msg}{_field_hint(model, loc)}; got {got}"
                            if err.get("type") not in ("missing", "extra_forbidden")
                            else f"{where}: {msg}")
        raise WorkloadError(f"invalid {model.op} workload: " + "; ".join(problems)) from None
