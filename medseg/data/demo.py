"""Built-in demo data: synthetic MRI-like volumes with two foreground classes, as an MSD-style folder.

The volumes come from MONAI's ``create_test_image_3d`` with a fixed seed (spheres of two intensity
classes in noise, both in every case), saved as ``.nii.gz`` with a realistic geometry: LPS orientation, anisotropic
0.8 x 0.8 x 2.0 mm spacing and a non-zero origin. They go through exactly the loader path of real
data, so the demo exercises orientation and spacing handling too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from monai.data import create_test_image_3d
from tqdm import tqdm

from medseg.errors import DatasetError
from medseg.io import atomic_write_json, write_nifti

DEMO_SPACING = (0.8, 0.8, 2.0)
"""Voxel spacing in mm along the voxel axes (i, j, k)."""
DEMO_SHAPE = (64, 64, 32)
DEMO_LABELS = {"0": "background", "1": "dim sphere", "2": "bright sphere"}
DEMO_NAME = "medseg-demo"
"""The ``name`` of the demo's ``dataset.json``."""
DEMO_MARKER = ".medseg-demo"
"""The file the generator writes into ``root`` before anything else: the folder is the demo's to rewrite."""


def lps_affine(spacing: tuple[float, float, float], origin: tuple[float, float, float]) -> np.ndarray:
    """A (4, 4) voxel-to-RAS affine whose voxel axes point Left, Posterior, Superior (DICOM's LPS)."""
    affine = np.diag([-spacing[0], -spacing[1], spacing[2], 1.0])
    affine[:3, 3] = origin
    return affine


def _case_with_every_class(shape: tuple[int, int, int], rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    """One ``(image, label)`` pair of spheres, ``shape`` each, that holds both foreground classes.

    Draws are repeated until both classes are visible (spheres of random class may all share one class, or
    hide one another), as in most MSD tasks, where every structure is in every case.
    """
    rad_max = max(2, min(shape) // 4)
    while True:
        image, label = create_test_image_3d(
            *shape, num_objs=6, rad_max=rad_max, rad_min=max(1, rad_max // 2 - 1), noise_max=0.25,
            num_seg_classes=2, random_state=rng,
        )
        if {1, 2} <= set(np.unique(label).tolist()):
            return image, label


def generate_demo_dataset(
    root: str | Path,
    num_cases: int = 40,
    shape: tuple[int, int, int] = DEMO_SHAPE,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Write ``num_cases`` synthetic cases and an MSD ``dataset.json`` under ``root``; returns ``root``.

    Images are float32 in an arbitrary MRI-like scale (0..1000); labels are uint8 in {0, 1, 2}.
    The same seed always gives the same data. ``dataset.json`` is written last, so a folder that
    holds it is complete.

    Raises:
        DatasetError: ``root`` holds files the demo did not make (:func:`check_demo_folder`); nothing is written.
    """
    root = Path(root)
    check_demo_folder(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / DEMO_MARKER).touch()
    rng = np.random.RandomState(seed)
    training = []
    for index in tqdm(range(num_cases), desc="demo data", disable=not progress):
        image, label = _case_with_every_class(shape, rng)
        origin = tuple(float(v) for v in rng.uniform(-100.0, 100.0, size=3))
        affine = lps_affine(DEMO_SPACING, origin)
        name = f"demo_{index:03d}.nii.gz"
        write_nifti(root / "imagesTr" / name, (image * 1000.0).astype(np.float32), affine)
        write_nifti(root / "labelsTr" / name, label.astype(np.uint8), affine)
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    atomic_write_json(root / "dataset.json", {
        "name": DEMO_NAME,
        "description": f"Synthetic spheres from monai.data.create_test_image_3d (seed {seed}), LPS, "
                       f"{DEMO_SPACING} mm spacing",
        "tensorImageSize": "3D",
        "modality": {"0": "MRI"},
        "labels": DEMO_LABELS,
        "numTraining": num_cases,
        "numTest": 0,
        "training": training,
        "test": [],
    })
    return root


def _dataset_meta(root: Path) -> dict:
    """``root/dataset.json`` as a dict; empty without one, or when it cannot be read as one."""
    try:
        meta = json.loads((root / "dataset.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def check_demo_folder(root: Path) -> None:
    """The demo writes only into a folder that is missing, empty, or its own (the :data:`DEMO_MARKER` file, or a
    ``dataset.json`` named :data:`DEMO_NAME` from before the marker existed).

    Raises:
        DatasetError: any other folder, e.g. someone's dataset given as ``data.root`` without ``data=msd``.
    """
    if not root.exists():
        return
    if not root.is_dir():
        raise DatasetError(f"data.root={root} is a file: the demo generates its data into a folder")
    name = _dataset_meta(root).get("name")
    if (root / DEMO_MARKER).is_file() or name == DEMO_NAME or not any(root.iterdir()):
        return
    held = f"a dataset.json of {name!r}" if (root / "dataset.json").is_file() else "files"
    raise DatasetError(f"data.root={root} holds {held} that the demo did not make; the demo writes only into an "
                       f"empty folder or its own. For your own data: data=msd data.root={root} (or data=nnunet)")


def ensure_demo_dataset(root: str | Path, num_cases: int = 40, seed: int = 0) -> Path:
    """Generate the demo dataset at ``root`` unless a complete one of ``num_cases`` cases is there.

    Raises:
        DatasetError: ``root`` holds files the demo did not make (:func:`check_demo_folder`); nothing is written.
    """
    root = Path(root)
    check_demo_folder(root)
    if _dataset_meta(root).get("numTraining") == num_cases:
        return root
    return generate_demo_dataset(root, num_cases=num_cases, seed=seed)
