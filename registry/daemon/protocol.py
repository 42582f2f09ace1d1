"""The daemon's wire protocol: frames, limits and socket paths (shared by client and server).

Protocol (version 1), over a Unix stream socket:

* A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON holding one
  object. Requests are at most :data:`MAX_REQUEST` bytes (the daemon answers a longer prefix with a
  ``too_large`` error and closes); replies at most :data:`MAX_REPLY`.
* A request is ``{"v": 1, "id": <int>, "type": <type>, ...}``; the reply echoes ``v`` and ``id``
  and carries ``"ok": true`` with the answer, or ``"ok": false, "error": {"code", "message"}``.
  Requests on one connection are answered in order.
* A reply with ``"attachment": N`` is followed by one more frame of N bytes: the select reply's
  Decision JSON, sent as the daemon cached it, so that a client validates it once, with
  ``Decision.model_validate_json``, instead of parsing it twice.

=========  ==============================================================  =====================
type       request fields                                                  reply fields
=========  ==============================================================  =====================
select     ``op``, ``facts_fp`` (DeviceFacts fingerprint), ``facts``       ``hit``, ``first_pid``,
           (DeviceFacts JSON text; needed once per connection and facts),  ``attachment`` (the
           ``workload`` (dict), ``override`` (raw value or null),          Decision JSON's
           ``plugins`` (plugin-set fingerprint)                            length)
explain    ``pid``, ``op`` (filters, null = all), ``limit``                 ``decisions`` (list)
stats      (none)                                                          counters, see daemon
shutdown   (none)                                                          ``pid``
=========  ==============================================================  =====================

Error codes: ``too_large``, ``bad_json``, ``bad_request``, ``unsupported_version``,
``unknown_type``, ``unknown_facts`` (send ``facts`` with the fingerprint), ``forbidden`` (peer of
another uid), ``busy`` (too many connections), ``internal`` (a daemon bug, logged),
``plugin_mismatch`` (the client's plugin set differs from the daemon's), ``select_failed`` (the
daemon's selection raised; the client selects in-process and gets the error itself).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from registry.errors import ConfigError

__all__ = [
    "HEADER",
    "MAX_REPLY",
    "MAX_REQUEST",
    "MAX_SOCKET_PATH",
    "PROTOCOL_VERSION",
    "decode_frame",
    "default_socket_path",
    "encode_frame",
    "resolve_socket",
]

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
MAX_REQUEST = 64 * 1024  # a select is about 1 KiB; bounds a connection's buffer
MAX_REPLY = 16 * 1024 * 1024
# A Unix socket path must fit sun_path (108 bytes on Linux, including the NUL).
MAX_SOCKET_PATH = 107


# ---------------------------------------------------------------------------------------------
# paths


def default_socket_path() -> Path:
    """``$XDG_RUNTIME_DIR/kreg/daemon.sock``, else ``$KREG_HOME/run/daemon.sock``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "kreg" / "daemon.sock"
    from registry._knobs import knobs

    return knobs.home / "run" / "daemon.sock"


def resolve_socket(value: str | os.PathLike[str] | None) -> Path:
    """The socket for a ``KREG_DAEMON``/``--socket`` value: ``1``/``true``/None mean the default."""
    if value is None or str(value).strip().lower() in ("", "1", "true", "yes", "on", "default"):
        path = default_socket_path()
    else:
        path = Path(value).expanduser()
    if len(os.fsencode(str(path))) > MAX_SOCKET_PATH:
        raise ConfigError(f"daemon socket path {str(path)!r} is {len(os.fsencode(str(path)))} "
                          f"bytes; Unix sockets allow {MAX_SOCKET_PATH}: choose a shorter "
                          f"path with --socket or KREG_DAEMON")
    return path


# ---------------------------------------------------------------------------------------------
# frames


def encode_frame(obj: Any) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


def decode_frame(body: bytes) -> dict[str, Any]:
    """Parse one frame body; raises ValueError for anything but a JSON object (UTF-8 only:
    decoding first also spares json its encoding detection). JSON nested deeper than the
    parser's recursion limit is a ValueError too, not a RecursionError."""
    try:
        obj = json.loads(body.decode())
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a frame must hold a JSON object, not {type(obj).__name__}")
    return obj
