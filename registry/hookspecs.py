"""kreg's hook specifications.

Plugins are modules or objects registered under the ``kreg`` entry-point group (in-tree ones
too). A plugin implements any of these hooks with ``@registry.hookimpl``: ``kreg_ops``,
``kreg_implementations``, ``kreg_configs``, ``kreg_enrich_facts`` and ``kreg_profiles``. Each
hook is called on every plugin separately, so one plugin's failure is isolated: it is named in a
warning and in ``kreg plugins``, and the other plugins still load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
def kreg_implementations(ops: Mapping[str, OpSpec]) -> Sequence[Implementation]:
    """Return the implementations this plugin offers, for any op.

    Implemented by policy plugins (``reference``, ``generic``, vendor plugins, ``measured``).
    ``ops`` holds the loaded op specs by name (take the argument only if you need it: the
    ``measured`` plugin serves every op whose spec names a tuner). Every result is collected;
    an implementation for an op nobody defines is reported and skipped; a duplicate
    implementation name is an error naming both plugins; anything but a list of
    ``Implementation`` fails the plugin, by name, and leaves the others loaded.
    """
    raise NotImplementedError


@hookspec
def kreg_configs(op: str) -> Mapping[str, Mapping[str, Any]] | None:
    """Return the named configs this plugin's implementations of ``op`` may choose, or None.

    ``{name: config}``; the registry lists them as ``<plugin>.<name>``
    (:meth:`registry.Registry.offered_configs`). They enter ``kreg tune OP``'s search space and
    are bench providers (``config=<plugin>.<name>``), so a vendor's configs are measured beside
    kreg's own without kreg importing the vendor's plugin. Implemented by policy plugins whose
    configs come from a table rather than a formula; every result is collected.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# device facts


@hookspec
def kreg_enrich_facts(facts: DeviceFacts) -> dict[str, str] | None:
    """Return extra device facts (string -> string) to merge into ``facts.extra``, or None.

    Implemented by vendor plugins that know more about their device than torch reports (a
    firmware feature, a die count). Called once per device on this machine's probed facts and
    once per profile (shipped, file or plugin), so a requirement on an enriched fact can be
    explained for a device nobody here has: answer from the ``facts`` given (name, arch,
    compute capability, ...), never by reading a device. Results merge in plugin registration
    order; a key the facts already carry (a profile's own ``extra``, ``--set extra.KEY=...``,
    the probe's ``triton_interpret``) is kept. A raising hook fails its plugin only.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# device profiles


@hookspec
def kreg_profiles() -> Sequence[DeviceFacts | str | os.PathLike[str] | Any] | None:
    """Return device profiles this plugin ships, or None.

    Each item is a :class:`~registry.DeviceFacts` (named by its ``profile`` field), or the path
    of a profile file or of a directory of them (``.toml`` / ``.json``, the schema of
    docs/PLUGINS.md, "Device profiles"): a ``pathlib.Path``, a string, or an
    ``importlib.resources`` Traversable such as ``files("acme_kreg") / "profiles"``, so the
    files ship inside the plugin's wheel. ``kreg explain --device NAME``, ``registry.select``
    and the conformance kit then take the name; ``kreg profiles`` lists it with the plugin as
    its source. A name already shipped by kreg or by another plugin, a bad file or a raising
    hook fails this plugin only (named in ``kreg plugins``); a profile in a ``KREG_PROFILES``
    directory replaces any of the same name.
    """
    raise NotImplementedError
