"""kreg's hook specifications.

Plugins are modules or objects registered under the ``kreg`` entry-point group (in-tree ones
too). A plugin implements any of these hooks with ``@registry.hookimpl``. Each hook is called on
every plugin separately, so one plugin's failure is isolated: it is named in a warning and in
``kreg plugins``, and the other plugins still load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from registry._facts import DeviceFacts
    from registry._spec import Implementation, OpSpec

hookspec = pluggy.HookspecMarker("kreg")
hookimpl = pluggy.HookimplMarker("kreg")

# ---------------------------------------------------------------------------------------------
# ops


@hookspec
def kreg_ops() -> Sequence[OpSpec]:
    """Return the ops this plugin defines (their workload model, workload extraction, reference).

    Implemented by the op packages in ``backends/``. Every result is collected; two plugins that
    define the same op name are an error naming both.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# implementations


@hookspec
def kreg_implementations() -> Sequence[Implementation]:
    """Return the implementations this plugin offers, for any op.

    Implemented by policy plugins (``reference``, ``generic``, vendor plugins, ``measured``).
    Every result is collected; an implementation for an op nobody defines is reported and
    skipped; a duplicate implementation name is an error naming both plugins.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# device facts


@hookspec
def kreg_enrich_facts(facts: DeviceFacts) -> dict[str, str] | None:
    """Return extra device facts (string -> string) to merge into ``facts.extra``, or None.

    Implemented by vendor plugins that know more about their device than torch reports (a
    firmware feature, a die count). Called on probed facts only, once per device; every result is
    merged in plugin registration order.
    """
    raise NotImplementedError
