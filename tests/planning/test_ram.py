"""Host RAM of a training run, estimated before it runs (:mod:`medseg.planning.ram`): the parts it adds up."""

from __future__ import annotations

from medseg.planning.ram import (
    CACHING_TRANSIENT,
    RUNTIME_BYTES,
    VALIDATION_BYTES,
    VALIDATION_MAPS,
    estimate_training_ram,
)

MIB = 2**20


def test_estimate_adds_the_cache_the_larger_transient_the_step_and_the_runtime() -> None:
    # 4 cases of 40 MiB as float32 images and label, 2 image channels: 9 of 12 bytes a voxel stay cached (int8 label)
    case, voxels = 40 * MIB, 40 * MIB / 12
    estimate = estimate_training_ram(4 * case, num_cases=4, cached_cases=5, channels=2, outputs=3, workers=3,
                                     step_bytes=300 * MIB)
    assert estimate.cache == int(5 * voxels * 9), "a case in both lists is cached twice"
    assert estimate.transient == int(CACHING_TRANSIENT * 3 * case), "3 threads caching outweigh a validated volume"
    assert (estimate.step, estimate.runtime) == (300 * MIB, RUNTIME_BYTES)
    assert estimate.total == estimate.cache + estimate.transient + estimate.step + estimate.runtime
    one_thread = estimate_training_ram(4 * case, 4, 5, 2, outputs=3, workers=0)
    assert one_thread.transient == int(voxels * (VALIDATION_MAPS * 4 * 3 + VALIDATION_BYTES)), "validating outweighs"
    many_classes = estimate_training_ram(4 * case, 4, 5, 2, outputs=14, workers=0)
    assert many_classes.transient > one_thread.transient, "a probability map per output"
