"""Postprocessing: the two steps on the output masks of hand-made label maps, the decision rule on out-of-fold cases
built so that each step helps or hurts, the HD95 guard, reading postprocessing.json, and finding the one decided for
an ensemble."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from medseg.errors import ConfigError
from medseg.postprocessing.components import (
    ClassStep,
    OutOfFoldCase,
    Postprocessing,
    _better,
    apply_step,
    decide,
    find_decision,
    from_setting,
    load,
)
from medseg.scoring.metrics import hd95

SPACING = (0.5, 0.8, 2.0)
VOXEL_MM3 = 0.5 * 0.8 * 2.0


def blocks(shape: tuple[int, int, int], *parts: tuple[int, tuple[slice, ...]]) -> np.ndarray:
    """A uint8 label map with each ``(class, region)`` painted in order."""
    labels = np.zeros(shape, np.uint8)
    for index, region in parts:
        labels[region] = index
    return labels


def masks_of(labels: np.ndarray, classes: tuple[int, ...] = (1, 2)) -> np.ndarray:
    """The (R, X, Y, Z) output masks of a label map: one per class of ``classes``."""
    return np.stack([labels == c for c in classes])


def test_largest_component_and_small_components() -> None:
    big, touching, speck = np.s_[1:5, 1:5, 1:5], np.s_[5, 5, 5], np.s_[10:12, 10:12, 8]
    labels = blocks((20, 20, 10), (1, big), (1, touching), (1, speck), (2, np.s_[14:17, 14:17, 2:5]),
                    (2, np.s_[18, 2, 2]))
    masks, expected = masks_of(labels), labels.copy()
    original, one = masks.copy(), masks[0]
    expected[speck] = 0  # the corner-touching voxel belongs to the big block (full connectivity)
    largest = apply_step(one, ClassStep("largest_component"), SPACING)
    np.testing.assert_array_equal(largest, expected == 1)
    np.testing.assert_array_equal(masks, original)  # the input is left as it was
    assert largest.dtype == bool
    speck_mm3 = 4 * VOXEL_MM3
    np.testing.assert_array_equal(apply_step(one, ClassStep("remove_small", speck_mm3 + 0.1), SPACING), expected == 1)
    np.testing.assert_array_equal(apply_step(one, ClassStep("remove_small", speck_mm3 - 0.1), SPACING), one)
    both = Postprocessing({1: ClassStep("largest_component"), 2: ClassStep("remove_small", 2 * VOXEL_MM3)})
    expected[18, 2, 2] = 0
    np.testing.assert_array_equal(both.apply(masks, SPACING), masks_of(expected))
    np.testing.assert_array_equal(masks, original)
    kept = labels.copy()
    np.testing.assert_array_equal(both.apply_to_classes(labels, SPACING), expected)  # the class map at once
    np.testing.assert_array_equal(labels, kept)
    assert "class 2: remove_small < 1.6 mm³" in both.describe() and Postprocessing().describe() == "none"


def dice_of(pred: np.ndarray, ref: np.ndarray) -> float:
    total = pred.sum() + ref.sum()
    return 1.0 if total == 0 else float(2 * (pred & ref).sum() / total)


def test_decide_takes_the_step_that_helps_each_class() -> None:
    """Class 1 has two real components in every reference, and the predictions add a speck smaller than either:
    only removing small components helps. Class 2 is one real component, and the predictions add a large false
    one: only keeping the largest component helps. Class 3 is in no case: nothing to do, and no volume threshold."""
    shape, labels = (24, 24, 12), {0: "background", 1: "one", 2: "two", 3: "three"}
    cases, expected = [], {"one": [], "two": []}
    for shift in range(3):
        one_a, one_b, two = np.s_[1 + shift:5 + shift, 1:5, 1:5], np.s_[10:12, 1:3, 1:3], np.s_[12:18, 12:18, 4:8]
        speck, false_two = np.s_[20, 2 + shift, 10], np.s_[1:4, 18:21, 8:11]
        reference = blocks(shape, (1, one_a), (1, one_b), (2, two))
        prediction = blocks(shape, (1, one_a), (1, one_b), (1, speck), (2, two), (2, false_two))
        prediction[12, 12, 4 + shift] = 0  # not perfect anywhere
        scores = {c: (dice_of(prediction == c, reference == c), hd95(prediction == c, reference == c, SPACING))
                  for c in (1, 2, 3)}
        cases.append(OutOfFoldCase(f"case{shift}", masks_of(prediction, (1, 2, 3)), masks_of(reference, (1, 2, 3)),
                                   SPACING, scores))
        no_speck, only_true = prediction == 1, prediction == 2
        no_speck[speck], only_true[false_two] = False, False
        expected["one"].append(dice_of(no_speck, reference == 1))
        expected["two"].append(dice_of(only_true, reference == 2))
    decision = decide(cases, labels)
    one, two, three = (decision["classes"][name] for name in ("one", "two", "three"))
    assert (one["step"], two["step"], three["step"]) == ("remove_small", "largest_component", "none")
    assert one["min_volume_mm3"] == pytest.approx(8 * VOXEL_MM3 / 2)  # half the 2x2x2 component
    assert "remove_small" not in three["candidates"] and three["min_volume_mm3"] is None
    # the candidates' scores are those of the postprocessed maps, computed here independently
    assert one["candidates"]["none"]["dice"] == pytest.approx(np.mean([c.scores[1][0] for c in cases]))
    assert one["candidates"]["remove_small"]["dice"] == pytest.approx(np.mean(expected["one"]))
    assert two["candidates"]["largest_component"]["dice"] == pytest.approx(np.mean(expected["two"]))
    assert one["candidates"]["largest_component"]["dice"] < one["candidates"]["none"]["dice"]


@pytest.mark.parametrize(("after", "taken"), [
    ({"dice": 0.81, "hd95_mm": 2.0, "hd95_excluded": 0}, True),
    ({"dice": 0.81, "hd95_mm": 3.1, "hd95_excluded": 0}, False),  # Dice up, HD95 worse
    ({"dice": 0.81, "hd95_mm": 1.0, "hd95_excluded": 1}, False),  # a case lost its finite HD95
    ({"dice": 0.80, "hd95_mm": 1.0, "hd95_excluded": 0}, False),  # Dice not raised
])
def test_a_step_must_raise_dice_without_worsening_hd95(after: dict, taken: bool) -> None:
    assert _better(after, {"dice": 0.80, "hd95_mm": 3.0, "hd95_excluded": 0}) is taken
    nan = {"dice": 0.8, "hd95_mm": math.nan, "hd95_excluded": 2}
    assert _better({**nan, "dice": 0.9}, nan), "no finite HD95 before and after: Dice decides"


def write_decision(path: Path, classes: dict, checkpoints: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rule": "test", "classes": classes, "checkpoints": checkpoints}))
    return path


LABELS = {0: "background", 1: "one", 2: "two"}
CLASSES = {"one": {"index": 1, "step": "largest_component", "min_volume_mm3": None},
           "two": {"index": 2, "step": "remove_small", "min_volume_mm3": 5.0}}


def test_load_a_decision(tmp_path: Path) -> None:
    path = write_decision(tmp_path / "pp.json", CLASSES, [])
    steps = load(path, LABELS)
    assert steps.classes == {1: ClassStep("largest_component"), 2: ClassStep("remove_small", 5.0)}
    assert from_setting(str(path), [], LABELS).classes == steps.classes
    assert from_setting("none", [], LABELS) is None
    assert from_setting("auto", [tmp_path / "a.pt"], LABELS) is None, "no cross-validation of this checkpoint"
    with pytest.raises(ConfigError, match="is for the classes .*'one'.* the checkpoint has .*'liver'"):
        load(path, {0: "background", 1: "liver", 2: "two"})
    with pytest.raises(ConfigError, match="file not found"):
        load(tmp_path / "absent.json", LABELS)
    with pytest.raises(ConfigError, match="unknown step 'erode'"):
        load(write_decision(tmp_path / "bad.json", {"one": {"index": 1, "step": "erode"}, "two": CLASSES["two"]}, []),
             LABELS)


def test_auto_finds_the_decision_made_for_exactly_these_checkpoints(tmp_path: Path) -> None:
    sweep = tmp_path / "multirun"
    folds = [sweep / str(k) / "checkpoints" / "best.pt" for k in range(3)]
    listed = [f"{k}/checkpoints/best.pt" for k in range(3)]
    single = write_decision(sweep / "crossval" / "postprocessing.json", CLASSES, listed)
    assert find_decision(folds) == single
    assert find_decision(folds[:2]) is None and find_decision(folds[:1]) is None
    wider = tmp_path / "wide"
    gamma = write_decision(wider / "crossval" / "model.attention.gamma=0.8" / "postprocessing.json", CLASSES,
                           ["0/checkpoints/best.pt", "1/checkpoints/best.pt"])
    write_decision(wider / "crossval" / "model.attention.gamma=0.9" / "postprocessing.json", CLASSES,
                   ["2/checkpoints/best.pt", "3/checkpoints/best.pt"])
    assert find_decision([wider / "1/checkpoints/best.pt", wider / "0/checkpoints/best.pt"]) == gamma
    assert find_decision([wider / "0/checkpoints/best.pt", sweep / "1/checkpoints/best.pt"]) is None
