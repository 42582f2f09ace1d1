"""Version comparison with release semantics (``3.10 > 3.9``), no third-party dependency."""

from __future__ import annotations

import re

__all__ = ["parse_version", "version_at_least"]

_NUM = re.compile(r"\d+")


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric release components: ``'2.13.0+cu130' -> (2, 13, 0)``, ``'3.7' -> (3, 7)``.

    A pre-release or local suffix (``rc1``, ``+git...``) is ignored: ``3.7.0rc1`` counts as 3.7.0.
    Raises ValueError when the text has no leading number.
    """
    parts: list[int] = []
    for piece in text.strip().lstrip("vV").split("."):
        m = _NUM.match(piece)
        if m is None:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    if not parts:
        raise ValueError(f"not a version: {text!r}")
    return tuple(parts)


def version_at_least(have: str, floor: str) -> bool:
    a, b = parse_version(have), parse_version(floor)
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)) >= b + (0,) * (n - len(b))
