"""Tuning: the tuning store, ``kreg tune``, the measuring harness and device timing.

What backends and plugins use is public here: the store (:class:`TuningStore`,
:class:`TuningEntry`, :func:`load_table`), the interleaved timing
(:func:`interleaved_median_ms`, :func:`graphed`) and the harness that checks, then times, the
candidates of a bench or a tuning point (:func:`measure`, :class:`Trial`, :class:`Measurement`).
Importing this package imports neither torch nor Triton.
"""

from registry.tuning.measure import Measurement, Trial, measure
from registry.tuning.store import (
    DeviceIdentity,
    Software,
    TuningEntry,
    TuningStore,
    identity_of,
    load_table,
    utc_now,
)
from registry.tuning.timing import graphed, interleaved_median_ms, isolated_median_ms

__all__ = [
    "DeviceIdentity",
    "Measurement",
    "Software",
    "Trial",
    "TuningEntry",
    "TuningStore",
    "graphed",
    "identity_of",
    "interleaved_median_ms",
    "isolated_median_ms",
    "load_table",
    "measure",
    "utc_now",
]
