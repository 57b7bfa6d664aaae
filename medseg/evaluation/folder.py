"""Score a folder of predictions made by any tool against the references of a dataset (``evaluate.py pred=DIR``).

Each label map ``DIR/<case>.nii.gz`` (or another image format medseg reads) is matched by case name to the reference
label of ``input`` (:func:`~medseg.inference.cases.find_references`). Before anything is scored, every reference case
must have a prediction and every prediction must lie on its reference's voxel grid (shape and affine); otherwise
evaluation stops with one line per case that is missing or on another grid. Predictions without a reference are named
in the log and in ``summary.json`` and left out.

The classes come from ``ckpt`` when given (its classes and regions), else from the ``dataset.json`` of ``input``, else
they are the label values found in the references (each named ``label_<value>``). A prediction holding a value that is
not one of the classes fails its case. Region-based classes are scored as the written label map holds them
(:func:`~medseg.scoring.per_case.score_case`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from monai.transforms import MapLabelValue
from tqdm import tqdm

from medseg.config import EvaluateConfig
from medseg.data.labels import LabelSpec
from medseg.data.reading import (
    NIBABEL_ENDINGS,
    affine_difference,
    check_label_values,
    drop_trailing_singletons,
    label_values,
    nifti_proxy,
    read_file,
)
from medseg.errors import DatasetError, ImageReadError, PredictionError
from medseg.inference.cases import dataset_json, files_by_case, find_references, read_dataset
from medseg.inference.ensemble import checkpoint_files
from medseg.inference.model import EvalModel, load_model
from medseg.inference.predict import root_message
from medseg.io import check_writable
from medseg.scoring.metrics import voxel_spacing
from medseg.scoring.per_case import score_case

log = logging.getLogger("medseg")


@dataclass
class ScoredFolder:
    """What :func:`score_folder` scored: one row per (case, output), the classes, the summary."""

    rows: list[dict[str, Any]]
    labels: LabelSpec
    summary: dict[str, Any] = field(default_factory=dict)


def voxel_grid(path: str) -> tuple[tuple[int, ...], np.ndarray]:
    """A label file's spatial shape ``(X, Y, Z)`` and ``(4, 4)`` affine; a NIfTI file's from its header alone.

    Raises:
        ImageReadError: the file cannot be read (:func:`~medseg.data.reading.nifti_proxy`,
            :func:`~medseg.data.reading.read_file`).
    """
    if path.endswith(NIBABEL_ENDINGS):
        image = nifti_proxy(path)
        shape, affine = image.shape, np.asarray(image.affine, dtype=np.float64)
    else:
        array, affine = read_file(path)
        shape = array.shape
    while len(shape) > 3 and shape[-1] == 1:  # (X, Y, Z, 1) is a 3D volume, as drop_trailing_singletons reads it
        shape = shape[:-1]
    return tuple(int(n) for n in shape), affine


def grid_difference(prediction: str, reference: str) -> str | None:
    """How ``prediction``'s voxel grid differs from ``reference``'s (shape, spacing, direction, origin); None when they
    agree."""
    (shape, affine), (ref_shape, ref_affine) = voxel_grid(prediction), voxel_grid(reference)
    if shape != ref_shape:
        return f"shape {shape} vs {ref_shape}"
    return affine_difference(ref_affine, affine)


def check_predictions(predictions: Mapping[str, str], references: Mapping[str, str], where: str) -> None:
    """Every reference case has a prediction, on its reference's voxel grid (``where`` names the predictions). A file
    whose grid cannot be read is left to its case: reading it for scoring fails that case, by name, as any unreadable
    file does.

    Raises:
        PredictionError: a reference case has no prediction, or a prediction lies on another voxel grid than its
            reference: one line per such case.
    """
    missing = [case for case in references if case not in predictions]
    if missing:
        raise PredictionError(f"{where}: no prediction for {len(missing)} of the {len(references)} reference "
                              f"case(s): {', '.join(missing)} (expected <case>.nii.gz for each)")
    mismatched = []
    for case, reference in references.items():
        try:
            difference = grid_difference(predictions[case], reference)
        except ImageReadError:
            continue  # scoring reads the file again and fails its case with the reader's message
        if difference is not None:
            mismatched.append(f"{case}: {Path(predictions[case]).name} is on another grid than {reference}: "
                              f"{difference}")
    if mismatched:
        raise PredictionError(f"{where}: {len(mismatched)} prediction(s) on another voxel grid than their "
                              f"reference, nothing scored:\n  " + "\n  ".join(mismatched))


def match_predictions(pred: Path, references: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Each reference case's prediction file in ``pred`` and the predictions without a reference.

    Raises:
        PredictionError: ``pred`` is no folder, a case held by two files
            (:func:`~medseg.inference.cases.files_by_case`), or see :func:`check_predictions`.
    """
    if not pred.is_dir():
        raise PredictionError(f"pred={pred}: not a folder of predictions")
    predictions = files_by_case(pred, f"pred={pred}")
    check_predictions(predictions, references, f"pred={pred}")
    return {case: predictions[case] for case in references}, sorted(set(predictions) - set(references))


def checkpoint_model(ckpt: Any) -> EvalModel | None:
    """The first model of ``ckpt`` (its classes and its training fold); None without ``ckpt``."""
    return None if ckpt is None else load_model(checkpoint_files(ckpt)[0])


def found_classes(references: Mapping[str, str]) -> LabelSpec:
    """Classes ``label_<value>`` for every non-zero value of the references (background 0), each file checked to
    hold whole numbers."""
    values: set[int] = set()
    for path in references.values():
        found, _ = label_values(check_label_values(drop_trailing_singletons(read_file(path)[0]), path))
        values.update(int(v) for v in found)
    names = {0: "background", **{v: f"label_{v}" for v in sorted(values - {0})}}
    return LabelSpec(dict(enumerate(names.values())), list(names))


def folder_classes(input_path: str, model: EvalModel | None, references: Mapping[str, str]) -> LabelSpec:
    """The classes scored: ``ckpt``'s, else the ``dataset.json``'s of ``input``, else the values found in the
    references (see the module docstring).

    Raises:
        PredictionError: no foreground class to score (references that hold only background, and no class list).
    """
    if model is not None:
        return model.label_spec
    description = dataset_json(Path(input_path).expanduser())
    if description is not None:
        return read_dataset(description).label_spec
    labels = found_classes(references)
    if not labels.outputs:
        raise PredictionError(f"input={input_path}: nothing to score: the {len(references)} reference(s) hold only "
                              f"background (0) and no class list names the classes; give input=<dataset.json> (its "
                              f"labels) or ckpt=<checkpoint> to score each class's absence")
    return labels


def score_pair(case: str, prediction: str, reference: str, labels: LabelSpec, tolerance_mm: float,
               renumber: Mapping[int, int] | None = None) -> list[dict[str, Any]]:
    """The metric rows of one prediction file against its reference file (same grid, checked before).

    ``renumber``: the prediction's label values -> the reference's (:func:`~medseg.data.labels.renumbering`), for a
    tool whose ``dataset.json`` numbers the same classes otherwise; its keys are then the values the prediction may
    hold, and MONAI's ``MapLabelValue`` turns them into the reference's before scoring.

    Raises:
        DatasetError: either file is unreadable or holds values that are not whole numbers or not ``labels``' (or
            ``renumber``'s).
    """
    ref_array, ref_affine = read_file(reference)
    ref_map = check_label_values(drop_trailing_singletons(ref_array), reference, labels.declared, "the scored classes")
    declared = labels.declared if renumber is None else {
        value: labels.declared[target] for value, target in renumber.items()}
    pred_map = check_label_values(drop_trailing_singletons(read_file(prediction)[0]), prediction, declared,
                                  "the scored classes")
    if renumber is not None:
        pred_map = MapLabelValue(list(renumber), list(renumber.values()), dtype=pred_map.dtype)(pred_map)
    return score_case(case, pred_map, ref_map, voxel_spacing(ref_affine), labels, tolerance_mm)


def score_folder(cfg: EvaluateConfig, output: Path) -> ScoredFolder:
    """Score the predictions of ``cfg.pred`` against the references of ``cfg.input`` (see the module docstring).

    Raises:
        PredictionError: no references, predictions missing or on another grid, or no class to score (nothing is
            scored then).
        ConfigError: ``output`` cannot be written into. CheckpointError: a ``ckpt`` that cannot be read.
    """
    started = time.perf_counter()
    check_writable(output, "output")
    pred = Path(str(cfg.pred)).expanduser()
    model = checkpoint_model(cfg.ckpt)
    references = find_references(cfg.input, cfg.split, model.data if model is not None else None)
    predictions, extra = match_predictions(pred, references)
    if extra:
        log.warning("pred=%s: %d prediction(s) without a reference, not scored: %s", pred, len(extra),
                    ", ".join(extra))
    labels = folder_classes(cfg.input, model, references)
    log.info("scoring %d prediction(s) of %s against %s; classes: %s", len(references), pred, cfg.input,
             ", ".join(labels.output_names))
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    progress = cfg.inference.progress
    for case, reference in tqdm(references.items(), desc="evaluate", unit="case", disable=not progress):
        try:
            rows += score_pair(case, predictions[case], reference, labels, cfg.tolerance_mm)
        except DatasetError as err:
            failed.append({"case": case, "reason": str(err)})
            log.error("case %s failed: %s", case, err)
        except Exception as err:  # one broken file must not stop the others
            failed.append({"case": case, "reason": root_message(err)})
            log.exception("case %s failed", case)
    summary = {
        "pred": str(pred),
        "input": str(cfg.input),
        "num_cases": len(references),
        "num_scored": len(references) - len(failed),
        "not_scored": extra,
        "failed": failed,
        "config": {key: value for key, value in asdict(cfg).items() if key in ("ckpt", "split", "tolerance_mm")},
        "seconds": round(time.perf_counter() - started, 2),
    }
    return ScoredFolder(rows, labels, summary)
