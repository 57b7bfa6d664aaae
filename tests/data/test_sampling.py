"""nnU-Net's foreground oversampling (:mod:`medseg.data.sampling`, ``data.augment=nnunet``) on small volumes.

The locations are checked exactly (all voxels, the cap, nnU-Net's own draw when nnunetv2 is installed), the crops
by their positions: the image of a test case holds each voxel's flat index + 1, so a crop's image says exactly which
voxels it cut (0 where it padded).
"""

from __future__ import annotations

import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai import transforms as mt
from monai.data import CacheDataset, MetaTensor, PersistentDataset

from medseg.config import DataConfig
from medseg.data.demo import lps_affine
from medseg.data.labels import IGNORE_INDEX, LabelSpec, RandCropByPosNegForegroundd
from medseg.data.reading import IMAGE, LABEL
from medseg.data.sampling import (
    ANNOTATED,
    CLASS_LOCATIONS,
    ClassLocationsd,
    PlacedCases,
    RandNnunetCropd,
    class_locations,
    forced_foreground,
    forced_per_case,
)
from medseg.data.transforms import augmentations, patch_sampling, samples_per_volume, train_transforms, window

SHAPE = (24, 22, 20)
CROP, FINAL = (10, 9, 7), (8, 6, 7)  # enlargements 2, 3 (odd: one more voxel of padding) and 0


def organ_and_lesions() -> np.ndarray:
    """A big organ (class 1, 4096 voxels), a lesion of 8 voxels at the lower corner (class 2) and one of 1 voxel at
    the upper corner (class 3): the lesions' crops are clamped (lower) or reach beyond the case (upper)."""
    label = np.zeros(SHAPE, np.int8)
    label[4:20, 3:19, 2:18] = 1
    label[0:2, 0:2, 0:2] = 2
    label[-1, -1, -1] = 3
    return label


def case(label: np.ndarray) -> dict:
    """A preprocessed case as the training chain holds it: the image is each voxel's flat index + 1."""
    image = np.arange(1, label.size + 1, dtype=np.float32).reshape(label.shape)
    return {IMAGE: MetaTensor(torch.from_numpy(image)[None]), LABEL: MetaTensor(torch.from_numpy(label)[None]),
            "case": "c0"}


def cropper(num_samples: int, fraction: float = 0.33, crop=CROP, final=FINAL) -> RandNnunetCropd:
    return RandNnunetCropd([IMAGE, LABEL], crop, final, num_samples, fraction)


def as_set(points) -> set[tuple[int, ...]]:
    return {tuple(int(v) for v in p) for p in np.asarray(points)}


# ------------------------------------------------------------------------------------ class locations


def test_class_locations_hold_every_voxel_of_a_small_class_and_no_ignore_voxel() -> None:
    label = organ_and_lesions()
    label[10:12, :, :] = IGNORE_INDEX  # cuts through the organ
    locations = class_locations(label, [[1], [2], [3], [4]])
    for number in (1, 2, 3):
        assert as_set(locations[number]) == as_set(np.argwhere(label == number))
        assert len(locations[number]) == int((label == number).sum())
    assert locations[4].shape == (0, 3)
    assert as_set(locations[ANNOTATED]) == as_set(np.argwhere(label >= 0))  # background and classes, not ignore
    assert ANNOTATED not in class_locations(organ_and_lesions()), "annotated voxels are kept only with ignore voxels"
    assert as_set(class_locations(label, [[2, 3]])[1]) == as_set(np.argwhere((label == 2) | (label == 3)))  # a region
    assert sorted(class_locations(label)) == [ANNOTATED, 1, 2, 3]  # None: the foreground classes up to the largest


def test_class_locations_cap_a_large_class_deterministically() -> None:
    label = np.zeros((40, 40, 20), np.int8)
    label[:, :, :15] = 1  # 24 000 voxels
    label[0, 0, 19] = 2
    first, again = class_locations(label), class_locations(label)
    assert len(first[1]) == 10_000 and len(as_set(first[1])) == 10_000  # the cap, without repeats
    assert (label[tuple(first[1].T)] == 1).all()
    assert all(np.array_equal(first[k], again[k]) for k in first), "the draw is seeded"
    assert not np.array_equal(first[1], class_locations(label, seed=1)[1])
    assert len(class_locations(label, min_locations=100)[1]) == 240, "at least 1% of the class (nnU-Net's coverage)"


def test_class_locations_equal_nnunets() -> None:
    preprocessor = pytest.importorskip("nnunetv2.preprocessing.preprocessors.default_preprocessor")
    rng = np.random.default_rng(0)
    label = rng.integers(0, 4, (30, 20, 16)).astype(np.int8)
    label[:4] = IGNORE_INDEX
    nnunet_label = np.where(label == IGNORE_INDEX, 4, label)[None]  # nnU-Net's ignore label: its highest value
    sample = preprocessor.DefaultPreprocessor._sample_foreground_locations
    theirs = sample(nnunet_label, [1, 2, 3, [-1, 0, 1, 2, 3]], min_num_samples=500)
    ours = class_locations(label, min_locations=500)
    for number, key in [(1, 1), (2, 2), (3, 3), (ANNOTATED, (-1, 0, 1, 2, 3))]:
        np.testing.assert_array_equal(ours[number], theirs[key][:, 1:])
    regions = [(1, 2, 3), (2, 3), (3,)]
    theirs = sample(label[None], regions, min_num_samples=500)
    ours = class_locations(label, regions, min_locations=500)
    for number, key in enumerate(regions, start=1):
        np.testing.assert_array_equal(ours[number], theirs[key][:, 1:])


# ------------------------------------------------------------------------------------ the crops


@pytest.mark.parametrize(("n", "forced"), [(1, 0), (2, 1), (3, 1), (4, 1), (6, 2)])
def test_the_last_crops_are_forced_to_foreground_by_nnunets_count(n: int, forced: int) -> None:
    assert forced == n - round(n * (1 - 0.33)) == forced_foreground(n, 0.33)
    transform = cropper(n)
    transform.set_random_state(n)
    transform.randomize(SHAPE, class_locations(organ_and_lesions()))
    assert [c is not None for c in transform.choices] == [False] * (n - forced) + [True] * forced
    assert forced_foreground(n, 0.0) == 0 and forced_foreground(n, 1.0) == n


def nnunet_oversampled(batch_size: int, percent: float = 0.33) -> list[bool]:
    """nnU-Net's ``nnUNetDataLoader.get_do_oversample`` for each sample of a batch: ``not sample_idx <
    round(batch_size * (1 - oversample_foreground_percent))``."""
    return [not index < round(batch_size * (1 - percent)) for index in range(batch_size)]


@pytest.mark.parametrize(("cases", "samples"), [(10, 1), (2, 1), (1, 2), (2, 5), (5, 2), (3, 3), (1, 1), (12, 1)])
def test_a_batch_forces_nnunets_count_on_its_last_crops(cases: int, samples: int) -> None:
    per_case = forced_per_case(cases, samples, 0.33)
    flags = [crop >= samples - forced for forced in per_case for crop in range(samples)]  # each case's last crops
    assert flags == nnunet_oversampled(cases * samples)


def test_the_loader_tells_each_case_its_batch_places_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten cases of one crop each: the loader's batches force the last three crops, as nnU-Net's batch of ten; the
    count is set only while a case is read."""
    from medseg.training.prepare import patch_loader

    seen: list[int] = []
    draw = RandNnunetCropd.randomize

    def spy(self: RandNnunetCropd, shape, locations) -> None:
        draw(self, shape, locations)
        seen.append(sum(choice is not None for choice in self.choices))

    monkeypatch.setattr(RandNnunetCropd, "randomize", spy)
    crop = cropper(1)
    dataset = CacheDataset([case(organ_and_lesions())] * 4, mt.Compose([ClassLocationsd(LABEL), crop]),
                           progress=False)
    loader = patch_loader(dataset, batch=10, workers=0, iterations=3)
    assert isinstance(loader.dataset, PlacedCases)
    batches = [batch[IMAGE].shape[0] for batch in loader]
    assert batches == [10] * 3 and seen == nnunet_oversampled(10) * 3 and crop.forced is None
    seen.clear()
    one_pass = patch_loader(dataset, batch=3, workers=0, iterations=None)  # 4 cases: one batch of 3, the rest dropped
    assert [batch[IMAGE].shape[0] for batch in one_pass] == [3] and seen == nnunet_oversampled(3)


@pytest.mark.parametrize("start", [(0, 0, 0), (-2, 3, -1), (20, 18, 15), (-3, -2, -4), (30, 1, 2)])
def test_a_crop_is_monais_spatial_crop_then_border_pad(start: tuple[int, int, int]) -> None:
    """Inside, partly outside (padded on either side) or wholly outside the case: the values and the affine of
    MONAI's ``SpatialCrop`` followed by ``BorderPad``."""
    volume = MetaTensor(torch.arange(2 * math.prod(SHAPE), dtype=torch.float32).reshape(2, *SHAPE),
                        affine=torch.from_numpy(lps_affine((0.8, 0.7, 2.5), origin=(10.0, -5.0, 3.0))))
    start_array, size = np.asarray(start), np.asarray(CROP)
    low, high = np.clip(start_array, 0, SHAPE), np.clip(start_array + size, 0, SHAPE)
    if (high > low).all():
        inside = mt.SpatialCrop(roi_start=low.tolist(), roi_end=high.tolist())(volume)
        border = [int(side) for pair in zip(low - start_array, start_array + size - high) for side in pair]
        expected = mt.BorderPad(border)(inside) if any(border) else inside
    else:  # nothing of the case: zeros, the affine moved as the crop's
        expected = None
    patch = cropper(1).crop(volume, start_array, index=3)
    assert isinstance(patch, MetaTensor) and patch.shape == (2, *CROP) and patch.meta["patch_index"] == 3
    if expected is None:
        assert not patch.any()
    else:
        assert torch.equal(patch.as_tensor(), expected.as_tensor())
        torch.testing.assert_close(patch.affine, expected.affine)
    corner = volume.affine @ torch.tensor([*map(float, start), 1.0], dtype=volume.affine.dtype)
    torch.testing.assert_close(patch.affine[:3, 3], corner[:3])


def test_forced_crops_centre_their_classes_voxel() -> None:
    """Each forced crop holds its class at its centre voxel, or, clamped at the lower border, inside the network's
    patch (the crop's centre); near the upper border it reaches beyond the case, padded."""
    label = organ_and_lesions()
    data = case(label)
    transform = cropper(60, fraction=1.0)
    transform.set_random_state(0)
    patches = transform(data | {CLASS_LOCATIONS: class_locations(label)})
    low, _ = transform.bounds(SHAPE)
    centre = tuple(c // 2 for c in CROP)
    final = tuple(slice(c // 2 - f // 2, c // 2 - f // 2 + f) for c, f in zip(CROP, FINAL))  # MONAI's centre crop
    assert {3} < set(transform.choices) and None not in transform.choices
    for patch, start, choice in zip(patches, transform.starts, transform.choices):
        patch_label = patch[LABEL][0]
        assert tuple(patch_label.shape) == CROP
        assert (patch_label[final] == choice).any(), "the chosen class lies inside the network's patch"
        if (start > low).all():
            assert patch_label[centre] == choice
        if choice == 3:  # the upper corner voxel: centred, so the crop reaches beyond the case
            assert (start + np.asarray(CROP) > np.asarray(SHAPE)).all() and patch[IMAGE][0][centre] == label.size


def test_crops_cut_the_case_at_their_corner_and_pad_beyond() -> None:
    label = organ_and_lesions()
    transform = cropper(40, fraction=0.5)
    transform.set_random_state(3)
    for patch, start in zip(transform(case(label) | {CLASS_LOCATIONS: class_locations(label)}), transform.starts):
        image = patch[IMAGE][0].as_tensor().numpy()
        grid = np.stack(np.meshgrid(*(s + np.arange(c) for s, c in zip(start, CROP)), indexing="ij"))
        inside = ((grid >= 0) & (grid < np.asarray(SHAPE)[:, None, None, None])).all(0)
        expected = np.where(inside, np.ravel_multi_index(np.where(inside, grid, 0), SHAPE) + 1, 0)
        np.testing.assert_array_equal(image, expected)
        np.testing.assert_array_equal(patch[LABEL][0].numpy(), np.where(inside, label[tuple(np.where(inside, grid, 0))],
                                                                         0))
        assert patch["case"] == "c0" and CLASS_LOCATIONS not in patch
        assert isinstance(patch[IMAGE], MetaTensor) and patch[LABEL].dtype == torch.int8


def test_classes_are_chosen_uniformly_among_those_present() -> None:
    """The 1-voxel lesion is chosen as often as the 4096-voxel organ (binomial, 4.5 standard deviations)."""
    draws = 3000
    transform = cropper(draws, fraction=1.0)
    transform.set_random_state(1)
    transform.randomize(SHAPE, class_locations(organ_and_lesions()))
    counts = np.bincount(np.asarray(transform.choices), minlength=4)[1:]
    assert counts.sum() == draws
    assert (np.abs(counts - draws / 3) < 4.5 * math.sqrt(draws * (1 / 3) * (2 / 3))).all(), counts
    transform.randomize(SHAPE, class_locations(organ_and_lesions(), [[1], [2], [4]]))  # class 4 absent, 3 not asked
    assert set(transform.choices) == {1, 2}


def test_random_crops_are_uniform_over_the_padded_case() -> None:
    draws = 4000
    transform = cropper(draws, fraction=0.0)
    transform.set_random_state(2)
    transform.randomize(SHAPE, class_locations(organ_and_lesions()))
    starts = np.stack(transform.starts)
    low, high = transform.bounds(SHAPE)
    np.testing.assert_array_equal(low, [-1, -2, 0])  # ceil of half the enlargement (2, 3, 0)
    np.testing.assert_array_equal(high, np.asarray(SHAPE) - CROP + [1, 2, 0])
    np.testing.assert_array_equal(starts.min(0), low)  # every corner reached
    np.testing.assert_array_equal(starts.max(0), high)
    spread = np.sqrt(((high - low + 1) ** 2 - 1) / 12 / draws)  # the standard deviation of the mean
    assert (np.abs(starts.mean(0) - (low + high) / 2) < 5 * spread).all()
    assert set(transform.choices) == {None}
    # a case smaller than the crop along an axis is padded around it, at one position
    small = cropper(50, fraction=0.0)
    small.randomize((6, 22, 20), {})
    assert {int(s[0]) for s in small.starts} == {-2}


def test_a_case_without_foreground_gets_random_crops() -> None:
    transform = cropper(200, fraction=1.0)
    transform.set_random_state(4)
    transform.randomize(SHAPE, class_locations(np.zeros(SHAPE, np.int8), [[1], [2]]))
    assert set(transform.choices) == {None} and len({tuple(s) for s in transform.starts}) > 50


def test_with_ignore_voxels_unforced_crops_centre_annotated_voxels() -> None:
    """nnU-Net's sparse annotation: the crops not forced to foreground are centred on annotated voxels."""
    label = organ_and_lesions()
    label[:, 11:, :] = IGNORE_INDEX
    transform = cropper(200, fraction=0.5)
    transform.set_random_state(5)
    patches = transform(case(label) | {CLASS_LOCATIONS: class_locations(label)})
    low, _ = transform.bounds(SHAPE)
    assert transform.choices[:100] == [ANNOTATED] * 100 and None not in transform.choices[100:]
    centre = tuple(c // 2 for c in CROP)
    for patch, start in zip(patches[:100], transform.starts):
        if (start > low).all():
            assert patch[LABEL][0][centre] >= 0


def test_crops_are_reproducible_under_set_random_state() -> None:
    label = organ_and_lesions()
    data = case(label) | {CLASS_LOCATIONS: class_locations(label)}
    runs = []
    for seed in (7, 7, 8):
        transform = cropper(6)
        transform.set_random_state(seed)
        runs.append([patch[IMAGE] for patch in transform(data)] + [transform.choices])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][:-1], runs[1][:-1])) and runs[0][-1] == runs[1][-1]
    assert not all(torch.equal(a, b) for a, b in zip(runs[0][:-1], runs[2][:-1]))


# ------------------------------------------------------------------------------------ the training chains


def nifti_case(folder: Path) -> dict:
    label = organ_and_lesions()
    image = np.random.default_rng(0).normal(size=label.shape).astype(np.float32) + label
    affine = lps_affine((1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0))
    paths = {IMAGE: folder / "image.nii.gz", LABEL: folder / "label.nii.gz"}
    nib.save(nib.Nifti1Image(image, affine), paths[IMAGE])
    nib.save(nib.Nifti1Image(label.astype(np.uint8), affine), paths[LABEL])
    return {key: str(path) for key, path in paths.items()}


LABELS = LabelSpec.plain({0: "background", 1: "organ", 2: "lesion", 3: "speck"})


@pytest.mark.parametrize(("spatial_dims", "patch"), [(3, [12, 10, 8]), (2, [12, 10])], ids=["3d", "2d"])
def test_nnunet_training_chain_gives_network_patches_of_valid_labels(tmp_path: Path, spatial_dims: int,
                                                                     patch: list[int]) -> None:
    data = DataConfig(root=str(tmp_path), spacing=[1.0, 1.0, 1.0], patch_size=patch, normalization="zscore",
                      samples_per_volume=4, augment="nnunet")
    chain = train_transforms(data, spatial_dims, LABELS)
    chain.set_random_state(0)
    samples = chain(nifti_case(tmp_path))
    assert len(samples) == samples_per_volume(data, spatial_dims) == 4
    for sample in samples:
        assert tuple(sample[IMAGE].shape) == tuple(sample[LABEL].shape) == (1, *window(data, spatial_dims).net_patch)
        assert set(sample[LABEL].unique().tolist()) <= {0.0, 1.0, 2.0, 3.0}
        assert CLASS_LOCATIONS not in sample


def test_the_class_locations_are_cached(tmp_path: Path) -> None:
    """ClassLocationsd comes before the first random transform: the memory and disk caches hold its output."""
    data = DataConfig(root=str(tmp_path), spacing=[1.0, 1.0, 1.0], patch_size=[12, 10, 8], normalization="zscore",
                      samples_per_volume=2, augment="nnunet")
    chain = train_transforms(data, 3, LABELS)
    kinds = [type(t) for t in chain.transforms]
    assert kinds.index(ClassLocationsd) + 1 == kinds.index(RandNnunetCropd)
    entry = nifti_case(tmp_path)
    memory = CacheDataset([entry], chain, progress=False)
    assert sorted(memory._cache[0][CLASS_LOCATIONS]) == [1, 2, 3]
    disk = PersistentDataset([entry], chain, cache_dir=tmp_path / "cache")
    for _ in range(2):  # written, then read back (the locations as tensors)
        assert [tuple(s[IMAGE].shape) for s in disk[0]] == [(1, 12, 10, 8)] * 2
        assert len(list((tmp_path / "cache").glob("*.pt"))) == 1


@pytest.mark.parametrize("augment", ["light", "none"])
def test_light_and_none_sample_as_before(augment: str) -> None:
    """``light``'s and ``none``'s chains are unchanged: MONAI's pad and positive/negative crop, on a fixed seed."""
    data = DataConfig(root="unused", spacing=[1.0, 1.0, 1.0], patch_size=[12, 10, 8], normalization="none",
                      pos_fraction=0.5, samples_per_volume=3, augment=augment)
    view = window(data, 3)
    before = mt.Compose([
        mt.SpatialPadd(keys=[IMAGE, LABEL], spatial_size=view.roi_size),
        RandCropByPosNegForegroundd(keys=[IMAGE, LABEL], label_key=LABEL, spatial_size=view.roi_size, pos=0.5,
                                    neg=0.5, num_samples=3, allow_smaller=False),
        *(augmentations(view.net_patch) if augment == "light" else []),
        mt.EnsureTyped(keys=[IMAGE, LABEL], dtype=torch.float32, track_meta=False),
    ])
    now = mt.Compose(patch_sampling(data, 3))
    small = organ_and_lesions()[:, :, :6]  # smaller than the patch along the last axis: padded
    for chain in (before, now):
        chain.set_random_state(11)
    for _ in range(3):
        for old, new in zip(before(case(small)), now(case(small))):
            assert torch.equal(old[IMAGE], new[IMAGE]) and torch.equal(old[LABEL], new[LABEL])
