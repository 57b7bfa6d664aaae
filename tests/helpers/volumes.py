"""NIfTI volumes and dataset folders for inference and evaluation: the demo as an nnU-Net test folder, an oblique
scan, and the geometry check of a written label map."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.orientations import axcodes2ornt, io_orientation, ornt_transform

LABELS = {"0": "background", "1": "dim sphere", "2": "bright sphere"}
"""The demo dataset's labels."""


def restore(path: Path, orientation: str) -> None:
    """Store the image at ``path`` again with its voxel axes in ``orientation`` (the same voxels in the world)."""
    image = nib.load(path)
    nib.save(image.as_reoriented(ornt_transform(io_orientation(image.affine), axcodes2ornt(orientation))), path)


def nnunet_folder(demo: Path, dest: Path, one_hot_images: bool = False, cases: int = 8,
                  orientation: str | None = None) -> Path:
    """``dest/imagesTs/CASE_0000.nii.gz`` + ``dest/labelsTs/CASE.nii.gz`` from the demo.

    ``one_hot_images``: the images are the one-hot labels, one channel file per class (``CASE_0000..0002``).
    ``orientation``: every file is stored again with its voxel axes in these codes (the demo's are LPS).
    """
    for index in range(cases):
        name = f"demo_{index:03d}"
        label = demo / "labelsTr" / f"{name}.nii.gz"
        image = demo / "imagesTr" / f"{name}.nii.gz"
        (dest / "imagesTs").mkdir(parents=True, exist_ok=True)
        (dest / "labelsTs").mkdir(parents=True, exist_ok=True)
        if one_hot_images:
            nii = nib.load(label)
            for c in range(len(LABELS)):
                channel = (np.asarray(nii.dataobj) == c).astype(np.float32)
                nib.save(nib.Nifti1Image(channel, nii.affine, nii.header), dest / "imagesTs" / f"{name}_{c:04d}.nii.gz")
        else:
            shutil.copy(image, dest / "imagesTs" / f"{name}_0000.nii.gz")
        shutil.copy(label, dest / "labelsTs" / f"{name}.nii.gz")
    for path in (dest.glob("*/*.nii.gz") if orientation else ()):
        restore(path, orientation)
    return dest


def assert_same_geometry(prediction: Path, image: Path) -> np.ndarray:
    """The prediction has the image's shape and affine exactly; returns its voxels."""
    pred, ref = nib.load(prediction), nib.load(image)
    assert pred.shape == ref.shape[:3]
    np.testing.assert_array_equal(pred.affine, ref.affine)
    assert pred.get_data_dtype() == np.uint8
    return np.asarray(pred.dataobj)


def oblique_volume(path: Path) -> Path:
    """A non-cubic volume stored LPS, rotated (oblique) and anisotropic (0.9 x 0.7 x 2.5 mm)."""
    def rotation(axis: int, degrees: float) -> np.ndarray:
        c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
        a, b = [i for i in range(3) if i != axis]
        matrix = np.eye(3)
        matrix[a, a], matrix[a, b], matrix[b, a], matrix[b, b] = c, -s, s, c
        return matrix

    affine = np.eye(4)
    affine[:3, :3] = np.diag([-1.0, -1.0, 1.0]) @ rotation(2, 20) @ rotation(0, 10) @ np.diag([0.9, 0.7, 2.5])
    affine[:3, 3] = (30.0, -12.0, 40.0)
    data = np.random.default_rng(0).normal(100, 20, (37, 30, 13)).astype(np.float32)
    image = nib.Nifti1Image(data, affine)
    image.set_qform(affine, code=1)
    image.set_sform(affine, code=1)
    nib.save(image, path)
    return path
