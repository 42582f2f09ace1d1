"""The dispatch daemon: one decision per key shared by every process of a node.

* :mod:`registry.daemon.protocol` — frames, limits and socket paths (client and server);
* :mod:`registry.daemon.client` — the client a registry asks on a miss while ``KREG_DAEMON`` is
  set (attached by the composition root, ``registry._default``);
* :mod:`registry.daemon.server` — the asyncio server (``python -m registry.daemon``);
* :mod:`registry.daemon.journal` — the rotating decision journal behind ``explain --live``;
* :mod:`registry.daemon.cli` — ``kreg daemon start|stop|status`` and ``kreg explain --live``.

Nothing here imports torch or Triton. Importing the package imports none of its modules.
"""
