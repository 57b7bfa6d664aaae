"""Image and label stay aligned through every augmentation and through the whole training chain.

The label of each test case is drawn from its image (``image > THRESHOLD``); any transform that moved the image
and the label differently would break that relation, so the tests check it after every transform. The list of
augmentations is read from :func:`medseg.data.transforms.augmentations`, so a new one is covered too.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.transforms import RandomizableTransform

from medseg.config import DataConfig
from medseg.data.demo import lps_affine
from medseg.data.transforms import IMAGE, LABEL, augmentations, train_transforms, window

LOW, HIGH = (0.0, 0.3), (0.7, 1.0)
"""Image values of background and foreground voxels. The gap survives the intensity jitter of the training
chain (a scale of 1 ± 0.1, then a shift of ± 0.1): background stays below 0.43, foreground above 0.53."""
THRESHOLD = 0.5
"""``label = image > THRESHOLD``, before and after any augmentation."""

# non-cubic patches whose square plane lies on each pair of axes, and a square 2D patch
PATCHES = [(10, 10), (7, 10, 10), (10, 7, 10), (10, 10, 7)]


def image_with_gap(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random voxels, about half of them foreground, with values in ``LOW`` or ``HIGH``."""
    rng = np.random.default_rng(seed)
    foreground = rng.random(shape) > 0.5
    return np.where(foreground, rng.uniform(*HIGH, size=shape), rng.uniform(*LOW, size=shape)).astype(np.float32)


def drawn_label(image: torch.Tensor) -> torch.Tensor:
    return (image > THRESHOLD).to(image.dtype)


def forced(patch: tuple[int, ...]) -> list[RandomizableTransform]:
    """The augmentations of the training chain for ``patch``, each forced to apply every time."""
    chain = augmentations(patch)
    for transform in chain:
        assert isinstance(transform, RandomizableTransform)
        transform.prob = 1.0
    return chain


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: "x".join(map(str, p)))
def test_every_augmentation_keeps_image_and_label_aligned(patch: tuple[int, ...]) -> None:
    """Spatial augmentations move both keys alike; the others move neither (the label stays drawn from the image)."""
    chain = forced(patch)
    assert any(LABEL in t.keys for t in chain), "the training chain has no spatial augmentation"
    image = torch.from_numpy(image_with_gap(patch, seed=len(patch)))[None]
    for seed, transform in enumerate(chain):
        name = type(transform).__name__
        transform.set_random_state(seed)
        out = transform({IMAGE: image.clone(), LABEL: drawn_label(image)})
        moved, label = (out[key].as_subclass(torch.Tensor) for key in (IMAGE, LABEL))
        assert moved.shape == image.shape, f"{name} changed the patch shape"
        assert not torch.equal(moved, image), f"{name} did not apply"
        assert torch.equal(label, drawn_label(moved)), f"{name} misaligned image and label"


def case_drawn_from_its_image(folder: Path, shape: tuple[int, int, int], spacing: tuple[float, float, float]) -> dict:
    """A NIfTI case (LPS, so loading reorients it) whose label is ``image > THRESHOLD``."""
    image = image_with_gap(shape, seed=7)
    affine = lps_affine(spacing, origin=(12.0, -30.0, 5.0))
    paths = {IMAGE: folder / "image.nii.gz", LABEL: folder / "label.nii.gz"}
    nib.save(nib.Nifti1Image(image, affine), paths[IMAGE])
    nib.save(nib.Nifti1Image((image > THRESHOLD).astype(np.uint8), affine), paths[LABEL])
    return {key: str(path) for key, path in paths.items()}


@pytest.mark.parametrize(("spatial_dims", "patch"), [(2, [12, 12]), (3, [12, 12, 6])], ids=["2d", "3d"])
def test_training_chain_keeps_label_drawn_from_image(tmp_path: Path, spatial_dims: int, patch: list[int]) -> None:
    spacing = (1.0, 1.0, 2.5)  # also the target: resampling keeps the voxel grid (the gap absorbs rounding)
    case = case_drawn_from_its_image(tmp_path, (20, 18, 9), spacing)
    data = DataConfig(root=str(tmp_path), spacing=list(spacing), patch_size=patch, normalization="none",
                      pos_fraction=0.5, samples_per_volume=8, augment="light")
    chain = train_transforms(data, spatial_dims)
    chain.set_random_state(0)
    samples = chain(case)
    assert len(samples) == data.samples_per_volume
    for sample in samples:
        image, label = sample[IMAGE], sample[LABEL]
        assert tuple(image.shape) == (1, *window(data, spatial_dims).net_patch)
        assert torch.equal(label, drawn_label(image)), "the training chain misaligned image and label"


@pytest.mark.parametrize(("spatial_dims", "patch"), [(2, [12, 12]), (3, [12, 12, 6])], ids=["2d", "3d"])
def test_nnunets_chain_crops_the_enlarged_patch_and_keeps_the_label_on_the_image(tmp_path: Path, spatial_dims: int,
                                                                                 patch: list[int]) -> None:
    """data.augment=nnunet: the patches reach the network's size from nnU-Net's enlarged crop, and the label still
    follows the image: rotation and scaling interpolate both (the image linearly, the label per class) and the
    intensity transforms move the image's values, so they agree but at some voxels; the label against its own mirror
    image (a misaligned pair) agrees far less."""
    spacing = (1.0, 1.0, 2.5)
    case = case_drawn_from_its_image(tmp_path, (20, 18, 9), spacing)
    data = DataConfig(root=str(tmp_path), spacing=list(spacing), patch_size=patch, normalization="none",
                      pos_fraction=0.5, samples_per_volume=16, augment="nnunet")
    chain = train_transforms(data, spatial_dims)
    chain.set_random_state(1)
    aligned, misaligned = [], []
    for sample in chain(case):
        image, label = sample[IMAGE], sample[LABEL]
        assert tuple(image.shape) == (1, *window(data, spatial_dims).net_patch)
        assert set(label.unique().tolist()) <= {0.0, 1.0}
        aligned.append(float((label == drawn_label(image)).float().mean()))
        misaligned.append(float((label.flip(1) == drawn_label(image)).float().mean()))
    assert np.mean(aligned) > 0.85 and np.mean(aligned) > np.mean(misaligned) + 0.2, (aligned, misaligned)
