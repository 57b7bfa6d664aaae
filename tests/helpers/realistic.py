"""Small, realistic datasets for tests, written in MSD or nnU-Net v2 layout.

Files are NIfTI by default; ``.nrrd`` (pynrrd) and ``.mha``/``.mhd`` (itk) need the ``formats`` extra.

Every generator builds its volumes in **RAS voxel order** (axis 0 = R, 1 = A, 2 = S): ``shape`` is
in voxels and ``spacing`` in mm along those axes. Each file is then stored reoriented to
``orientation`` (e.g. ``"LPS"``, DICOM's convention, or a permuted ``"PIR"``), so files carry a
non-trivial affine while the values a reader should recover in RAS order are exactly those asked
for. ``spacing`` may also be a list of per-case spacings (cycled), to make spacings vary.

Generators are deterministic for a given ``seed``. Typical use::

    from tests.helpers.realistic import write_ct_dataset
    root = write_ct_dataset(tmp_path / "ct", fmt="nnunet", num_cases=6)
    info = load_dataset(root, "nnunet")
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
from nibabel.orientations import axcodes2ornt, ornt_transform

Spacing = tuple[float, float, float]
Shape = tuple[int, int, int]
FORMATS = ("msd", "nnunet")
NIFTI_ENDINGS = (".nii.gz", ".nii")


@dataclass
class SyntheticCase:
    """One generated case, in RAS voxel order."""

    case: str
    image: np.ndarray
    """(C, X, Y, Z) intensities (int16 HU for CT, float32 otherwise)."""
    label: np.ndarray
    """(X, Y, Z) uint8 label values."""
    spacing: Spacing
    """mm along X, Y, Z."""


def _reoriented(array: np.ndarray, spacing: Sequence[float], orientation: str,
                origin: Sequence[float]) -> nib.Nifti1Image:
    """``array`` (RAS voxel order) as a NIfTI image whose voxel axes are stored in ``orientation``."""
    affine = np.diag([*map(float, spacing), 1.0])
    affine[:3, 3] = origin
    image = nib.Nifti1Image(array, affine)
    return image.as_reoriented(ornt_transform(axcodes2ornt("RAS"), axcodes2ornt(tuple(orientation))))


def save_nifti(path: str | Path, array: np.ndarray, spacing: Sequence[float], orientation: str = "RAS",
               origin: Sequence[float] = (0.0, 0.0, 0.0)) -> Path:
    """Write ``array`` ((X, Y, Z) or (X, Y, Z, C), RAS voxel order) stored in ``orientation`` axis codes.

    The array keeps its dtype (int16 stays int16, no scaling); qform and sform are both set.
    """
    path = Path(path)
    image = _reoriented(array, spacing, orientation, origin)
    image.set_qform(image.affine, code=1)
    image.set_sform(image.affine, code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(image, path)
    return path


def _lps_geometry(affine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spacing (3,), direction (3, 3; columns are the voxel axes) and origin (3,) in ITK's LPS world."""
    lps = np.diag([-1.0, -1.0, 1.0]) @ affine[:3]
    spacing = np.linalg.norm(lps[:, :3], axis=0)
    return spacing, lps[:, :3] / spacing, lps[:, 3]


def _save_nrrd(path: Path, image: nib.Nifti1Image) -> None:
    import nrrd  # pynrrd, from the ``formats`` extra

    spacing, direction, origin = _lps_geometry(image.affine)
    header = {"space": "left-posterior-superior", "space directions": (direction * spacing).T,
              "space origin": origin, "encoding": "gzip"}
    nrrd.write(str(path), np.asarray(image.dataobj), header)


def _save_itk(path: Path, image: nib.Nifti1Image) -> None:
    import itk  # itk-io, from the ``formats`` extra

    spacing, direction, origin = _lps_geometry(image.affine)
    # ITK's numpy view is (Z, Y, X): reverse the voxel axes
    itk_image = itk.image_from_array(np.ascontiguousarray(np.asarray(image.dataobj).transpose(2, 1, 0)))
    itk_image.SetSpacing(spacing.tolist())
    itk_image.SetOrigin(origin.tolist())
    itk_image.SetDirection(itk.matrix_from_array(np.ascontiguousarray(direction)))
    itk.imwrite(itk_image, str(path), compression=True)


def save_image(path: str | Path, array: np.ndarray, spacing: Sequence[float], orientation: str = "RAS",
               origin: Sequence[float] = (0.0, 0.0, 0.0)) -> Path:
    """:func:`save_nifti`, or by ``path``'s ending a ``.nrrd`` (pynrrd) or ``.mha``/``.mhd`` (itk) file of the
    same voxels and world geometry. Non-NIfTI files must be 3D (one file per channel)."""
    path = Path(path)
    if path.name.endswith(NIFTI_ENDINGS):
        return save_nifti(path, array, spacing, orientation, origin)
    if array.ndim != 3:
        raise ValueError(f"{path}: only 3D arrays are written as {path.suffix}; use the nnunet layout for channels")
    writers = {".nrrd": _save_nrrd, ".mha": _save_itk, ".mhd": _save_itk}
    if path.suffix not in writers:
        raise ValueError(f"{path}: unsupported ending, expected one of {(*NIFTI_ENDINGS, *writers)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    writers[path.suffix](path, _reoriented(array, spacing, orientation, origin))
    return path


def write_dataset(root: str | Path, cases: Sequence[SyntheticCase], channel_names: Sequence[str],
                  labels: Sequence[str] | Mapping[str, Any], fmt: str = "msd", orientation: str = "RAS",
                  name: str = "synthetic", file_ending: str = ".nii.gz",
                  extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``cases`` and a ``dataset.json`` under ``root`` in ``fmt`` ("msd" or "nnunet"); returns root.

    MSD: ``imagesTr/CASE<ending>`` (4D, channels last, when multi-channel; NIfTI only). nnU-Net v2:
    ``imagesTr/CASE_0000<ending>`` ... one file per channel. Labels: ``labelsTr/CASE<ending>``.
    ``labels`` are the class names by index, background first, or nnU-Net's mapping name -> value (or list of values,
    for regions: nnU-Net layout only); ``extra`` adds keys to ``dataset.json`` (``regions_class_order``);
    ``file_ending`` picks the file type (see :func:`save_image`).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r}: expected one of {FORMATS}")
    root = Path(root)
    training = []
    for case in cases:
        geometry = (case.spacing, orientation, tuple(-0.5 * n * s for n, s in zip(case.label.shape, case.spacing)))
        save_image(root / "labelsTr" / f"{case.case}{file_ending}", case.label, *geometry)
        if fmt == "msd":
            array = case.image[0] if len(case.image) == 1 else np.moveaxis(case.image, 0, -1)
            save_image(root / "imagesTr" / f"{case.case}{file_ending}", array, *geometry)
            training.append({"image": f"./imagesTr/{case.case}{file_ending}",
                             "label": f"./labelsTr/{case.case}{file_ending}"})
        else:
            for channel, array in enumerate(case.image):
                save_image(root / "imagesTr" / f"{case.case}_{channel:04d}{file_ending}", array, *geometry)
    channels = {str(i): c for i, c in enumerate(channel_names)}
    values = dict(labels) if isinstance(labels, Mapping) else {n: i for i, n in enumerate(labels)}
    if fmt == "msd":
        meta = {"name": name, "tensorImageSize": "4D" if len(channel_names) > 1 else "3D",
                "modality": channels, "labels": {str(v): n for n, v in values.items()},
                "numTraining": len(cases), "numTest": 0, "training": training, "test": []}
    else:
        meta = {"name": name, "channel_names": channels, "labels": values,
                "numTraining": len(cases), "file_ending": file_ending}
    meta.update(extra or {})
    (root / "dataset.json").write_text(json.dumps(meta, indent=2))
    return root


def _per_case(value: Sequence, index: int) -> tuple:
    """``value`` if it is one spacing/shape, else its ``index``-th entry (cycled)."""
    return tuple(value) if np.isscalar(value[0]) else tuple(value[index % len(value)])


def _ellipsoid(shape: Shape, center: Sequence[float], radii: Sequence[float]) -> np.ndarray:
    """(X, Y, Z) bool mask; ``center`` and ``radii`` are fractions of the field of view per axis."""
    grids = np.meshgrid(*[(np.arange(n) + 0.5) / n for n in shape], indexing="ij", sparse=True)
    return sum(((g - c) / r) ** 2 for g, c, r in zip(grids, center, radii)) <= 1.0


def _cylinder(shape: Shape, center: Sequence[float], radii: Sequence[float]) -> np.ndarray:
    """(X, Y, Z) bool elliptic cylinder along S; ``center``/``radii`` are in-plane FOV fractions."""
    in_plane = _ellipsoid((shape[0], shape[1], 1), (*center, 0.5), (*radii, 1.0))
    return np.broadcast_to(in_plane, shape)


def ct_case(case: str, rng: np.random.Generator, shape: Shape, spacing: Spacing,
            lesion_size: float = 0.4) -> SyntheticCase:
    """An abdominal-CT-like int16 volume in HU: air -1000, soft tissue ~40, a vertebra ~700, an organ
    ~60 HU (label 1) holding a darker lesion ~10 HU (label 2), its radii ``lesion_size`` times the organ's."""
    hu = np.full(shape, -1000.0) + rng.normal(0, 5, shape)
    body = _cylinder(shape, (0.5, 0.5), (0.42, 0.32))
    hu[body] = rng.normal(40, 15, int(body.sum()))
    bone = _cylinder(shape, (0.5, 0.7), (0.06, 0.06))
    hu[bone] = rng.normal(700, 120, int(bone.sum()))
    center = (0.38 + rng.uniform(-0.03, 0.03), 0.45 + rng.uniform(-0.03, 0.03), 0.5)
    radii = np.array([0.17, 0.15, 0.32]) * rng.uniform(0.85, 1.15)
    organ = _ellipsoid(shape, center, radii)
    lesion = _ellipsoid(shape, center, radii * lesion_size)
    hu[organ] = rng.normal(60, 10, int(organ.sum()))
    hu[lesion] = rng.normal(10, 10, int(lesion.sum()))
    label = organ.astype(np.uint8) + lesion.astype(np.uint8)
    image = np.clip(np.rint(hu), -1024, 3071).astype(np.int16)[None]
    return SyntheticCase(case, image, label, spacing)


def mri_case(case: str, rng: np.random.Generator, shape: Shape, spacing: Spacing,
             contrasts: Sequence[tuple[float, float]] = ((0.5, 0.85),)) -> SyntheticCase:
    """An MRI-like float32 volume in an arbitrary scale: a head-like ellipsoid with a smooth bias
    field and a structure (label 1), Rician-like background noise. ``contrasts`` gives, per
    channel, the (tissue, structure) intensity relative to the case's random scale."""
    head = _ellipsoid(shape, (0.5, 0.5, 0.5), (0.42, 0.45, 0.45))
    center = 0.5 + rng.uniform(-0.05, 0.05, 3)
    structure = _ellipsoid(shape, center, np.array([0.15, 0.13, 0.18]) * rng.uniform(0.85, 1.15))
    bias = 1 + 0.2 * np.linspace(-1, 1, shape[0])[:, None, None] * rng.uniform(-1, 1)
    channels = []
    for tissue, target in contrasts:
        scale = rng.uniform(200, 3000)
        volume = np.where(head, tissue, 0.0) + np.where(structure & head, target - tissue, 0.0)
        noisy = np.abs(volume * bias + rng.normal(0, 0.03, shape) + 1j * rng.normal(0, 0.03, shape))
        channels.append((noisy * scale).astype(np.float32))
    return SyntheticCase(case, np.stack(channels), (structure & head).astype(np.uint8), spacing)


def _write(root: str | Path, fmt: str, num_cases: int, prefix: str, make, shape, spacing,
           orientation: str, seed: int, channel_names: Sequence[str], labels: Sequence[str],
           file_ending: str = ".nii.gz") -> Path:
    rng = np.random.default_rng(seed)
    cases = [make(f"{prefix}_{i:03d}", rng, _per_case(shape, i), _per_case(spacing, i))
             for i in range(num_cases)]
    return write_dataset(root, cases, channel_names, labels, fmt, orientation, name=prefix, file_ending=file_ending)


def write_ct_dataset(root: str | Path, fmt: str = "msd", num_cases: int = 10,
                     shape: Shape | Sequence[Shape] = (64, 64, 20),
                     spacing: Spacing | Sequence[Spacing] = (0.7, 0.7, 5.0),
                     orientation: str = "LPS", seed: int = 0, file_ending: str = ".nii.gz",
                     lesion_size: float = 0.4) -> Path:
    """Anisotropic int16 CT (HU), stored LPS by default; classes background, organ, lesion (its radii
    ``lesion_size`` times the organ's)."""
    make = partial(ct_case, lesion_size=lesion_size)
    return _write(root, fmt, num_cases, "ct", make, shape, spacing, orientation, seed,
                  ["CT"], ["background", "organ", "lesion"], file_ending)


def write_ct_mosaic(image: str | Path, label: str | Path, tiles: Sequence[int] = (8, 8, 3),
                    tile: Shape = (64, 64, 20), spacing: Spacing = (0.7, 0.7, 5.0), orientation: str = "LPS",
                    seed: int = 7) -> tuple[Path, Path]:
    """A large CT scan (and its label) of cases of :func:`write_ct_dataset`'s kind side by side, each of ``tile``
    voxels, on the ``tiles`` grid cells that an elliptic body (radii 0.42 x 0.32 of the field of view, as a CT's)
    covers, air in the others: a scan of ``tiles * tile`` voxels (8 x 8 x 3 tiles: 512 x 512 x 60) whose every part
    looks like the cases a network trained on :func:`write_ct_dataset` saw, with air in the corners as a CT's."""
    rng = np.random.default_rng(seed)
    shape = tuple(n * t for n, t in zip(tiles, tile))
    hu = np.clip(np.rint(rng.normal(-1000, 5, shape)), -1024, 3071).astype(np.int16)
    labels = np.zeros(shape, np.uint8)
    for index in np.ndindex(*tiles):
        x, y = ((index[axis] + 0.5) / tiles[axis] - 0.5 for axis in (0, 1))
        if (x / 0.42) ** 2 + (y / 0.32) ** 2 <= 1:
            case = ct_case("tile", rng, tile, spacing)
            where = tuple(slice(i * t, (i + 1) * t) for i, t in zip(index, tile))
            hu[where], labels[where] = case.image[0], case.label
    origin = tuple(-0.5 * n * s for n, s in zip(shape, spacing))
    return save_image(image, hu, spacing, orientation, origin), save_image(label, labels, spacing, orientation, origin)


def write_mri_dataset(root: str | Path, fmt: str = "msd", num_cases: int = 6,
                      shape: Shape | Sequence[Shape] = (48, 48, 40),
                      spacing: Spacing | Sequence[Spacing] = (1.0, 1.0, 1.0),
                      orientation: str = "RAS", seed: int = 0, file_ending: str = ".nii.gz") -> Path:
    """Isotropic float32 MRI-like data in an arbitrary per-case scale; classes background, structure."""
    return _write(root, fmt, num_cases, "mri", mri_case, shape, spacing, orientation, seed,
                  ["T1"], ["background", "structure"], file_ending)


SAGITTAL_SHAPE, SAGITTAL_SPACING = (12, 48, 40), (4.0, 0.8, 0.8)
"""Defaults of :func:`write_sagittal_dataset`: thick along R, so 2D slices are sagittal (across axis 0);
A and S differ in size, so a slice's two axes can be told apart."""


def write_sagittal_dataset(root: str | Path, fmt: str = "msd", num_cases: int = 4,
                           shape: Shape | Sequence[Shape] = SAGITTAL_SHAPE,
                           spacing: Spacing | Sequence[Spacing] = SAGITTAL_SPACING,
                           orientation: str = "LPS", seed: int = 0) -> Path:
    """MRI-like volumes acquired in thick sagittal slices: the thick axis is R (axis 0), not S."""
    return _write(root, fmt, num_cases, "sag", mri_case, shape, spacing, orientation, seed,
                  ["T2"], ["background", "structure"])


def write_thin_dataset(root: str | Path, fmt: str = "msd", num_cases: int = 4,
                       shape: Shape | Sequence[Shape] = (64, 64, 12),
                       spacing: Spacing | Sequence[Spacing] = (0.9, 0.9, 3.0),
                       orientation: str = "LPS", seed: int = 0) -> Path:
    """MRI-like volumes of only 12 slices: thinner than a 32-slice patch."""
    return _write(root, fmt, num_cases, "thin", mri_case, shape, spacing, orientation, seed,
                  ["T2"], ["background", "structure"])


def write_two_channel_dataset(root: str | Path, fmt: str = "msd", num_cases: int = 4,
                              shape: Shape | Sequence[Shape] = (40, 40, 24),
                              spacing: Spacing | Sequence[Spacing] = (0.6, 0.6, 3.0),
                              orientation: str = "LPS", seed: int = 0) -> Path:
    """Two MRI channels (T2, ADC) with different contrasts and scales: MSD stores them as one 4D
    file (channels last), nnU-Net as two files per case."""

    def make(case: str, rng: np.random.Generator, shape: Shape, spacing: Spacing) -> SyntheticCase:
        return mri_case(case, rng, shape, spacing, contrasts=((0.5, 0.85), (0.7, 0.3)))

    return _write(root, fmt, num_cases, "mc", make, shape, spacing, orientation, seed,
                  ["T2", "ADC"], ["background", "structure"])


BRATS_LABELS = {"background": 0, "edema": 1, "non-enhancing": 2, "enhancing": 4, "ignore": 5}
"""The label values of :func:`write_brats_dataset`: BraTS's gap at 3, and an ``ignore`` label above the others."""
BRATS_REGIONS = {"whole tumor": [1, 2, 4], "tumor core": [2, 4], "enhancing tumor": [4]}
"""Nested regions (whole tumour > tumour core > enhancing tumour), as label values."""
BRATS_ORDER = [1, 2, 4]
"""``regions_class_order``: the value each region writes, the inner ones last."""
BRATS_CHANNELS = ["T1", "T1ce", "T2", "FLAIR"]


def brats_case(case: str, rng: np.random.Generator, shape: Shape, spacing: Spacing,
               ignore: bool = False) -> SyntheticCase:
    """A four-channel glioma-like MRI case: a head with a tumour of edema (1) around a core of non-enhancing tissue
    (2) inside an enhancing shell (4). ``ignore``: the voxels of the first half along R (tumour included) are
    unannotated, label 5, so that any patch at least half as wide holds some. Each channel shows the compartments with
    its own contrast."""
    head = _ellipsoid(shape, (0.5, 0.5, 0.5), (0.45, 0.45, 0.45))
    center, scale = 0.5 + rng.uniform(-0.06, 0.06, 3), rng.uniform(0.9, 1.1)
    whole = _ellipsoid(shape, center, np.array([0.3, 0.28, 0.4]) * scale) & head
    core = _ellipsoid(shape, center, np.array([0.2, 0.18, 0.28]) * scale) & head
    necrosis = _ellipsoid(shape, center, np.array([0.1, 0.09, 0.14]) * scale)
    label = np.zeros(shape, np.uint8)
    label[whole], label[core], label[necrosis] = 1, 4, 2
    contrasts = {"T1": (0.6, 0.5, 0.4, 0.5), "T1ce": (0.6, 0.6, 0.4, 1.0), "T2": (0.5, 0.9, 1.0, 0.8),
                 "FLAIR": (0.5, 1.0, 0.7, 0.8)}  # tissue, edema, non-enhancing, enhancing
    channels = []
    for tissue, edema, inner, enhancing in contrasts.values():
        values = np.where(head, tissue, 0.0)
        for value, mask in ((edema, label == 1), (inner, label == 2), (enhancing, label == 4)):
            values[mask] = value
        channels.append((values + rng.normal(0, 0.03, shape)).astype(np.float32) * rng.uniform(300, 1200))
    if ignore:
        label[: shape[0] // 2] = BRATS_LABELS["ignore"]
    return SyntheticCase(case, np.stack(channels), label, spacing)


def write_brats_dataset(root: str | Path, fmt: str = "msd", num_cases: int = 4,
                        shape: Shape | Sequence[Shape] = (24, 24, 12),
                        spacing: Spacing | Sequence[Spacing] = (1.0, 1.0, 2.0),
                        orientation: str = "LPS", seed: int = 0, ignore_cases: Sequence[int] = (0,)) -> Path:
    """BraTS-like data: four channels (:data:`BRATS_CHANNELS`), labels 0/1/2/4 and an ignore label 5 in the cases
    ``ignore_cases``. MSD declares the labels by value (regions come from ``data.regions``); nnU-Net v2 declares
    nnU-Net's region syntax (:data:`BRATS_REGIONS` with ``regions_class_order`` :data:`BRATS_ORDER`)."""
    rng = np.random.default_rng(seed)
    cases = [brats_case(f"brats_{i:03d}", rng, _per_case(shape, i), _per_case(spacing, i), i in ignore_cases)
             for i in range(num_cases)]
    if fmt == "msd":
        return write_dataset(root, cases, BRATS_CHANNELS, BRATS_LABELS, fmt, orientation, name="brats")
    labels = {"background": 0, **BRATS_REGIONS, "ignore": BRATS_LABELS["ignore"]}
    return write_dataset(root, cases, BRATS_CHANNELS, labels, fmt, orientation, name="brats",
                         extra={"regions_class_order": BRATS_ORDER})
