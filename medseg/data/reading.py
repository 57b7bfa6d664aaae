"""The one image reader: files as stored (verification) and in RAS voxel order (planning, training, evaluation).

Axis convention: "RAS voxel order" means axis 0 runs left -> right (R), axis 1 posterior -> anterior (A),
axis 2 inferior -> superior (S), the order MONAI's ``Orientationd(axcodes="RAS")`` produces. Files stored in
another orientation (DICOM's LPS, permuted axes) are permuted and flipped into it with nibabel's orientation
tools, and :func:`from_ras` takes voxels back to a file's own order.

- :func:`read_file`: a file's voxels and affine as stored (NIfTI through nibabel, ``.nrrd``/``.mha``/``.mhd``
  through MONAI's readers, which need the ``formats`` extra), a DICOM series folder's (:mod:`medseg.data.dicom`,
  the ``dicom`` extra), or those of a nibabel image held in memory (the
  Python API, :func:`medseg.predict`, passes arrays this way: no temporary file). It is the one gate of every
  reader path (training, planning, evaluation, cross-validation, ``predict()``, visualisation, the data check):
  a ``.gz`` file is read to the end of its stream (its CRC checked), and voxels that are empty, not numbers or
  not finite, or an affine that is singular or not finite, are refused (:func:`check_voxels`);
- :func:`check_label_values`: a label file's voxels as whole, non-negative class values, optionally only the declared
  ones;
- :func:`affine_difference`: how two files' geometries (spacing, direction, origin) differ, if they do (the data
  check and scoring compare an image's with its label's);
- :func:`read_ras`: the same voxels in RAS order, with the RAS affine;
- :func:`read_case`: a datalist entry (image file or one file per channel, optional label) in RAS order;
- :class:`LoadCased`: :func:`read_case` as the first MONAI transform of every chain, so planning, training,
  validation and evaluation see the same axes by construction.
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import nibabel as nib
import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import LoadImage, MapTransform
from nibabel.orientations import apply_orientation, axcodes2ornt, inv_ornt_aff, io_orientation, ornt_transform
from nibabel.spatialimages import SpatialImage

from medseg.data.dicom import DicomSeries, is_dicom_file, read_series
from medseg.errors import DatasetError, ImageReadError, one_line

IMAGE, LABEL = "image", "label"
"""The keys of a case's image file(s) and label file in a datalist entry, and of their tensors in a chain."""
NIBABEL_ENDINGS = (".nii.gz", ".nii")
FORMAT_PACKAGES = {".nrrd": ("nrrd", "pynrrd"), ".mha": ("itk", "itk-io"), ".mhd": ("itk", "itk-io")}
"""Non-NIfTI endings MONAI reads through an optional package: ending -> (module, pip name)."""
IMAGE_ENDINGS = (*NIBABEL_ENDINGS, *FORMAT_PACKAGES)
"""Every image file ending medseg reads."""
ImageSource = str | Path | SpatialImage | DicomSeries
"""What the readers take: a file path, a DICOM series folder (its path, or one :class:`DicomSeries` of a folder that
holds several), or a nibabel image held in memory."""
_RAS = axcodes2ornt("RAS")
INTENSITY_MIN = "intensity_min"
"""The image meta key of :class:`LoadCased`: ``(C,)`` float64, each channel's least value as read (before any
resampling or normalisation)."""


def _missing_reader_hint(path: str | Path) -> str:
    """``; reading .X needs P: pip install ...`` when ``path``'s format needs a package that is not installed."""
    module, package = FORMAT_PACKAGES.get(Path(path).suffix.lower(), (None, None))
    if module is None or importlib.util.find_spec(module) is not None:
        return ""
    return f"; reading {Path(path).suffix} needs {package}: pip install 'medseg[formats]'"


def _read_with_monai(path: str) -> tuple[np.ndarray, np.ndarray]:
    data, meta = LoadImage(image_only=False, dtype=None, ensure_channel_first=False)(path)
    return np.asarray(data), np.asarray(meta["affine"], dtype=np.float64)


def source_name(source: ImageSource) -> str:
    """How messages name an image: its path (an image in memory: its file name, if it has one)."""
    if isinstance(source, SpatialImage):
        return source.get_filename() or "the image in memory"
    return str(source)


def _read_nifti(path: str) -> tuple[np.ndarray, np.ndarray]:
    """A NIfTI file's voxels (in memory) and affine; a ``.gz`` stream is read to its end, so that gzip checks its
    CRC and length (nibabel alone stops after the voxels, so a corrupt stream would pass). One decompression."""
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as stream:
        header_size = stream.read(4)  # NIfTI-2 headers are 540 bytes, NIfTI-1's 348, in either byte order
        nifti2 = 540 in (int.from_bytes(header_size, "little"), int.from_bytes(header_size, "big"))
        stream.seek(0)
        image = (nib.Nifti2Image if nifti2 else nib.Nifti1Image).from_stream(stream)
        array = np.asarray(image.dataobj)
        stream.read()  # the rest of the stream: gzip raises BadGzipFile on a CRC or length mismatch
    return array, np.asarray(image.affine, dtype=np.float64)


def _count_text(array: np.ndarray) -> str:
    """``"3 NaN and 2 Inf"``: the non-finite voxels of a float ``array`` that has some."""
    nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
    return " and ".join(text for count, text in ((nan, f"{nan} NaN"), (inf, f"{inf} Inf")) if count)


def voxels_problem(array: np.ndarray, affine: np.ndarray) -> str | None:
    """Why medseg cannot use these voxels and affine, or None: no voxels, voxels that are not numbers (bool,
    complex, text), NaN or Inf voxels, or a ``(4, 4)`` voxel-to-world affine that is not finite or is singular
    (no voxel size or direction). The min/max test is cheap; counting happens only on failure."""
    if array.size == 0:
        return f"no voxels (shape {array.shape})"
    if array.dtype.kind not in "iuf":
        return f"voxels of type {array.dtype}; expected numbers (integers or floats)"
    if array.dtype.kind == "f" and not (np.isfinite(array.min()) and np.isfinite(array.max())):
        return f"contains {_count_text(array)} voxels (of {array.size}); every voxel must be a finite number"
    matrix = np.asarray(affine, dtype=np.float64)
    if not np.isfinite(matrix).all():
        return f"its voxel-to-world affine is not finite: {matrix[:3].tolist()}"
    if abs(np.linalg.det(matrix[:3, :3])) < 1e-12:
        return f"its voxel-to-world affine is singular (a zero voxel size or parallel axes): {matrix[:3].tolist()}"
    return None


def check_voxels(array: np.ndarray, affine: np.ndarray, source: ImageSource | str) -> None:
    """Refuse voxels and an affine :func:`voxels_problem` finds a problem in.

    Raises:
        ImageReadError: naming ``source`` (a path, an image in memory, or what the caller calls it).
    """
    problem = voxels_problem(array, affine)
    if problem is not None:
        raise ImageReadError(source if isinstance(source, str | Path) else source_name(source), problem)


def read_file(path: ImageSource) -> tuple[np.ndarray, np.ndarray]:
    """A file's voxels in its own dtype and axis order, and its ``(4, 4)`` voxel-to-world (RAS mm) affine.

    NIfTI goes through nibabel's ``dataobj`` (integer labels stay integer, scaling applied as stored), a ``.gz``
    file read to the end of its stream; other formats through MONAI's ``LoadImage``, whose affine is converted to
    RAS world coordinates as NIfTI's are. A folder is a DICOM series (:func:`medseg.data.dicom.read_series`: voxels
    ``(columns, rows, slices)`` in the modality's units, the affine from the slice positions). A nibabel image in
    memory gives its array and affine as they are. Every source then passes :func:`check_voxels`.

    Raises:
        ImageReadError: the file is missing or unreadable (a corrupt gzip stream included): the message names it
            (and the package to install when its format needs one that is missing), the reader's exception is the
            cause; a series that is not one regular volume (:mod:`medseg.data.dicom`); a single DICOM file (its
            folder is the series); or voxels or an affine that are unusable (:func:`voxels_problem`).
    """
    if isinstance(path, SpatialImage):
        array, affine = np.asarray(path.dataobj), np.asarray(path.affine, dtype=np.float64)
    elif isinstance(path, DicomSeries) or Path(path).is_dir():
        array, affine = read_series(path)
    elif Path(path).is_file() and not str(path).endswith(IMAGE_ENDINGS) and is_dicom_file(Path(path)):
        raise ImageReadError(path, "a DICOM file: give the folder of its series, which medseg reads as one volume")
    elif not Path(path).is_file():
        raise ImageReadError(path, "file not found")
    else:
        try:
            array, affine = (_read_nifti if str(path).endswith(NIBABEL_ENDINGS) else _read_with_monai)(str(path))
        except Exception as err:  # the file's bytes decide what nibabel, gzip, pynrrd or ITK raise: all "unreadable"
            raise ImageReadError(path, f"cannot read file ({one_line(err)}){_missing_reader_hint(path)}") from err
    check_voxels(array, affine, path)
    return array, affine


def drop_trailing_singletons(array: np.ndarray) -> np.ndarray:
    """``array`` without its size-1 axes after the third: ``(X, Y, Z, 1)`` is a 3D volume (a view)."""
    while array.ndim > 3 and array.shape[-1] == 1:
        array = array[..., 0]
    return array


def nifti_proxy(path: str | Path) -> SpatialImage:
    """A NIfTI file's image with its header read and its voxels left on disk (nibabel's proxy): shape, affine and
    header without a decompression of the voxels.

    Raises:
        ImageReadError: the file is missing, or nibabel cannot read its header (an empty file, a ``.nii.gz`` that is no
            gzip stream, another format under a NIfTI ending); the message names it, nibabel's exception is the cause.
    """
    try:
        return nib.load(str(path))
    except Exception as err:  # the file's bytes decide what nibabel or gzip raise: all "unreadable"
        raise ImageReadError(path, f"cannot read file ({one_line(err)})") from err


def nifti_header(path: str | Path) -> nib.Nifti1Header | None:
    """The header of a NIfTI file (its voxels are not read), to write an output onto its grid; None for others.

    Raises:
        ImageReadError: see :func:`nifti_proxy`.
    """
    return nifti_proxy(path).header if str(path).endswith(NIBABEL_ENDINGS) else None


class RasImage(NamedTuple):
    """One image file in RAS voxel order."""

    array: np.ndarray
    """(X, Y, Z) or (X, Y, Z, C): the file's voxels in its own dtype, spatial axes permuted/flipped to RAS."""
    affine: np.ndarray
    """(4, 4) voxel-to-world (RAS mm) affine of ``array``."""
    file_affine: np.ndarray
    """(4, 4) the file's own affine, which :func:`from_ras` needs to go back to its voxel order."""


def read_ras(path: ImageSource) -> RasImage:
    """Read ``path`` (:func:`read_file`) and reorder its first three axes to RAS, as MONAI's ``Orientationd`` does.

    Size-1 axes after the third are dropped (:func:`drop_trailing_singletons`).

    Raises:
        ImageReadError: missing or unreadable file.
        DatasetError: the image is not 3D (or 4D with channels last).
    """
    data, affine = read_file(path)
    data = drop_trailing_singletons(data)
    if data.ndim not in (3, 4):
        raise DatasetError(f"{source_name(path)}: expected a 3D image (or 4D, channels last), got shape {data.shape}")
    to_ras = ornt_transform(io_orientation(affine), _RAS)
    return RasImage(apply_orientation(data, to_ras), affine @ inv_ornt_aff(to_ras, data.shape[:3]), affine)


def from_ras(array: np.ndarray, file_affine: np.ndarray) -> np.ndarray:
    """``array`` (X, Y, Z, ...) in RAS voxel order back in the voxel order of the file whose affine is
    ``file_affine``: the inverse of :func:`read_ras`'s reordering (a view, trailing axes kept)."""
    return apply_orientation(array, ornt_transform(_RAS, io_orientation(file_affine)))


@dataclass
class CaseVolume:
    """One case as read from disk, in RAS voxel order."""

    image: np.ndarray
    """(C, X, Y, Z) in the file's dtype (e.g. int16 for CT); cast before arithmetic."""
    label: np.ndarray | None
    """(X, Y, Z) class indices (the file's integer dtype, int64 for a float file), or None without label."""
    affine: np.ndarray
    """(4, 4) voxel-to-world (RAS mm) affine of ``image`` and ``label`` (the first image file's)."""
    file_affine: np.ndarray
    """(4, 4) the first image file's own affine (its axis order)."""

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Voxel size in mm along X, Y, Z (RAS order)."""
        return tuple(float(s) for s in nib.affines.voxel_sizes(self.affine))

    @property
    def orientation(self) -> str:
        """The file's axis codes before reorientation, e.g. ``"LPS"``."""
        return "".join(nib.aff2axcodes(self.file_affine))


def image_paths(entry: Mapping[str, Any]) -> list[str]:
    """The image file(s) of a datalist entry: one path, or one per channel (nnU-Net layout)."""
    return [str(p) for p in image_sources(entry)]


def image_sources(entry: Mapping[str, Any]) -> list[ImageSource]:
    """The image(s) of a datalist entry as given: paths, or nibabel images in memory (one per channel)."""
    image = entry[IMAGE]
    return list(image) if isinstance(image, list | tuple) else [image]


def format_values(values: Sequence[float] | np.ndarray) -> str:
    """``"(0.5, 2.7)"``: numbers for a message, 4 significant digits."""
    return "(" + ", ".join(f"{v:.4g}" for v in np.ravel(values)) + ")"


def _decompose(affine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spacing (column norms), direction (unit columns) and origin of a 4x4 affine."""
    matrix = affine[:3, :3]
    spacing = np.linalg.norm(matrix, axis=0)
    direction = matrix / np.where(spacing == 0, 1.0, spacing)
    return spacing, direction, affine[:3, 3]


def affine_difference(reference: np.ndarray, other: np.ndarray, tolerance: float = 1e-3) -> str | None:
    """Explain how ``other`` differs from ``reference`` beyond ``tolerance``, or None if they agree.

    Spacing is compared relatively, direction cosines absolutely, and the origin relative to the
    smallest voxel size, so the tolerance means the same for 0.5 mm and 5 mm voxels.
    """
    ref_spacing, ref_direction, ref_origin = _decompose(reference)
    spacing, direction, origin = _decompose(other)
    voxel = max(float(ref_spacing.min()), 1e-6)
    differences = []
    if np.any(np.abs(spacing - ref_spacing) > tolerance * np.maximum(ref_spacing, 1e-6)):
        differences.append(f"spacing {format_values(spacing)} vs {format_values(ref_spacing)}")
    if np.max(np.abs(direction - ref_direction)) > tolerance:
        differences.append(f"direction {format_values(direction)} vs {format_values(ref_direction)}")
    if np.max(np.abs(origin - ref_origin)) > tolerance * voxel:
        differences.append(f"origin {format_values(origin)} vs {format_values(ref_origin)}")
    return "; ".join(differences) or None


def describe_values(names: Mapping[int, str]) -> str:
    """``"0 background, 1 edema, 4 enhancing"``."""
    return ", ".join(f"{value} {name}" for value, name in sorted(names.items()))


def label_values(array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(whole-number values present, other values present: fractions, NaN, Inf) of a label array, sorted."""
    if array.size == 0:
        return np.array([], np.int64), np.array([])
    non_negative_int = array.dtype.kind in "ub" or (array.dtype.kind == "i" and array.min() >= 0)
    if non_negative_int and int(array.max()) < 1 << 16:  # bincount is much faster than sorting a volume
        counts = np.bincount(array.ravel().astype(np.intp, copy=False))
        return np.flatnonzero(counts), np.array([])
    values = np.unique(array)
    if values.dtype.kind not in "fc":
        return values, np.array([])
    whole = np.isfinite(values) & (values == np.round(values))
    return values[whole].astype(np.int64), values[~whole]


def label_problems(array: np.ndarray, declared: Mapping[int, str] | None = None,
                   known_as: str = "dataset.json's labels") -> list[str]:
    """Why ``array`` is not a label map of ``declared``'s values (value -> name; None: any value), each one line:
    non-integer values, negative values, values not declared. Empty when it is one."""
    values, fractional = label_values(array)
    problems = []
    if fractional.size:
        problems.append(f"non-integer label values {format_values(fractional[:5])}"
                        f"{' ...' if fractional.size > 5 else ''}; labels must be whole numbers")
    if values.size and values[0] < 0:
        problems.append(f"negative label values {format_values(values[values < 0][:5])}")
    unknown = [int(v) for v in values if v >= 0 and declared is not None and int(v) not in declared]
    if unknown:
        problems.append(f"label values {format_values(unknown[:10])} are not in {known_as} "
                        f"({describe_values(declared or {})})")
    return problems


def check_label_values(array: np.ndarray, source: str | Path, declared: Mapping[int, str] | None = None,
                       known_as: str = "dataset.json's labels") -> np.ndarray:
    """``array`` (a label file's voxels) as integer class values: the file's integer dtype, or int64 for a float (or
    uint64) file holding whole numbers. The one label check of training, planning and scoring.

    Raises:
        ImageReadError: naming ``source``, with every problem :func:`label_problems` finds.
    """
    problems = label_problems(array, declared, known_as)
    if problems:
        raise ImageReadError(source, "; ".join(problems))
    return array if array.dtype.kind in "iu" and array.dtype != np.uint64 else array.astype(np.int64)


def _read_label(path: str, shape: tuple[int, ...]) -> np.ndarray:
    """(X, Y, Z) non-negative integer label map in RAS order (:func:`check_label_values`), checked against the image
    ``shape``."""
    label = read_ras(path).array
    if label.shape != shape:
        raise DatasetError(f"{path}: label shape {label.shape} (RAS) differs from the image's {shape}")
    return check_label_values(label, path)


def read_case(entry: Mapping[str, Any]) -> CaseVolume:
    """Read a datalist entry (``image`` path or per-channel paths, or images in memory; optional ``label``) in RAS
    order.

    An MSD multi-channel file is 4D with channels last; nnU-Net's are one 3D file per channel.

    Raises:
        DatasetError: a missing or unreadable file, channel files that differ in shape, a label whose shape
            differs from the image's or that holds negative or non-integer values; the message names the file or
            case.
    """
    volumes = [read_ras(source) for source in image_sources(entry)]
    first = volumes[0]
    if len(volumes) == 1:
        image = np.moveaxis(first.array, -1, 0) if first.array.ndim == 4 else first.array[None]
    else:
        shapes = {v.array.shape for v in volumes}
        if len(shapes) > 1 or first.array.ndim != 3:
            raise DatasetError(f"case {entry.get('case')}: channel files differ in shape or are not 3D: {shapes}")
        image = np.stack([v.array for v in volumes])
    label = _read_label(str(entry[LABEL]), image.shape[1:]) if entry.get(LABEL) else None
    return CaseVolume(image=image, label=label, affine=first.affine, file_affine=first.file_affine)


class LoadCased(MapTransform):
    """:func:`read_case` as a MONAI transform: a datalist entry's files become RAS ``MetaTensor`` s.

    ``image`` becomes (C, X, Y, Z) and ``label`` (with ``with_label``) (1, X, Y, Z), both float32 with the RAS
    affine, which ``Spacingd`` and the rest of a chain follow; the image's meta also holds its first file's
    ``original_affine`` (for :func:`from_ras`), path (``filename_or_obj``) and each channel's least value as read
    (:data:`INTENSITY_MIN`, ``(C,)``: what says whether a volume is in Hounsfield units). The result equals MONAI's
    ``LoadImaged`` + ``EnsureChannelFirstd`` + ``EnsureTyped(float32)`` + ``Orientationd("RAS")``
    (tests/data/test_reading.py), with the reading rule planning uses.
    """

    def __init__(self, with_label: bool = True) -> None:
        keys: Sequence[Hashable] = (IMAGE, LABEL) if with_label else (IMAGE,)
        super().__init__(keys)
        self.with_label = with_label

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """``data``: a datalist entry (``image`` and, with ``with_label``, ``label`` paths; ``case`` optional)."""
        if self.with_label and not data.get(LABEL):
            raise DatasetError(f"case {data.get('case')}: no label file")
        volume = read_case(data if self.with_label else {k: v for k, v in data.items() if k != LABEL})
        affine = torch.as_tensor(volume.affine, dtype=torch.float64)
        out = dict(data)
        meta = {"original_affine": volume.file_affine, "filename_or_obj": source_name(image_sources(data)[0]),
                INTENSITY_MIN: volume.image.reshape(len(volume.image), -1).min(axis=1).astype(np.float64)}
        out[IMAGE] = MetaTensor(torch.from_numpy(np.ascontiguousarray(volume.image, np.float32)), affine=affine,
                                meta=meta)
        if self.with_label:
            out[LABEL] = MetaTensor(torch.from_numpy(np.ascontiguousarray(volume.label[None], np.float32)),
                                    affine=affine.clone())
        return out
