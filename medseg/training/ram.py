"""Host RAM of a training run: what it will need (the ``data.cache=auto`` decision) and what it took.

Where a run's RAM goes with ``data.cache=memory`` (docs/data.md, "Caching"):

* the **runtime**: the interpreter, torch, MONAI and Hydra (:data:`RUNTIME_BYTES`);
* the **cache**: every case a process trains or validates on, its images float32 and its label int8
  (:class:`medseg.data.transforms.CompactLabeld`); with ``data.fold=all`` in one process training samples its
  patches from the validation cache, so each case is held once (under DDP a rank's training and validation shares
  differ, and both are held);
* the larger of two **transients**: caching, where each of ``data.num_workers`` threads resamples a case
  (:data:`CACHING_TRANSIENT`: the voxels as read, their float32 copy, MONAI's sampling grid of 12 bytes a voxel,
  the output), and validating a whole volume (:data:`VALIDATION_MAPS`, :data:`VALIDATION_BYTES`: the
  probabilities of every output, the predicted and the reference label maps);
* the **training step**, when it runs on the CPU: activations, weights, gradients and optimizer state
  (:func:`medseg.planning.memory.estimate_training_memory`).

:func:`estimate_training_ram` adds these up; :class:`PeakRam` measures what the process and its loader workers
really took.
"""

from __future__ import annotations

import os
import re
import resource
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from medseg.attention.common import FLOAT32_BYTES
from medseg.runtime.device import reset_peak_memory

GIB = 2**30
"""Bytes per GiB, the unit of the log lines."""
RUNTIME_BYTES = 600 * 2**20
"""The interpreter, torch, MONAI and Hydra, with the loader workers' own share (the main process holds about 0.48
GiB when caching starts, on the CPU)."""
CACHING_TRANSIENT = 4.0
"""What resampling a case takes besides its cached result, per byte of the case as float32 image and label
(measured 3.8: 0.98 GB over 2 threads caching 128 MB cases)."""
VALIDATION_MAPS = 2
"""Float32 probability maps of every output alive at once while a volume is validated: the sliding window's sum
and the softmax (or sigmoid) of it."""
VALIDATION_BYTES = 48
"""Further bytes a voxel while a volume is validated: the predicted and the reference class maps (int64), the
output masks, Dice's counts (int64 temporaries); with :data:`VALIDATION_MAPS` fitted to 75 bytes a voxel measured
with 3 outputs."""
LABEL_BYTES = 1
"""Bytes a voxel of a cached label (int8; images are float32)."""


@dataclass(frozen=True)
class RamEstimate:
    """Estimated peak host RAM of a training run with ``data.cache=memory``, in bytes, by part."""

    runtime: int
    """:data:`RUNTIME_BYTES`."""
    cache: int
    """The cached cases."""
    transient: int
    """Caching or validating (the larger), beyond the cache."""
    step: int
    """A training step on the CPU (0 on a GPU, whose memory holds it)."""

    @property
    def total(self) -> int:
        return self.runtime + self.cache + self.transient + self.step

    def text(self) -> str:
        """``"3.4 GiB (cache 0.4, transients 1.1, training step 1.4, runtime 0.6 GiB)"``, for the log."""
        parts = [("cache", self.cache), ("transients", self.transient), ("training step", self.step),
                 ("runtime", self.runtime)]
        return (f"{self.total / GIB:.1f} GiB ({', '.join(f'{name} {size / GIB:.1f}' for name, size in parts)} "
                f"GiB)")


def estimate_training_ram(dataset_bytes: int, num_cases: int, cached_cases: int, channels: int, outputs: int,
                          workers: int, step_bytes: int = 0) -> RamEstimate:
    """Estimated peak host RAM of training with the cases cached in memory, from the mean case.

    Args:
        dataset_bytes: the resampled dataset as float32 images and labels
            (:attr:`medseg.planning.plan.Plan.dataset_bytes`).
        num_cases: the cases ``dataset_bytes`` covers.
        cached_cases: the cases this process caches: its training plus its validation cases, or the validation
            cases alone when it trains on them too (``data.fold=all``).
        channels: image channels.
        outputs: the network's outputs (classes with background, or regions).
        workers: ``data.num_workers``, the threads that cache; 0 counts as 1.
        step_bytes: one training step when it runs on the CPU (:attr:`medseg.planning.memory.MemoryEstimate.total`),
            else 0.
    """
    case = dataset_bytes / max(num_cases, 1)
    voxels = case / ((channels + 1) * FLOAT32_BYTES)
    cached = voxels * (channels * FLOAT32_BYTES + LABEL_BYTES)
    caching = CACHING_TRANSIENT * max(workers, 1) * case
    validating = voxels * (VALIDATION_MAPS * FLOAT32_BYTES * outputs + VALIDATION_BYTES)
    return RamEstimate(runtime=RUNTIME_BYTES, cache=int(cached_cases * cached), transient=int(max(caching, validating)),
                       step=int(step_bytes))


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
