"""Connected-component postprocessing of predictions, decided per output (foreground class or region) on the
out-of-fold predictions.

A prediction is one boolean mask per output (:meth:`medseg.data.labels.LabelSpec.prediction_masks`), and each
output's mask is postprocessed on its own: a region's (nnU-Net's region-based training) as much as a class's. Two
steps, both MONAI's (with full connectivity: voxels touching by a face, an edge or a corner are connected); the voxels
they remove leave the output's mask (a class's become background in the label map):

- ``largest_component``: keep only the largest connected component of the class (``KeepLargestConnectedComponent``);
- ``remove_small``: remove the class's components smaller than ``min_volume_mm3`` (``RemoveSmallObjects``).

:func:`decide` chooses them as nnU-Net does, on the out-of-fold predictions of a cross-validation, with HD95 as a
guard: for each class, a step is a candidate when it raises the class's mean Dice (over the cases where it is
defined: :mod:`medseg.scoring.metrics`' rule) and does not
worsen its HD95 (no more cases without a finite HD95, and a mean over the finite ones that does not grow); of the
two candidates, the one with the higher mean Dice is taken, else none. The volume below which ``remove_small``
removes components is read from the references: half the smallest connected component of the class in any
reference label of the cross-validation, so no component as large as a real one is ever removed.

``scripts/crossval.py`` stores the decision as ``postprocessing.json`` with the checkpoints it was decided for;
:func:`load` reads it back as a :class:`Postprocessing`, which ``scripts/evaluate.py ... postprocessing=auto|none|
<file>`` applies (``auto``: :func:`find_decision`).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from monai.transforms import KeepLargestConnectedComponent, RemoveSmallObjects

from medseg.errors import ConfigError
from medseg.runs.layout import crossval_dir
from medseg.scoring.detection import components
from medseg.scoring.metrics import defined_mean, dice, hd95

POSTPROCESSING_FILE = "postprocessing.json"
STEPS = ("none", "largest_component", "remove_small")
"""The choices per class: nothing, only the largest component, no components below the volume threshold."""
RULE = ("per class, a step is taken when it raises the class's mean Dice over the out-of-fold cases and does not "
        "worsen its HD95 (no more cases without a finite HD95, a finite mean that does not grow); the better of "
        "largest_component and remove_small wins; remove_small removes components below half the smallest "
        "connected component of the class in any reference label")


@dataclass(frozen=True)
class ClassStep:
    """What the postprocessing does to one foreground class."""

    step: str = "none"
    """One of :data:`STEPS`."""
    min_volume_mm3: float | None = None
    """``remove_small``: components below this volume (mm³) are removed."""


@dataclass
class Postprocessing:
    """Per-output steps, applied to output masks in their own voxel spacing."""

    classes: dict[int, ClassStep] = field(default_factory=dict)
    """Output number (from 1: class index, or region position) -> its step (outputs absent: nothing)."""
    source: str = ""
    """The ``postprocessing.json`` it was read from, for the log."""

    def apply(self, masks: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
        """``masks`` (R, X, Y, Z) bool, output ``i``'s at ``i - 1``, with every output's step applied (a new array);
        ``spacing``: voxel size in mm per axis."""
        out = masks.copy()
        for index, step in self.classes.items():
            out[index - 1] = apply_step(masks[index - 1], step, spacing)
        return out

    def apply_to_classes(self, classes: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
        """``classes`` (X, Y, Z), each voxel's class index (the masks of exclusive classes at once), with every
        class's step applied (a new array): the voxels a step removes become background (0)."""
        out = classes.copy()
        for index, step in self.classes.items():
            mask = classes == index
            out[mask & ~apply_step(mask, step, spacing)] = 0
        return out

    def describe(self) -> str:
        """``"class 1: largest_component, class 2: remove_small < 12.5 mm³"``, or ``"none"``."""
        parts = [f"class {index}: {step.step}" + (f" < {step.min_volume_mm3:.4g} mm³" if step.min_volume_mm3 else "")
                 for index, step in self.classes.items() if step.step != "none"]
        return ", ".join(parts) or "none"


def apply_step(mask: np.ndarray, step: ClassStep, spacing: Sequence[float]) -> np.ndarray:
    """``mask`` (X, Y, Z, bool) after ``step``: a new array, or ``mask`` itself when nothing runs."""
    if step.step == "largest_component":
        keep = KeepLargestConnectedComponent(applied_labels=[1], is_onehot=False, connectivity=mask.ndim)
        return np.asarray(keep(mask[None].astype(np.uint8)))[0] > 0
    if step.step == "remove_small":
        # scikit-image removes components of fewer voxels than this count (of at most this many from 0.26 on):
        # half a voxel below the first whole count that reaches the volume means "smaller than the volume" in both
        voxels = math.ceil(step.min_volume_mm3 / float(np.prod(spacing))) - 0.5
        remove = RemoveSmallObjects(min_size=voxels, connectivity=mask.ndim)  # type: ignore[arg-type]
        with warnings.catch_warnings():  # scikit-image 0.26 deprecates the argument MONAI 1.6 passes
            warnings.simplefilter("ignore", FutureWarning)
            return np.asarray(remove(mask[None]))[0].astype(bool, copy=False)
    return mask


def component_volumes(mask: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
    """The volume (mm³) of each connected component of a binary mask (full connectivity), in no order."""
    labelled, count = components(mask)
    return np.bincount(labelled.ravel(), minlength=count + 1)[1:] * float(np.prod(spacing))


@dataclass
class OutOfFoldCase:
    """One out-of-fold case: its prediction, its reference and the scores of the prediction as it is."""

    case: str
    prediction: np.ndarray
    """(R, X, Y, Z) bool predicted mask of each output, in the reference's grid."""
    reference: np.ndarray
    """(R, X, Y, Z) bool reference mask of each output (a region's: the union of its labels)."""
    spacing: tuple[float, ...]
    """Voxel size in mm per axis."""
    scores: Mapping[int, tuple[float, float]]
    """Output number -> (Dice, HD95 mm) of ``prediction`` as it is (metrics.csv's values)."""
    valid: np.ndarray | None = None
    """(X, Y, Z) bool, the voxels that are scored (the ignore label's are not); None: all."""


def _step_scores(cases: Iterable[OutOfFoldCase], steps: Mapping[int, Mapping[str, ClassStep]],
                 metric: str) -> dict[int, dict[str, list[float]]]:
    """``metric`` (``dice`` or ``hd95_mm``) of each step's result, per class and case, in one pass over ``cases``;
    where a step changes nothing, the score of the prediction as it is."""
    column = 0 if metric == "dice" else 1
    out: dict[int, dict[str, list[float]]] = {index: {name: [] for name in named} for index, named in steps.items()}
    for case in cases:
        for index, named in steps.items():
            reference, prediction = case.reference[index - 1], case.prediction[index - 1]
            for name, step in named.items():
                mask = apply_step(prediction, step, case.spacing)
                if mask is prediction or np.array_equal(mask, prediction):
                    value = case.scores[index][column]
                else:
                    mask = mask if case.valid is None else mask & case.valid
                    value = dice(mask, reference) if column == 0 else hd95(mask, reference, case.spacing)
                out[index][name].append(value)
    return out


def _hd95_summary(values: Sequence[float]) -> dict[str, Any]:
    """Mean HD95 over the finite values (NaN if none) and how many were not finite, as evaluation's means."""
    finite = [v for v in values if math.isfinite(v)]
    return {"hd95_mm": float(np.mean(finite)) if finite else math.nan, "hd95_excluded": len(values) - len(finite)}


def _better(after: Mapping[str, float], before: Mapping[str, float]) -> bool:
    """The step raises mean Dice and does not worsen HD95 (NaN, no finite HD95 at all, never counts as worse)."""
    return (after["dice"] > before["dice"] and after["hd95_excluded"] <= before["hd95_excluded"]
            and not after["hd95_mm"] > before["hd95_mm"])


def decide(cases: Iterable[OutOfFoldCase], labels: Mapping[int, str]) -> dict[str, Any]:
    """Decide the postprocessing of each output of ``labels`` (output number from 1 -> name; a mapping that includes
    0, background, is taken without it) on out-of-fold cases.

    ``cases`` is iterated up to three times (the references, for the volume threshold; the Dice of every step;
    the HD95 of the steps that raise the mean Dice, the only ones that need it): pass a re-iterable collection, or
    one that reads the cases from disk on each iteration.

    Returns:
        ``{"rule": ..., "classes": {name: {"index", "step", "min_volume_mm3", "candidates": {step: {"dice",
        "hd95_mm", "hd95_excluded"}}}}}`` (HD95 None where it was not needed), the content of ``postprocessing.json``.
    """
    foreground = [i for i in sorted(labels) if i > 0]
    smallest = dict.fromkeys(foreground, math.inf)
    as_is: dict[int, list[float]] = {index: [] for index in foreground}  # HD95 of the predictions as they are
    for case in cases:
        for index in foreground:
            as_is[index].append(case.scores[index][1])
            volumes = component_volumes(case.reference[index - 1], case.spacing)
            if volumes.size:
                smallest[index] = min(smallest[index], float(volumes.min()))
    steps = {index: {"none": ClassStep(), "largest_component": ClassStep("largest_component")} for index in foreground}
    for index in foreground:
        if math.isfinite(smallest[index]):
            steps[index]["remove_small"] = ClassStep("remove_small", smallest[index] / 2)
    dices = {index: {name: defined_mean(values) for name, values in named.items()}
             for index, named in _step_scores(cases, steps, "dice").items()}
    raising = {index: {name: step for name, step in steps[index].items() if dices[index][name] > dices[index]["none"]}
               for index in foreground}
    needed = {index: named for index, named in raising.items() if named}
    hd95s = _step_scores(cases, needed, "hd95_mm") if needed else {}
    classes = {}
    for index in foreground:
        candidates = {name: {"dice": dices[index][name], "hd95_mm": None, "hd95_excluded": None}
                      for name in steps[index]}
        for name, values in {**hd95s.get(index, {}), "none": as_is[index]}.items():
            candidates[name].update(_hd95_summary(values))
        better = [name for name in raising[index] if _better(candidates[name], candidates["none"])]
        chosen = max(better, key=lambda name: candidates[name]["dice"], default="none")
        classes[labels[index]] = {"index": index, "step": chosen,
                                  "min_volume_mm3": steps[index][chosen].min_volume_mm3, "candidates": candidates}
    return {"rule": RULE, "classes": classes}


def load(path: str | Path, labels: Mapping[int, str]) -> Postprocessing:
    """Read a ``postprocessing.json`` for a model with classes ``labels`` (index -> name).

    Raises:
        ConfigError: the file is missing or unreadable, or its classes are not the model's.
    """
    path = Path(path).expanduser()
    try:
        classes = json.loads(path.read_text())["classes"]
        steps = {int(c["index"]): (name, ClassStep(str(c["step"]), c.get("min_volume_mm3"))) for name, c in
                 classes.items()}
    except FileNotFoundError:
        raise ConfigError(f"postprocessing={path}: file not found (auto, none, or a postprocessing.json)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"postprocessing={path}: not a postprocessing.json of scripts/crossval.py "
                          f"({type(err).__name__}: {err})") from None
    names = {index: name for index, (name, _) in steps.items()}
    foreground = {index: name for index, name in labels.items() if index > 0}
    if names != foreground:
        raise ConfigError(f"postprocessing={path} is for the classes {names}, the checkpoint has {foreground}; "
                          f"use the postprocessing.json of its own cross-validation, or postprocessing=none")
    unknown = sorted({step.step for _, step in steps.values()} - set(STEPS))
    if unknown:
        raise ConfigError(f"postprocessing={path}: unknown step {unknown[0]!r} (valid: {', '.join(STEPS)})")
    return Postprocessing({index: step for index, (_, step) in steps.items()}, source=str(path))


def from_setting(value: str, checkpoints: Sequence[Path], labels: Mapping[int, str]) -> Postprocessing | None:
    """What ``postprocessing=value`` names for a model (or ensemble) of ``checkpoints`` with classes ``labels``:
    ``none`` (None), ``auto`` (:func:`find_decision`, None when there is none) or a ``postprocessing.json``.

    Raises:
        ConfigError: the file is missing, unreadable, or for other classes.
    """
    if value == "none":
        return None
    path = find_decision(checkpoints) if value == "auto" else Path(value)
    return None if path is None else load(path, labels)


def find_decision(checkpoints: Sequence[Path]) -> Path | None:
    """The ``postprocessing.json`` that ``scripts/crossval.py`` decided for exactly ``checkpoints`` (the folds of one
    cross-validation, ``<sweep>/<job>/checkpoints/best.pt``), in their sweep's ``crossval/``; None when there is none
    (e.g. for a single fold, or checkpoints from several sweeps)."""
    parents = [Path(c).resolve().parents for c in checkpoints]
    sweeps = {p[2] for p in parents if len(p) > 2}
    if len(sweeps) != 1:
        return None
    (sweep,) = sweeps
    wanted = {Path(c).resolve() for c in checkpoints}
    root = crossval_dir(sweep)
    for candidate in [root / POSTPROCESSING_FILE, *sorted(root.glob(f"*/{POSTPROCESSING_FILE}"))]:
        try:
            listed = json.loads(candidate.read_text()).get("checkpoints") or []
        except (OSError, ValueError, AttributeError):
            continue
        if {(sweep / c).resolve() for c in listed} == wanted:
            return candidate
    return None
