"""Segmentation metrics: empty-mask conventions, and Dice/HD95/NSD/volumes against hand-computed examples and, on
random masks, against the scipy references of ``tests/helpers/references.py`` (independent of MONAI)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import ndimage

from medseg.scoring.metrics import (
    BOTH_EMPTY,
    PRED_EMPTY,
    REF_EMPTY,
    ClassMetrics,
    aggregate,
    class_metrics,
    defined_mean,
    dice,
    hd95,
    surface_dice,
    undefined_when_empty,
    volume_ml,
    voxel_spacing,
)
from medseg.scoring.per_case import score_case
from tests.helpers.references import reference_dice, reference_hd95, reference_nsd

SPACING = (0.5, 0.5, 2.0)
"""Anisotropic voxel size in mm (0.5 mm³ per voxel)."""


def _voxels(shape, *points) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    for p in points:
        mask[p] = True
    return mask


@pytest.mark.parametrize(
    ("pred_full", "ref_full", "flag", "expected_dice", "expected_nsd", "expected_hd"),
    [(False, False, BOTH_EMPTY, math.nan, math.nan, math.nan), (True, False, REF_EMPTY, 0.0, 0.0, math.inf),
     (False, True, PRED_EMPTY, 0.0, 0.0, math.inf)],
)
def test_empty_mask_conventions(pred_full, ref_full, flag, expected_dice, expected_nsd, expected_hd) -> None:
    shape = (6, 5, 4)
    block = np.zeros(shape, dtype=bool)
    block[1:4, 1:4, 1:3] = True
    pred = block if pred_full else np.zeros(shape, dtype=bool)
    ref = block if ref_full else np.zeros(shape, dtype=bool)
    metrics = class_metrics(pred, ref, SPACING, tolerance_mm=1.0)
    assert metrics.flag == flag
    assert metrics.dice == pytest.approx(expected_dice, nan_ok=True)
    assert metrics.nsd == pytest.approx(expected_nsd, nan_ok=True)
    if math.isnan(expected_hd):
        assert math.isnan(metrics.hd95_mm)
    else:
        assert metrics.hd95_mm == expected_hd
    assert metrics.pred_ml == pytest.approx(volume_ml(pred, SPACING))
    assert metrics.ref_ml == pytest.approx(volume_ml(ref, SPACING))


def test_dice_and_volume_by_hand() -> None:
    pred = _voxels((4, 4, 4), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0))
    ref = _voxels((4, 4, 4), (0, 0, 0), (0, 0, 1), (0, 1, 0), (3, 3, 3), (3, 3, 2), (3, 2, 3))
    assert dice(pred, ref) == pytest.approx(2 * 3 / (4 + 6))
    # 6 voxels of 0.5 x 0.5 x 2.0 = 0.5 mm³ each: 3 mm³ = 0.003 mL
    assert volume_ml(ref, SPACING) == pytest.approx(0.003)
    assert dice(ref, ref) == 1.0


def test_hd95_uses_anisotropic_spacing_per_axis() -> None:
    shape = (8, 8, 8)
    ref = _voxels(shape, (1, 1, 1))
    # 3 voxels apart along axis 0 (0.5 mm) -> 1.5 mm; 1 voxel along axis 2 (2 mm) -> 2 mm
    assert hd95(_voxels(shape, (4, 1, 1)), ref, SPACING) == pytest.approx(1.5)
    assert hd95(_voxels(shape, (1, 1, 2)), ref, SPACING) == pytest.approx(2.0)
    # diagonal: sqrt(1.5² + 2²) = 2.5 mm
    assert hd95(_voxels(shape, (4, 1, 2)), ref, SPACING) == pytest.approx(2.5)
    assert hd95(ref, ref, SPACING) == 0.0


def test_hd95_is_the_larger_directed_95th_percentile() -> None:
    shape = (8, 8, 8)
    pred = _voxels(shape, (1, 1, 1))
    ref = _voxels(shape, (1, 1, 1), (1, 1, 3))  # the second reference voxel lies 2 x 2 mm = 4 mm away
    # pred -> ref: [0]; ref -> pred: [0, 4]; linear 95th percentile of [0, 4] is 3.8
    assert hd95(pred, ref, SPACING) == pytest.approx(3.8)
    assert hd95(ref, pred, SPACING) == pytest.approx(3.8)


@pytest.mark.slow
def test_hd95_of_more_surface_voxels_than_torch_quantile_takes() -> None:
    # every other row of a 5800 x 5800 slice: 16.8 M surface voxels a mask, each 0.5 mm from the other's rows; more
    # distances than torch.quantile accepts (2^24), which MONAI's compute_hausdorff_distance would have raised on
    pred = np.zeros((5800, 5800), bool)
    pred[::2] = True
    ref = np.roll(pred, 1, axis=0)
    assert pred.sum() > 2**24
    assert hd95(pred, ref, (0.5, 0.8)) == pytest.approx(0.5)


def test_surface_dice_by_hand() -> None:
    shape = (8, 8, 8)
    pred = _voxels(shape, (1, 1, 1))
    ref = _voxels(shape, (1, 1, 1), (1, 1, 3))
    # surfaces: pred {a}, ref {a, b}; within 1 mm: a->a, a->a; b is 4 mm away -> 2 of 3 surface voxels
    assert surface_dice(pred, ref, SPACING, tolerance_mm=1.0) == pytest.approx(2 / 3)
    assert surface_dice(pred, ref, SPACING, tolerance_mm=4.0) == pytest.approx(1.0)
    far = _voxels(shape, (4, 1, 1))  # 1.5 mm from ref's first voxel
    assert surface_dice(far, _voxels(shape, (1, 1, 1)), SPACING, tolerance_mm=1.0) == 0.0
    assert surface_dice(far, _voxels(shape, (1, 1, 1)), SPACING, tolerance_mm=1.5) == 1.0


def test_metrics_match_scipy_reference_on_random_blobs() -> None:
    rng = np.random.default_rng(0)
    for _ in range(3):
        ref = ndimage.binary_dilation(rng.random((20, 18, 10)) > 0.97, iterations=2)
        pred = ndimage.binary_dilation(ref, iterations=1) & (rng.random(ref.shape) > 0.1)
        spacing = (0.7, 0.9, 2.5)
        metrics = class_metrics(pred, ref, spacing, tolerance_mm=1.0)
        assert metrics.dice == pytest.approx(reference_dice(pred, ref))
        assert metrics.hd95_mm == pytest.approx(reference_hd95(pred, ref, spacing), rel=1e-5)
        assert metrics.nsd == pytest.approx(reference_nsd(pred, ref, spacing, 1.0), rel=1e-6)
        assert metrics.pred_ml == pytest.approx(pred.sum() * 0.7 * 0.9 * 2.5 / 1000)


def test_score_case_per_class_of_label_maps() -> None:
    ref = np.zeros((6, 6, 4), dtype=np.uint8)
    ref[1:3, 1:3, 1:3] = 1
    pred = ref.copy()
    pred[4, 4, 1] = 2  # class 2 only in the prediction
    labels = {0: "background", 1: "a", 2: "b", 3: "c"}
    rows = score_case("case", pred, ref, spacing=(1.0, 1.0, 1.0), labels=labels, tolerance_mm=1.0)
    scores = {row["class_index"]: row for row in rows}
    assert scores[1]["dice"] == 1.0 and scores[1]["hd95_mm"] == 0.0 and scores[1]["flags"] == ""
    assert scores[2]["flags"] == REF_EMPTY and scores[2]["dice"] == 0.0
    assert scores[2]["pred_ml"] == pytest.approx(0.001)
    assert scores[3]["flags"] == BOTH_EMPTY and math.isnan(scores[3]["dice"]), "absent from both: undefined"


def test_voxel_spacing_of_lps_affine() -> None:
    affine = np.diag([-0.8, -0.8, 2.0, 1.0])
    affine[:3, 3] = (10.0, -5.0, 3.0)
    assert voxel_spacing(affine) == pytest.approx((0.8, 0.8, 2.0))


def test_aggregate_excludes_non_finite_hd95_and_counts_them() -> None:
    rows = {
        "a": [ClassMetrics(1.0, 2.0, 0.9, 1.0, 1.0), ClassMetrics(0.0, math.inf, 0.0, 0.0, 1.0, PRED_EMPTY),
              ClassMetrics(1.0, math.nan, 1.0, 0.0, 0.0, BOTH_EMPTY)],
        "b": [ClassMetrics(0.5, 4.0, 0.5, 1.0, 2.0)] * 3,
    }
    summary = aggregate(rows)
    a, b = summary["classes"]["a"], summary["classes"]["b"]
    assert a["dice"] == pytest.approx(2 / 3) and a["hd95_mm"] == 2.0 and a["hd95_excluded"] == 2
    assert a["nsd"] == pytest.approx(1.9 / 3) and a["num_cases"] == 3
    assert b["hd95_mm"] == 4.0 and b["hd95_excluded"] == 0
    assert summary["foreground_mean"]["dice"] == pytest.approx((2 / 3 + 0.5) / 2)
    assert summary["foreground_mean"]["hd95_mm"] == pytest.approx(3.0)


def test_metrics_reloaded_leaves_a_case_without_the_class_undefined() -> None:
    """Where label and prediction both lack the class, Dice and NSD are undefined (not 1); other flags and other
    measures keep their values; means skip the undefined, not the infinite."""
    values = {"dice": 1.0, "nsd": 1.0, "hd95_mm": math.nan, "lesion_false_positives": 0.0}
    empty = undefined_when_empty(values, BOTH_EMPTY)
    assert math.isnan(empty["dice"]) and math.isnan(empty["nsd"]) and empty["lesion_false_positives"] == 0.0
    assert undefined_when_empty({"dice": 0.0, "nsd": 0.0}, REF_EMPTY) == {"dice": 0.0, "nsd": 0.0}
    assert defined_mean([1.0, math.nan, 0.5]) == 0.75 and math.isnan(defined_mean([math.nan]))
    assert defined_mean([1.0, math.inf]) == math.inf


def test_a_class_absent_from_reference_and_prediction_is_left_out_of_every_mean() -> None:
    """One rule (nnU-Net v2's NaN and nanmean, Metrics Reloaded's): the mean is over the cases that hold the class in
    reference or prediction, and counts the case it left out; never an absent class scored as a perfect 1."""
    block = np.zeros((6, 5, 4), dtype=bool)
    block[1:4, 1:4, 1:3] = True
    empty = np.zeros_like(block)
    half = block.copy()
    half[:2] = False
    per_class = {"tumour": [class_metrics(half, block, SPACING, 1.0), class_metrics(empty, empty, SPACING, 1.0)]}
    summary = aggregate(per_class)["classes"]["tumour"]
    assert summary["dice"] == pytest.approx(dice(half, block)) and summary["both_empty"] == 1
    assert summary["nsd"] == pytest.approx(per_class["tumour"][0].nsd) and summary["num_cases"] == 2
    assert math.isnan(aggregate({"tumour": per_class["tumour"][1:]})["classes"]["tumour"]["dice"])
