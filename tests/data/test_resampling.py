"""``data.resampling``: nnU-Net's choice of separate z, and its interpolation against references written from its rule
(a cubic spline in the plane, nearest neighbour along the thick axis) on the grid that linear resampling makes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai import transforms as mt
from monai.data import MetaTensor
from scipy import ndimage

from medseg.data.reading import IMAGE, LABEL
from medseg.data.resampling import ResampleToSpacingd, separate_axis
from medseg.errors import ConfigError
from medseg.inference.resample_back import Grids


@pytest.mark.parametrize(("spacing", "target", "axis"), [
    ((0.7, 0.7, 5.0), (1.0, 1.0, 1.0), 2),      # the case is anisotropic: its thick axis
    ((5.0, 0.7, 0.7), (1.0, 1.0, 1.0), 0),
    ((1.0, 1.0, 2.5), (1.0, 1.0, 1.0), None),   # 2.5 <= 3: one pass
    ((1.0, 1.0, 1.0), (1.0, 1.0, 3.5), 2),      # isotropic case, anisotropic target: the target's thick axis
    ((3.5, 3.5, 1.0), (1.0, 1.0, 1.0), None),   # two axes share the largest spacing: nnU-Net does not separate
])
def test_separate_z_is_chosen_as_nnunet_chooses(spacing: tuple, target: tuple, axis: int | None) -> None:
    assert separate_axis(spacing, target) == axis


def _case(spacing: tuple[float, ...], shape: tuple[int, ...], seed: int = 0) -> dict[str, MetaTensor]:
    volume = np.random.default_rng(seed).normal(size=(1, *shape)).astype(np.float32)
    volume = ndimage.gaussian_filter(volume, (0, 1.5, 1.5, 0))  # smooth in-plane, distinct slices
    label = (volume > 0).astype(np.float32)
    affine = torch.diag(torch.tensor([*spacing, 1.0], dtype=torch.float64))
    return {IMAGE: MetaTensor(torch.from_numpy(volume), affine=affine),
            LABEL: MetaTensor(torch.from_numpy(label), affine=affine.clone())}


def test_an_anisotropic_case_gets_a_spline_in_plane_and_nearest_slices() -> None:
    """Each output slice is one input slice (the nearest, never a blend), resampled in its plane by a cubic spline
    (scipy's, at the output voxel centres: index i at i * 1.0 / 0.7 input voxels; edge values repeated beyond the
    border, as nnU-Net's ``mode='edge'``)."""
    spacing, target = (0.7, 0.7, 5.0), (1.0, 1.0, 2.0)
    case = _case(spacing, (36, 30, 7))
    out = ResampleToSpacingd([IMAGE, LABEL], target, "nnunet")(case)
    linear = ResampleToSpacingd([IMAGE, LABEL], target, "linear")(_case(spacing, (36, 30, 7)))
    assert out[IMAGE].shape == linear[IMAGE].shape and torch.equal(out[IMAGE].affine, linear[IMAGE].affine)
    volume = case[IMAGE].numpy()[0]
    rows, cols = out[IMAGE].shape[1:3]
    grid = np.meshgrid(np.arange(rows) * target[0] / spacing[0], np.arange(cols) * target[1] / spacing[1],
                       indexing="ij")
    for k in range(out[IMAGE].shape[3]):
        nearest = int(np.floor(k * target[2] / spacing[2] + 0.5))
        plane = volume[..., nearest].astype(np.float64)
        expected = ndimage.map_coordinates(plane, grid, order=3, mode="nearest")
        np.testing.assert_allclose(out[IMAGE].numpy()[0][..., k], expected, atol=1e-5)
        assert np.abs(ndimage.map_coordinates(plane, grid, order=1, mode="nearest") - expected).max() > 1e-2
    assert set(np.unique(out[LABEL].numpy())) <= {0.0, 1.0}, "labels by nearest neighbour"


def test_an_isotropic_case_gets_one_cubic_spline_pass() -> None:
    spacing, target = (1.0, 1.2, 1.4), (1.5, 1.5, 1.5)
    out = ResampleToSpacingd([IMAGE], target, "nnunet")(_case(spacing, (20, 18, 16)))
    one_pass = mt.Spacingd([IMAGE], pixdim=target, mode=3, dtype=np.float32)(_case(spacing, (20, 18, 16)))
    torch.testing.assert_close(out[IMAGE].as_tensor(), one_pass[IMAGE].as_tensor())


def test_linear_is_monais_spacing() -> None:
    spacing, target = (0.7, 0.7, 5.0), (1.0, 1.0, 2.0)
    out = ResampleToSpacingd([IMAGE, LABEL], target, "linear")(_case(spacing, (20, 18, 5)))
    monai = mt.Spacingd([IMAGE, LABEL], pixdim=target, mode=["bilinear", "nearest"],
                        dtype=np.float32)(_case(spacing, (20, 18, 5)))
    for key in (IMAGE, LABEL):
        torch.testing.assert_close(out[key].as_tensor(), monai[key].as_tensor())


def test_an_unknown_resampling_is_refused_by_key() -> None:
    with pytest.raises(ConfigError, match=r"data\.resampling='cubic'.*linear, nnunet"):
        ResampleToSpacingd([IMAGE], (1.0, 1.0, 1.0), "cubic")


def test_separate_z_is_undone_onto_the_original_grid() -> None:
    """Prediction maps go back to the case's own grid: the first pass's source, not the in-plane pass's output
    (:class:`~medseg.inference.resample_back.Grids`), linearly; and MONAI's inverse undoes both passes."""
    spacing, shape = (0.7, 0.7, 5.0), (36, 30, 7)
    case = _case(spacing, shape)
    case[IMAGE].meta["original_affine"] = case[IMAGE].affine.numpy()  # as the reader records the file's
    transform = ResampleToSpacingd([IMAGE, LABEL], (1.0, 1.0, 2.0), "nnunet")
    out = transform(case)
    assert [op["class"] for op in out[IMAGE].applied_operations] == ["SpatialResample"] * 2
    grids = Grids.of(out[IMAGE])
    assert grids.ras_shape == shape and np.allclose(grids.ras_affine, case[IMAGE].affine.numpy())
    assert grids.resample["mode"] == "bilinear"
    back = transform.inverse(out)
    assert tuple(back[IMAGE].shape[1:]) == shape and not back[IMAGE].applied_operations
    torch.testing.assert_close(back[IMAGE].affine, case[IMAGE].affine)
