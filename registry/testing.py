"""The conformance kit: ``pytest --kreg-conformance PLUGIN [--kreg-conformance-device PROFILE]``.

A pytest plugin shipped with kreg (entry point ``pytest11``; before that, ``-p registry.testing``).
For every implementation the named plugin registers, it runs the op's conformance cases (the
module named by ``OpSpec.conformance``: ``CASES`` and ``DTYPES``, plus the implementation's own
``Implementation.conformance_cases`` and any ``--kreg-conformance-cases``) on the device present
— the GPU when there is one, else the CPU with the Triton interpreter — in the dtypes the op
lists for that device, and compares each result with the op's torch reference on the same inputs
through ``OpSpec.compare``.

*Where it is judged.* Selection is judged on *targets*: this machine, and each device profile the
implementation declares (``Implementation.conformance_profiles``), or exactly the profiles given
with ``--kreg-conformance-device`` (a profile name or a ``.toml`` / ``.json`` profile file;
repeatable). On a profile, the implementation is forced with ``<implementation>:measure``
against the profile's facts (its envelope waived, its capability requirements checked there),
and the config it chooses there is then run *here*: on a CPU through the Triton interpreter, at
the cases' small sizes. So a kernel gated to an architecture nobody here has is executed, not
skipped.

*Every config of its table.* A config that only applies at large sizes (a long-KV or dense
geometry) is never chosen at the cases' sizes, so for each case the kit also asks the
implementation what it would choose for the case's shape at other sizes — the op's
``point_fields`` (sparse_prefill: kv_len and total_q) set to every power of two up to 2**20 —
and each config found that the plugin offers (its ``kreg_configs`` table) and no case item runs
is run once more, on that case, at the first dtype, named after it
(``...-seed_prefill_g6@dense.prefill_g6``). Configs a formula derives per shape (not offered)
are covered by the case items.

Each item is named ``<implementation>[<target>:<device>-<dtype>-<case>]`` (no ``<target>:`` for
this machine). It fails when the kernel raises, when dispatch ran another implementation, when the
kernel changed one of its inputs, or when the comparison reports a violation; the failure names
the case, what it pins and the violation. It is skipped, with the failed checks as the reason,
where a capability requirement fails on the target for the case's workload. A kernel that raises
:class:`~registry.errors.KernelUnavailableError` while it runs (a Gluon engine under the
interpreter, a GPU it does not support) is *not runnable here*: reported by config name, skipped,
and not counted as tested.

A run in which no item of a plugin named with ``--kreg-conformance`` executed (all skipped or
not runnable) fails, naming the reasons and the option that would make it run (a profile it is
eligible on, ``TRITON_INTERPRET=1``, or cases that fit its capability). The terminal summary
counts executed, not runnable and skipped items per plugin.

The items join whatever else pytest collects; ``-m kreg_conformance`` selects the kit alone.

Options::

    --kreg-conformance PLUGIN        plugin name (repeatable, or comma-separated; "all" for every
                                     loaded plugin with implementations: those are reported, but
                                     the nothing-tested rule applies to named plugins only)
    --kreg-conformance-device PROFILE
                                     judge on this profile (name or .toml/.json file) instead of
                                     this machine and the declared profiles (repeatable)
    --kreg-conformance-cases OP=MODULE
                                     add OP's cases from MODULE ("module" with CASES [and
                                     DTYPES], or "module:ATTR") to the op's own (repeatable)
    --kreg-conformance-seed N        seed of the cases' random inputs (default 0)

The same checks are available without pytest: :func:`conformance_targets` and
:func:`run_target`.
"""

from __future__ import annotations

import importlib
import itertools
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

__all__ = ["Outcome", "Target", "available_devices", "conformance_targets", "run_target"]

#: Sizes the kit tries for every point field when it asks which configs an implementation would
#: choose for a case's shape (every power of two up to 2**20, and the case's own value).
PROBE_SIZES = tuple(1 << i for i in range(21))


@dataclass(frozen=True)
class Target:
    """One conformance item: an implementation, a target, a device, a dtype and a case.

    ``profile`` is the device profile the selection is judged on (a name or a profile file's
    path; ``""`` for this machine) and ``profile_name`` its name; ``config`` a config found by
    probing the case's shape at other sizes, run instead of the one chosen at the case's size.
    """

    plugin: str
    op: str
    implementation: str
    device: str  # where it runs: "cpu" or "cuda" (the current CUDA/ROCm device)
    dtype: str
    case: str
    doc: str = ""
    cases_module: str = ""
    profile: str = ""
    profile_name: str = ""
    config: tuple[tuple[str, Any], ...] | None = None
    config_label: str = ""

    @property
    def name(self) -> str:
        where = f"{self.profile_name or self.profile}:" if self.profile else ""
        tail = f"@{self.config_label}" if self.config is not None else ""
        return f"{self.implementation}[{where}{self.device}-{self.dtype}-{self.case}{tail}]"


@dataclass(frozen=True)
class Outcome:
    """``passed`` / ``failed`` / ``skipped`` / ``not_runnable`` (the kernel cannot run on this
    machine: not tested), the report, and for a skip the failed checks."""

    status: Literal["passed", "failed", "skipped", "not_runnable"]
    message: str = ""
    checks: tuple[str, ...] = field(default=(), compare=False)
    config: tuple[tuple[str, Any], ...] | None = field(default=None, compare=False)


def available_devices() -> list[str]:
    """The GPU when there is one (CUDA or ROCm), else the CPU (Triton through its interpreter)."""
    import torch

    return ["cuda"] if torch.cuda.is_available() else ["cpu"]


def _load_cases(ref: str, op_dtypes: Mapping[str, tuple[str, ...]] | None = None
                ) -> tuple[tuple[Any, ...], dict[str, tuple[str, ...]]]:
    """``(cases, dtypes)`` of ``"module"`` (``CASES``, ``DTYPES``) or ``"module:ATTR"`` (a tuple
    of cases; the op's dtypes)."""
    from registry.errors import PluginError

    module, _, attr = ref.partition(":")
    try:
        mod = importlib.import_module(module)
        cases = getattr(mod, attr or "CASES")
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"conformance cases {ref!r} cannot be loaded: {type(exc).__name__}: "
                          f"{exc}; name a module with CASES (and DTYPES) or 'module:ATTR'"
                          ) from None
    dtypes = dict(getattr(mod, "DTYPES", {})) if not attr else {}
    return tuple(cases), dtypes or dict(op_dtypes or {})


def _sources(reg: Any, impl: Any, extra: Mapping[str, Sequence[str]]) -> list[str]:
    spec = reg.spec(impl.op)
    out = [spec.conformance, impl.conformance_cases, *extra.get(impl.op, ())]
    return list(dict.fromkeys(s for s in out if s))


def _cases_of(reg: Any, impl: Any, extra: Mapping[str, Sequence[str]]
              ) -> list[tuple[Any, str, dict[str, tuple[str, ...]]]]:
    """Every case for ``impl``: ``(case, its module ref, dtypes)``; the op's first."""
    from registry.errors import PluginError

    sources = _sources(reg, impl, extra)
    op_dtypes: dict[str, tuple[str, ...]] = {}
    out: list[tuple[Any, str, dict[str, tuple[str, ...]]]] = []
    seen: dict[str, str] = {}
    for i, ref in enumerate(sources):
        cases, dtypes = _load_cases(ref, op_dtypes)
        if i == 0:
            op_dtypes = dtypes
        for case in cases:
            if case.name in seen:
                raise PluginError(f"conformance case {case.name!r} of {ref!r} has the name of a "
                                  f"case of {seen[case.name]!r}; rename it (cases are added to "
                                  f"the op's, never replace them)")
            seen[case.name] = ref
            out.append((case, ref, dtypes))
    return out


def _cases_arg(cases: Mapping[str, str | Sequence[str]] | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for op, refs in (cases or {}).items():
        out.setdefault(op, []).extend([refs] if isinstance(refs, str) else list(refs))
    return out


def _workload(reg: Any, op: str, case: Any, device: str, dtype: str,
              seed: int = 0) -> tuple[Any, Any]:
    """The case's workload and the facts of the device it runs on here."""
    import torch

    spec = reg.spec(op)
    args, kwargs = case.make(torch.device(device), getattr(torch, dtype), seed)
    key = spec.call_key(*args, **kwargs)
    return spec.workload_from_key(key[2:]), reg.facts_for_index(key[1])


def _eligible(impl: Any, facts: Any, workload: Any) -> bool:
    """Whether ``impl`` forced with ``:measure`` (its envelope waived) may run ``workload``."""
    for req in impl.requirements:
        try:
            check = req.check(facts, workload)
        except Exception:
            return False
        if not check.passed and check.kind != "envelope":
            return False
    return True


def _probe(impl: Any, facts: Any, workload: Any, point_fields: Sequence[str]
           ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``[(config, point)]``: every distinct config ``impl`` chooses for ``workload``'s shape
    with its point fields set to :data:`PROBE_SIZES` (the smallest point first)."""
    fields = [f for f in point_fields if f in type(workload).model_fields][:3]
    if not fields:
        return []
    axes = [sorted({*PROBE_SIZES, *([getattr(workload, f)] if getattr(workload, f) else [])})
            for f in fields]
    found: dict[tuple[tuple[str, Any], ...], tuple[dict[str, Any], dict[str, Any]]] = {}
    for values in itertools.product(*axes):
        point = dict(zip(fields, values, strict=True))
        wl = workload.model_copy(update=point)
        if not _eligible(impl, facts, wl):
            continue
        try:
            cfg = impl.resolve_config(facts, wl)
        except Exception:
            continue
        if cfg is None:
            continue
        key = tuple(sorted(cfg.items()))
        if key not in found:
            found[key] = (cfg, point)
    return list(found.values())


def conformance_targets(plugin: str, *, cases: Mapping[str, str | Sequence[str]] | None = None,
                        devices: Iterable[str] | None = None,
                        profiles: Sequence[str] | None = None,
                        probe: bool = True) -> list[Target]:
    """Every item of ``plugin``'s implementations (see the module docstring).

    ``cases`` maps an op to extra case modules (added to ``OpSpec.conformance`` and the
    implementation's ``conformance_cases``). ``devices`` are where the items run (default: the
    GPU, else the CPU). ``profiles`` are the targets to judge on (names or profile files);
    None means this machine plus each implementation's ``conformance_profiles``. ``probe``
    adds the items of the configs found at other sizes. An op without cases yields one target
    with ``case="no-cases"`` (reported as skipped). Raises
    :class:`~registry.errors.PluginError` for a plugin that is not loaded and for cases that
    cannot be loaded, :class:`~registry.errors.UnknownDeviceError` /
    :class:`~registry.errors.ConfigError` for a profile that does not resolve.
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
    extra = _cases_arg(cases)
    devs = list(devices) if devices is not None else available_devices()
    out: list[Target] = []
    for name in rec.implementations:
        impl = next(i for d in reg.impls.values() for n, i in d.items() if n == name)
        all_cases = _cases_of(reg, impl, extra)
        if not all_cases:
            out.append(Target(plugin, impl.op, name, devs[0], "-", "no-cases",
                              f"op {impl.op!r} declares no conformance cases (OpSpec.conformance)"))
            continue
        wanted = list(profiles) if profiles is not None else ["", *impl.conformance_profiles]
        for prof in dict.fromkeys(wanted):
            pname = (reg.resolve_device(prof).profile or prof) if prof else ""
            for dev in devs:
                for case, ref, dtypes in all_cases:
                    for dtype in dtypes.get(dev, ("float32",)):
                        out.append(Target(plugin, impl.op, name, dev, dtype, case.name,
                                          getattr(case, "doc", ""), ref, prof, pname))
                if probe:
                    out.extend(_probe_targets(reg, plugin, impl, prof, pname, dev, all_cases))
    return out


def _probe_targets(reg: Any, plugin: str, impl: Any, prof: str, pname: str, dev: str,
                   all_cases: list[tuple[Any, str, dict[str, tuple[str, ...]]]]) -> list[Target]:
    """The items of the configs ``impl`` chooses at other sizes than the cases' (see above)."""
    spec = reg.spec(impl.op)
    offered = {tuple(sorted(cfg.items())): label.removeprefix(f"{impl.plugin}.")
               for label, cfg in reg.offered_configs(impl.op).items()
               if label.startswith(f"{impl.plugin}.")}
    if not spec.point_fields or not offered:
        return []
    facts = reg.resolve_device(prof) if prof else None
    shapes = []
    for case, ref, dtypes in all_cases:
        dtype = (dtypes.get(dev) or ("float32",))[0]
        try:
            wl, local = _workload(reg, impl.op, case, dev, dtype)
        except Exception:
            continue  # the case item reports it
        here = facts if facts is not None else local
        if not _eligible(impl, here, wl):
            continue
        own = impl.resolve_config(here, wl)
        shapes.append((case, ref, dtype, wl, here, tuple(sorted((own or {}).items()))))
    done = {own for *_, own in shapes}
    out: list[Target] = []
    for case, ref, dtype, wl, here, _ in shapes:
        for cfg, _point in _probe(impl, here, wl, spec.point_fields):
            key = tuple(sorted(cfg.items()))
            if key in done or key not in offered:  # a formula's configs are covered by cases
                continue
            done.add(key)
            label = offered[key]
            out.append(Target(plugin, impl.op, impl.name, dev, dtype, case.name,
                              getattr(case, "doc", ""), ref, prof, pname, key, label))
    return out


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    import torch

    named = [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    return [(n, t) for n, t in named if isinstance(t, torch.Tensor)]


def _clone(x: Any) -> Any:
    import torch

    return x.clone() if isinstance(x, torch.Tensor) else x


def run_target(target: Target, *, seed: int = 0) -> Outcome:
    """Run one conformance item; never raises for a kernel's failure (it becomes the outcome)."""
    import torch

    import registry
    from registry import format_config
    from registry.errors import KernelUnavailableError, KregError, StrictModeError
    from registry.observe import record
    from registry.observe.checker import _resolve

    if target.case == "no-cases":
        return Outcome("skipped", target.doc)
    reg = registry.get_registry()
    spec = reg.spec(target.op)
    op_cases, _ = _load_cases(target.cases_module)
    case = next(c for c in op_cases if c.name == target.case)
    args, kwargs = case.make(torch.device(target.device), getattr(torch, target.dtype), seed)
    key = spec.call_key(*args, **kwargs)
    workload = spec.workload_from_key(key[2:])
    facts = reg.resolve_device(target.profile) if target.profile else reg.facts_for_index(key[1])
    on = f"{target.profile_name or target.profile} ({facts.describe()})" if target.profile \
        else facts.describe()
    forced = target.implementation + ":measure"
    direct = bool(target.profile) or target.config is not None
    try:
        if direct:  # judged on the target's facts; run here, not through dispatch
            decision = reg.decide_local(target.op, facts, workload, forced)
        else:
            with registry.override(target.op, forced):
                decision = reg.select(target.op, workload, facts)
    except StrictModeError as exc:  # KREG_STRICT=1 turns "not honoured" into an error
        return Outcome("skipped", f"{target.implementation} cannot run here: {exc}")
    except KregError as exc:  # nothing eligible at all on the target
        return Outcome("skipped", f"{target.implementation} cannot run [{workload.short()}] on "
                                  f"{on}: {type(exc).__name__}: {exc}")
    if decision.implementation != target.implementation:
        cand = next((c for c in decision.candidates
                     if c.implementation == target.implementation), None)
        failed = tuple(f"{c} [{c.kind}]" for c in cand.checks if not c.ok) if cand else ()
        why = "; ".join(failed) or (decision.override.reason if decision.override is not None
                                    else "not selected")
        return Outcome("skipped", f"{target.implementation} cannot run [{workload.short()}] on "
                                  f"{on}: {why}", failed)
    impl = reg.implementation(target.op, target.implementation)
    config = dict(target.config) if target.config is not None else decision.config
    label = target.config_label or "chosen"
    where = (f"{target.implementation} on {target.device} {target.dtype}"
             f"{' judged on ' + (target.profile_name or target.profile) if target.profile else ''}"
             f", case {target.case!r} ({target.doc}); workload [{workload.short()}]; config "
             f"{label}: {format_config(config)}")
    try:
        fn = impl.load_kernel()
    except KregError as exc:
        return Outcome("failed", f"{where}: {type(exc).__name__}: {exc}")
    checker = _resolve(reg, target.op)
    if checker.reference is None:
        return Outcome("failed", f"cannot compare: {checker.problem}")
    originals = [(n, t.clone()) for n, t in _tensors(args, kwargs)]
    expected = checker.reference(*[_clone(a) for a in args],
                                 **{k: _clone(v) for k, v in kwargs.items()})
    launches: list[Any] = []
    ran = tuple(sorted((config or {}).items()))
    try:
        if direct:
            actual = (fn(*args, config=dict(config or {}), **kwargs) if impl.configurable
                      else fn(*args, **kwargs))
        else:
            with registry.override(target.op, forced), record() as launches:
                actual = registry.dispatch(target.op, *args, **kwargs)
    except KernelUnavailableError as exc:
        return Outcome("not_runnable", f"not runnable here: {target.implementation} config "
                                       f"{label} ({format_config(config)}): {exc}", config=ran)
    except KregError as exc:
        return Outcome("failed", f"{where}: dispatch raised {type(exc).__name__}: {exc}",
                       config=ran)
    except Exception as exc:
        return Outcome("failed", f"{where}: the kernel raised {type(exc).__name__}: {exc}",
                       config=ran)
    if not direct:
        impls = [launch.implementation for launch in launches]
        if impls != [target.implementation]:
            return Outcome("failed", f"{where}: dispatch ran {impls}, not "
                                     f"{target.implementation}")
    for (name, before), (_, after) in zip(originals, _tensors(args, kwargs), strict=True):
        if not _same(before, after):
            return Outcome("failed", f"{where}: the kernel modified its input {name}",
                           config=ran)
    violation = checker.compare(actual, expected)
    if violation is not None:
        return Outcome("failed", f"{where}: {violation}", config=ran)
    return Outcome("passed", config=ran)


def _same(a: Any, b: Any) -> bool:
    import torch

    if a.is_floating_point():
        return bool(torch.equal(a.isnan(), b.isnan())
                    and torch.equal(a.nan_to_num(), b.nan_to_num()))
    return bool(torch.equal(a, b))


def suggestions(plugin: str, targets: Sequence[Target]) -> list[str]:
    """What would make ``plugin``'s items run here: per implementation, the profiles where a
    case of it is eligible (``--kreg-conformance-device``), or ``TRITON_INTERPRET=1``, or cases
    that fit its capability."""
    import registry

    reg = registry.get_registry()
    out: list[str] = []
    for name in dict.fromkeys(t.implementation for t in targets):
        mine = [t for t in targets if t.implementation == name and t.case != "no-cases"]
        if not mine:
            continue
        impl = reg.implementation(mine[0].op, name)
        workloads, here = [], None
        for t in {(t.cases_module, t.case, t.device, t.dtype): t for t in mine}.values():
            cases, _ = _load_cases(t.cases_module)
            case = next(c for c in cases if c.name == t.case)
            try:
                wl, here = _workload(reg, t.op, case, t.device, t.dtype)
            except Exception:
                continue
            workloads.append(wl)
        if here is not None and here.vendor == "cpu" and here.extra.get("triton_interpret") != "1":
            out.append(f"{name}: set TRITON_INTERPRET=1 so Triton kernels run on this CPU")
        fits = [p for p, facts in reg.profiles().items()
                if any(_eligible(impl, facts, wl) for wl in workloads)]
        judged = {t.profile_name or t.profile for t in mine if t.profile}
        fits = [p for p in fits if p not in judged]
        if fits:
            out.append(f"{name}: judge it on a profile where its capability holds: "
                       f"--kreg-conformance-device {fits[0]} (eligible on {', '.join(fits)}), "
                       f"or declare Implementation(conformance_profiles=({fits[0]!r},))")
        elif not any(_eligible(impl, f, wl) for f in reg.profiles().values() for wl in workloads):
            out.append(f"{name}: no case of op {impl.op!r} fits its capability on any known "
                       f"profile: add cases that do (--kreg-conformance-cases {impl.op}=MODULE, "
                       f"or Implementation(conformance_cases='module:ATTR')), and a profile of "
                       f"its device if kreg ships none (--kreg-conformance-device FILE.toml, or "
                       f"a kreg_profiles hook)")
    return out


# ---------------------------------------------------------------------------------------------
# pytest glue


class ConformanceFailure(Exception):
    """A conformance item's failure; its message is the whole report."""


_RESULTS = pytest.StashKey[dict[str, list[tuple[Target, Outcome]]]]()
_TARGETS = pytest.StashKey[dict[str, list[Target]]]()
_NAMED = pytest.StashKey[set[str]]()
_VERDICT = pytest.StashKey[list[str]]()


class ConformanceItem(pytest.Item):
    def __init__(self, *, target: Target, seed: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target
        self.seed = seed
        self.add_marker("kreg_conformance")

    def runtest(self) -> None:
        outcome = run_target(self.target, seed=self.seed)
        self.config.stash.setdefault(_RESULTS, {}).setdefault(self.target.plugin, []).append(
            (self.target, outcome))
        if outcome.status in ("skipped", "not_runnable"):
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
    group.addoption("--kreg-conformance-device", action="append", default=[],
                    metavar="PROFILE",
                    help="judge selection on this device profile (a name from `kreg profiles` "
                         "or a .toml/.json profile file) and run the configs it chooses there "
                         "on this machine; repeatable; replaces this machine and the "
                         "implementations' conformance_profiles")
    group.addoption("--kreg-conformance-cases", action="append", default=[], metavar="OP=MODULE",
                    help="add OP's cases from MODULE ('module' with CASES [and DTYPES], or "
                         "'module:ATTR') to the op's own conformance cases (repeatable)")
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

    cases: dict[str, list[str]] = {}
    for raw in config.getoption("kreg_conformance_cases") or []:
        op, sep, module = raw.partition("=")
        if not sep or not op.strip() or not module.strip():
            raise pytest.UsageError(f"--kreg-conformance-cases {raw!r}: expected OP=MODULE, e.g. "
                                    "sparse_prefill=my_plugin.cases (added to the op's cases)")
        cases.setdefault(op.strip(), []).append(module.strip())
    unknown = sorted(set(cases) - set(registry.ops()))
    if unknown:
        raise pytest.UsageError(f"--kreg-conformance-cases: no op {', '.join(unknown)}; loaded "
                                f"ops: {', '.join(registry.ops())}")
    devices = [d.strip() for raw in config.getoption("kreg_conformance_device") or []
               for d in [raw] if d.strip()]
    named = {n for n in names if n != "all"}
    if "all" in names:
        names = [*dict.fromkeys([*[n for n in names if n != "all"],
                                 *[r.name for r in registry.plugins()
                                   if r.loaded and r.implementations]])]
    config.stash[_NAMED] = named
    config.stash[_TARGETS] = {}
    seed = config.getoption("kreg_conformance_seed")
    for name in names:
        try:
            targets = conformance_targets(name, cases=cases, profiles=devices or None)
        except (KregError, ImportError) as exc:
            where = " (--kreg-conformance-device)" if devices else ""
            raise pytest.UsageError(f"--kreg-conformance {name}{where}: {exc}") from None
        if not targets:
            raise pytest.UsageError(f"--kreg-conformance {name}: plugin {name!r} registers no "
                                    "implementation; nothing to check")
        config.stash[_TARGETS][name] = targets
        for target in targets:
            items.append(ConformanceItem.from_parent(session, name=target.name,
                                                     nodeid=target.name, target=target,
                                                     seed=seed))


def _summary(config: pytest.Config) -> tuple[list[str], list[str]]:
    """(summary lines, the named plugins nothing of which was tested)."""
    results = config.stash.get(_RESULTS, {})
    targets = config.stash.get(_TARGETS, {})
    named = config.stash.get(_NAMED, set())
    lines: list[str] = []
    untested: list[str] = []
    for plugin in targets:
        done = results.get(plugin, [])
        if not done:
            continue
        count = Counter(o.status for _, o in done)
        executed = count["passed"] + count["failed"]
        where = sorted({t.profile_name or t.profile or "this machine" for t, _ in done})
        parts = [f"{n} {what}" for what, n in (("passed", count["passed"]),
                                               ("failed", count["failed"])) if n]
        line = (f"kreg conformance {plugin}: {executed} executed"
                f"{' (' + ', '.join(parts) + ')' if parts else ''}, judged on "
                f"{', '.join(where)}")
        if count["not_runnable"]:
            line += f"; {count['not_runnable']} not runnable here (not tested)"
        if count["skipped"]:
            line += f"; {count['skipped']} skipped"
        lines.append(line)
        lines.extend(_table_lines(plugin, done))
        if executed == 0 and plugin in named:
            untested.append(plugin)
            lines.append(f"FAILED: nothing of plugin {plugin!r} was tested: all {len(done)} of "
                         f"its items were skipped or not runnable here")
            reasons = Counter(c for _, o in done for c in o.checks)
            if reasons:
                lines.append("  failed checks: " + "; ".join(
                    f"{c} ({n} items)" for c, n in reasons.most_common(4)))
            elif done:
                lines.append(f"  e.g. {done[0][1].message}")
            try:
                hints = suggestions(plugin, targets[plugin])
            except Exception as exc:  # the verdict stands without the hint
                hints = [f"(no suggestion: {type(exc).__name__}: {exc})"]
            lines.extend(f"  to run it: {s}" for s in hints)
    return lines, untested


def _table_lines(plugin: str, done: list[tuple[Target, Outcome]]) -> list[str]:
    """What became of the configs the plugin offers (its kreg_configs table), per op."""
    import registry

    reg = registry.get_registry()
    out = []
    for op in dict.fromkeys(t.op for t, _ in done):
        offered = {tuple(sorted(cfg.items())): label.removeprefix(f"{plugin}.")
                   for label, cfg in reg.offered_configs(op).items()
                   if label.startswith(f"{plugin}.")}
        if not offered:
            continue
        runs = [(o.config, o) for t, o in done if t.op == op and o.config is not None]
        executed = {c for c, o in runs if o.status in ("passed", "failed")} & set(offered)
        not_here = {c: o.message for c, o in runs if o.status == "not_runnable"
                    and c in offered and c not in executed}
        missed = [offered[c] for c in offered if c not in executed and c not in not_here]
        line = (f"  {op}: {len(executed)} of the {len(offered)} configs plugin {plugin!r} offers "
                f"executed")
        if not_here:
            line += f"; not runnable here (not tested): {', '.join(offered[c] for c in not_here)}"
        if missed:
            line += f"; chosen for no case: {', '.join(missed)}"
        out.append(line)
        out.extend(f"    {offered[c]}: {msg}" for c, msg in not_here.items())
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _TARGETS not in session.config.stash:
        return
    lines, untested = _summary(session.config)
    session.config.stash[_VERDICT] = lines
    if untested and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(_VERDICT, [])
    if lines:
        terminalreporter.section("kreg conformance")
        for line in lines:
            terminalreporter.write_line(line, red=line.startswith("FAILED"))


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    names = _plugins(config)
    if not names:
        return None
    import registry

    facts = registry.probe()
    devices = config.getoption("kreg_conformance_device") or []
    judged = (f"judged on {', '.join(devices)}" if devices
              else "judged on this machine and the declared profiles")
    return [f"kreg conformance: plugin(s) {', '.join(names)} on {facts.describe()}, {judged}"]
