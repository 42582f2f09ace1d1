"""kreg: a kernel backend registry for LLM inference frameworks.

``registry.dispatch(op, ...)`` picks an implementation for this device and workload, caches the
choice, records why, and runs it; ``registry.select`` returns the decision without running
anything, also for device profiles you do not have. docs/ARCHITECTURE.md maps the code.

The flat core (facts, workloads, requirements, selection, decisions) is imported here; the
subsystems (``registry.tuning``, ``registry.daemon``, ``registry.observe``) load on first use,
so ``import registry`` stays light. ``TuningEntry``, ``TuningStore`` and ``load_table`` are
names of ``registry.tuning`` re-exported lazily.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from registry import errors
from registry._contract import Contract
from registry._decision import Candidate, Decision, OverrideInfo
from registry._default import get_registry, reset_registry
from registry._facts import DeviceFacts
from registry._format import format_config
from registry._registry import PluginRecord, Registry
from registry._spec import Implementation, OpSpec
from registry._workload import Workload
from registry.hookspecs import hookimpl, hookspec
from registry.requirements import Check, Requirement

from registry import _default as _root  # isort: skip

if typing.TYPE_CHECKING:
    from registry.tuning import TuningEntry, TuningStore, load_table

__all__ = [
    "Candidate",
    "Check",
    "Contract",
    "Decision",
    "DeviceFacts",
    "Implementation",
    "OpSpec",
    "OverrideInfo",
    "PluginRecord",
    "Registry",
    "Requirement",
    "TuningEntry",
    "TuningStore",
    "Workload",
    "agree",
    "check",
    "dispatch",
    "errors",
    "format_config",
    "get_registry",
    "hookimpl",
    "hookspec",
    "implementations",
    "invalidate",
    "load_custom_ops",
    "load_table",
    "ops",
    "override",
    "plugins",
    "probe",
    "profiles",
    "record",
    "record_outputs",
    "register_plugin",
    "require",
    "reset_registry",
    "select",
    "stats",
    "unregister_plugin",
]


def dispatch(op: str, /, *args: Any, **kwargs: Any) -> Any:
    """Run ``op`` on the implementation selected for this call's device and workload.

    The hit path: one key from shapes and host arguments, one dict lookup, the call. No pydantic
    model, no device read, no lock (safe during CUDA graph capture).
    """
    reg = _root.current
    if reg is None:
        reg = get_registry()
    try:
        call_key = reg.call_keys.get(op)
    except TypeError:  # an unhashable op: spec() below says so (try costs nothing unraised)
        call_key = None
    if call_key is None:
        reg.spec(op)  # raises UnknownOpError listing the known ops
    try:
        key = call_key(*args, **kwargs)  # type: ignore[misc]
    except TypeError as exc:  # an unknown keyword or a missing argument
        raise errors.WorkloadError(f"{op}: {exc}; see `kreg ops` for the call's arguments") \
            from None
    try:
        fn = reg.dispatch_map.get(key)
    except TypeError:  # an unhashable host argument (a list for k or max_q, ...)
        raise _unhashable(op, key) from None
    if fn is None:
        fn = reg.dispatch_miss(op, key)
    if reg.observers:
        return reg.observe(key, fn, args, kwargs)
    return fn(*args, **kwargs)


def _unhashable(op: str, key: Any) -> errors.WorkloadError:
    bad = []
    for value in key if isinstance(key, tuple) else (key,):
        try:
            hash(value)
        except TypeError:
            bad.append(f"{type(value).__name__} {value!r:.60}")
    return errors.WorkloadError(
        f"{op}: a host argument is not a plain value ({'; '.join(bad) or repr(key)[:80]}): "
        f"sizes such as k and max_q are Python ints, the kind a string; see `kreg ops`")


def select(op: str, workload: Mapping[str, Any] | Workload,
           device: DeviceFacts | str | None = None) -> Decision:
    """The decision for ``workload`` on ``device`` (DeviceFacts, a profile name, or None for this
    machine's current device), with every candidate's verdicts. Raises a ``KregError`` subclass
    for an unknown op, an invalid workload, or when nothing can run it."""
    reg = _root.current
    if reg is None:
        reg = get_registry()
    return reg.select(op, workload, device)


def probe() -> DeviceFacts:
    """DeviceFacts of this machine's current device (read once per device index), enriched by
    the plugins' ``kreg_enrich_facts`` hooks."""
    return get_registry().resolve_device(None)


def profiles() -> dict[str, DeviceFacts]:
    """``{name: DeviceFacts}`` of every device profile: the shipped ones
    (``registry/profiles/*.toml``), the plugins' (hook ``kreg_profiles``) and those of the
    ``KREG_PROFILES`` directories, enriched by ``kreg_enrich_facts``. ``kreg profiles`` shows
    where each comes from; ``select(..., device=NAME)`` takes the name (or a profile file's
    path)."""
    return get_registry().profiles()


def load_custom_ops(ops: list[str] | None = None) -> dict[str, str]:
    """Register ``torch.ops.<namespace>.<op>`` for every loaded op whose ``OpSpec.custom_op``
    names a module (or for ``ops``), by importing that module; returns ``{op: module}``.

    Call it once at start-up, before ``torch.compile`` traces code that calls the custom ops
    (kreg never imports these modules itself: dispatch and selection stay free of
    ``torch.library``). Importing a module twice is harmless. Raises
    :class:`~registry.errors.KernelUnavailableError` naming the op, its plugin and the module
    when one cannot be imported, and :class:`~registry.errors.UnknownOpError` for an unknown
    op in ``ops``.
    """
    import importlib

    reg = get_registry()
    names = sorted(reg.ops) if ops is None else list(ops)
    out: dict[str, str] = {}
    for name in names:
        module = reg.spec(name).custom_op
        if not module:
            if ops is not None:
                raise errors.KernelUnavailableError(
                    f"op {name!r} (plugin {reg.op_plugins.get(name, '?')!r}) has no custom op: "
                    f"its OpSpec.custom_op names no module")
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise errors.KernelUnavailableError(
                f"op {name!r} (plugin {reg.op_plugins.get(name, '?')!r}): cannot import its "
                f"OpSpec.custom_op module {module!r}: {type(exc).__name__}: {exc}") from exc
        out[name] = module
    return out


@contextmanager
def override(op: str, implementation: str) -> Iterator[None]:
    """Prefer ``implementation`` (``auto``, a name, or ``name:measure``) for ``op`` in the block."""
    with get_registry().override(op, implementation):
        yield


@contextmanager
def require(op: str, *guarantees: str) -> Iterator[None]:
    """Require ``guarantees`` (``exact``, ``deterministic``, ``batch_invariant``) of ``op``'s
    implementations in the block, as ``KREG_REQUIRE_<OP>`` does for the process: candidates
    without them fail a ``contract`` check, and with ``batch_invariant`` one implementation and
    config serve every batch size."""
    from registry._contract import parse_guarantees

    wanted = parse_guarantees(guarantees, f"registry.require({op!r}, ...)")
    with get_registry().require(op, wanted):
        yield


def invalidate() -> None:
    """Forget every cached decision (e.g. after changing ``KREG_SELECT_<OP>`` in-process)."""
    get_registry().invalidate()


def register_plugin(plugin: object, name: str) -> None:
    """Register a plugin object at run time (the cache is invalidated)."""
    get_registry().register_plugin(plugin, name)


def unregister_plugin(name: str) -> None:
    get_registry().unregister_plugin(name)


def plugins() -> list[PluginRecord]:
    """Every plugin seen: loaded ones with their ops and implementations, and failures."""
    return sorted(get_registry().plugins.values(), key=lambda p: p.name)


def record() -> Any:
    """``with registry.record() as launches:`` captures (op, implementation, config, workload)
    of every dispatch in the block, so a test can assert the geometry that actually ran."""
    from registry.observe import record as _record

    return _record()


def check(rate: float, seed: int | None = None) -> Any:
    """Re-run a sampled fraction of dispatches through the op's reference and compare (also a
    context manager restoring the previous rate); see ``KREG_CHECK``."""
    from registry.observe import check as _check

    return _check(rate, seed=seed)


def stats() -> Any:
    """Dispatch and check-mode counters of this process."""
    from registry.observe import stats as _stats

    return _stats()


def agree(group: Any = None, adopt: bool = False, outputs: bool = False) -> Any:
    """A torch.distributed collective: all-gather every rank's decision digests, report each
    divergence, and with ``adopt=True`` pin rank 0's decisions on every rank. ``outputs=True``
    also compares the output digests ``record_outputs`` took since the last call."""
    from registry._agree import agree as _agree

    return _agree(group=group, adopt=adopt, outputs=outputs)


def record_outputs(ops: Any = None, every: int = 16) -> Any:
    """``with registry.record_outputs(["indexer_topk"], every=16):`` digests every 16th dispatch
    of the named ops (default: all) for ``registry.agree(outputs=True)`` to compare across
    ranks (the digest runs on the output's device; the dispatch never synchronizes)."""
    from registry.observe.digests import record_outputs as _record_outputs

    return _record_outputs(get_registry(), ops, every)


def ops() -> list[str]:
    return sorted(get_registry().ops)


def implementations(op: str) -> list[Implementation]:
    from registry._select import sort_key

    return sorted(get_registry().implementations(op), key=sort_key)


_LAZY = {"TuningEntry": "registry.tuning", "TuningStore": "registry.tuning",
         "load_table": "registry.tuning"}


def __getattr__(name: str) -> Any:
    """The tuning names, imported on first use (the core imports no subsystem)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'registry' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
