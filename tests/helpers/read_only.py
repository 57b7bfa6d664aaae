"""Read-only storage for tests: a real read-only mount where this machine can make one, and a simulated one in
process (the file system refuses every write with ``EROFS`` while the permissions still allow it)."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | getattr(os, "O_TMPFILE", 0)


def read_only_command(root: Path, command: list[str]) -> list[str]:
    """``command`` run with ``root`` read-only; skips the test when this machine cannot make it so.

    As root (CI containers), through a read-only bind mount in a private mount namespace (``unshare``); as any other
    user, through its permissions.
    """
    if os.geteuid() != 0:
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        return command
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("running as root without user namespaces: no way to make a folder read-only")
    mount = f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && exec {shlex.join(command)}"
    return ["unshare", "-rm", "sh", "-c", mount]


def read_only_mount(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make ``folder`` behave as a read-only mount in this process: opening a file for writing in it (or an unnamed
    temporary file, ``O_TMPFILE``) fails with ``OSError(EROFS)``, as the kernel's does, while ``os.access`` and
    the permissions still say it is writable."""
    real_open, inside = os.open, folder.resolve()

    def open_on_a_read_only_mount(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        target = Path(os.fsdecode(path)).resolve()
        if flags & WRITE_FLAGS and (target == inside or target.is_relative_to(inside)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_on_a_read_only_mount)
