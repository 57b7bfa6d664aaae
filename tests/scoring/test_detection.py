"""Lesion-wise detection (:mod:`medseg.scoring.detection`) and the peers harness's scoring of a folder with it, and
with Dice averaged as nnU-Net does."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import nibabel as nib
import numpy as np
import pytest

from benchmarks.peers import score_folder
from medseg.data.datalist import load_dataset
from medseg.scoring.detection import Detection, detect_lesions, detection_summary


def blobs(shape: tuple[int, ...], *corners: tuple[int, ...], size: int = 2) -> np.ndarray:
    """A boolean mask with a cube of ``size`` voxels at each corner."""
    mask = np.zeros(shape, bool)
    for corner in corners:
        mask[tuple(slice(c, c + size) for c in corner)] = True
    return mask


def test_found_lesions_and_false_positives_are_counted_by_component() -> None:
    reference = blobs((20, 20, 12), (1, 1, 1), (10, 10, 5), (15, 2, 8))
    prediction = blobs((20, 20, 12), (2, 2, 2), (10, 11, 5), (1, 15, 1), size=1)  # 2 lesions touched, 1 elsewhere
    prediction |= blobs((20, 20, 12), (5, 5, 9), size=3)  # a second stray component
    assert detect_lesions(prediction, reference) == Detection(lesions=3, found=2, false_positives=2)
    assert detect_lesions(reference, reference) == Detection(3, 3, 0)
    assert detect_lesions(np.zeros_like(reference), reference) == Detection(3, 0, 0)


def test_voxels_touching_by_a_corner_are_one_lesion_in_2d_and_3d() -> None:
    diagonal = np.zeros((6, 6, 6), bool)
    diagonal[1, 1, 1] = diagonal[2, 2, 2] = True
    assert detect_lesions(diagonal, diagonal) == Detection(1, 1, 0)
    plane = np.eye(5, dtype=bool)
    assert detect_lesions(np.zeros_like(plane), plane) == Detection(1, 0, 0)
    with pytest.raises(ValueError, match="differ in shape"):
        detect_lesions(plane, diagonal)


def test_summary_over_cases() -> None:
    summary = detection_summary([Detection(3, 2, 1), Detection(1, 1, 0), Detection(0, 0, 2)])
    assert summary == {"lesions": 4, "found": 3, "sensitivity": 0.75, "false_positives_per_case": 1.0}
    assert math.isnan(detection_summary([Detection(0, 0, 1)])["sensitivity"]), "no lesion: no sensitivity"


def test_an_empty_case_cannot_pass_for_a_found_lesion(tmp_path: Path) -> None:
    """Case a holds a lesion the prediction half covers; case b holds none and none is predicted. Dice averages 1 for
    b in; nnU-Net's way leaves b out; detection finds 1 of 1 lesions, no false positive."""
    root, predictions = tmp_path / "msd", tmp_path / "pred"
    for folder in (root / "imagesTr", root / "labelsTr", predictions):
        folder.mkdir(parents=True)
    lesion = blobs((12, 12, 8), (4, 4, 2), size=4).astype(np.uint8)
    half = lesion.copy()
    half[:6] = 0
    for case, label, prediction in (("a", lesion, half), ("b", np.zeros_like(lesion), np.zeros_like(lesion))):
        nib.save(nib.Nifti1Image(np.ones(lesion.shape, np.float32), np.eye(4)), root / "imagesTr" / f"{case}.nii.gz")
        nib.save(nib.Nifti1Image(label, np.eye(4)), root / "labelsTr" / f"{case}.nii.gz")
        nib.save(nib.Nifti1Image(prediction, np.eye(4)), predictions / f"{case}.nii.gz")
    (root / "dataset.json").write_text(json.dumps({
        "name": "lesions", "modality": {"0": "CT"}, "labels": {"0": "background", "1": "lesion"}, "test": [],
        "training": [{"image": f"./imagesTr/{c}.nii.gz", "label": f"./labelsTr/{c}.nii.gz"} for c in "ab"]}))
    info = load_dataset(root)
    scored = score_folder(SimpleNamespace(label_spec=info.label_spec), info.training, predictions)
    dice_a = 2 * half.sum() / (half.sum() + lesion.sum())
    assert scored["summary"]["classes"]["lesion"]["dice"] == pytest.approx((dice_a + 1) / 2)
    assert scored["dice_empty_left_out"]["lesion"] == pytest.approx(dice_a)
    assert scored["detection"]["lesion"] == {"lesions": 1, "found": 1, "sensitivity": 1.0,
                                             "false_positives_per_case": 0.0}
