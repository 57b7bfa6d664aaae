"""nnU-Net v2's training augmentation (:mod:`medseg.data.nnunet_augment`) against nnU-Net's own definitions.

Each transform is checked twice: the formula it applies, against a reference written here from nnU-Net 2.8.1 and
batchgeneratorsv2's source; and the distribution it draws from (application rate within a binomial tolerance, the
parameter ranges, per-channel draws). Where batchgeneratorsv2 is installed, the transforms are also compared with
its own on the same input and the same parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from monai import transforms as mt
from scipy.ndimage import correlate1d, map_coordinates

from medseg.data.nnunet_augment import (
    RandContrastd,
    RandGammad,
    RandGaussianBlurd,
    RandLowResolutiond,
    RandNNUNetSpatiald,
    bg_contrast,
    enlarged_patch,
    gaussian_kernel,
    is_dummy_2d,
    nnunet_augmentations,
    nnunet_crop,
    rotation_range,
)
from medseg.data.reading import IMAGE, LABEL

DRAWS = 4000


def assert_rate(hits: int, draws: int, p: float) -> None:
    """``hits`` out of ``draws`` is within 4.5 binomial standard deviations of ``p``."""
    assert abs(hits - draws * p) <= 4.5 * math.sqrt(draws * p * (1 - p)), (hits, draws, p)


def random_image(shape: Sequence[int], seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(size=tuple(shape)).astype(np.float32))


def blob_label(shape: Sequence[int], values: Sequence[int], seed: int = 0) -> torch.Tensor:
    """``(1, *shape)`` int8 label of smooth blobs taking each of ``values``."""
    rng = np.random.default_rng(seed)
    coarse = torch.from_numpy(rng.random((1, 1, *[max(2, s // 4) for s in shape]), dtype=np.float32))
    mode = "trilinear" if len(shape) == 3 else "bilinear"
    smooth = F.interpolate(coarse, size=tuple(shape), mode=mode)[0]
    ranks = (smooth * len(values)).long().clamp(max=len(values) - 1)
    return torch.as_tensor(values, dtype=torch.int8)[ranks]


# --- nnU-Net's rules for the patch ----------------------------------------------------------------------------------


def rot_x(a: float) -> np.ndarray:
    return np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])


def rot_y(a: float) -> np.ndarray:
    return np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])


def rot_z(a: float) -> np.ndarray:
    return np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])


def rot_2d(a: float) -> np.ndarray:
    return np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])


def reference_patch_size(patch: Sequence[int], rot: float, scale: tuple[float, float]) -> list[int]:
    """nnU-Net's ``get_patch_size`` (``compute_initial_patch_size.py``), in nnU-Net's axis order: the size vector
    rotated (as a row vector) about x, y and z alone, the largest absolute components, divided by ``min(scale)``."""
    rot = min(abs(rot), np.pi / 2)
    coords = np.array(patch, dtype=float)
    shape = coords.copy()
    matrices = [rot_x(rot), rot_y(rot), rot_z(rot)] if len(patch) == 3 else [rot_2d(rot)]
    for matrix in matrices:
        shape = np.maximum(shape, np.abs(coords @ matrix))
    return list((shape / min(scale)).astype(int))


@pytest.mark.parametrize(("patch", "slice_axis", "expected"), [
    ((20, 160, 160), 0, True), ((64, 160, 192), 0, False), ((60, 180, 180), 0, False),  # 3.0 is not > 3
    ((160, 192, 48), 2, True), ((160, 48, 192), 2, False), ((128, 128), 0, False),
])
def test_is_dummy_2d_is_nnunets_anisotropy_rule(patch: tuple[int, ...], slice_axis: int, expected: bool) -> None:
    assert is_dummy_2d(patch, slice_axis) is expected


def test_rotation_range() -> None:
    assert rotation_range((256, 256), 2) == pytest.approx((np.pi,))
    assert rotation_range((512, 160), 2) == pytest.approx((np.pi / 12,))  # elongated 2D patch: ±15°
    assert rotation_range((64, 160, 192), 3, 0) == pytest.approx((np.pi / 6,) * 3)
    assert rotation_range((160, 192, 32), 3, 2) == pytest.approx((0.0, 0.0, np.pi))  # dummy 2D: in-plane only
    assert rotation_range((32, 160, 192), 3) == pytest.approx((np.pi, 0.0, 0.0))  # None: nnU-Net's order


@pytest.mark.parametrize(("patch", "spatial_dims", "slice_axis"), [
    ((128, 128, 128), 3, 0), ((64, 160, 192), 3, 0), ((96, 112, 80), 3, 0), ((160, 192, 64), 3, 2),
    ((112, 48, 160), 3, 1), ((40, 48, 160), 3, 0), ((20, 16, 128), 3, 0), ((160, 192, 32), 3, 2),
    ((256, 256), 2, 0), ((512, 160), 2, 0), ((100, 120), 2, 0),
])
def test_enlarged_patch_is_nnunets_get_patch_size(patch: tuple[int, ...], spatial_dims: int, slice_axis: int) -> None:
    dummy = spatial_dims == 3 and is_dummy_2d(patch, slice_axis)
    order = [slice_axis, *(a for a in range(3) if a != slice_axis)] if spatial_dims == 3 else [0, 1]
    rotation = rotation_range(patch, spatial_dims, slice_axis)  # nnU-Net's get_patch_size: max(rotation) on each axis
    expected_nnunet_order = reference_patch_size([patch[a] for a in order], max(rotation), (0.85, 1.25))
    if dummy:
        expected_nnunet_order[0] = patch[slice_axis]
    expected = [expected_nnunet_order[order.index(a)] for a in range(spatial_dims)]
    sliced = slice_axis if spatial_dims == 3 else None
    assert enlarged_patch(patch, rotation, dummy_2d=dummy, slice_axis=sliced) == expected


def test_enlarged_patch_pinned_values() -> None:
    """Values nnU-Net 2.8.1 computes (``configure_rotation_dummyDA_mirroring_and_inital_patch_size``)."""
    assert enlarged_patch((128, 128, 128), np.pi / 6) == [205, 205, 205]
    assert enlarged_patch((64, 160, 192), np.pi / 6) == [159, 275, 233]
    assert enlarged_patch((160, 192, 64), np.pi / 6, slice_axis=2) == [275, 233, 159]
    assert enlarged_patch((40, 48, 160), np.pi, dummy_2d=True) == [40, 188, 188]
    assert enlarged_patch((512, 160), np.pi / 12) == [630, 188]
    assert enlarged_patch((64, 64), np.pi, scale=(0.7, 1.4)) == [91, 91]  # 64 / 0.7


def test_nnunet_crop_is_the_enlarged_patch_of_the_chain() -> None:
    assert nnunet_crop((20, 160, 160), 3, 0) == [20, 188, 188]  # dummy 2D
    assert nnunet_crop((160, 160, 20), 3, 2) == [188, 188, 20]
    assert nnunet_crop((192, 160, 64), 3, 2) == enlarged_patch((192, 160, 64), np.pi / 6, slice_axis=2)
    assert nnunet_crop((256, 256), 2, 1) == [301, 301]


def test_enlarged_patch_matches_nnunet_when_installed() -> None:
    pytest.importorskip("batchgenerators")
    initial = pytest.importorskip("nnunetv2.training.data_augmentation.compute_initial_patch_size")
    for patch, rot in [((64, 160, 192), np.pi / 6), ((96, 112, 80), np.pi / 6), ((100, 120), np.pi)]:
        nnunet = initial.get_patch_size(patch, (-rot, rot), (-rot, rot), (-rot, rot), (0.85, 1.25))
        assert enlarged_patch(patch, rot) == [int(s) for s in nnunet]


# --- the spatial transform ------------------------------------------------------------------------------------------


def fixed_spatial(patch: Sequence[int], angles: Sequence[float], scale: float,
                  slice_axis: int | None = None) -> RandNNUNetSpatiald:
    """The spatial transform with its draw set to ``angles`` and ``scale`` (call it with ``randomize=False``)."""
    transform = RandNNUNetSpatiald(patch, [np.pi] * len(angles), slice_axis=slice_axis)
    transform.angles, transform.scale = tuple(angles), scale
    return transform


def test_rotation_by_90_degrees_moves_a_point_where_nnunet_does() -> None:
    """2D, 90°: the output voxel at offset ``u`` from the patch centre samples the input at ``R u`` from its centre,
    ``R = [[0, -1], [1, 0]]``; output (4, 5) is offset (1, 2), so it samples offset (-2, 1): input (3, 6)."""
    image, label = torch.zeros(1, 11, 11), torch.zeros(1, 11, 11, dtype=torch.int8)
    image[0, 3, 6], label[0, 3, 6] = 1.0, 2
    out = fixed_spatial((7, 7), [np.pi / 2], 1.0)({IMAGE: image, LABEL: label}, randomize=False)
    expected = torch.zeros(1, 7, 7)
    expected[0, 4, 5] = 1.0
    torch.testing.assert_close(out[IMAGE], expected, atol=1e-5, rtol=0)
    assert torch.equal(out[LABEL], (expected * 2).to(torch.int8))


@pytest.mark.parametrize(("angles", "scale"), [((0.3, -0.2, 0.5), 1.0), ((0.0, 0.0, 0.0), 1.4),
                                               ((-0.4, 0.25, 0.1), 0.75), ((0.5, 0.0, 0.0), 1.2)])
def test_rotation_and_scaling_of_a_linear_image_equal_the_reference(angles: tuple[float, ...], scale: float) -> None:
    """Trilinear interpolation is exact on a linear image, so the output equals ``a · (Rz Ry Rx S u + c) + b``."""
    size, patch = (31, 29, 33), (9, 8, 10)
    weights = np.array([1.0, -2.0, 0.5])
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in size], indexing="ij"), -1)
    image = torch.from_numpy((grid @ weights + 3.0).astype(np.float32))[None]
    out = fixed_spatial(patch, angles, scale)({IMAGE: image}, randomize=False)[IMAGE]
    offsets = np.stack(np.meshgrid(*[np.arange(p) - (p - 1) / 2 for p in patch], indexing="ij"), -1)
    matrix = rot_z(angles[2]) @ rot_y(angles[1]) @ rot_x(angles[0]) * scale
    sampled = offsets @ matrix.T + (np.array(size) - 1) / 2
    expected = sampled @ weights + 3.0
    np.testing.assert_allclose(out[0].numpy(), expected, atol=2e-4)


def reference_label_warp(label: np.ndarray, matrix: np.ndarray, patch: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """nnU-Net's label resampling for a patch inside the input: each value's indicator interpolated (bi/trilinearly,
    scipy), the largest wins. Returns the labels and the margin between the two best scores (small: a near-tie)."""
    offsets = np.stack(np.meshgrid(*[np.arange(p) - (p - 1) / 2 for p in patch], indexing="ij"), 0)
    coords = np.tensordot(matrix, offsets, axes=1) + ((np.array(label.shape) - 1) / 2).reshape(-1, *[1] * len(patch))
    values = np.unique(label)
    scores = np.stack([map_coordinates((label == v).astype(float), coords, order=1) for v in values])
    top = np.sort(scores, axis=0)
    return values[np.argmax(scores, axis=0)], top[-1] - top[-2]


@pytest.mark.parametrize("dims", [2, 3])
def test_labels_are_interpolated_per_value_then_argmaxed(dims: int) -> None:
    shape, patch = ((40, 44, 48), (24, 26, 28)) if dims == 3 else ((60, 64), (36, 40))
    label = blob_label(shape, [-1, 0, 1, 2, 5], seed=dims)
    angles, scale = ((0.4, -0.3, 0.2), 1.3) if dims == 3 else ((0.9,), 1.3)
    matrix = (rot_z(angles[2]) @ rot_y(angles[1]) @ rot_x(angles[0]) if dims == 3 else rot_2d(angles[0])) * scale
    out = fixed_spatial(patch, angles, scale)({LABEL: label}, randomize=False)[LABEL]
    expected, margin = reference_label_warp(label[0].numpy(), matrix, patch)
    clear = margin > 1e-3
    assert out.dtype == torch.int8 and out.shape == (1, *patch)
    assert clear.mean() > 0.95
    np.testing.assert_array_equal(out[0].numpy()[clear], expected[clear])


def test_labels_keep_their_values_and_pad_with_background() -> None:
    """Reaching outside the input (scale 1.4 on a patch as large as the input) pads with 0, never with -1 or -2."""
    label = blob_label((20, 22, 24), [-1, 1, 2, 3], seed=3)
    out = fixed_spatial((20, 22, 24), (0.6, 0.3, -0.5), 1.4)({LABEL: label}, randomize=False)[LABEL]
    assert set(torch.unique(out).tolist()) == {-1, 0, 1, 2, 3}
    assert out[0, 0, 0, 0] == 0 and out[0, -1, -1, -1] == 0
    transform = RandNNUNetSpatiald((16, 16, 16), rotation_range((16, 16, 16), 3), p_rotation=1.0, p_scaling=1.0)
    transform.set_random_state(0)
    for _ in range(10):
        assert set(torch.unique(transform({LABEL: label})[LABEL]).tolist()) <= {-1, 0, 1, 2, 3}


def test_no_rotation_or_scaling_cuts_the_centre_without_interpolation() -> None:
    image = random_image((1, 21, 20, 19))
    out = fixed_spatial((10, 11, 12), (0.0, 0.0, 0.0), 1.0)({IMAGE: image}, randomize=False)[IMAGE]
    assert torch.equal(out, image[:, 5:15, 5:16, 3:15])  # nnU-Net's centre: size // 2 - patch // 2


def test_dummy_2d_transforms_each_slice_alike_in_plane() -> None:
    """Slice k holds the constant k: in-plane resampling keeps each slice a multiple k * w of one weight map w."""
    image = torch.arange(1, 7, dtype=torch.float32).reshape(1, 1, 6, 1).expand(1, 30, 6, 28).clone()
    out = fixed_spatial((20, 6, 20), (0.0, 2.0, 0.0), 1.4, slice_axis=1)({IMAGE: image}, randomize=False)[IMAGE]
    assert out.shape == (1, 20, 6, 20)
    weights = out[0, :, 0, :]
    for k in range(6):
        torch.testing.assert_close(out[0, :, k, :], (k + 1) * weights)
    assert weights.min() < 0.5 and weights.max() == pytest.approx(1.0)  # rotated by 2 rad, scaled: zeros at corners


def test_spatial_draws_rotation_and_scaling_as_nnunet() -> None:
    transform = RandNNUNetSpatiald((32, 32, 32), rotation_range((32, 32, 32), 3))
    transform.set_random_state(0)
    angles, scales = [], []
    for _ in range(DRAWS):
        transform.randomize()
        angles.append(transform.angles)
        scales.append(transform.scale)
    angles, scales = np.array(angles), np.array(scales)
    rotated, scaled = np.any(angles != 0, axis=1), scales != 1.0
    assert_rate(int(rotated.sum()), DRAWS, 0.2)
    assert_rate(int(scaled.sum()), DRAWS, 0.2)
    assert_rate(int((rotated & scaled).sum()), DRAWS, 0.04)  # independent draws
    assert np.all(angles[rotated] != 0) and np.abs(angles).max() <= np.pi / 6  # every axis, within ±30°
    assert abs(angles[rotated].std() - np.pi / 6 / math.sqrt(3)) < 0.02  # uniform
    assert scales[scaled].min() >= 0.7 and scales[scaled].max() <= 1.4 and abs(scales[scaled].mean() - 1.05) < 0.02


def test_dummy_2d_draws_one_in_plane_angle() -> None:
    transform = nnunet_augmentations((16, 96, 96), 3, 0)[0]
    assert isinstance(transform, RandNNUNetSpatiald) and transform.slice_axis == 0
    transform.set_random_state(1)
    drawn = []
    for _ in range(1000):
        transform.randomize()
        if any(transform.angles):
            drawn.append(transform.angles)
    drawn = np.array(drawn)
    assert_rate(len(drawn), 1000, 0.2)
    assert np.all(drawn[:, 1:] == 0) and np.abs(drawn[:, 0]).max() > 2.5  # ±180° about the slice axis only
    transform.angles = tuple(drawn[0])
    assert transform.matrix().shape == (2, 2)


def test_spatial_matches_batchgeneratorsv2() -> None:
    spatial = pytest.importorskip("batchgeneratorsv2.transforms.spatial.spatial")
    cases = [((40, 44, 48), (32, 33, 30), 0.3, 1.2, None), ((30, 34), (30, 34), 2.5, 1.4, None),
             ((8, 30, 34), (8, 24, 26), 2.0, 1.1, 0), ((20, 22, 24), (20, 22, 24), 0.7, 1.4, None)]
    for shape, patch, angle, scale, slice_axis in cases:
        image, label = random_image((1, *shape)), blob_label(shape, [0, 1, 2, 3]).to(torch.int16)
        nnunet = spatial.SpatialTransform(
            patch if slice_axis is None else patch[1:], 0, False, p_rotation=1, rotation=angle, p_scaling=1,
            scaling=scale, p_synchronize_scaling_across_axes=1, bg_style_seg_sampling=False,
            border_mode_seg="constant", padding_value_seg=-1)
        planes = shape if slice_axis is None else shape[1:]  # dummy 2D: nnU-Net's slices as channels
        expected = nnunet(image=image.reshape(-1, *planes).clone(), segmentation=label.reshape(-1, *planes).clone())
        expected_label = expected["segmentation"].reshape(1, *patch).clone()
        expected_label[expected_label == -1] = 0  # nnU-Net's RemoveLabelTransform(-1, 0)
        angles = (angle,) * (3 if len(patch) == 3 else 1)
        out = fixed_spatial(patch, angles, scale, slice_axis)({IMAGE: image, LABEL: label}, randomize=False)
        torch.testing.assert_close(out[IMAGE], expected["image"].reshape(1, *patch), atol=2e-5, rtol=0)
        assert torch.equal(out[LABEL], expected_label)


# --- intensity transforms -------------------------------------------------------------------------------------------


def applied(transform: mt.RandomizableTransform, image: torch.Tensor, params: list) -> torch.Tensor:
    """``transform`` applied to ``image`` with its per-channel draw set to ``params``."""
    transform._do_transform, transform.params = True, params
    return transform({IMAGE: image.clone()}, randomize=False)[IMAGE]


def draws(transform: mt.RandomizableTransform, shape: Sequence[int], n: int = DRAWS) -> tuple[int, list]:
    """How often ``transform`` applies in ``n`` draws for an image of ``shape``, and its per-channel parameters."""
    transform.set_random_state(0)
    hits, params = 0, []
    for _ in range(n):
        transform.randomize(shape)
        hits += transform._do_transform
        params += transform.params
    return hits, params


def reference_blur_kernel(sigma: float) -> np.ndarray:
    """batchgeneratorsv2's ``_build_kernel(sigma, truncate=6)``: size by ``_round_to_nearest_odd(6 sigma + 0.5)``."""
    n = sigma * 6 + 0.5
    rounded = round(n)
    size = rounded if rounded % 2 == 1 else (rounded + 1 if n - rounded >= 0 else rounded - 1)
    x = np.linspace(-(size - 1) / 2, (size - 1) / 2, size)
    pdf = np.exp(-0.5 * (x / sigma) ** 2)
    return pdf / pdf.sum()


def test_blur_kernel() -> None:
    for sigma in [0.5, 0.55, 7 / 12, 0.6, 0.75, 0.8, 11 / 12, 0.95, 1.0, 2.3]:
        np.testing.assert_allclose(gaussian_kernel(sigma).numpy(), reference_blur_kernel(sigma), atol=1e-7)


def test_blur_is_separable_with_reflected_borders() -> None:
    image = random_image((2, 9, 10, 11))
    sigmas = (0.5, 0.8, 1.0)
    out = applied(RandGaussianBlurd(IMAGE), image, [sigmas, None])
    expected = image[0].numpy().astype(float)
    for axis, sigma in enumerate(sigmas):  # torch's "reflect" padding is scipy's "mirror"
        expected = correlate1d(expected, reference_blur_kernel(sigma), axis=axis, mode="mirror")
    np.testing.assert_allclose(out[0].numpy(), expected, atol=1e-5)
    assert torch.equal(out[1], image[1])


def test_blur_draws() -> None:
    hits, params = draws(RandGaussianBlurd(IMAGE), (2, 8, 8, 8))
    assert_rate(hits, DRAWS, 0.2)
    assert_rate(sum(p is not None for p in params), len(params), 0.5)  # p_per_channel
    sigmas = np.array([p for p in params if p is not None])
    assert sigmas.shape[1] == 3 and sigmas.min() >= 0.5 and sigmas.max() <= 1.0
    assert np.mean(sigmas[:, 0] != sigmas[:, 1]) == 1.0  # a sigma per axis


def test_contrast_formula_preserves_range() -> None:
    image = random_image((2, 6, 7, 8))
    out = applied(RandContrastd(IMAGE), image, [1.25, 0.8])
    for channel, factor in enumerate([1.25, 0.8]):
        x = image[channel]
        expected = ((x - x.mean()) * factor + x.mean()).clamp(x.min(), x.max())
        torch.testing.assert_close(out[channel], expected)


def test_bg_contrast_is_half_below_and_half_above_one() -> None:
    R = np.random.RandomState(0)
    values = np.array([bg_contrast(R, 0.7, 1.5) for _ in range(DRAWS)])
    below = values < 1
    assert_rate(int(below.sum()), DRAWS, 0.5)  # uniform over (0.7, 1.5) would give 0.375
    assert values.min() >= 0.7 and values.max() <= 1.5
    assert abs(values[below].mean() - 0.85) < 0.01 and abs(values[~below].mean() - 1.25) < 0.015
    assert np.all(np.array([bg_contrast(R, 1.1, 1.5) for _ in range(100)]) >= 1.1)


@pytest.mark.parametrize(("transform", "p", "low", "high"), [
    (RandContrastd(IMAGE), 0.15, 0.75, 1.25), (RandGammad(IMAGE, prob=0.1, invert=True), 0.1, 0.7, 1.5),
    (RandGammad(IMAGE, prob=0.3), 0.3, 0.7, 1.5), (RandLowResolutiond(IMAGE), 0.25, 0.5, 1.0),
], ids=["contrast", "inverted gamma", "gamma", "low resolution"])
def test_per_channel_draws(transform: mt.RandomizableTransform, p: float, low: float, high: float) -> None:
    hits, params = draws(transform, (3, 4, 4, 4))
    assert_rate(hits, DRAWS, p)
    drawn = np.array([v for v in params if v is not None])
    if isinstance(transform, RandLowResolutiond):
        assert_rate(len(drawn), len(params), 0.5)  # p_per_channel
    else:
        assert len(drawn) == len(params)
    assert drawn.min() >= low and drawn.max() <= high and len(set(drawn.tolist())) == len(drawn)  # one per channel
    if low < 1 < high:  # bg_contrast
        assert_rate(int((drawn < 1).sum()), len(drawn), 0.5)


def reference_gamma(x: np.ndarray, gamma: float, invert: bool) -> np.ndarray:
    """batchgeneratorsv2's ``GammaTransform`` with ``p_retain_stats=1`` on one channel."""
    x = -x if invert else x.copy()
    mean, std = x.mean(), x.std(ddof=1)
    low, span = x.min(), x.max() - x.min()
    x = ((x - low) / max(span, 1e-7)) ** gamma * span + low
    x = (x - x.mean()) * (std / max(x.std(ddof=1), 1e-7)) + mean
    return -x if invert else x


@pytest.mark.parametrize("invert", [False, True])
def test_gamma_formula_retains_stats(invert: bool) -> None:
    image = random_image((2, 6, 7, 8), seed=4)
    out = applied(RandGammad(IMAGE, prob=1.0, invert=invert), image, [0.7, 1.5])
    for channel, gamma in enumerate([0.7, 1.5]):
        np.testing.assert_allclose(out[channel].numpy(), reference_gamma(image[channel].numpy().astype(float), gamma,
                                                                         invert), atol=1e-5)
        assert float(out[channel].mean()) == pytest.approx(float(image[channel].mean()), abs=1e-5)
        assert float(out[channel].std()) == pytest.approx(float(image[channel].std()), rel=1e-5)


def test_low_resolution_formula() -> None:
    """Nearest-neighbour (``nearest-exact``) down to ``round(size * zoom)``, linear back; ``ignore_axis`` untouched."""
    image = random_image((2, 8, 10, 12), seed=5)
    out = applied(RandLowResolutiond(IMAGE), image, [0.5, None])
    coarse = image[0][1::2, 1::2, 1::2]  # nearest-exact at zoom 0.5: voxel floor((i + 0.5) * 2) = 2 i + 1
    expected = F.interpolate(coarse[None, None], size=(8, 10, 12), mode="trilinear", align_corners=False)[0, 0]
    torch.testing.assert_close(out[0], expected)
    assert torch.equal(out[1], image[1])
    per_slice = applied(RandLowResolutiond(IMAGE, ignore_axis=0), image, [0.5, None])
    single = applied(RandLowResolutiond(IMAGE), image[:1, 3], [0.5])  # slice 3 alone, in 2D
    torch.testing.assert_close(per_slice[0, 3], single[0])


def test_intensity_transforms_match_batchgeneratorsv2() -> None:
    pytest.importorskip("batchgeneratorsv2")
    from batchgeneratorsv2.transforms.intensity.contrast import ContrastTransform
    from batchgeneratorsv2.transforms.intensity.gamma import GammaTransform
    from batchgeneratorsv2.transforms.noise.gaussian_blur import GaussianBlurTransform
    from batchgeneratorsv2.transforms.spatial.low_resolution import SimulateLowResolutionTransform

    image = random_image((1, 12, 14, 16), seed=6) * 3 - 1
    cases = [
        (RandGaussianBlurd(IMAGE), (0.6,) * 3, GaussianBlurTransform(0.6, False, False, 1)),
        (RandContrastd(IMAGE), 0.8, ContrastTransform(0.8, True, False, 1)),
        (RandGammad(IMAGE, prob=1.0, invert=True), 1.3, GammaTransform(1.3, 1, False, 1, 1)),
        (RandGammad(IMAGE, prob=1.0), 0.75, GammaTransform(0.75, 0, False, 1, 1)),
        (RandLowResolutiond(IMAGE, ignore_axis=0), 0.63, SimulateLowResolutionTransform(0.63, False, True, (0,))),
    ]
    for ours, param, theirs in cases:
        torch.testing.assert_close(applied(ours, image, [param]), theirs(image=image.clone())["image"])


# --- MONAI's own transforms in the chain ----------------------------------------------------------------------------


def chain_3d() -> list[mt.Transform]:
    return nnunet_augmentations((8, 10, 12), 3, 2)


def test_chain_order_and_monai_settings() -> None:
    chain = chain_3d()
    names = [type(t).__name__ for t in chain]
    assert names == ["RandNNUNetSpatiald", "RandGaussianNoised", "RandGaussianBlurd", "RandScaleIntensityd",
                     "RandContrastd", "RandLowResolutiond", "RandGammad", "RandGammad", "RandFlipd", "RandFlipd",
                     "RandFlipd"]
    assert [t.prob for t in chain[1:]] == [0.1, 0.2, 0.15, 0.15, 0.25, 0.1, 0.3, 0.5, 0.5, 0.5]
    assert [t.flipper.spatial_axis for t in chain[-3:]] == [0, 1, 2]
    assert [t.invert for t in chain[6:8]] == [True, False]
    assert [type(t).__name__ for t in nnunet_augmentations((16, 16), 2, 0)][-2:] == ["RandFlipd", "RandFlipd"]


def test_gaussian_noise_draws_one_std_for_all_channels() -> None:
    """nnU-Net's noise: std uniform in (0, 0.1) (its ``noise_variance`` is used as the std), shared by the channels,
    independent noise per voxel and channel."""
    noise = chain_3d()[1]
    noise.set_random_state(0)
    hits, stds = 0, []
    for _ in range(DRAWS // 4):
        out = noise({IMAGE: torch.zeros(2, 16, 16, 16)})[IMAGE]
        if out.abs().sum() > 0:
            hits += 1
            stds.append(out.std(dim=(1, 2, 3)).tolist())
            assert abs(float(torch.corrcoef(out.reshape(2, -1))[0, 1])) < 0.1
    assert_rate(hits, DRAWS // 4, 0.1)
    stds = np.array(stds)
    np.testing.assert_allclose(stds[:, 0], stds[:, 1], rtol=0.15, atol=2e-3)
    assert stds.max() < 0.105 and abs(stds.mean() - 0.05) < 0.01


def test_brightness_multiplies_each_channel_by_its_own_factor() -> None:
    """MONAI's channel-wise ``RandScaleIntensityd`` draws ``1 + U(-0.25, 0.25)``: nnU-Net's ``BGContrast((0.75,
    1.25))``, whose halves below and above 1 are equally wide."""
    brightness = chain_3d()[3]
    brightness.set_random_state(0)
    image = torch.ones(2, 3, 3, 3)
    hits, factors = 0, []
    for _ in range(DRAWS // 2):
        out = brightness({IMAGE: image})[IMAGE]
        if not torch.equal(out, image):
            hits += 1
            factors.append(out[:, 0, 0, 0].tolist())
            assert torch.equal(out, out[:, :1, :1, :1].expand_as(out))
    assert_rate(hits, DRAWS // 2, 0.15)
    factors = np.array(factors)
    assert factors.min() >= 0.75 and factors.max() <= 1.25 and np.all(factors[:, 0] != factors[:, 1])
    assert_rate(int((factors < 1).sum()), factors.size, 0.5)


def test_mirroring_rate_per_axis() -> None:
    flips = chain_3d()[-3:]
    image = torch.arange(8, dtype=torch.float32).reshape(1, 2, 2, 2)
    for axis, flip in enumerate(flips):
        flip.set_random_state(axis)
        hits = sum(not torch.equal(flip({IMAGE: image, LABEL: image.clone()})[IMAGE], image) for _ in range(1000))
        assert_rate(hits, 1000, 0.5)


# --- the whole chain ------------------------------------------------------------------------------------------------


def run_chain(patch: Sequence[int], spatial_dims: int, slice_axis: int, seed: int, forced: bool = False,
              samples: int = 4) -> list[dict[str, torch.Tensor]]:
    """``samples`` draws of the chain, reseeded with ``seed``, on a fixed synthetic 2-channel case; ``forced``: every
    transform applies (rotation and scaling too), each channel still with its own probability."""
    size = nnunet_crop(patch, spatial_dims, slice_axis)
    case = {IMAGE: random_image((2, *size), seed=7), LABEL: blob_label(size, [-1, 0, 1, 2], seed=8)}
    chain = nnunet_augmentations(patch, spatial_dims, slice_axis)
    if forced:
        chain[0].p_rotation = chain[0].p_scaling = 1.0
        for transform in chain[1:]:
            transform.prob = 1.0
    compose = mt.Compose(chain)
    compose.set_random_state(seed)
    return [compose(dict(case)) for _ in range(samples)]


CHAINS = [((12, 14, 16), 3, 2), ((4, 16, 18), 3, 0), ((20, 24), 2, 0)]


@pytest.mark.parametrize(("patch", "spatial_dims", "slice_axis"), CHAINS, ids=["3d", "dummy-2d", "2d"])
def test_chain_is_reproducible_under_set_random_state(patch: tuple[int, ...], spatial_dims: int,
                                                      slice_axis: int) -> None:
    first, again, other = (run_chain(patch, spatial_dims, slice_axis, seed) for seed in (3, 3, 4))
    for a, b in zip(first, again):
        assert torch.equal(a[IMAGE], b[IMAGE]) and torch.equal(a[LABEL], b[LABEL])
    assert any(not torch.equal(a[IMAGE], c[IMAGE]) for a, c in zip(first, other))
    for sample in first:
        assert sample[IMAGE].shape == (2, *patch) and sample[LABEL].shape == (1, *patch)
        assert sample[LABEL].dtype == torch.int8 and set(torch.unique(sample[LABEL]).tolist()) <= {-1, 0, 1, 2}


PINNED = {
    "3d": ([-84.514494, -78.302009, -73.408920, -9.0240907], [1048, 1069, 1069, 1065], [184, 161, 161, 176]),
    "2d": ([-29.736089, -26.346146, -23.727230, -34.868109], [192, 192, 192, 175], [97, 97, 97, 96]),
    "3d-forced": ([-49.883030, 4.6285772, 52.703655, -154.32129], [964, 1019, 1060, 1021], [239, 186, 168, 193]),
    "dummy-2d-forced": ([-31.408582, -40.136111, -24.912432, 31.423438], [382, 375, 442, 223], [116, 94, 106, 188]),
}
"""Per pinned run: the image sums, the foreground and the ignore voxel counts of its four draws."""


@pytest.mark.parametrize(("name", "patch", "spatial_dims", "slice_axis", "forced"), [
    ("3d", (12, 14, 16), 3, 2, False), ("2d", (20, 24), 2, 0, False),
    ("3d-forced", (12, 14, 16), 3, 2, True), ("dummy-2d-forced", (16, 18, 4), 3, 2, True),
])
def test_chain_output_is_pinned(name: str, patch: tuple[int, ...], spatial_dims: int, slice_axis: int,
                                forced: bool) -> None:
    """Four draws on seed 0: a change of any draw or formula shows in the image sums or the label counts."""
    samples = run_chain(patch, spatial_dims, slice_axis, seed=0, forced=forced)
    sums = [float(s[IMAGE].double().sum()) for s in samples]
    foreground, ignore = ([int(op(s[LABEL]).sum()) for s in samples] for op in (lambda x: x > 0, lambda x: x < 0))
    expected_sums, expected_foreground, expected_ignore = PINNED[name]
    assert sums == pytest.approx(expected_sums, rel=1e-4, abs=1e-3)
    assert (foreground, ignore) == (expected_foreground, expected_ignore)
