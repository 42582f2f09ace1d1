"""The conformance kit: ``pytest --kreg-conformance PLUGIN``.

A pytest plugin shipped with kreg (entry point ``pytest11``; before that, ``-p registry.testing``).
For every implementation the named plugin registers, it runs the op's conformance cases (the
module named by ``OpSpec.conformance``: ``CASES`` and ``DTYPES``) on the devices present — the
GPU when there is one, else the CPU with the Triton interpreter — in the dtypes the op lists for
that device, and compares each result with the op's torch reference on the same inputs through
``OpSpec.compare``.

Each (implementation, device, dtype, case) is one test item, named
``<implementation>[<device>-<dtype>-<case>]``. The implementation is forced with
``registry.override(op, "<implementation>:measure")``: its envelope requirements are waived, its
capability requirements are not, so where one fails on this device (or for the case's workload)
the item is skipped with the failed checks as the reason. An item fails when the kernel raises,
when dispatch ran another implementation, when the kernel changed one of its inputs, or when the
comparison reports a violation; the failure names the case, what it pins and the violation.

The items join whatever else pytest collects; ``-m kreg_conformance`` selects the kit alone.

Options::

    --kreg-conformance PLUGIN        plugin name (repeatable, or comma-separated; "all" for every
                                     loaded plugin)
    --kreg-conformance-cases OP=MODULE
                                     take OP's cases from MODULE instead of OpSpec.conformance
    --kreg-conformance-seed N        seed of the cases' random inputs (default 0)

The same checks are available without pytest: :func:`conformance_targets` and
:func:`run_target`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pytest

__all__ = ["Outcome", "Target", "available_devices", "conformance_targets", "run_target"]


@dataclass(frozen=True)
class Target:
    """One conformance item: an implementation, a device, a dtype and a case."""

    plugin: str
    op: str
    implementation: str
    device: str  # "cpu" or "cuda" (the current CUDA/ROCm device)
    dtype: str
    case: str
    doc: str = ""
    cases_module: str = ""

    @property
    def name(self) -> str:
        return f"{self.implementation}[{self.device}-{self.dtype}-{self.case}]"


@dataclass(frozen=True)
class Outcome:
    status: Literal["passed", "failed", "skipped"]
    message: str = ""


def available_devices() -> list[str]:
    """The GPU when there is one (CUDA or ROCm), else the CPU (Triton through its interpreter)."""
    import torch

    return ["cuda"] if torch.cuda.is_available() else ["cpu"]


def _cases(module: str) -> tuple[Any, dict[str, tuple[str, ...]]]:
    import importlib

    mod = importlib.import_module(module)
    return tuple(mod.CASES), dict(getattr(mod, "DTYPES", {}))


def conformance_targets(plugin: str, *, cases: Mapping[str, str] | None = None,
                        devices: Iterable[str] | None = None) -> list[Target]:
    """Every (implementation, device, dtype, case) of ``plugin``'s implementations.

    ``cases`` maps an op to the module of its cases, overriding ``OpSpec.conformance``. An op
    without cases yields one target with ``case="no-cases"`` (reported as skipped).
    Raises :class:`~registry.errors.PluginError` for a plugin that is not loaded.
    """
    import registry
    from registry.errors import PluginError

    reg = registry.get_registry()
    rec = reg.plugins.get(plugin)
    if rec is None or not rec.loaded:
        loaded = ", ".join(sorted(n for n, r in reg.plugins.items() if r.loaded)) or "(none)"
        why = "is not installed" if rec is None else (
            f"did not load: {rec.error or rec.skipped_reason}")
        raise PluginError(f"conformance: plugin {plugin!r} {why}; loaded plugins: {loaded}")
    overrides = dict(cases or {})
    devs = list(devices) if devices is not None else available_devices()
    out: list[Target] = []
    for name in rec.implementations:
        impl = next(i for d in reg.impls.values() for n, i in d.items() if n == name)
        module = overrides.get(impl.op) or reg.spec(impl.op).conformance
        if not module:
            out.append(Target(plugin, impl.op, name, devs[0], "-", "no-cases",
                              f"op {impl.op!r} declares no conformance cases (OpSpec.conformance)"))
            continue
        op_cases, dtypes = _cases(module)
        for dev in devs:
            for dtype in dtypes.get(dev, ("float32",)):
                for case in op_cases:
                    out.append(Target(plugin, impl.op, name, dev, dtype, case.name,
                                      getattr(case, "doc", ""), module))
    return out


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    import torch

    named = [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    return [(n, t) for n, t in named if isinstance(t, torch.Tensor)]


def run_target(target: Target, *, seed: int = 0) -> Outcome:
    """Run one conformance item; never raises for a kernel's failure (it becomes the outcome)."""
    import torch

    import registry
    from registry.errors import KregError, StrictModeError
    from registry.observe import record
    from registry.observe.checker import _resolve

    if target.case == "no-cases":
        return Outcome("skipped", target.doc)
    reg = registry.get_registry()
    spec = reg.spec(target.op)
    op_cases, _ = _cases(target.cases_module)
    case = next(c for c in op_cases if c.name == target.case)
    args, kwargs = case.make(torch.device(target.device), getattr(torch, target.dtype), seed)
    key = spec.call_key(*args, **kwargs)
    facts = reg.facts_for_index(key[1])
    workload = spec.workload_from_key(key[2:])
    forced = target.implementation + ":measure"
    try:
        with registry.override(target.op, forced):
            decision = reg.select(target.op, workload, facts)
    except StrictModeError as exc:  # KREG_STRICT=1 turns "not honoured" into an error
        return Outcome("skipped", f"{target.implementation} cannot run here: {exc}")
    if decision.implementation != target.implementation:
        why = decision.override.reason if decision.override is not None else "not selected"
        return Outcome("skipped", f"{target.implementation} cannot run [{workload.short()}] on "
                                  f"{facts.describe()}: {why}")
    checker = _resolve(reg, target.op)
    if checker.reference is None:
        return Outcome("failed", f"cannot compare: {checker.problem}")
    originals = [(n, t.clone()) for n, t in _tensors(args, kwargs)]
    expected = checker.reference(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args],
                                 **{k: v.clone() if isinstance(v, torch.Tensor) else v
                                    for k, v in kwargs.items()})
    where = (f"{target.implementation} on {target.device} {target.dtype}, case {target.case!r} "
             f"({target.doc}); workload [{workload.short()}]")
    try:
        with registry.override(target.op, forced), record() as launches:
            actual = registry.dispatch(target.op, *args, **kwargs)
    except KregError as exc:
        return Outcome("failed", f"{where}: dispatch raised {type(exc).__name__}: {exc}")
    ran = [launch.implementation for launch in launches]
    if ran != [target.implementation]:
        return Outcome("failed", f"{where}: dispatch ran {ran}, not {target.implementation}")
    for (name, before), (_, after) in zip(originals, _tensors(args, kwargs), strict=True):
        if not _same(before, after):
            return Outcome("failed", f"{where}: the kernel modified its input {name}")
    violation = checker.compare(actual, expected)
    if violation is not None:
        return Outcome("failed", f"{where}: {violation}")
    return Outcome("passed")


def _same(a: Any, b: Any) -> bool:
    import torch

    if a.is_floating_point():
        return bool(torch.equal(a.isnan(), b.isnan())
                    and torch.equal(a.nan_to_num(), b.nan_to_num()))
    return bool(torch.equal(a, b))


# ---------------------------------------------------------------------------------------------
# pytest glue


class ConformanceFailure(Exception):
    """A conformance item's failure; its message is the whole report."""


class ConformanceItem(pytest.Item):
    def __init__(self, *, target: Target, seed: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target
        self.seed = seed
        self.add_marker("kreg_conformance")

    def runtest(self) -> None:
        outcome = run_target(self.target, seed=self.seed)
        if outcome.status == "skipped":
            pytest.skip(outcome.message)
        if outcome.status == "failed":
            raise ConformanceFailure(outcome.message)

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, ConformanceFailure):
            return f"conformance: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"kreg conformance {self.target.name}"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kreg", "kreg conformance kit")
    group.addoption("--kreg-conformance", action="append", default=[], metavar="PLUGIN",
                    help="run the op conformance cases against every implementation PLUGIN "
                         "registers (repeatable or comma-separated; 'all' for every plugin)")
    group.addoption("--kreg-conformance-cases", action="append", default=[], metavar="OP=MODULE",
                    help="take OP's conformance cases from MODULE instead of OpSpec.conformance")
    group.addoption("--kreg-conformance-seed", type=int, default=0, metavar="N",
                    help="seed of the conformance cases' random inputs (default 0)")


def _plugins(config: pytest.Config) -> list[str]:
    return [p.strip() for raw in config.getoption("kreg_conformance") or []
            for p in raw.split(",") if p.strip()]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kreg_conformance: an item of the kreg conformance kit")
    if _plugins(config):
        # Triton reads TRITON_INTERPRET at import: set it before any kernel module loads.
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection, so those select conformance items
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    names = _plugins(config)
    if not names:
        return
    import registry
    from registry.errors import KregError

    cases: dict[str, str] = {}
    for raw in config.getoption("kreg_conformance_cases") or []:
        op, sep, module = raw.partition("=")
        if not sep or not op.strip() or not module.strip():
            raise pytest.UsageError(f"--kreg-conformance-cases {raw!r}: expected OP=MODULE, e.g. "
                                    "sparse_prefill=backends.sparse_prefill.conformance")
        cases[op.strip()] = module.strip()
    if "all" in names:
        names = [r.name for r in registry.plugins() if r.loaded and r.implementations]
    seed = config.getoption("kreg_conformance_seed")
    for name in names:
        try:
            targets = conformance_targets(name, cases=cases)
        except (KregError, ImportError) as exc:
            raise pytest.UsageError(f"--kreg-conformance {name}: {exc}") from None
        if not targets:
            raise pytest.UsageError(f"--kreg-conformance {name}: plugin {name!r} registers no "
                                    "implementation; nothing to check")
        for target in targets:
            items.append(ConformanceItem.from_parent(session, name=target.name,
                                                     nodeid=target.name, target=target,
                                                     seed=seed))


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    names = _plugins(config)
    if not names:
        return None
    import registry

    facts = registry.probe()
    return [f"kreg conformance: plugin(s) {', '.join(names)} on {facts.describe()}"]
