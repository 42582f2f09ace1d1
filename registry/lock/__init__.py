"""Decision lockfiles: ``kreg lock``, ``kreg verify`` and ``KREG_LOCK``.

A lockfile records, for every (device, op, workload) it was asked for, the decision and what
decided it, so that a review sees a changed decision as a diff and a deployment can refuse to
start on decisions it was not tested with. docs/LOCKFILE.md is the reference (format, modes,
the identity matched, CI use).

* :func:`build_lock`, :func:`dump_lock`, :func:`load_lock`, :func:`verify_lock`,
  :func:`diff_locks`: the pure logic (``registry.lock.lockfile``);
* ``registry.lock.runtime``: the hook the composition root attaches as ``Registry.lock``
  while ``KREG_LOCK`` is set;
* ``registry.lock.cli``: the click commands ``kreg lock`` and ``kreg verify``.

Importing this package imports neither torch, Triton nor click.
"""

from registry.lock.lockfile import (
    FORMAT,
    LOCAL,
    SCHEMA_VERSION,
    DeviceInput,
    DiffReport,
    Drift,
    LockDriftError,
    LockEntry,
    LockError,
    Lockfile,
    LockPinError,
    Reason,
    build_lock,
    diff_locks,
    dump_lock,
    load_lock,
    parse_lock,
    resolve_devices,
    verify_lock,
)

__all__ = [
    "FORMAT",
    "LOCAL",
    "SCHEMA_VERSION",
    "DeviceInput",
    "DiffReport",
    "Drift",
    "LockDriftError",
    "LockEntry",
    "LockError",
    "LockPinError",
    "Lockfile",
    "Reason",
    "build_lock",
    "diff_locks",
    "dump_lock",
    "load_lock",
    "parse_lock",
    "resolve_devices",
    "verify_lock",
]
