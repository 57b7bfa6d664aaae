"""Host memory measured and given back: the RAM available (:func:`available_ram_bytes`), the peak a process and its
loader workers take (:class:`PeakRam`), and the freed pages of whole volumes returned to the system between stages
(:func:`release_freed_memory`). What a training run will need is estimated by :mod:`medseg.planning.ram`.

glibc keeps what a process frees for its next allocations: it raises its mmap threshold to the size of each large
block freed (up to 32 MiB), so later volumes, their resampled copies and their probability maps come from its heap,
and the heap's freed pages stay resident, so a run's peak RAM holds pages it no longer uses and varies between
identical runs. :func:`release_freed_memory` hands those pages back (glibc's ``malloc_trim(3)``) where a stage that
freed whole volumes ends: after caching, after each validation, after each evaluated case. The threshold itself is
left to glibc: fixed (``mallopt(M_MMAP_THRESHOLD)``), it would map every activation of every training step anew,
which slows the steps (the figures: docs/data.md, "Caching").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import resource
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from medseg.runtime.device import reset_peak_memory


@functools.cache
def _trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (not Linux, musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Return the allocator's free pages to the system; True when some were (glibc), False otherwise or elsewhere."""
    trim = _trim()
    return bool(trim(0)) if trim is not None else False


def available_ram_bytes() -> int:
    """RAM that new allocations can take without swapping: Linux's ``MemAvailable``; elsewhere the physical RAM."""
    kib = _kib(_read("/proc/meminfo"), "MemAvailable")
    return kib * 1024 if kib is not None else os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _read(path: str) -> str:
    """A ``/proc`` file's text; empty when it is missing (not Linux, or the process ended)."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _kib(text: str, field: str) -> int | None:
    """The value of a ``field: N kB`` line of a ``/proc`` file's text (``/proc/<pid>/status``, ``/proc/meminfo``)."""
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match[1]) if match else None


def child_pids(pid: int | str = "self") -> list[int]:
    """The processes started by ``pid`` and, in turn, by them (Linux ``/proc/<pid>/task/<tid>/children``)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:  # not Linux, or the process ended meanwhile
        return []
    found: list[int] = []
    for task in tasks:
        for child in _read(str(task / "children")).split():
            found += [int(child), *child_pids(child)]
    return found


class PeakRam:
    """The peak host RAM of this process and its child processes (the DataLoader workers) while it is open.

    ``with PeakRam() as ram: train(cfg)``, then ``ram.peak_bytes``. A thread samples every ``interval`` seconds
    this process's resident set plus, for each child, what its resident set grew by since it was first seen; the
    peak is the largest such sum, or this process's own high-water mark (Linux ``VmHWM``, reset when ``PeakRam``
    opens, so nothing before counts) when that is larger. A forked worker starts out mapping all of its parent's
    pages, so its resident set (and ``ru_maxrss``, its own and ``RUSAGE_CHILDREN``'s) counts the parent's memory a
    second time; only its growth is its own. Pages a worker copies on write do not show, nor peaks between
    samples. Elsewhere than Linux the peak is this process's ``ru_maxrss`` alone.
    """

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self._peak = 0
        self._start: dict[int, int] = {}
        """Each child's smallest resident set seen, KiB: what it maps of its parent's memory."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="PeakRam", daemon=True)

    def __enter__(self) -> PeakRam:
        reset_peak_memory(torch.device("cpu"))  # VmHWM restarts from the current resident set
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def peak_bytes(self) -> int:
        """The peak so far (bytes)."""
        if not self._stop.is_set():
            self._sample()
        return self._peak

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        status = _read("/proc/self/status")
        own, high = _kib(status, "VmRSS"), _kib(status, "VmHWM")
        if own is None or high is None:
            scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
            self._peak = max(self._peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale)
            return
        grown = 0
        for pid in child_pids():
            rss = _kib(_read(f"/proc/{pid}/status"), "VmRSS")
            if rss is not None:
                self._start[pid] = min(self._start.get(pid, rss), rss)
                grown += rss - self._start[pid]
        self._peak = max(self._peak, (own + grown) * 1024, high * 1024)
