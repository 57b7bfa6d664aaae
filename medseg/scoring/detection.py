"""Lesion-wise detection: which connected components of the reference a prediction finds, how well, and what it adds.

Dice per class rewards the voxels of large structures; a small lesion missed, or an empty case scored 1 because
neither map holds the class, hardly moves it. Detection counts lesions instead. A lesion is a connected component of
a class's reference mask (full connectivity: voxels that share a face, an edge or a corner, as
``scipy.ndimage.label`` with a full structuring element), and so is a predicted component of the prediction's mask.

Matching is by overlap:

* a lesion is *found* when at least one predicted voxel of the class lies in it;
* a *false positive* is a predicted component that touches no reference voxel of the class;
* the *Dice of a found lesion* ``L`` is ``2 |P ∩ L| / (|P| + |L|)``, where ``P`` is the union of the predicted
  components that overlap ``L``, without the voxels that belong to other lesions: a component that bridges two
  lesions is shared by both (each is scored against its own part of it and the component's voxels outside every
  lesion), a lesion split into several components is scored against all of them.

The per-case values (:meth:`Detection.columns`) are columns of ``metrics.csv`` (:mod:`medseg.scoring.per_case`);
:func:`detection_summary` pools them over the cases of a class. Where a case lacks what a measure counts, the measure
is undefined (NaN), following Metrics Reloaded, not a perfect score: sensitivity without a reference lesion, Dice per
lesion without a found one. False positives are counted in every case, empty or not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import ndimage

LESION_COLUMNS = ("lesions", "lesions_found", "lesion_sensitivity", "lesion_false_positives", "lesion_dice")
"""The per-case detection columns of ``metrics.csv`` (:meth:`Detection.columns`)."""


@dataclass(frozen=True)
class Detection:
    """Lesion-wise detection of one class in one case."""

    lesions: int
    """Connected components of the reference."""
    found: int
    """Of them, those that at least one predicted voxel lies in."""
    false_positives: int
    """Connected components of the prediction that touch no reference voxel."""
    lesion_dice: tuple[float, ...] = ()
    """The Dice of each found lesion (``found`` values, in the order of the reference's component labels)."""

    @property
    def sensitivity(self) -> float:
        """``found / lesions``; NaN without a reference lesion."""
        return self.found / self.lesions if self.lesions else math.nan

    @property
    def mean_lesion_dice(self) -> float:
        """The mean Dice over the found lesions; NaN when none is found."""
        return math.fsum(self.lesion_dice) / len(self.lesion_dice) if self.lesion_dice else math.nan

    def columns(self) -> dict[str, float | int]:
        """The :data:`LESION_COLUMNS` of a ``metrics.csv`` row."""
        return dict(zip(LESION_COLUMNS, (self.lesions, self.found, self.sensitivity, self.false_positives,
                                         self.mean_lesion_dice)))


def components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Connected components of a boolean mask (any shape), full connectivity: the label map (0 outside) and their
    number."""
    structure = ndimage.generate_binary_structure(mask.ndim, mask.ndim)
    labelled, count = ndimage.label(mask, structure=structure)
    return labelled, int(count)


def detect_lesions(prediction: np.ndarray, reference: np.ndarray) -> Detection:
    """Detection of one class in one case (see the module docstring for the matching).

    Args:
        prediction: boolean mask of the predicted class, any shape (X, Y, Z) or (H, W).
        reference: boolean mask of the class in the reference, the same shape.

    Raises:
        ValueError: the shapes differ.
    """
    if prediction.shape != reference.shape:
        raise ValueError(f"prediction {prediction.shape} and reference {reference.shape} differ in shape")
    prediction, reference = prediction.astype(bool, copy=False), reference.astype(bool, copy=False)
    # one label map (int32 a voxel) held at a time: what the matching needs is read off the predicted voxels
    lesion_labels, lesions = components(reference)
    lesion_at_predicted = lesion_labels[prediction]
    lesion_sizes = np.bincount(lesion_labels[reference], minlength=lesions + 1)
    del lesion_labels
    predicted_labels, predicted = components(prediction)
    component_at_predicted = predicted_labels[prediction]
    del predicted_labels
    # every (lesion, predicted component) pair that shares voxels, with their count; lesion 0: outside every lesion
    pairs, counts = np.unique(lesion_at_predicted.astype(np.int64) * (predicted + 1) + component_at_predicted,
                              return_counts=True)
    lesion_of, component_of = np.divmod(pairs, predicted + 1)
    outside = np.zeros(predicted + 1, np.int64)
    outside[component_of[lesion_of == 0]] = counts[lesion_of == 0]
    inside = lesion_of > 0
    lesion_of, component_of, counts = lesion_of[inside], component_of[inside], counts[inside]
    if not len(counts):
        return Detection(lesions=lesions, found=0, false_positives=predicted)
    found, starts = np.unique(lesion_of, return_index=True)  # pairs come sorted by lesion
    shared = np.add.reduceat(counts, starts)
    matched = shared + np.add.reduceat(outside[component_of], starts)  # |P|: its own voxels and those in no lesion
    sizes = lesion_sizes[found]
    return Detection(lesions=lesions, found=len(found),
                     false_positives=predicted - len(np.unique(component_of)),
                     lesion_dice=tuple(float(d) for d in 2 * shared / (matched + sizes)))


def detection_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | int]:
    """Pooled over the ``metrics.csv`` rows of one class (each with the :data:`LESION_COLUMNS`): ``lesions``,
    ``found``, ``sensitivity`` (found / lesions; NaN without lesions), ``false_positives_per_case`` and
    ``dice_per_lesion`` (the mean Dice over every found lesion; NaN when none is found)."""
    lesions = sum(int(row["lesions"]) for row in rows)
    found = sum(int(row["lesions_found"]) for row in rows)
    dice_sum = math.fsum(int(row["lesions_found"]) * float(row["lesion_dice"]) for row in rows
                         if int(row["lesions_found"]))
    return {"lesions": lesions, "found": found, "sensitivity": found / lesions if lesions else math.nan,
            "false_positives_per_case": (sum(int(row["lesion_false_positives"]) for row in rows) / len(rows)
                                         if rows else math.nan),
            "dice_per_lesion": dice_sum / found if found else math.nan}
