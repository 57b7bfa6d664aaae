"""``data.augment_on=device``: nnU-Net's chain drawn on the workers (:mod:`medseg.data.nnunet_draws`) and applied to
the batch on the training device (:mod:`medseg.data.batched_augment`) gives the worker path's patches.

On the CPU both paths run, so the device path is compared with the worker path patch for patch: the same seeds draw
the same numbers, and the same draws give the same images (to float tolerance: batched reductions and convolutions
sum in another order) and the same labels (exactly).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch
from monai import transforms as mt
from monai.data import Dataset
from monai.data.utils import set_rnd

from medseg.config import DataConfig
from medseg.data.batched_augment import BatchedNnunetAugment, blur, warp_batch
from medseg.data.labels import LabelSpec, RegionTargetsd
from medseg.data.nnunet_augment import RandGaussianBlurd, RandNNUNetSpatiald, nnunet_augmentations, nnunet_crop
from medseg.data.nnunet_draws import DRAWS, Drawn, NnunetDraws, collate_with_draws, nnunet_draws
from medseg.data.reading import IMAGE, LABEL
from medseg.data.transforms import augment_on_device, batched_augmentation, patch_sampling
from medseg.errors import ConfigError
from medseg.training.prepare import patch_loader
from tests.data.test_nnunet_augment import blob_label, random_image

pytestmark = pytest.mark.usefixtures("one_thread")

IMAGE_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
"""Images of the two paths agree to this (float32 sums in another order); labels agree exactly."""
CHAINS = [((12, 14, 16), 3, 2), ((4, 16, 18), 3, 0), ((16, 18, 4), 3, 2), ((20, 24), 2, 0)]
CHAIN_IDS = ["3d", "dummy-2d-first-axis", "dummy-2d-last-axis", "2d"]


def cases(patch: Sequence[int], spatial_dims: int, slice_axis: int, count: int = 3) -> list[dict[str, torch.Tensor]]:
    """``count`` 2-channel crops of nnU-Net's enlarged size, labels -1 (ignore), 0, 1, 2."""
    size = nnunet_crop(patch, spatial_dims, slice_axis)
    return [{IMAGE: random_image((2, *size), seed=7 + i), LABEL: blob_label(size, [-1, 0, 1, 2], seed=8 + i)}
            for i in range(count)]


def seeded(chain: list[mt.Transform], forced: bool, seed: int = 5) -> mt.Compose:
    """``chain`` composed and seeded; ``forced``: every transform applies (each channel still with its own chance)."""
    if forced:
        for transform in chain:
            inner = transform.transform if isinstance(transform, Drawn) else transform
            if isinstance(inner, RandNNUNetSpatiald):
                inner.p_rotation = inner.p_scaling = 1.0
            elif isinstance(inner, mt.RandomizableTransform):
                inner.prob = 1.0
    return mt.Compose(chain).set_random_state(seed)


def both_paths(patch: Sequence[int], spatial_dims: int, slice_axis: int, forced: bool, rounds: int = 4,
               regions: list[list[int]] | None = None) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """The worker path's (image, target) batch and the device path's, ``rounds`` draws of each case, the same seed."""
    crops = cases(patch, spatial_dims, slice_axis)
    targets = [] if regions is None else [RegionTargetsd(LABEL, regions)]
    worker = seeded([*nnunet_augmentations(patch, spatial_dims, slice_axis), *targets], forced)
    drawer = seeded(nnunet_draws(patch, spatial_dims, slice_axis), forced)
    patches = [worker(dict(case)) for _ in range(rounds) for case in crops]
    batch = collate_with_draws([drawer(dict(case)) for _ in range(rounds) for case in crops])
    device = BatchedNnunetAugment(patch, spatial_dims, slice_axis, regions)(batch[IMAGE], batch[LABEL], batch[DRAWS])
    return (torch.stack([p[IMAGE] for p in patches]).float(), torch.stack([p[LABEL] for p in patches]).float()), device


@pytest.mark.parametrize("forced", [False, True], ids=["nnunet-probabilities", "every-transform"])
@pytest.mark.parametrize(("patch", "spatial_dims", "slice_axis"), CHAINS, ids=CHAIN_IDS)
def test_the_device_path_gives_the_worker_paths_patches(patch: tuple[int, ...], spatial_dims: int, slice_axis: int,
                                                        forced: bool) -> None:
    (image, label), (device_image, device_label) = both_paths(patch, spatial_dims, slice_axis, forced)
    assert device_image.shape == image.shape == (12, 2, *patch) and device_image.dtype == torch.float32
    assert device_label.shape == label.shape == (12, 1, *patch) and device_label.dtype == torch.float32
    torch.testing.assert_close(device_image, image, **IMAGE_TOLERANCE)
    assert torch.equal(device_label, label)
    assert set(torch.unique(label).tolist()) <= {-1.0, 0.0, 1.0, 2.0}
    # the draws differ between the samples, and each sample is augmented with its own
    assert len({float(p.double().sum()) for p in image}) == len(image)


def test_region_targets_are_made_after_the_device_augmentation() -> None:
    regions = [[1, 2], [2]]
    (image, target), (device_image, device_target) = both_paths((12, 14, 16), 3, 2, True, rounds=2,
                                                                regions=regions)
    assert device_target.shape == target.shape == (6, 2, 12, 14, 16)
    assert torch.equal(device_target, target) and (target == -1).any() and (target == 1).any()
    torch.testing.assert_close(device_image, image, **IMAGE_TOLERANCE)


def test_another_samples_draws_give_another_patch() -> None:
    """The batch applies draw ``b`` to sample ``b``: the draws of sample 0 given to sample 1 change its patch."""
    patch = (12, 14, 16)
    crops = cases(patch, 3, 2, count=2)
    drawer = seeded(nnunet_draws(patch, 3, 2), forced=True)
    batch = collate_with_draws([drawer(dict(case)) for case in crops])
    augment = BatchedNnunetAugment(patch, 3, 2)
    own, _ = augment(batch[IMAGE], batch[LABEL], batch[DRAWS])
    swapped, _ = augment(batch[IMAGE], batch[LABEL], batch[DRAWS][::-1])
    assert not torch.allclose(own, swapped, atol=1e-3)


def test_workers_draw_only_and_pass_the_crop_on() -> None:
    """The draw-only chain leaves the crop as it is and draws exactly what the applying chain draws."""
    patch = (12, 14, 16)
    (case,) = cases(patch, 3, 2, count=1)
    drawn = seeded(nnunet_draws(patch, 3, 2), forced=True)(dict(case))
    assert drawn[IMAGE] is case[IMAGE] and drawn[LABEL] is case[LABEL]
    draws = drawn[DRAWS]
    assert isinstance(draws, NnunetDraws) and len(draws.flips) == 3 and len(draws.angles) == 3
    assert draws.noise is not None and draws.noise.shape == (2, *patch) and draws.noise.dtype == torch.float32
    chain = seeded(nnunet_augmentations(patch, 3, 2), forced=True)
    chain(dict(case))
    spatial, blur_transform = chain.transforms[0], chain.transforms[2]
    assert isinstance(spatial, RandNNUNetSpatiald) and isinstance(blur_transform, RandGaussianBlurd)
    assert draws.angles == pytest.approx(spatial.angles, abs=0) and draws.scale == spatial.scale
    assert draws.blur == blur_transform.params


def test_blur_with_kernels_of_several_lengths_equals_each_channels_own() -> None:
    """Sigmas 0.5 and 1.0 give kernels of 3 and 7 taps: zero-padded to 7 in one grouped convolution, each channel
    still equals its own separable blur (MONAI's ``separable_filtering`` with reflected borders)."""
    channels = random_image((2, 9, 10, 11), seed=1)
    sigmas = [(0.5, 1.0, 0.7), (1.0, 0.5, 0.5)]
    single = RandGaussianBlurd(IMAGE)
    expected = torch.stack([single.apply_channel(c, s) for c, s in zip(channels, sigmas)])
    torch.testing.assert_close(blur(channels, sigmas), expected, **IMAGE_TOLERANCE)


def test_warp_without_rotation_or_scaling_cuts_the_centre() -> None:
    image, label = random_image((2, 1, 11, 12, 13)), blob_label((11, 12, 13), [0, 1])[None].expand(2, -1, -1, -1, -1)
    out, out_label = warp_batch(image, label, [None, None], (8, 8, 8))
    assert torch.equal(out, image[:, :, 1:9, 2:10, 2:10]) and torch.equal(out_label, label[:, :, 1:9, 2:10, 2:10])


def test_augment_on_resolves_to_the_device_on_cuda_and_for_nnunet_only() -> None:
    nnunet = DataConfig(augment="nnunet")
    assert augment_on_device(nnunet, "cuda") and not augment_on_device(nnunet, "cpu")
    assert augment_on_device(replace(nnunet, augment_on="device"), "cpu")
    assert not augment_on_device(replace(nnunet, augment_on="workers"), "cuda")
    assert not augment_on_device(DataConfig(augment="light", augment_on="device"), "cuda"), "light has no device path"
    with pytest.raises(ConfigError, match="augment_on"):
        augment_on_device(replace(nnunet, augment_on="gpu"), "cuda")


def _case(seed: int) -> dict[str, torch.Tensor]:
    return {IMAGE: random_image((1, 30, 34, 20), seed=seed), LABEL: blob_label((30, 34, 20), [0, 1, 2], seed=seed)}


@pytest.mark.parametrize("regions", [None, [[1, 2], [2]]], ids=["classes", "regions"])
def test_the_loader_of_the_device_path_gives_the_worker_loaders_batches(regions: list[list[int]] | None) -> None:
    """The whole training chain (nnU-Net's sampling, the draws) through the loader, seeded as the trainer seeds it,
    then the device half: the worker path's batches, so a run draws the same patches on either path."""
    names = {0: "background", 1: "a", 2: "b"}
    labels = (LabelSpec.plain(names) if regions is None
              else LabelSpec(names, [0, 1, 2], {"ab": regions[0], "b": regions[1]}, [1, 2]))
    data = DataConfig(augment="nnunet", spacing=[1.0, 1.0, 2.0], patch_size=[16, 20, 8], normalization="none",
                      samples_per_volume=2)
    batches = {}
    for on_device in (False, True):
        dataset = Dataset([_case(seed) for seed in range(3)],
                          mt.Compose(patch_sampling(data, 3, labels, on_device=on_device)))
        loader = patch_loader(dataset, batch=2, workers=0, iterations=3, collate=collate_with_draws if on_device
                              else None)
        torch.manual_seed(0)
        set_rnd(dataset, 11)
        batches[on_device] = list(loader)
    augment = batched_augmentation(data, 3, labels)
    for worker, device in zip(batches[False], batches[True]):
        image, target = augment(device[IMAGE], device[LABEL], device[DRAWS])
        assert image.shape == worker[IMAGE].shape == (4, 1, 16, 20, 8)
        torch.testing.assert_close(image, worker[IMAGE], **IMAGE_TOLERANCE)
        assert torch.equal(target, worker[LABEL])
