"""The decision journal: JSON lines, size-bounded with rotation.

The daemon appends one line per select it answers (``t``, ``pid``, ``op``, ``implementation``,
``config``, ``reason``, ``workload``, ``device``, ``hit``). When the current file passes
``max_bytes`` it becomes ``<name>.1`` (``.1`` becomes ``.2``, and so on) and the oldest is
dropped, so the journal never holds more than ``files * max_bytes`` bytes (plus one line).

Writes are buffered and flushed by the daemon's timer (and at exit): a crash loses at most the
last half second, never the file's consistency, because readers skip a torn last line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["DEFAULT_FILES", "DEFAULT_MAX_BYTES", "Journal", "read_journal"]

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_FILES = 3


class Journal:
    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES,
                 files: int = DEFAULT_FILES) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.files = max(1, files)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fh: IO[str] | None = None
        self._size = 0
        self.rotations = 0
        self._open()

    def _open(self) -> None:
        # Owner-only: decisions name the workloads of the user's processes.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._fh = os.fdopen(fd, "a", encoding="utf-8", buffering=64 * 1024)
        self._size = os.fstat(fd).st_size

    def write(self, record: dict[str, Any]) -> None:
        self.write_line(json.dumps(record, separators=(",", ":"), default=str) + "\n")

    def write_line(self, line: str) -> None:
        """Append one serialized record (one line, ending in a newline)."""
        if self._fh is None:
            return
        self._fh.write(line)
        self._size += len(line)
        if self._size >= self.max_bytes:
            self.rotate()

    def rotate(self) -> None:
        if self._fh is not None:
            self._fh.close()
        for i in range(self.files - 1, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
        if self.files == 1:
            self.path.unlink(missing_ok=True)
        self.rotations += 1
        self._open()

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in journal_files(self.path, self.files) if p.exists())


def journal_files(path: Path, files: int = DEFAULT_FILES) -> list[Path]:
    """Oldest first."""
    return [path.with_name(f"{path.name}.{i}") for i in range(files - 1, 0, -1)] + [path]


def read_journal(path: Path, files: int = DEFAULT_FILES) -> Iterator[dict[str, Any]]:
    """Every readable record, oldest first; torn or foreign lines are skipped."""
    for p in journal_files(Path(path), files):
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield rec
