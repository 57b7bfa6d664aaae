"""Scoring predictions against labels in the original geometry: metric rows, ``metrics.csv``, means, the table.

Every output of a case (foreground class, or region) is scored with the label's own voxel spacing
(:mod:`medseg.scoring.metrics`) and lesion by lesion (:mod:`medseg.scoring.detection`): its predicted mask against the
voxels of the label that hold its values, both without the voxels of the ignore label.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medseg.data.labels import LabelSpec, each_member_mask
from medseg.data.reading import affine_difference, check_label_values, drop_trailing_singletons, read_file
from medseg.errors import DatasetError
from medseg.io import atomic_write_text
from medseg.scoring.detection import LESION_COLUMNS, detect_lesions
from medseg.scoring.metrics import METRIC_NAMES, ClassMetrics, aggregate, class_metrics, voxel_spacing
from medseg.tables import text_table

CSV_COLUMNS = ("case", "class_index", "class_name", *METRIC_NAMES, *LESION_COLUMNS, "flags")


def read_reference(path: str, shape: tuple[int, ...], affine: np.ndarray, image_file: str,
                   labels: LabelSpec) -> tuple[np.ndarray, tuple[float, ...]]:
    """A label file as an integer map (X, Y, Z) in its own axis order, and its voxel spacing (mm).

    Raises:
        DatasetError: the file is unreadable, its shape or affine differs from its image's (``shape``, ``affine``,
            from ``image_file``), or it holds values that are not whole numbers or not among the values ``labels``
            declares (:func:`~medseg.data.reading.check_label_values`): such a label cannot be scored.
    """
    array, label_affine = read_file(path)
    array = drop_trailing_singletons(array)
    if array.shape != tuple(shape):
        raise DatasetError(f"{path}: label shape {tuple(array.shape)} differs from the shape {tuple(shape)} "
                           f"of its image {image_file}")
    difference = affine_difference(affine, label_affine)
    if difference is not None:
        raise DatasetError(f"{path}: label geometry differs from its image {image_file}: {difference}")
    return check_label_values(array, path, labels.declared, "the model's labels"), voxel_spacing(label_affine)


def reference_digest(path: str | Path) -> str:
    """SHA-256 of a label file's bytes (of a folder: of its files', in name order): two datasets whose case names
    coincide are told apart by it, and a copy of the same labels elsewhere matches."""
    path = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def score_case(case: str, prediction: np.ndarray, reference: np.ndarray, spacing: Sequence[float],
               labels: Mapping[int, str] | LabelSpec, tolerance_mm: float) -> list[dict[str, Any]]:
    """One metric row per output of ``labels`` (class index -> name for classes ``0..K-1``, or a :class:`LabelSpec`)
    for a written label map ``prediction`` against ``reference``, both (X, Y, Z) in the dataset's label values: each
    output's prediction is the voxels that hold its values (:func:`score_masks`, one output's mask at a time)."""
    spec = labels if isinstance(labels, LabelSpec) else LabelSpec.plain(labels)
    return score_masks(case, each_member_mask(prediction, spec.output_values), reference, spacing, spec, tolerance_mm)


def score_masks(case: str, masks: Iterable[np.ndarray], reference: np.ndarray, spacing: Sequence[float],
                labels: LabelSpec, tolerance_mm: float) -> list[dict[str, Any]]:
    """One metric row per output of ``labels`` for the predicted ``masks`` (each (X, Y, Z) bool, one per output in
    order: an (R, X, Y, Z) array, or an iterator that makes each when it is asked for) against ``reference``
    (X, Y, Z) in the dataset's label values; ``class_index`` is the output number (from 1). A row holds
    :data:`CSV_COLUMNS`: the voxel metrics, then the lesion-wise detection
    (:meth:`~medseg.scoring.detection.Detection.columns`).

    Each output is scored on its own: its mask without the reference's ignore voxels, against the reference's mask of
    its values, both made when it comes and dropped before the next output's, so that the memory holds one pair of
    masks whatever the number of outputs.
    """
    kept = None if labels.ignore_value is None else reference != labels.ignore_value
    rows = []
    for (index, name), mask, ref in zip(labels.outputs.items(), masks,
                                        each_member_mask(reference, labels.output_values)):
        mask = mask if kept is None else mask & kept
        values = class_metrics(mask, ref, spacing, tolerance_mm).as_dict()
        flags = values.pop("flag")
        rows.append({"case": case, "class_index": index, "class_name": name, **values,
                     **detect_lesions(mask, ref).columns(), "flags": flags})
        del mask, ref  # before the next output's pair is made
    return rows


def write_metrics_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """One row per (case, class); floats at full precision, ``nan``/``inf`` spelled out."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_text(path, buffer.getvalue())


def summarize(rows: Sequence[Mapping[str, Any]], labels: Mapping[int, str]) -> dict[str, Any]:
    """Per-output and foreground means of metric rows (see :func:`medseg.scoring.metrics.aggregate`); ``labels``:
    output number -> name (:attr:`LabelSpec.outputs`; a background entry 0 is left out)."""
    per_class: dict[str, list[ClassMetrics]] = {labels[i]: [] for i in sorted(labels) if i > 0}
    for row in rows:
        per_class[row["class_name"]].append(ClassMetrics(
            **{k: row[k] for k in METRIC_NAMES}, flag=row["flags"]))
    summary = aggregate(per_class)
    for index, name in labels.items():
        if name in summary["classes"]:
            summary["classes"][name] = {"index": index, **summary["classes"][name]}
    return summary


def summary_table(summary: Mapping[str, Any]) -> str:
    """Per-class means and the foreground mean as an aligned text table."""
    headers = ["class", "dice", "hd95_mm", "nsd", "pred_ml", "ref_ml", "hd95_excluded"]
    rows = [[name, m["dice"], m["hd95_mm"], m["nsd"], m["pred_ml"], m["ref_ml"], m["hd95_excluded"]]
            for name, m in summary["classes"].items()]
    mean = summary["foreground_mean"]
    rows.append(["foreground mean", mean["dice"], mean["hd95_mm"], mean["nsd"], "", "", ""])
    return text_table(headers, rows)
