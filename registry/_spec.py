"""The two things plugins contribute: op specifications and implementations."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from registry._contract import Contract
from registry._facts import DeviceFacts
from registry._workload import Workload
from registry.errors import KernelUnavailableError, WorkloadError
from registry.requirements import Requirement

__all__ = ["Implementation", "OpSpec", "default_compare", "load_object"]

NO_GUARANTEES = Contract()  # frozen: one shared default

# ``resolver(facts, workload)``; the workload is the op's own Workload subclass, so a resolver
# declares that type (``w: SparsePrefillWorkload``) and reads its fields type-checked.
ConfigResolver = Callable[[DeviceFacts, Any], Mapping[str, Any] | None]


@dataclass(frozen=True)
class OpSpec:
    """An op's contract, contributed by its package in ``backends/``.

    ``call_key(*args, **kwargs)`` returns ``(op name, device index, *rest)`` for one call
    (device index -1 for the CPU), from shapes, dtypes and host arguments only. It is the
    dispatch cache key and runs on the hot path: it must be cheap, must never read device memory,
    and may leave derivations and validation to the miss path — ``decode_key(rest)`` turns the
    rest into the workload's field values (model field order); without it, the rest must already
    be those values. ``workload_from_key`` builds the validated model.
    """

    name: str
    workload_model: type[Workload]
    call_key: Callable[..., tuple[Any, ...]]
    reference: str = ""
    error_bound: Callable[[str], float] | None = None
    doc: str = ""
    # "module:function" comparing a kernel's output with the reference's: returns None when
    # within the op's bound, else a one-line description of the violation (check mode, the
    # conformance kit).
    compare: str = ""
    # "module" holding the op's conformance cases (the conformance kit).
    conformance: str = ""
    # "module" implementing the tuner protocol of registry/tuning/tune.py (kreg tune).
    tuner: str = ""
    decode_key: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
    # "module:attribute" of the click command ``kreg bench <op>`` runs (built on
    # registry.tuning.measure); without one the op has no bench command.
    bench: str = ""
    # "module:function" the tuner's configs drive, called as ``kernel(*args, config=..., **kw)``:
    # what ``kreg tune`` times and what the ``measured`` plugin serves for this op.
    tuned_kernel: str = ""
    # The workload fields that form a tuning entry's measured axis: the ``measured`` plugin
    # serves the config of the largest measured point at or below the workload in every one.
    point_fields: tuple[str, ...] = ()
    # Point fields that entries written before the field existed lack: such entries serve any
    # value of it until entries of the same shape that name it exist.
    later_point_fields: tuple[str, ...] = ()
    # Workload fields outside an entry's shape: the point fields and the batch-shape fields a
    # requirement of the ``measured`` implementation covers instead (default: the point fields).
    unmatched_fields: tuple[str, ...] = ()
    # Requirements the ``measured`` implementation adds for this op: what the tuner's inputs do
    # not cover (sparse_prefill: tuned on uniform batches, so skewed chunk batches stay off).
    measured_requirements: tuple[Requirement, ...] = ()
    # "module" whose import registers ``torch.ops.<namespace>.<op>`` (a torch custom op whose
    # real implementation dispatches through the registry), or "".
    custom_op: str = ""
    # The workload fields that grow with the batch (sparse_prefill: total_q, num_requests,
    # max_q; indexer_topk: num_rows), and the point selection decides at for every batch size
    # when ``batch_invariant`` is required (the envelope's reference point: where the policies
    # were measured).
    batch_fields: tuple[str, ...] = ()
    batch_reference: Mapping[str, Any] = field(default_factory=dict)
    # The contract of ``tuned_kernel`` per config (what the ``measured`` implementation, and
    # policies running the same kernel, declare), or None (no guarantee declared).
    kernel_contract: Contract | Callable[[Mapping[str, Any] | None], Contract] | None = None

    def at_batch_reference(self, workload: Workload) -> Workload:
        """``workload`` with its batch fields at the reference point (batch-invariant selection)."""
        from registry._workload import make_workload

        data = workload.model_dump()
        data.update({k: v for k, v in self.batch_reference.items() if k in self.batch_fields})
        return make_workload(self.workload_model, data)

    def load_compare(self) -> Callable[[Any, Any], str | None]:
        """The op's ``compare(actual, expected)``: ``OpSpec.compare`` when it names one, else
        :func:`default_compare` with the op's error bound. Raises KernelUnavailableError naming
        the path when it cannot be imported."""
        if not self.compare:
            return functools.partial(default_compare, bound=self.error_bound)
        try:
            fn = load_object(self.compare)
        except (ImportError, AttributeError) as exc:
            raise KernelUnavailableError(f"cannot load {self.name}'s compare {self.compare!r}: "
                                         f"{type(exc).__name__}: {exc}; OpSpec.compare must be "
                                         f"'module:function'") from exc
        return fn  # type: ignore[no-any-return]

    @property
    def shape_free_fields(self) -> tuple[str, ...]:
        """The fields a tuning entry's bucket does not match on."""
        return self.unmatched_fields or self.point_fields

    def check_consistent(self) -> None:
        """Raise ValueError naming the field when the spec contradicts itself (at load)."""
        names = set(self.workload_model.model_fields)
        for attr in ("point_fields", "later_point_fields", "unmatched_fields", "batch_fields"):
            unknown = [f for f in getattr(self, attr) if f not in names]
            if unknown:
                raise ValueError(f"op {self.name!r}: OpSpec.{attr} names {unknown}, which are not "
                                 f"fields of {self.workload_model.__name__} ({', '.join(names)})")
        if self.tuner and not (self.tuned_kernel and self.point_fields):
            raise ValueError(f"op {self.name!r}: OpSpec.tuner is set, so tuned_kernel and "
                             f"point_fields must be too (what kreg tune times and what the "
                             f"measured plugin serves)")

    def workload_from_key(self, key: tuple[Any, ...]) -> Workload:
        fields = list(self.workload_model.model_fields)
        from registry._workload import make_workload

        if self.decode_key is not None:
            key = self.decode_key(key)
        if len(key) != len(fields):
            raise WorkloadError(f"{self.name}: workload key has {len(key)} values, "
                                f"expected {len(fields)} ({', '.join(fields)})")
        return make_workload(self.workload_model, dict(zip(fields, key, strict=True)))


def default_compare(actual: Any, expected: Any,
                    bound: Callable[[str], float] | None = None) -> str | None:
    """The comparison used when an op declares no ``OpSpec.compare``: exact for integer
    tensors; for floating ones, max-abs within ``bound(dtype name)`` (the op's
    ``OpSpec.error_bound``), else within 1e-3."""
    import torch

    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return None if actual == expected else f"result {actual!r} != reference {expected!r}"
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)} != reference {list(expected.shape)}"
    if not actual.is_floating_point():
        bad = int((actual != expected).sum())
        return None if bad == 0 else f"{bad} of {actual.numel()} elements differ from the reference"
    limit = 1e-3 if bound is None else bound(str(actual.dtype).removeprefix("torch."))
    diff = (actual.double() - expected.double()).abs()
    err = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
    return None if err <= limit else f"max |result - reference| = {err:.3g} > {limit:g}"


def load_object(path: str) -> Any:
    """Import ``'package.module:attr'``."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Implementation:
    """One way to run an op: a kernel plus the conditions under which it may run.

    ``name`` is ``plugin.impl``. ``kernel`` is ``'module:function'`` (imported at first dispatch,
    so selection imports neither torch nor Triton) or a callable, or None while the kernel does not
    exist yet (dispatch then raises :class:`KernelUnavailableError`). When ``configurable``, the
    kernel is called as ``kernel(*args, config=config, **kwargs)``. A kernel that cannot run on
    this machine (an engine without an interpreter, a GPU it does not support) raises
    KernelUnavailableError: the conformance kit reports that as not runnable here.

    For the conformance kit (registry/testing.py): ``conformance_profiles`` names the device
    profiles (names or profile files) the kit judges this implementation on besides this
    machine, where its capability requirements hold (``nvidia_sm120``: the RTX PRO 6000 Server
    profile), so its configs execute here under the Triton interpreter;
    ``conformance_cases`` (``"module"`` with ``CASES`` and optionally ``DTYPES``, or
    ``"module:ATTR"`` naming a tuple of cases) adds cases fitted to its capability (the seed's
    top-k 2051 and head dim 256) to the op's own.
    """

    op: str
    name: str
    priority: int
    requirements: tuple[Requirement, ...] = ()
    config: ConfigResolver | Mapping[str, Any] | None = None
    kernel: str | Callable[..., Any] | None = None
    configurable: bool = True
    fallback: bool = False
    description: str = ""
    # What the implementation guarantees (registry/_contract.py): a Contract, or a function of the
    # resolved config returning one (a guarantee that holds for some configs only).
    contract: Contract | Callable[[Mapping[str, Any] | None], Contract] = NO_GUARANTEES
    # The config to run when ``batch_invariant`` is required, where it differs from ``config``
    # (a policy whose best config at some points is not batch-invariant designates the best one
    # that is), or None: ``config`` serves then too.
    invariant_config: ConfigResolver | None = None
    # ``describe_config(config) -> str``: which code path a resolved config takes, in words
    # (``kreg explain`` shows it as a ``path:`` note of the decision), or None.
    describe_config: Callable[[Mapping[str, Any] | None], str] | None = None
    conformance_profiles: tuple[str, ...] = ()
    conformance_cases: str = ""
    # ``route(config) -> (implementation, its config)`` when a config stands for another
    # implementation's kernel (the ``measured`` plugin's entries that name the implementation a
    # measurement picked), else None: :meth:`bind` then makes that implementation's callable, so
    # the dispatch cache holds the target's kernel itself (nothing is added to the hit path).
    route: Callable[[Mapping[str, Any] | None],
                    tuple[Implementation, Mapping[str, Any] | None] | None] | None = None
    _loaded: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if "." not in self.name:
            raise ValueError(f"implementation name {self.name!r} must be 'plugin.impl'")
        if any(r.kind not in ("capability", "envelope") for r in self.requirements):
            raise ValueError(f"{self.name}: requirement kinds must be capability or envelope")

    @property
    def plugin(self) -> str:
        return self.name.split(".", 1)[0]

    def contract_for(self, config: Mapping[str, Any] | None) -> Contract:
        """The contract of this implementation run with ``config``."""
        c = self.contract
        return c if isinstance(c, Contract) else c(config)

    def resolve_config(self, facts: DeviceFacts, workload: Workload,
                       invariant: bool = False) -> dict[str, Any] | None:
        """The config for ``workload`` on ``facts``; ``invariant``: the one to run while
        ``batch_invariant`` is required (``invariant_config`` when the policy gives one)."""
        cfg = self.invariant_config if invariant and self.invariant_config else self.config
        if cfg is None:
            return None
        if callable(cfg):
            out = cfg(facts, workload)
            return None if out is None else dict(out)
        return dict(cfg)

    def load_kernel(self) -> Callable[..., Any]:
        fn = self._loaded.get("fn")
        if fn is not None:
            return fn  # type: ignore[no-any-return]
        if self.kernel is None:
            raise KernelUnavailableError(
                f"{self.name} has no kernel in this installation yet; select another "
                f"implementation with KREG_SELECT_{self.op.upper()}=<name> or "
                f"registry.override({self.op!r}, <name>)")
        if callable(self.kernel):
            fn = self.kernel
        else:
            try:
                fn = load_object(self.kernel)
            except (ImportError, AttributeError) as exc:
                raise KernelUnavailableError(
                    f"{self.name}: cannot load kernel {self.kernel!r}: {exc}; install the "
                    f"package that provides it or select another implementation") from exc
        self._loaded["fn"] = fn
        return fn  # type: ignore[no-any-return]

    def bind(self, config: Mapping[str, Any] | None) -> Callable[..., Any]:
        """The ready-to-call kernel for one config (what the dispatch cache stores)."""
        if self.route is not None:
            target = self.route(config)
            if target is not None:
                return target[0].bind(target[1])
        fn = self.load_kernel()
        if not self.configurable:
            return fn
        # functools.partial is implemented in C: cheaper on the hit path than a Python closure.
        return functools.partial(fn, config=dict(config or {}))
