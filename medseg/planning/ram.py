"""Host RAM of a training run, estimated before it runs: the ``data.cache=auto`` decision
(:func:`medseg.training.prepare.choose_cache`).

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

:func:`estimate_training_ram` adds these up; what a run really took is measured by
:class:`medseg.runtime.host_memory.PeakRam`.
"""

from __future__ import annotations

from dataclasses import dataclass

from medseg.attention.common import FLOAT32_BYTES

GIB = 2**30
"""Bytes per GiB, the unit of the log lines."""
RUNTIME_BYTES = 600 * 2**20
"""The interpreter, torch, MONAI and Hydra, with the loader workers' own share (the main process holds about 0.48
GiB when caching starts, on the CPU)."""
CACHING_TRANSIENT = 4.0
"""What resampling a case takes besides its cached result, per byte of the case as float32 image and label
(fitted to measured caching peaks, rounded up)."""
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
