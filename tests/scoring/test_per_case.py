"""Scoring a case output by output: the rows of every class and region (the ignore label's voxels left out) equal
each output's metrics and detection computed on its own, and the memory scoring takes does not grow with the number of
outputs (one output's masks are held at a time)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from medseg.data.labels import LabelSpec, build_regions, msd_labels
from medseg.inference.inferer import Prediction
from medseg.scoring.detection import detect_lesions
from medseg.scoring.metrics import class_metrics
from medseg.scoring.per_case import score_case, score_masks

SPACING = (0.8, 0.8, 1.5)
SHAPE = (24, 20, 16)
IGNORE = 5


def gapped_labels() -> LabelSpec:
    """Values 0, 1, 2, 4 and the ignore label 5 (BraTS-like)."""
    return msd_labels({"0": "background", "1": "edema", "2": "necrosis", "4": "enhancing", "5": "ignore"},
                      Path(__file__))


def brats_regions() -> LabelSpec:
    return build_regions(gapped_labels(), {"whole": [1, 2, 4], "core": [2, 4], "enhancing": [4]}, [1, 2, 4],
                         "data.regions", "data.regions_class_order")


def label_maps(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A reference of nested boxes in the values 1, 2, 4, with ignore voxels, and a prediction of them with 10% of
    the voxels changed to a random value (0, 1, 2, 4)."""
    reference = np.zeros(SHAPE, np.uint8)
    reference[2:20, 2:18, 2:14] = 1
    reference[6:16, 5:15, 4:12] = 2
    reference[9:13, 8:12, 6:10] = 4
    reference[0:4, 15:20, :] = IGNORE
    prediction = np.where(reference == IGNORE, 1, reference).astype(np.uint8)
    changed = rng.random(SHAPE) < 0.1
    prediction[changed] = rng.choice(np.array([0, 1, 2, 4], np.uint8), int(changed.sum()))
    return prediction, reference


def expected_rows(prediction: np.ndarray, reference: np.ndarray, labels: LabelSpec) -> list[dict[str, object]]:
    """Each output on its own: its values in the prediction, ignore voxels removed, against its values in the
    reference, through the metrics and the detection."""
    kept = reference != IGNORE
    rows = []
    for (index, name), values in zip(labels.outputs.items(), labels.output_values):
        pred, ref = np.isin(prediction, values) & kept, np.isin(reference, values)
        metrics = class_metrics(pred, ref, SPACING, 1.0).as_dict()
        flags = metrics.pop("flag")
        rows.append({"case": "c", "class_index": index, "class_name": name, **metrics,
                     **detect_lesions(pred, ref).columns(), "flags": flags})
    return rows


@pytest.mark.parametrize("labels", [gapped_labels(), brats_regions()], ids=["classes", "regions"])
def test_each_output_is_scored_as_on_its_own(labels: LabelSpec) -> None:
    prediction, reference = label_maps(np.random.default_rng(0))
    expected = expected_rows(prediction, reference, labels)
    assert len(expected) == 3 and all(row["flags"] == "" for row in expected), "every output present"
    assert score_case("c", prediction, reference, SPACING, labels, 1.0) == expected
    assert score_masks("c", labels.output_masks(labels.prediction_outputs(one_hot(prediction, labels))), reference,
                       SPACING, labels, 1.0) == expected, "the masks as one array"


def one_hot(prediction: np.ndarray, labels: LabelSpec) -> np.ndarray:
    """``(C, *spatial)`` probabilities that decide ``prediction``: one-hot classes, or each region's membership."""
    members = labels.output_values if labels.region_based else [[v] for v in labels.label_values]
    return np.stack([np.isin(prediction, values) for values in members]).astype(np.float32)


def test_a_predictions_masks_one_at_a_time_are_its_masks() -> None:
    prediction, _ = label_maps(np.random.default_rng(1))
    for labels in (gapped_labels(), brats_regions()):
        predicted = Prediction(labels.prediction_outputs(one_hot(prediction, labels)), np.eye(4), labels)
        assert predicted.shape == SHAPE
        masks = list(predicted.each_mask())
        assert len(masks) == 3 and np.array_equal(np.stack(masks), predicted.masks())


def traced_peak(score: Callable[[], object]) -> int:
    """The peak bytes numpy and Python allocate while ``score`` runs (``tracemalloc``: counted, not timed)."""
    tracemalloc.start()
    try:
        score()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("from_prediction", [False, True], ids=["label_map", "prediction"])
def test_scoring_memory_does_not_grow_with_the_outputs(from_prediction: bool) -> None:
    """The same case scored with 4 and with 40 classes (36 of them absent from both maps): the peak stays that of one
    output's pair, where all the masks at once take 40 boolean volumes for each side (10x those of 4 classes)."""
    shape = (64, 64, 32)
    reference = np.zeros(shape, np.uint8)
    reference[10:50, 10:50, 4:28] = 1
    reference[20:40, 20:40, 8:24] = 2
    reference[25:35, 25:35, 12:20] = 3
    prediction = np.roll(reference, 2, axis=0)
    peaks = []
    for classes in (4, 40):
        labels = LabelSpec.plain({k: f"class {k}" for k in range(classes)})
        masks = Prediction(prediction, np.eye(4), labels).each_mask() if from_prediction else None
        peaks.append(traced_peak(partial(score_masks, "c", masks, reference, SPACING, labels, 1.0) if from_prediction
                                 else partial(score_case, "c", prediction, reference, SPACING, labels, 1.0)))
    assert peaks[1] < 1.5 * peaks[0], f"peak of 40 classes {peaks[1]} B against {peaks[0]} B of 4"
