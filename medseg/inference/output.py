"""What evaluation writes per case into ``output/``: the label map (NIfTI on the input's grid; a DICOM-SEG with
``output_format=dicom_seg``: :mod:`.dicom_seg`), probabilities (slab by slab: :class:`ProbabilityWriter`) and output
masks."""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from medseg.data.reading import nifti_header
from medseg.errors import PredictionError
from medseg.inference.cases import Case
from medseg.inference.dicom_seg import seg_path
from medseg.io import atomic_write, write_nifti


def label_map_path(output: Path, case: str) -> Path:
    """Where a case's label map goes: ``output/<case>.nii.gz``."""
    return output / f"{case}.nii.gz"


def write_label_map(output: Path, case: Case, labels: np.ndarray, affine: np.ndarray) -> Path:
    """Write ``labels`` (X, Y, Z) with the case image's ``affine`` (and NIfTI header) as ``output/<case>.nii.gz``.

    The file has exactly the input's shape, affine and header, so it opens on top of the scan.
    """
    return write_nifti(label_map_path(output, case.case), labels, affine, nifti_header(case.image_files[0]))


PROBABILITIES = "probabilities"
"""The array of ``<case>.npz``: float16 ``(C, X, Y, Z)``, as nnU-Net's ``--save_probabilities`` (``np.load`` reads
it back)."""
COPY_CHUNK = 16 << 20
"""Bytes copied at a time from the slabs' file into the ``.npz``."""


class ProbabilityWriter:
    """``output/<case>.npz`` with float16 ``probabilities`` ``(C, X, Y, Z)`` (the label map's grid), written slab by
    slab as a prediction gives them (:meth:`write`, in any order) into a temp file of ``output`` (never whole in
    memory: the array is stored in Fortran order, where the slices of the last axis follow each other); :meth:`save`
    puts them into the ``.npz`` (deflated, as ``np.savez_compressed``), atomically. Leaving the ``with`` block
    removes the temp file (a killed run leaves one that :func:`medseg.io.remove_temporaries` finds)."""

    def __init__(self, output: Path, case: str) -> None:
        self.path = output / f"{case}.npz"
        output.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp.slabs", dir=output)
        self.slabs = Path(name)
        self.file = open(handle, "w+b")  # noqa: SIM115 - closed by __exit__

    def __enter__(self) -> ProbabilityWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        self.slabs.unlink(missing_ok=True)

    def write(self, first: int, stop: int, maps: np.ndarray) -> None:
        """Store ``maps`` ``(C, X, Y, stop - first)``, the probabilities of slices ``[first, stop)``."""
        half = maps.astype(np.float16)
        self.file.seek(first * half[..., 0].nbytes)
        self.file.write(half.tobytes(order="F"))

    def save(self, shape: Sequence[int]) -> Path:
        """Write ``output/<case>.npz`` of the probabilities ``(C, X, Y, Z)`` = ``shape`` written so far."""
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float16)), "fortran_order": True,
                  "shape": tuple(int(n) for n in shape)}

        def archive(handle: object) -> None:
            self.file.flush()
            self.file.seek(0)
            with zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as npz, \
                    npz.open(f"{PROBABILITIES}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array_header_1_0(member, header)
                shutil.copyfileobj(self.file, member, COPY_CHUNK)

        return atomic_write(self.path, archive)


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
