"""One training per run folder: a lock file, held while a training owns the folder, that names its process.

Two trainings into one folder (``hydra.run.dir=D`` twice at once) would write each other's checkpoints and
metrics. :func:`acquire` creates ``<folder>/.medseg.lock`` atomically (``O_EXCL``) with the owner's pid and host; a
second training finds it and stops with one line. A lock whose process is gone (a killed run on this host) is stale
and taken over; a lock of another host cannot be checked, so it is kept, and the message says how to clear it.
The training removes its lock when it ends, however it ends (:func:`medseg.training.run.owned_folder`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from medseg.errors import ConfigError
from medseg.runs.layout import RunLayout


def _holder(path: Path) -> tuple[int, str] | None:
    """``(pid, host)`` written in a lock file; None when it cannot be read as that."""
    try:
        pid, host = path.read_text().split()
        return int(pid), host
    except (OSError, ValueError):
        return None


def _alive(pid: int, host: str) -> bool:
    """Whether the lock's process may still run: checked on this host, assumed elsewhere."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def acquire(folder: Path) -> Path:
    """Lock ``folder`` (created if missing) for this process; returns the lock file, which the caller removes.

    Raises:
        ConfigError: another training holds the folder (or a lock file there cannot be read).
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = RunLayout(folder).lock_file
    for _ in range(2):  # a stale lock is removed once, then taken
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if holder is None or _alive(*holder):
                who = f"process {holder[0]} on {holder[1]}" if holder else "a process that left no pid"
                raise ConfigError(f"{folder} is in use by another training ({who}): give this run its own folder "
                                  f"(hydra.run.dir=...), or delete {path} if no training runs there") from None
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(descriptor, "w") as file:
            file.write(f"{os.getpid()} {socket.gethostname()}\n")
        return path
    raise ConfigError(f"{folder}: another training took the folder while this one started; give it its own folder")
