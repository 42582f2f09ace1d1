"""kreg's exceptions.

Every error kreg raises on purpose derives from :class:`KregError` and also from the builtin a
caller would already catch::

    KregError
    ├── WorkloadError (ValueError)          a workload or call argument breaks an op's contract
    ├── OverrideError (ValueError)          a malformed override (KREG_SELECT_<OP>, override())
    ├── ConfigError (ValueError)            a bad environment setting or kernel config
    ├── UnknownOpError (LookupError)        no op of that name is registered
    ├── UnknownDeviceError (LookupError)    no device profile of that name
    ├── UnknownImplementationError (LookupError)
    │                                       no implementation of that name exists for the op
    ├── NoEligibleImplementationError (RuntimeError)
    │                                       nothing can run this workload (message: the trace)
    ├── StrictModeError (RuntimeError)      KREG_STRICT=1 refused an override fallback or a fallback
    │   │                                   to the torch reference
    │   └── CheckViolationError (AssertionError)
    │                                       check mode found a kernel outside its op's bound
    ├── KernelUnavailableError (NotImplementedError)
    │                                       the chosen implementation has no kernel installed
    ├── PluginError (RuntimeError)          a plugin failed to import or its hook raised
    ├── StoreError (RuntimeError)           the tuning store cannot be read or written
    └── DaemonError (ConnectionError)       the dispatch daemon is unreachable or refused a request

Messages name the object, the rule it broke, and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "CheckViolationError",
    "ConfigError",
    "DaemonError",
    "KernelUnavailableError",
    "KregError",
    "NoEligibleImplementationError",
    "OverrideError",
    "PluginError",
    "StoreError",
    "StrictModeError",
    "UnknownDeviceError",
    "UnknownImplementationError",
    "UnknownOpError",
    "WorkloadError",
]


class KregError(Exception):
    """Base class of every error kreg raises on purpose."""


class WorkloadError(KregError, ValueError):
    """A workload field or a call argument breaks the op's contract."""


class OverrideError(KregError, ValueError):
    """An override value does not follow ``auto | <implementation> | <implementation>:measure``."""


class ConfigError(KregError, ValueError):
    """An environment setting or a kernel config has a bad value."""


class UnknownOpError(KregError, LookupError):
    """No op of that name is registered."""


class UnknownDeviceError(KregError, LookupError):
    """No device profile of that name is shipped."""


class UnknownImplementationError(KregError, LookupError):
    """No implementation of that name is registered for the op."""


class NoEligibleImplementationError(KregError, RuntimeError):
    """No implementation can run the workload on the device; the message holds every verdict."""


class StrictModeError(KregError, RuntimeError):
    """``KREG_STRICT=1`` turned a fallback (override not honoured, reference) into an error."""


class CheckViolationError(StrictModeError, AssertionError):
    """Check mode under ``KREG_STRICT=1``: a dispatch's result is outside its op's bound."""


class KernelUnavailableError(KregError, NotImplementedError):
    """The selected implementation's kernel is not available in this installation."""


class PluginError(KregError, RuntimeError):
    """A plugin failed to import, or one of its hooks raised."""


class StoreError(KregError, RuntimeError):
    """The tuning store cannot be read or written."""


class DaemonError(KregError, ConnectionError):
    """The dispatch daemon is unreachable, too slow, or refused the request."""
