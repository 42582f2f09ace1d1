"""The public facade's ``__all__`` is honest and holds the names DESIGN.md pins."""

from __future__ import annotations

import registry
import registry.errors
import registry.requirements

PINNED = {"select", "dispatch", "probe", "profiles", "override", "DeviceFacts", "Decision",
          "errors", "agree", "record", "check"}


def test_all_is_sorted_complete_and_resolvable() -> None:
    for mod in (registry, registry.errors, registry.requirements):
        names = mod.__all__
        assert len(names) == len(set(names)), mod.__name__  # the order is ruff's (RUF022)
        for name in names:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"
    import types

    public = {n for n in dir(registry) if not n.startswith("_")
              and not isinstance(getattr(registry, n), types.ModuleType)} - {
        "annotations", "Any", "Iterator", "Mapping", "contextmanager"}
    assert public <= set(registry.__all__)
    assert set(registry.__all__) >= PINNED


def test_every_error_is_a_kreg_error_and_a_builtin() -> None:
    for name in registry.errors.__all__:
        cls = getattr(registry.errors, name)
        assert issubclass(cls, registry.errors.KregError)
        if cls is not registry.errors.KregError:
            assert len(cls.__mro__) > 3, f"{name} should also subclass a builtin"
    assert issubclass(registry.errors.WorkloadError, ValueError)
    assert issubclass(registry.errors.OverrideError, ValueError)
    assert issubclass(registry.errors.UnknownOpError, LookupError)
    assert issubclass(registry.errors.UnknownImplementationError, LookupError)
