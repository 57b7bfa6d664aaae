"""DICOM series written with pydicom from a volume and its NIfTI (RAS) affine, as a scanner's export holds them.

:func:`write_series` writes one single-frame CT image per slice, following the standard's geometry by hand (so that
the reader is checked against an independent writing of the rules): ``ImageOrientationPatient`` from the affine's
first two columns in DICOM's LPS world, ``ImagePositionPatient`` of each slice from its origin and third column,
``PixelSpacing`` as (between rows, between columns). The files go to disk in a shuffled order under names that say
nothing, half without an ending (found by the ``DICM`` magic), with shuffled ``InstanceNumber`` s and a
``SliceThickness`` that is not the spacing, so that only the positions give the order and the spacing. Needs
pydicom (the ``dicom`` extra).

:func:`write_ct_case` writes one realistic CT case (:func:`tests.helpers.realistic.ct_case`) three ways: its image as
NIfTI and as a DICOM series of the same voxels and geometry, and its label as NIfTI on that grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy.spatial.transform import Rotation

from tests.helpers.realistic import ct_case, save_nifti

CT_IMAGE = "1.2.840.10008.5.1.4.1.1.2"
BASIC_TEXT_SR = "1.2.840.10008.5.1.4.1.1.88.11"
SEGMENTATION = "1.2.840.10008.5.1.4.1.1.66.4"
LPS = np.diag([-1.0, -1.0, 1.0, 1.0])
"""RAS <-> LPS world coordinates (its own inverse)."""


@dataclass
class WrittenSeries:
    """What :func:`write_series` wrote."""

    folder: Path
    files: list[Path]
    """One file per slice, in slice order (axis 2 of the volume as the reader gives it)."""
    series_uid: str
    sop_uids: list[str]
    """The images' SOPInstanceUIDs in slice order."""


def _ds(values: Sequence[float]) -> list:
    from pydicom.valuerep import DSfloat

    return [DSfloat(float(v), auto_format=True) for v in values]


def file_meta(sop_class: str, sop_instance: str):
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = sop_class, sop_instance
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return meta


def base_dataset(sop_class: str, study_uid: str, series_uid: str, series_number: int = 1, description: str = "",
                 frame_of_reference: str | None = None):
    """A DICOM dataset with the patient, study, series and equipment modules filled, and its file meta."""
    from pydicom.dataset import Dataset
    from pydicom.uid import generate_uid

    ds = Dataset()
    ds.SOPInstanceUID = generate_uid()
    ds.file_meta = file_meta(sop_class, ds.SOPInstanceUID)
    ds.SOPClassUID = sop_class
    ds.PatientName, ds.PatientID, ds.PatientBirthDate, ds.PatientSex = "Test^Phantom", "PHANTOM01", "19700101", "O"
    ds.StudyInstanceUID, ds.StudyID, ds.AccessionNumber = study_uid, "1", "A1"
    ds.StudyDate, ds.StudyTime, ds.ReferringPhysicianName = "20240102", "101500", ""
    ds.SeriesInstanceUID, ds.SeriesNumber, ds.SeriesDescription = series_uid, series_number, description
    ds.Modality, ds.Manufacturer = "CT", "medseg tests"
    ds.FrameOfReferenceUID = frame_of_reference or generate_uid()
    ds.PositionReferenceIndicator = ""
    return ds


def write_series(folder: str | Path, volume: np.ndarray, affine: np.ndarray, *, slope: float = 1.0,
                 intercept: float = 0.0, stored: type = np.int16, seed: int = 0, series_number: int = 1,
                 description: str = "axial", study_uid: str | None = None, series_uid: str | None = None,
                 thickness: float = 0.75) -> WrittenSeries:
    """Write ``volume`` (X, Y, Z) with its NIfTI voxel-to-world (RAS mm) ``affine`` as a CT series in ``folder``.

    Stored values are ``(volume - intercept) / slope`` in ``stored`` (e.g. uint16 with slope 0.5 and intercept
    -1024), which must hold them exactly. The affine's third column must point along the slice normal (the cross
    product of the first two in LPS), as the slices of a series are ordered.
    """
    from pydicom.uid import generate_uid

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lps = LPS @ np.asarray(affine, dtype=np.float64)
    spacing = np.linalg.norm(lps[:3, :3], axis=0)
    row, column = lps[:3, 0] / spacing[0], lps[:3, 1] / spacing[1]
    if np.dot(np.cross(row, column), lps[:3, 2]) <= 0:
        raise ValueError("the affine's third column points against the slice normal; flip the volume's axis 2")
    values = (np.asarray(volume, dtype=np.float64) - intercept) / slope
    pixels = np.rint(values).astype(stored)
    if not np.array_equal(pixels.astype(np.float64), values):
        raise ValueError(f"the volume is not exactly stored as {np.dtype(stored)} with slope {slope}, intercept "
                         f"{intercept}")
    study_uid, series_uid = study_uid or generate_uid(), series_uid or generate_uid()
    frame_of_reference = generate_uid()
    rng = np.random.default_rng(seed)
    slices = volume.shape[2]
    names = [f"{rng.integers(1 << 30):09x}{'.dcm' if k % 2 else ''}" for k in range(slices)]
    instance_numbers = rng.permutation(slices) + 1
    files: list[Path | None] = [None] * slices
    uids: list[str] = [""] * slices
    for k in rng.permutation(slices):  # the order the files are written in
        ds = base_dataset(CT_IMAGE, study_uid, series_uid, series_number, description, frame_of_reference)
        ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.InstanceNumber = int(instance_numbers[k])
        ds.ImagePositionPatient = _ds(lps[:3, 3] + k * lps[:3, 2])
        ds.ImageOrientationPatient = _ds([*row, *column])
        ds.PixelSpacing = _ds([spacing[1], spacing[0]])  # between rows (along a column), then between columns
        ds.SliceThickness = _ds([thickness])[0]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.Rows, ds.Columns = volume.shape[1], volume.shape[0]
        ds.BitsAllocated = ds.BitsStored = 8 * np.dtype(stored).itemsize
        ds.HighBit = ds.BitsStored - 1
        ds.PixelRepresentation = int(np.dtype(stored).kind == "i")
        ds.RescaleSlope, ds.RescaleIntercept, ds.RescaleType = _ds([slope])[0], _ds([intercept])[0], "HU"
        ds.PixelData = np.ascontiguousarray(pixels[:, :, k].T).astype(f"<{np.dtype(stored).str[1:]}").tobytes()
        path = folder / names[k]
        ds.save_as(path, enforce_file_format=True)
        files[k], uids[k] = path, str(ds.SOPInstanceUID)
    return WrittenSeries(folder, [f for f in files if f is not None], series_uid, uids)


def write_report(path: str | Path, study_uid: str | None = None) -> Path:
    """A Basic Text SR object (a report: no pixel data) at ``path``."""
    from pydicom.uid import generate_uid

    ds = base_dataset(BASIC_TEXT_SR, study_uid or generate_uid(), generate_uid(), 99, "report")
    ds.Modality = "SR"
    ds.InstanceNumber = 1
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path


SHAPE, SPACING = (40, 36, 12), (0.8, 0.9, 2.5)
"""The size (voxels) and spacing (mm) of :func:`write_ct_case`'s volumes: small, anisotropic, non-cubic."""
GEOMETRIES = ("oblique", "lps")


def oblique_affine(spacing=SPACING, origin=(-12.5, 30.25, -80.0)) -> np.ndarray:
    """A RAS voxel-to-world affine rotated about all three axes (an oblique acquisition)."""
    affine = np.eye(4)
    affine[:3, :3] = Rotation.from_euler("xyz", [20, -10, 15], degrees=True).as_matrix() @ np.diag(spacing)
    affine[:3, 3] = origin
    return affine


@dataclass
class SeriesCase:
    """One CT case as :func:`write_ct_case` wrote it."""

    nifti: Path
    label: Path
    series: WrittenSeries


def write_ct_case(root: str | Path, name: str, geometry: str = "oblique", seed: int = 0) -> SeriesCase:
    """A CT case as ``root/<name>.nii.gz``, ``root/<name>_label.nii.gz`` and the series ``root/<name>/``.

    ``geometry``: ``oblique`` (:func:`oblique_affine`; the series stores uint16 with slope 0.5 and intercept -1024)
    or ``lps`` (axis-aligned, stored LPS as DICOM's own; int16 with slope 1 and intercept -1024).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    case = ct_case(name, np.random.default_rng(seed), SHAPE, SPACING)
    nifti, label = root / f"{name}.nii.gz", root / f"{name}_label.nii.gz"
    if geometry == "oblique":
        affine = oblique_affine()
        for path, array in ((nifti, case.image[0]), (label, case.label)):
            nib.save(nib.Nifti1Image(array, affine), path)
        stored = {"slope": 0.5, "intercept": -1024.0, "stored": np.uint16}
    elif geometry == "lps":
        origin = (-16.0, -16.2, -15.0)
        save_nifti(nifti, case.image[0], SPACING, "LPS", origin)
        save_nifti(label, case.label, SPACING, "LPS", origin)
        stored = {"slope": 1.0, "intercept": -1024.0, "stored": np.int16}
    else:
        raise ValueError(f"geometry={geometry!r}: expected one of {GEOMETRIES}")
    image = nib.load(nifti)
    series = write_series(root / name, np.asarray(image.dataobj), image.affine, seed=seed, **stored)
    return SeriesCase(nifti, label, series)


def two_series_folder(folder: str | Path) -> list[tuple[np.ndarray, WrittenSeries]]:
    """Two series of one study in one folder, told apart by their UIDs only: 40x36x12 LPS (number 2, "axial") and
    32x30x8 oblique (number 5, "T2 tse"); returns each one's volume (as the reader gives it) and files."""
    from pydicom.uid import generate_uid

    rng = np.random.default_rng(3)
    first = ct_case("a", rng, SHAPE, SPACING).image[0]
    second = ct_case("b", rng, (32, 30, 8), (0.7, 0.7, 3.0)).image[0]
    study = generate_uid()
    return [(first, write_series(folder, first, LPS @ np.diag([*SPACING, 1.0]), series_number=2,
                                 description="axial", study_uid=study, intercept=-1024, seed=1)),
            (second, write_series(folder, second, oblique_affine((0.7, 0.7, 3.0)), series_number=5,
                                  description="T2 tse", study_uid=study, intercept=-1024, seed=2))]
