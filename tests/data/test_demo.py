"""The built-in demo dataset: geometry, labels, determinism, and the transform chains on it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np

from medseg.config import DataConfig
from medseg.data.datalist import load_dataset
from medseg.data.demo import DEMO_SPACING, generate_demo_dataset
from medseg.data.transforms import Window, eval_transforms, thick_axis, train_transforms, window


def test_demo_volumes_have_lps_anisotropic_geometry_and_two_classes(tiny_demo_root: Path) -> None:
    info = load_dataset(tiny_demo_root, "msd")
    assert len(info.training) == 8 and info.num_classes == 3
    image = nib.load(info.training[0]["image"])
    label = nib.load(info.training[0]["label"])
    assert nib.aff2axcodes(image.affine) == ("L", "P", "S")
    np.testing.assert_allclose(image.header.get_zooms(), DEMO_SPACING)
    np.testing.assert_allclose(image.affine, label.affine)
    for entry in info.training:  # every case holds both foreground classes
        assert set(np.unique(np.asarray(nib.load(entry["label"]).dataobj)).tolist()) == {0, 1, 2}


def test_demo_is_deterministic(tmp_path: Path) -> None:
    a = generate_demo_dataset(tmp_path / "a", num_cases=2, shape=(16, 16, 12), progress=False)
    b = generate_demo_dataset(tmp_path / "b", num_cases=2, shape=(16, 16, 12), progress=False)
    for name in ("imagesTr/demo_001.nii.gz", "labelsTr/demo_001.nii.gz"):
        np.testing.assert_array_equal(nib.load(a / name).get_fdata(), nib.load(b / name).get_fdata())


def test_slice_axis_and_2d_patch() -> None:
    assert thick_axis([0.8, 0.8, 2.0]) == 2
    assert thick_axis([3.0, 0.7, 0.7]) == 0
    assert thick_axis([1.0, 1.0, 1.0]) == 2
    def view(spacing: list[float], patch: list[int], spatial_dims: int) -> Window:
        return window(DataConfig(root="unused", spacing=spacing, patch_size=patch), spatial_dims)

    assert view([0.8, 0.8, 2.0], [48, 48, 32], 3) == Window(2, [48, 48, 32], [48, 48, 32])
    assert view([0.8, 0.8, 2.0], [48, 48, 32], 2) == Window(2, [48, 48, 1], [48, 48])
    assert view([3.0, 0.7, 0.7], [40, 56], 2) == Window(0, [1, 40, 56], [40, 56])
    assert view([3.0, 0.7, 0.7], [12, 40, 56], 2) == Window(0, [1, 40, 56], [40, 56])


def test_chains_reorient_pad_and_crop(tiny_demo_root: Path) -> None:
    entry = load_dataset(tiny_demo_root, "msd").training[0]
    cfg = DataConfig(root=str(tiny_demo_root), spacing=[0.8, 0.8, 2.0], patch_size=[24, 40, 20],
                     normalization="zscore", pos_fraction=0.5, samples_per_volume=3)
    patches = train_transforms(cfg, 3)(entry)
    assert len(patches) == 3
    # 20 slices requested from a 16-slice volume: padded, never smaller than the patch
    assert patches[0]["image"].shape == (1, 24, 40, 20) and patches[0]["label"].shape == (1, 24, 40, 20)
    slices = train_transforms(replace(cfg, patch_size=[24, 24]), 2)(entry)
    assert len(slices) == 3 and slices[0]["image"].shape == (1, 24, 24)
    # samples_per_volume: null draws 2 patches in 3D and 16 slices in 2D
    assert len(train_transforms(replace(cfg, samples_per_volume=None), 3)(entry)) == 2
    assert len(train_transforms(replace(cfg, patch_size=[24, 24], samples_per_volume=None), 2)(entry)) == 16
    whole = eval_transforms(cfg)(entry)
    assert whole["image"].shape == (1, 32, 32, 16)
    assert nib.aff2axcodes(whole["image"].affine.numpy()) == ("R", "A", "S")
    assert abs(float(whole["image"].mean())) < 1e-3 and abs(float(whole["image"].std()) - 1) < 1e-2
