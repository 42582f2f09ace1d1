"""Check mode's comparison: re-run a sampled dispatch through the op's reference and compare."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from registry._knobs import knobs
from registry._spec import default_compare
from registry.errors import CheckViolationError, KregError
from registry.observe.persist import _maybe_persist
from registry.observe.records import Violation
from registry.observe.state import _counter, _state

if TYPE_CHECKING:
    from registry._decision import Decision
    from registry._registry import Registry

logger = logging.getLogger("registry.observe")


@dataclass(frozen=True)
class _OpCheck:
    reference: Callable[..., Any] | None
    compare: Callable[[Any, Any], str | None]
    problem: str | None = None  # why this op cannot be checked


def _resolve(reg: Registry, op: str) -> _OpCheck:
    spec = reg.spec(op)
    try:
        compare = spec.load_compare()
    except KregError as exc:
        return _OpCheck(None, default_compare, str(exc))
    try:
        return _OpCheck(reg.reference_kernel(op), compare)
    except KregError as exc:
        return _OpCheck(None, compare, str(exc))


def _capturing() -> bool:
    """True inside CUDA graph capture on this thread's current stream (never imports torch)."""
    probe = _state.capture_probe
    if probe is None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return False
        probe = _state.capture_probe = torch.cuda.is_current_stream_capturing
    return bool(probe())


def _check_one(reg: Registry, decision: Decision, args: tuple[Any, ...], kwargs: dict[str, Any],
               result: Any) -> None:
    st = _state
    with st.lock:
        c = _counter(decision)
        c.dispatches += 1
        st.dirty = True
        st.updated = time.time()
        sampled = (not decision.fallback
                   and (st.rate >= 1.0 or st.rng.random() < st.rate))
    if not sampled:
        _maybe_persist()
        return
    if _capturing():
        with st.lock:
            c.skipped += 1
        return
    key = (id(reg), decision.op)
    oc = st.checks.get(key)
    if oc is None:
        oc = st.checks[key] = _resolve(reg, decision.op)
    message: str | None
    try:
        if oc.reference is None:
            raise RuntimeError(oc.problem)
        expected = oc.reference(*args, **kwargs)
        message = oc.compare(result, expected)
    except Exception as exc:  # a check must never break the dispatch it watches
        with st.lock:
            c.errors += 1
        wkey = ("error", decision.op, decision.implementation)
        if wkey not in st.logged:
            st.logged.add(wkey)
            logger.warning("check mode: cannot check %s %s: %s: %s", decision.op,
                           decision.implementation, type(exc).__name__, exc)
        _maybe_persist()
        return
    with st.lock:
        c.checked += 1
        if message is not None:
            c.violations += 1
            c.last_violation = message
            c.last_workload = dict(decision.workload)
            st.seq += 1
            v = Violation(st.seq, decision.op, decision.implementation,
                          MappingProxyType(dict(decision.config or {})),
                          MappingProxyType(dict(decision.workload)), message)
            st.violations.append(v)
        st.updated = time.time()
    if message is None:
        _maybe_persist()
        return
    lkey = (decision.op, decision.implementation, c.config and tuple(c.config.items()),
            tuple(decision.workload.items()))
    if lkey not in st.logged:
        st.logged.add(lkey)
        logger.warning("check mode: %s violation: %s", decision.op, v)
    _maybe_persist(force=True)
    if knobs.strict:
        raise CheckViolationError(
            f"KREG_STRICT=1: check mode found {decision.op} implementation {v}; the reference "
            f"{decision.op} disagrees on the same inputs. Fix or disable the implementation "
            f"(KREG_SELECT_{decision.op.upper()}=<another>, KREG_DISABLE_PLUGINS=<plugin>), or "
            f"unset KREG_STRICT to only count violations (kreg stats)")
