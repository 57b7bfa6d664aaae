"""DICOM series: a folder of single-frame DICOM images read as one volume, through pydicom (the ``dicom`` extra).

A series' geometry comes from the images' headers, never from their order on disk:

- the slices are sorted by their ``ImagePositionPatient`` projected on the slice normal (the cross product of the
  row and column directions of ``ImageOrientationPatient``), not by ``InstanceNumber`` or file name;
- the spacing between slices is the step of the regular grid from the first position to the last (not
  ``SliceThickness``, which an overlapping or gapped reconstruction does not share), and every position must lie on
  that grid within :data:`POSITION_TOLERANCE_MM`: the drift that steps each near the median add up to is measured,
  not each step alone; one slice alone takes ``SpacingBetweenSlices``, else ``SliceThickness``;
- the directions are ``ImageOrientationPatient``'s, oblique ones included, which must be two orthogonal unit vectors;
- the voxels are the stored values through the modality LUT (:func:`rescale`: ``RescaleSlope`` and
  ``RescaleIntercept``, Hounsfield units for CT; an absent slope is 1 and an absent intercept 0, each alone too),
  kept integer when the slope and intercept are whole numbers.

The volume's voxel order is DICOM's own: axis 0 runs along a row (column index), axis 1 down the columns (row index),
axis 2 through the sorted slices; its affine is DICOM's LPS geometry turned into the RAS world of NIfTI (the first
two rows negated). :func:`medseg.data.reading.read_file` reads a folder through :func:`read_series`, so a series is
read wherever a volume file is.

A folder may hold several series; they are told apart by ``SeriesInstanceUID`` (:func:`folder_series`), and one
of them is named by a :class:`DicomSeries`; an input's series folders are found at any depth (:func:`series_folders`).
A series with images of different sizes, pixel spacings or orientations, orientation cosines that are not two
orthogonal unit vectors, slice positions off a regular grid (a missing slice, a drift), two images at one position
(or one image twice), multi-frame
objects, or non-image objects (a structured report, a DICOM-SEG, anything without pixel data) is refused with one
line naming the folder and what is wrong (:class:`~medseg.errors.ImageReadError`).

Why not MONAI's readers: on a series whose files and ``InstanceNumber`` s are shuffled, MONAI 1.6.1's
``PydicomReader`` gave a slice axis of -0.68 mm where the positions step 2.5 mm (voxels off by up to 398 HU);
its ``ITKReader`` (GDCM) sorts by position and agrees with this module (tests/data/test_dicom.py), but needs ITK
(~105 MB). Both read a series with a missing slice as a regular volume (ITK only warns: 11 slices 2.75 mm apart where
12 were 2.5 mm apart and one is missing).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medseg.errors import ImageReadError, one_line

if TYPE_CHECKING:
    from pydicom import Dataset

log = logging.getLogger("medseg")

DICOM_EXTRA = 'pip install "medseg[dicom]"'
"""How to install what DICOM input and DICOM-SEG output need (pydicom, highdicom)."""
DICOM_ENDING = ".dcm"
SEG_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.66.4"
"""Segmentation Storage: a DICOM-SEG, which is an output, never an image to segment."""
DIRECTORY_SOP_CLASS = "1.2.840.10008.1.3.10"
"""Media Storage Directory Storage (a ``DICOMDIR`` index): not part of any series, skipped."""
ORIENTATION_TOLERANCE = 1e-3
"""How far (direction cosines) the ``ImageOrientationPatient`` of two slices of one series may differ, and its row and
column directions from unit length and from orthogonal (their dot product from 0)."""
SPACING_TOLERANCE = 1e-4
"""How far (a fraction) the ``PixelSpacing`` of two slices of one series may differ."""
POSITION_TOLERANCE_MM = 0.1
"""How far (mm) a slice's ``ImagePositionPatient`` may lie off the regular grid from the first slice to the last:
the drift that steps each near the median accumulate is measured, not each step alone."""
DUPLICATE_MM = 1e-3
"""Two slices nearer than this (mm along the normal) are at one position."""


def missing_packages(*modules: str) -> str | None:
    """``"needs pydicom: pip install ..."`` when one of ``modules`` is not installed, else None."""
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    return f"needs {' and '.join(missing)}: {DICOM_EXTRA}" if missing else None


def _pydicom(where: object) -> Any:
    """The ``pydicom`` module, or an :class:`ImageReadError` naming ``where`` and the extra to install."""
    reason = missing_packages("pydicom")
    if reason:
        raise ImageReadError(where, f"reading a DICOM series {reason}")
    import pydicom

    return pydicom


@dataclass(frozen=True)
class DicomSeries:
    """One series of a folder that holds several: the folder and the series' ``SeriesInstanceUID``.

    A folder that holds one series is named by its path alone. ``os.fspath`` gives the folder.
    """

    folder: str
    uid: str

    def __str__(self) -> str:
        return f"{self.folder} (SeriesInstanceUID {self.uid})"

    def __fspath__(self) -> str:
        return self.folder


def is_dicom_file(path: Path) -> bool:
    """Whether ``path`` is a DICOM file: it ends in ``.dcm``, or holds ``DICM`` after its 128-byte preamble."""
    if path.name.lower().endswith(DICOM_ENDING):
        return True
    try:
        with open(path, "rb") as stream:
            stream.seek(128)
            return stream.read(4) == b"DICM"
    except OSError:
        return False


def _is_series_file(path: Path) -> bool:
    """A DICOM file that may belong to a series: not hidden, not a ``DICOMDIR`` index."""
    return (not path.name.startswith(".") and path.name.upper() != "DICOMDIR" and path.is_file()
            and is_dicom_file(path))


def dicom_files(folder: Path) -> list[Path]:
    """The DICOM files directly in ``folder`` (not hidden, not a ``DICOMDIR``), sorted by name."""
    return sorted(path for path in folder.iterdir() if _is_series_file(path))


def is_series_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding DICOM files (one series or several)."""
    folder = Path(path)
    return folder.is_dir() and any(_is_series_file(p) for p in folder.iterdir())


def folder_series(folder: str | Path) -> dict[str, list[Dataset]]:
    """The DICOM files of ``folder`` read (their pixel data left on disk until used) and grouped by
    ``SeriesInstanceUID`` (``""`` for files without one), in file-name order.

    Raises:
        ImageReadError: pydicom is missing, the folder holds no DICOM file (or only an index), or a file is no DICOM
            pydicom reads.
    """
    pydicom = _pydicom(folder)
    files = dicom_files(Path(folder)) if Path(folder).is_dir() else []
    if not files:
        raise ImageReadError(folder, "no DICOM files in this folder (expected a DICOM series, or an image file)")
    groups: dict[str, list[Dataset]] = {}
    for path in files:
        try:
            dataset = pydicom.dcmread(path, defer_size=1024)  # the pixel data is read when used
        except Exception as err:  # whatever the bytes make pydicom raise: not a DICOM file it can read
            raise ImageReadError(folder, f"{path.name}: not a DICOM file pydicom reads ({one_line(err)})") from err
        if str(dataset.get("SOPClassUID", "")) != DIRECTORY_SOP_CLASS:
            groups.setdefault(str(dataset.get("SeriesInstanceUID", "")), []).append(dataset)
    if not groups:
        raise ImageReadError(folder, "no DICOM images in this folder, only a DICOMDIR index")
    return groups


def series_label(dataset: Dataset) -> str:
    """A readable name of a series from one of its images: ``s<SeriesNumber>_<SeriesDescription>`` (file-name
    safe), or its ``SeriesInstanceUID`` without either."""
    number, description = dataset.get("SeriesNumber"), str(dataset.get("SeriesDescription", "")).strip()
    parts = [f"s{number}" if number not in (None, "") else "", re.sub(r"[^\w.-]+", "_", description).strip("_")]
    return "_".join(part for part in parts if part) or str(dataset.get("SeriesInstanceUID", "unnamed"))


def series_sources(folder: str | Path, name: str | None = None) -> list[tuple[str, str | DicomSeries]]:
    """The series of ``folder`` as ``(case name, source)`` pairs: a folder of one series is the case ``name`` (default
    the folder's name; its path the source); each series of a folder of several is a case ``<name>_<series label>``
    (:func:`series_label`, made unique by its UID where two labels are the same), its source a :class:`DicomSeries`.
    A folder holding a file pydicom cannot read is the one case ``name``, which fails alone when it is read (naming
    that file), so that it does not stop the folder's other cases.

    Raises:
        ImageReadError: pydicom is missing, or the folder holds no DICOM file (:func:`folder_series`).
    """
    folder = Path(folder)
    name = folder.name if name is None else name
    _pydicom(folder)  # without pydicom no series is read: no case alone is to blame
    try:
        groups = folder_series(folder)
    except ImageReadError:
        if not dicom_files(folder):
            raise
        return [(name, str(folder))]
    if len(groups) == 1:
        return [(name, str(folder))]
    labels = {uid: series_label(datasets[0]) for uid, datasets in groups.items()}
    repeated = {label for label, count in Counter(labels.values()).items() if count > 1}
    return sorted((f"{name}_{label}{f'_{uid}' if label in repeated else ''}", DicomSeries(str(folder), uid))
                  for uid, label in labels.items())


def series_folders(root: str | Path) -> tuple[list[Path], list[Path]]:
    """The folders under ``root`` (itself included, at any depth: a ``DICOMDIR`` export's series lie a few levels
    down) that hold DICOM files, and those that hold files, none of them DICOM, and no such folder below them
    (skipped); hidden folders are left out. Both sorted."""
    series, other = [], []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        path = Path(folder)
        if is_series_folder(path):
            series.append(path)
        elif path != Path(root) and any(not f.startswith(".") for f in files):
            other.append(path)
    return sorted(series), sorted(path for path in other if not any(path in s.parents for s in series))


def series_modality(source: str | Path | DicomSeries) -> str | None:
    """A series' ``Modality`` (``CT``, ``MR``, ``PT``, ...) from the header of its first image; None without one.

    Raises:
        ImageReadError: pydicom is missing.
    """
    pydicom = _pydicom(source)
    uid = source.uid if isinstance(source, DicomSeries) else None
    for path in dicom_files(Path(os.fspath(source))):
        header = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=["SeriesInstanceUID", "Modality"])
        if uid is None or str(header.get("SeriesInstanceUID", "")) == uid:
            return str(header.get("Modality", "")).strip().upper() or None
    return None


def _series_datasets(source: str | Path | DicomSeries) -> list[Dataset]:
    """The images of ``source``'s series, unsorted: the folder's one series, or the series of its UID."""
    folder = source.folder if isinstance(source, DicomSeries) else str(source)
    groups = folder_series(folder)
    if isinstance(source, DicomSeries):
        if source.uid not in groups:
            raise ImageReadError(source, "no such series in this folder")
        return groups[source.uid]
    if len(groups) > 1:
        names = ", ".join(sorted(series_label(datasets[0]) for datasets in groups.values()))
        raise ImageReadError(folder, f"holds {len(groups)} series ({names}); give each series its own folder (an "
                                     f"evaluation input folder makes a case of each)")
    return next(iter(groups.values()))


def _file_name(dataset: Dataset) -> str:
    return Path(str(dataset.filename)).name


def _non_image_problem(dataset: Dataset) -> str | None:
    """Why one DICOM object is not a slice medseg reads, or None."""
    sop_class = dataset.get("SOPClassUID")
    kind = sop_class.name if sop_class is not None else "DICOM (no SOPClassUID)"
    if str(sop_class) == SEG_SOP_CLASS:
        return f"{_file_name(dataset)} is a {kind} object (DICOM-SEG), not an image series"
    if "PixelData" not in dataset:
        return f"{_file_name(dataset)} is a {kind} object without pixel data, not an image series"
    if int(dataset.get("NumberOfFrames", 1) or 1) > 1:
        return (f"{_file_name(dataset)} is a multi-frame {kind} object ({dataset.NumberOfFrames} frames); medseg "
                f"reads series of single-frame images")
    if int(dataset.get("SamplesPerPixel", 1)) != 1:
        return f"{_file_name(dataset)} has {dataset.SamplesPerPixel} samples per pixel (colour); expected greyscale"
    missing = [key for key in ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing")
               if dataset.get(key) in (None, "")]
    if missing:
        return f"{_file_name(dataset)} has no {' or '.join(missing)}: not a slice of a volume ({kind})"
    return None


def _mixed(datasets: Sequence[Dataset], what: str, values: Sequence[Any]) -> str:
    """``"mixed image sizes within one series (512x512 in 30 file(s), 256x256 in 2 file(s); e.g. a.dcm, b.dcm): ..."``,
    the example files those of the rarest value."""
    counts = Counter(values)
    rare = min(counts, key=counts.__getitem__)
    files = [_file_name(d) for d, v in zip(datasets, values) if v == rare][:3]
    listed = ", ".join(f"{value} in {count} file(s)" for value, count in counts.most_common())
    return (f"mixed {what} within one series ({listed}; e.g. {', '.join(files)}): more than one series under one "
            f"SeriesInstanceUID?")


@dataclass
class SeriesGeometry:
    """A checked series: its images in slice order and their voxel-to-world affine."""

    datasets: list[Dataset]
    """The images, sorted by position along the slice normal (the volume's axis 2)."""
    affine: np.ndarray
    """(4, 4) voxel (column, row, slice) -> world, RAS mm."""


def series_geometry(source: str | Path | DicomSeries) -> SeriesGeometry:
    """The images of a series, checked and sorted by position (see the module's rules), and their RAS affine.

    Raises:
        ImageReadError: naming the folder (or series) and what is wrong with it.
    """
    datasets = _series_datasets(source)
    for dataset in datasets:
        problem = _non_image_problem(dataset)
        if problem:
            raise ImageReadError(source, problem)
    sizes = [f"{int(d.Columns)}x{int(d.Rows)}" for d in datasets]
    if len(set(sizes)) > 1:
        raise ImageReadError(source, _mixed(datasets, "image sizes", sizes))
    orientations = np.array([[float(v) for v in d.ImageOrientationPatient] for d in datasets])
    if np.abs(orientations - orientations[0]).max() > ORIENTATION_TOLERANCE:
        texts = ["\\".join(f"{v:.3g}" for v in row) for row in orientations]
        raise ImageReadError(source, _mixed(datasets, "orientations (ImageOrientationPatient)", texts))
    spacings = np.array([[float(v) for v in d.PixelSpacing] for d in datasets])
    if np.abs(spacings - spacings[0]).max() > SPACING_TOLERANCE * spacings[0].max():
        texts = ["x".join(f"{v:.4g}" for v in pair) for pair in spacings]
        raise ImageReadError(source, _mixed(datasets, "pixel spacings", texts))
    uids = [str(d.get("SOPInstanceUID", "")) for d in datasets]
    twice = [uid for uid, count in Counter(uids).items() if uid and count > 1]
    if twice:
        files = [_file_name(d) for d, uid in zip(datasets, uids) if uid == twice[0]]
        raise ImageReadError(source, f"one image twice: {', '.join(files)} have the same SOPInstanceUID {twice[0]}")
    row, column = _directions(orientations[0], source)
    normal = np.cross(row, column)
    positions = np.array([[float(v) for v in d.ImagePositionPatient] for d in datasets])
    order = np.argsort(positions @ normal, kind="stable")
    datasets, positions = [datasets[i] for i in order], positions[order]
    step = _slice_step(datasets, positions, normal, source)
    row_spacing, column_spacing = spacings[0]  # PixelSpacing: between rows, then between columns
    lps = np.eye(4)
    lps[:3, 0], lps[:3, 1], lps[:3, 2], lps[:3, 3] = row * column_spacing, column * row_spacing, step, positions[0]
    return SeriesGeometry(datasets, np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps)


def _directions(cosines: np.ndarray, source: object) -> tuple[np.ndarray, np.ndarray]:
    """The unit row and column directions (each (3,), LPS) of ``ImageOrientationPatient`` ``cosines`` (6,), which must
    be two orthogonal unit vectors within :data:`ORIENTATION_TOLERANCE` (else the spacing along them is unknown)."""
    row, column = cosines[:3], cosines[3:]
    lengths, dot = (float(np.linalg.norm(row)), float(np.linalg.norm(column))), float(row @ column)
    if max(abs(lengths[0] - 1), abs(lengths[1] - 1), abs(dot)) > ORIENTATION_TOLERANCE:
        text = "\\".join(f"{v:.4g}" for v in cosines)
        raise ImageReadError(source, f"ImageOrientationPatient {text} is not two orthogonal unit vectors (lengths "
                                     f"{lengths[0]:.4g} and {lengths[1]:.4g}, dot product {dot:.4g}; tolerance "
                                     f"{ORIENTATION_TOLERANCE:g}): its directions and spacings are unknown")
    return row / lengths[0], column / lengths[1]


def _slice_step(datasets: Sequence[Dataset], positions: np.ndarray, normal: np.ndarray, source: object) -> np.ndarray:
    """(3,) the LPS vector from one slice to the next: the step of the regular grid from the first sorted position to
    the last, on which every position must lie within :data:`POSITION_TOLERANCE_MM` (no gap, no drift, no two slices
    at one position); one slice alone steps along the normal by its ``SpacingBetweenSlices`` (else
    ``SliceThickness``)."""
    if len(datasets) == 1:
        spacing = datasets[0].get("SpacingBetweenSlices") or datasets[0].get("SliceThickness")
        if not spacing or float(spacing) <= 0:
            raise ImageReadError(source, f"one slice ({_file_name(datasets[0])}) without SpacingBetweenSlices or "
                                         f"SliceThickness: its thickness is unknown")
        return normal * float(spacing)
    along = np.diff(positions, axis=0) @ normal
    if along.min() < DUPLICATE_MM:
        k = int(np.argmin(along))
        raise ImageReadError(source, f"two slices at one position, {float(positions[k] @ normal):.4g} mm along the "
                                     f"slice normal ({_file_name(datasets[k])}, {_file_name(datasets[k + 1])})")
    step = (positions[-1] - positions[0]) / (len(positions) - 1)
    drift = np.linalg.norm(positions - (positions[0] + np.arange(len(positions))[:, None] * step), axis=1)
    if drift.max() > POSITION_TOLERANCE_MM:
        k, median, j = int(np.argmax(drift)), float(np.median(along)), int(np.argmax(along))
        gap = (f"; {along[j]:.4g} mm from {_file_name(datasets[j])} to {_file_name(datasets[j + 1])} (a missing "
               f"slice?)" if along[j] > 1.5 * median else "")
        raise ImageReadError(source, f"uneven slice positions: {_file_name(datasets[k])} lies {drift[k]:.3g} mm "
                                     f"({drift[k] / np.linalg.norm(step):.2f} of a slice) off the regular grid from "
                                     f"the first slice to the last (tolerance {POSITION_TOLERANCE_MM:g} mm); the steps "
                                     f"run from {along.min():.4g} to {along.max():.4g} mm (median {median:.4g} mm)"
                                     f"{gap}")
    return step


def rescale(dataset: Dataset) -> tuple[float, float]:
    """The modality LUT's ``(slope, intercept)`` of one image: its ``RescaleSlope`` and ``RescaleIntercept``, an
    absent slope 1 and an absent intercept 0 (the identity the standard gives an image without them; an intercept
    without its slope, which the standard requires beside it, is applied with slope 1)."""
    slope, intercept = dataset.get("RescaleSlope"), dataset.get("RescaleIntercept")
    return (1.0 if slope in (None, "") else float(slope)), (0.0 if intercept in (None, "") else float(intercept))


def _half_rescale(datasets: Sequence[Dataset]) -> str | None:
    """``"RescaleIntercept without RescaleSlope in 12 of 12 image(s)"`` (or the other way round) where images give
    one of the two alone; None where none does."""
    for present, absent in (("RescaleIntercept", "RescaleSlope"), ("RescaleSlope", "RescaleIntercept")):
        count = sum(d.get(present) not in (None, "") and d.get(absent) in (None, "") for d in datasets)
        if count:
            return f"{present} without {absent} in {count} of {len(datasets)} image(s)"
    return None


def _stored_to_modality(dataset: Dataset) -> np.ndarray:
    """(rows, columns) one image's stored values in the modality's units: its Modality LUT Sequence (pydicom's
    ``apply_modality_lut``) where it has one, else through :func:`rescale`."""
    if "ModalityLUTSequence" in dataset:
        from pydicom.pixels import apply_modality_lut

        return apply_modality_lut(dataset.pixel_array, dataset)
    slope, intercept = rescale(dataset)
    pixels = dataset.pixel_array
    return pixels if (slope, intercept) == (1.0, 0.0) else pixels * slope + intercept


def read_series(source: str | Path | DicomSeries) -> tuple[np.ndarray, np.ndarray]:
    """A series' voxels ``(columns, rows, slices)`` through the modality LUT (:func:`rescale`: ``RescaleSlope`` and
    ``RescaleIntercept``; a half-given pair is said once in the log) and its ``(4, 4)`` RAS voxel-to-world affine
    (:func:`series_geometry`). The voxels are int16 (int32 where they need it) when every slope and intercept is a
    whole number, else float32.

    Raises:
        ImageReadError: see :func:`series_geometry`; or pixel data pydicom cannot decode.
    """
    geometry = series_geometry(source)
    half = _half_rescale(geometry.datasets)
    if half:
        log.warning("%s: %s, read with slope 1 and intercept 0 where absent (the standard's identity)", source, half)
    slices = []
    for dataset in geometry.datasets:
        try:
            slices.append(_stored_to_modality(dataset))
        except Exception as err:  # a transfer syntax without a decoder installed, truncated pixel data, ...
            raise ImageReadError(source, f"{_file_name(dataset)}: cannot decode its pixel data ({one_line(err)})"
                                 ) from err
    volume = np.stack(slices, axis=-1).transpose(1, 0, 2)  # (rows, columns, slices) -> (columns, rows, slices)
    if all(float(value).is_integer() for d in geometry.datasets for value in rescale(d)):
        low, high = volume.min(), volume.max()
        kind = np.int16 if np.iinfo(np.int16).min <= low and high <= np.iinfo(np.int16).max else np.int32
        return np.rint(volume).astype(kind), geometry.affine
    return volume.astype(np.float32), geometry.affine
