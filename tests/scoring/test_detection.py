"""Lesion-wise detection (:mod:`medseg.scoring.detection`): lesions found, false positives and Dice per found lesion
on masks whose matching is known by hand; the per-case rows that record it, and the peers harness's scoring of a
folder with it, beside Dice averaged as nnU-Net does."""

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
from medseg.data.labels import LabelSpec
from medseg.scoring.detection import LESION_COLUMNS, Detection, detect_lesions, detection_summary
from medseg.scoring.per_case import CSV_COLUMNS, score_masks


def blobs(shape: tuple[int, ...], *corners: tuple[int, ...], size: int = 2) -> np.ndarray:
    """A boolean mask with a cube of ``size`` voxels at each corner."""
    mask = np.zeros(shape, bool)
    for corner in corners:
        mask[tuple(slice(c, c + size) for c in corner)] = True
    return mask


def counts(detection: Detection) -> tuple[int, int, int]:
    """Lesions, found, false positives."""
    return detection.lesions, detection.found, detection.false_positives


def test_found_lesions_and_false_positives_are_counted_by_component() -> None:
    reference = blobs((20, 20, 12), (1, 1, 1), (10, 10, 5), (15, 2, 8))
    prediction = blobs((20, 20, 12), (2, 2, 2), (10, 11, 5), (1, 15, 1), size=1)  # 2 lesions touched, 1 elsewhere
    prediction |= blobs((20, 20, 12), (5, 5, 9), size=3)  # a second stray component
    assert counts(detect_lesions(prediction, reference)) == (3, 2, 2)
    assert detect_lesions(reference, reference) == Detection(3, 3, 0, (1.0, 1.0, 1.0))
    assert detect_lesions(np.zeros_like(reference), reference) == Detection(3, 0, 0)


def test_voxels_touching_by_a_corner_are_one_lesion_in_2d_and_3d() -> None:
    diagonal = np.zeros((6, 6, 6), bool)
    diagonal[1, 1, 1] = diagonal[2, 2, 2] = True
    assert counts(detect_lesions(diagonal, diagonal)) == (1, 1, 0)
    plane = np.eye(5, dtype=bool)
    assert counts(detect_lesions(np.zeros_like(plane), plane)) == (1, 0, 0)
    with pytest.raises(ValueError, match="differ in shape"):
        detect_lesions(plane, diagonal)


def known_lesions() -> tuple[np.ndarray, np.ndarray]:
    """Five lesions and a prediction whose matching is worked out by hand (20 x 20 x 12 voxels):

    * A, 4 x 4 x 4 = 64 voxels, half of it predicted (32): Dice 2 * 32 / (32 + 64) = 2/3;
    * B and C, 3 x 3 x 3 = 27 voxels each, one voxel apart, predicted by one component that covers both and the
      9 voxels between them: each scored against its own 27 and the 9, Dice 2 * 27 / (36 + 27) = 6/7;
    * D, 4 x 2 x 2 = 16 voxels, split between two components, of 4 voxels (inside D) and 8 (4 inside, 4 beside it):
      Dice 2 * 8 / (12 + 16) = 4/7;
    * E, 8 voxels, missed; and one stray predicted component: a false positive.
    """
    reference, prediction = np.zeros((20, 20, 12), bool), np.zeros((20, 20, 12), bool)
    reference[1:5, 1:5, 1:5] = True  # A
    prediction[1:5, 1:5, 1:3] = True
    reference[10:13, 10:13, 1:4] = reference[10:13, 14:17, 1:4] = True  # B, C
    prediction[10:13, 10:17, 1:4] = True
    reference[1:5, 15:17, 8:10] = True  # D
    prediction[1, 15:17, 8:10] = prediction[4:6, 15:17, 8:10] = True
    reference[15:17, 1:3, 8:10] = True  # E
    prediction[17:19, 17:19, 5:7] = True  # stray
    return prediction, reference


def test_each_found_lesion_is_scored_against_the_components_that_overlap_it() -> None:
    prediction, reference = known_lesions()
    detection = detect_lesions(prediction, reference)
    assert counts(detection) == (5, 4, 1)
    assert sorted(detection.lesion_dice) == pytest.approx(sorted([2 / 3, 6 / 7, 6 / 7, 4 / 7]))
    assert detection.sensitivity == pytest.approx(4 / 5)
    assert detection.mean_lesion_dice == pytest.approx((2 / 3 + 6 / 7 + 6 / 7 + 4 / 7) / 4)
    assert detection.columns() == pytest.approx({"lesions": 5, "lesions_found": 4, "lesion_sensitivity": 4 / 5,
                                                 "lesion_false_positives": 1,
                                                 "lesion_dice": detection.mean_lesion_dice})


def test_undefined_where_the_case_lacks_what_a_measure_counts() -> None:
    """Metrics Reloaded: no sensitivity without a reference lesion, no Dice per lesion without a found one; false
    positives count in an empty case as in any other."""
    empty = np.zeros((8, 8, 8), bool)
    stray = empty.copy()
    stray[2:4, 2:4, 2:4] = True
    for detection, false_positives in ((detect_lesions(empty, empty), 0), (detect_lesions(stray, empty), 1)):
        columns = detection.columns()
        assert math.isnan(columns["lesion_sensitivity"]) and math.isnan(columns["lesion_dice"])
        assert columns["lesion_false_positives"] == false_positives and columns["lesions"] == 0
    missed = detect_lesions(empty, stray).columns()
    assert missed["lesion_sensitivity"] == 0.0 and math.isnan(missed["lesion_dice"])


def test_score_masks_records_the_detection_of_every_output() -> None:
    prediction, reference = known_lesions()
    labels = LabelSpec.plain({0: "background", 1: "lesion", 2: "absent"})
    rows = score_masks("case", np.stack([prediction, np.zeros_like(prediction)]), reference.astype(np.int64),
                       (1.0, 1.0, 1.0), labels, 1.0)
    assert set(rows[0]) == set(CSV_COLUMNS)
    assert {k: rows[0][k] for k in LESION_COLUMNS} == detect_lesions(prediction, reference).columns()
    assert rows[1]["lesions"] == 0 and rows[1]["lesion_false_positives"] == 0 and rows[1]["flags"] == "both_empty"


def test_summary_pools_the_cases() -> None:
    """Two cases: 3 lesions, 2 found (Dice 0.5 and 1.0), 1 false positive; 1 lesion, found (Dice 0.25); and a case
    without lesions and with 2 false positives. Pooled: 3 of 4 found, 1 false positive a case, Dice per found lesion
    (0.5 + 1.0 + 0.25) / 3."""
    rows = [Detection(3, 2, 1, (0.5, 1.0)).columns(), Detection(1, 1, 0, (0.25,)).columns(),
            Detection(0, 0, 2).columns()]
    assert detection_summary(rows) == pytest.approx({"lesions": 4, "found": 3, "sensitivity": 0.75,
                                                     "false_positives_per_case": 1.0, "dice_per_lesion": 1.75 / 3})
    alone = detection_summary([Detection(0, 0, 1).columns()])
    assert math.isnan(alone["sensitivity"]) and math.isnan(alone["dice_per_lesion"]), "no lesion: undefined"


def test_an_empty_case_cannot_pass_for_a_found_lesion(tmp_path: Path) -> None:
    """Case a holds a lesion the prediction half covers; case b holds none and none is predicted. The Dice mean leaves
    b out (counted as both_empty), as nnU-Net's nanmean does; detection finds 1 of 1 lesions, no false positive."""
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
    assert scored["summary"]["classes"]["lesion"]["dice"] == pytest.approx(dice_a)
    assert scored["summary"]["classes"]["lesion"]["both_empty"] == 1
    assert scored["dice_empty_left_out"]["lesion"] == pytest.approx(dice_a)
    assert scored["detection"]["lesion"] == pytest.approx({"lesions": 1, "found": 1, "sensitivity": 1.0,
                                                           "false_positives_per_case": 0.0, "dice_per_lesion": dice_a})
