"""Lesion-wise detection: which connected components of the reference a prediction finds, and what it adds.

Dice per class rewards the voxels of large structures; a small lesion missed, or an empty case scored 1 because
neither map holds the class, hardly moves it. Detection counts lesions instead. A lesion is a connected component of
a class's reference mask (full connectivity: voxels that share a face, an edge or a corner, as
``scipy.ndimage.label`` with a full structuring element); it is *found* when at least one predicted voxel of the class
lies in it. A *false positive* is a connected component of the prediction that touches no reference voxel of the class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import ndimage


@dataclass(frozen=True)
class Detection:
    """Lesion counts of one case and class (or summed over cases)."""

    lesions: int
    """Connected components of the reference."""
    found: int
    """Of them, those that at least one predicted voxel lies in."""
    false_positives: int
    """Connected components of the prediction that touch no reference voxel."""

    def __add__(self, other: Detection) -> Detection:
        return Detection(self.lesions + other.lesions, self.found + other.found,
                         self.false_positives + other.false_positives)


def components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Connected components of a boolean mask (any shape), full connectivity: the label map (0 outside) and their
    number."""
    structure = ndimage.generate_binary_structure(mask.ndim, mask.ndim)
    labelled, count = ndimage.label(mask, structure=structure)
    return labelled, int(count)


def detect_lesions(prediction: np.ndarray, reference: np.ndarray) -> Detection:
    """Detection of one class in one case: ``prediction`` and ``reference`` are boolean masks of the same shape."""
    if prediction.shape != reference.shape:
        raise ValueError(f"prediction {prediction.shape} and reference {reference.shape} differ in shape")
    reference_components, lesions = components(reference)
    found = np.unique(reference_components[prediction & reference])
    predicted_components, predicted = components(prediction)
    touching = np.unique(predicted_components[prediction & reference])
    return Detection(lesions=lesions, found=int(np.count_nonzero(found)),
                     false_positives=predicted - int(np.count_nonzero(touching)))


def detection_summary(per_case: Sequence[Detection]) -> dict[str, float | int]:
    """Over the cases of one class: lesions, found, ``sensitivity`` (found / lesions; NaN without lesions) and
    ``false_positives_per_case``."""
    total = sum(per_case, Detection(0, 0, 0))
    return {"lesions": total.lesions, "found": total.found,
            "sensitivity": total.found / total.lesions if total.lesions else math.nan,
            "false_positives_per_case": total.false_positives / len(per_case) if per_case else math.nan}
