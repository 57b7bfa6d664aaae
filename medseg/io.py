"""Crash-safe file writes: write to a temporary file beside the target, fsync, then rename atomically.

A process killed at any moment leaves either the old file or the new one, never a torn file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write(fileobj)`` on a temp file in ``path``'s folder, fsync it, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes the file owner-only; give it normal permissions
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""
    return atomic_write(path, lambda handle: handle.write(text.encode()))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Atomically replace ``path`` with ``obj`` as indented JSON."""
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")
