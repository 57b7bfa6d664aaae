"""What evaluation writes per case into ``output/``: the label map (NIfTI on the input's grid; a DICOM-SEG with
``output_format=dicom_seg``: :mod:`.dicom_seg`), probabilities and output masks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from medseg.data.reading import nifti_header
from medseg.errors import PredictionError
from medseg.inference.cases import Case
from medseg.inference.dicom_seg import seg_path
from medseg.inference.inferer import Prediction
from medseg.io import atomic_write, write_nifti


def label_map_path(output: Path, case: str) -> Path:
    """Where a case's label map goes: ``output/<case>.nii.gz``."""
    return output / f"{case}.nii.gz"


def write_label_map(output: Path, case: Case, labels: np.ndarray, affine: np.ndarray) -> Path:
    """Write ``labels`` (X, Y, Z) with the case image's ``affine`` (and NIfTI header) as ``output/<case>.nii.gz``.

    The file has exactly the input's shape, affine and header, so it opens on top of the scan.
    """
    return write_nifti(label_map_path(output, case.case), labels, affine, nifti_header(case.image_files[0]))


def write_probabilities(output: Path, case: Case, prediction: Prediction) -> Path:
    """Write ``output/<case>.npz`` with float16 ``probabilities`` ``(C, X, Y, Z)`` (the label map's grid)."""
    half = prediction.probabilities.astype(np.float16)
    return atomic_write(output / f"{case.case}.npz", lambda handle: np.savez_compressed(handle, probabilities=half))


def masks_path(output: Path, case: str) -> Path:
    """Where a case's output masks go: ``output/<case>.masks.npz``."""
    return output / f"{case}.masks.npz"


def write_masks(output: Path, case: Case, masks: np.ndarray) -> Path:
    """Write ``output/<case>.masks.npz`` with the bool ``masks`` ``(R, X, Y, Z)`` of the outputs (the label map's grid):
    what a region-based label map does not hold where regions disagree with their nesting."""
    return atomic_write(masks_path(output, case.case), lambda handle: np.savez_compressed(handle, masks=masks))


def read_masks(output: Path, case: str) -> np.ndarray:
    """The masks :func:`write_masks` wrote for ``case`` into ``output``."""
    with np.load(masks_path(output, case)) as stored:
        return stored["masks"]


def check_output(cases: Sequence[Case], output: Path, output_format: str = "nifti") -> None:
    """Refuse to write a prediction over an input file (e.g. ``output`` = the image folder), or into an input DICOM
    series folder (where a DICOM-SEG would join the series)."""
    inputs = {Path(f).resolve() for c in cases for f in [*c.image_files, *([c.label] if c.label else [])]}
    path = seg_path if output_format == "dicom_seg" else label_map_path
    clash = [c.case for c in cases if path(output, c.case).resolve() in inputs]
    if clash:
        raise PredictionError(f"output={output}: predictions would overwrite input files (cases {clash[:3]}); "
                              f"choose another output folder")
    if output.resolve() in inputs:
        raise PredictionError(f"output={output}: this is an input DICOM series folder; choose another output folder")
