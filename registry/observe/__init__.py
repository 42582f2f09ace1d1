"""Observation: the launch recorder, check mode, counters and their persistence.

Both ride on ``Registry.observers``: a list of ``obs(registry, decision, args, kwargs, result)``
callables
that ``dispatch`` calls after the kernel returns, only while the list is non-empty (the hit path
tests ``if reg.observers:`` and nothing else). This module installs a single observer, the *hub*,
while a recorder is open or the check rate is above zero, and removes it otherwise: with
``KREG_CHECK`` unset and no recorder, the list is empty and dispatch pays nothing.

**Launch recorder.** ``with registry.record() as launches:`` appends a frozen :class:`Launch`
(op, implementation, config, workload) for every dispatch in the block, so a framework's test can
assert the geometry that actually ran.

**Check mode** (``KREG_CHECK=<fraction>`` or ``registry.check(rate)``). A sampled fraction of
dispatches is re-run through the op's torch reference on the same inputs and compared with the
op's ``OpSpec.compare`` (``"module:function"``, ``compare(actual, expected) -> None | str``).
Sampling uses :class:`random.Random` with a seed (default 0), so a run is reproducible.
Dispatches served by the reference itself are counted but not compared. A violation is counted
per (op, implementation, config), logged at WARNING with the workload (once per workload and
config), kept in :func:`violations`, and raised as :class:`CheckViolationError` under
``KREG_STRICT=1``. Dispatches inside CUDA graph capture are never compared (the comparison reads
device memory); they are counted as ``skipped``.

Counters of this process: :func:`stats`. Check mode also persists them to
``$KREG_HOME/stats.json`` (one entry per process id, written at most once a second while
counters change and once at exit), which is what ``kreg stats`` shows from another shell.
"""

from registry._spec import default_compare
from registry.observe.check import CheckScope, check
from registry.observe.counters import reset_stats, stats, violations
from registry.observe.hub import install, sync
from registry.observe.persist import clear_persisted, read_persisted, stats_path
from registry.observe.recorder import record
from registry.observe.records import Counter, Launch, Stats, Violation

__all__ = [
    "CheckScope",
    "Counter",
    "Launch",
    "Stats",
    "Violation",
    "check",
    "clear_persisted",
    "default_compare",
    "install",
    "read_persisted",
    "record",
    "reset_stats",
    "stats",
    "stats_path",
    "sync",
    "violations",
]
