"""DICOM series as input: read through the one reader, equal to the NIfTI volume they were written from.

The series are written by :mod:`tests.helpers.dicom` from NIfTI volumes of the realistic generator, by hand from the
standard's geometry rules, with the files shuffled on disk and their ``InstanceNumber`` s shuffled, a
``SliceThickness`` that is not the spacing, an oblique orientation, a rescale slope and intercept and an LPS volume:
what the reader gives for a series must equal what it gives for the NIfTI (voxels and affine, in the file's order and
in RAS). pydicom's own ``CT_small.dcm`` is read against the values of its header. Bad series are refused with one
line naming the folder.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom")

from medseg.data.datalist import load_dataset  # noqa: E402
from medseg.data.dicom import DicomSeries, series_folders, series_sources  # noqa: E402
from medseg.data.reading import ImageReadError, LoadCased, read_case, read_file, read_ras  # noqa: E402
from medseg.data.verify import verify_dataset  # noqa: E402
from medseg.inference.cases import find_cases  # noqa: E402
from medseg.planning.fingerprint import compute_fingerprint  # noqa: E402
from medseg.training.run import train  # noqa: E402
from tests.helpers.dicom import (  # noqa: E402
    GEOMETRIES,
    SEGMENTATION,
    SHAPE,
    oblique_affine,
    two_series_folder,
    write_ct_case,
    write_report,
    write_series,
)
from tests.helpers.realistic import ct_case  # noqa: E402
from tests.helpers.runs import micro_config  # noqa: E402

LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_series_reads_as_the_nifti_it_was_written_from(geometry: str, tmp_path: Path) -> None:
    case = write_ct_case(tmp_path, "case", geometry)
    expected, expected_affine = read_file(str(case.nifti))
    array, affine = read_file(str(case.series.folder))
    assert array.shape == SHAPE
    np.testing.assert_array_equal(array, expected)  # the rescaled values, slices in position order
    np.testing.assert_allclose(affine, expected_affine, atol=1e-6)
    # int16 HU for a whole-number slope and intercept (as the NIfTI), float32 for slope 0.5
    assert array.dtype == (np.float32 if geometry == "oblique" else np.int16)
    ras, expected_ras = read_ras(str(case.series.folder)), read_ras(str(case.nifti))
    np.testing.assert_array_equal(ras.array, expected_ras.array)
    np.testing.assert_allclose(ras.affine, expected_ras.affine, atol=1e-6)
    # the spacing between slices is the positions' step (2.5 mm), not the SliceThickness written (0.75 mm)
    volume = read_case({"image": str(case.series.folder)})
    assert volume.spacing == pytest.approx(read_case({"image": str(case.nifti)}).spacing, abs=1e-6)


def test_the_itk_reader_agrees(tmp_path: Path) -> None:
    """MONAI's ITKReader (GDCM sorts the slices by position too) gives the same voxels and affine for the oblique,
    shuffled, rescaled series."""
    pytest.importorskip("itk")
    from monai.transforms import LoadImage

    case = write_ct_case(tmp_path, "case", "oblique")
    array, affine = read_file(str(case.series.folder))
    itk_array, meta = LoadImage(reader="ITKReader", image_only=False)(str(case.series.folder))
    np.testing.assert_allclose(np.asarray(itk_array), array, atol=1e-4)
    np.testing.assert_allclose(np.asarray(meta["affine"]), affine, atol=1e-5)


def test_pydicoms_ct_small_is_a_one_slice_series(tmp_path: Path) -> None:
    source = Path(pydicom.data.get_testdata_file("CT_small.dcm"))
    folder = tmp_path / "ct_small"
    folder.mkdir()
    shutil.copy(source, folder / source.name)
    header = pydicom.dcmread(source)
    array, affine = read_file(str(folder))
    assert array.shape == (int(header.Columns), int(header.Rows), 1) == (128, 128, 1)
    hu = header.pixel_array.T.astype(np.float64) * float(header.RescaleSlope) + float(header.RescaleIntercept)
    np.testing.assert_array_equal(array[..., 0], hu)
    assert array.dtype == np.int16 and hu.min() == -896 and hu.max() == 1167
    row_spacing, column_spacing = map(float, header.PixelSpacing)
    expected = np.eye(4)
    expected[:3, 0] = np.asarray(header.ImageOrientationPatient[:3], float) * column_spacing
    expected[:3, 1] = np.asarray(header.ImageOrientationPatient[3:], float) * row_spacing
    expected[:3, 2] = [0.0, 0.0, float(header.SliceThickness)]  # one slice: its thickness along the normal
    expected[:3, 3] = np.asarray(header.ImagePositionPatient, float)
    np.testing.assert_allclose(affine, LPS @ expected, atol=1e-6)
    assert read_case({"image": str(folder)}).spacing == pytest.approx((0.661468, 0.661468, 5.0))


def test_several_series_in_one_folder_are_cases_of_their_own(tmp_path: Path) -> None:
    (first, _), (second, _) = two_series_folder(tmp_path / "input" / "study")
    single = write_ct_case(tmp_path, "single", "lps")
    shutil.move(single.series.folder, tmp_path / "input" / "single")
    (tmp_path / "input" / "notes").mkdir()  # a folder without DICOM files is no case
    (tmp_path / "input" / "notes" / "readme.txt").write_text("not an image")
    cases = find_cases(tmp_path / "input", "test", num_channels=1)
    assert [c.case for c in cases] == ["single", "study_s2_axial", "study_s5_T2_tse"]
    assert cases[0].image == str(tmp_path / "input" / "single")
    assert all(isinstance(c.image, DicomSeries) for c in cases[1:])
    np.testing.assert_array_equal(read_file(cases[1].image)[0], first)
    np.testing.assert_array_equal(read_file(cases[2].image)[0], second)
    np.testing.assert_array_equal(read_file(cases[0].image)[0], read_file(str(single.nifti))[0])
    # a folder that is one series is the case itself; a folder of several needs telling which
    assert [c.case for c in find_cases(tmp_path / "input" / "single", "test", 1)] == ["single"]
    with pytest.raises(ImageReadError, match=r"study: holds 2 series \(s2_axial, s5_T2_tse\); give each series"):
        read_file(str(tmp_path / "input" / "study"))


def test_dataset_json_naming_series_folders_checks_plans_and_trains(tmp_path: Path, one_thread: None) -> None:
    """An MSD dataset whose images are series folders: the data check passes, the fingerprint and the training chain
    see exactly the NIfTI cases, and a one-epoch training runs on it."""
    root = tmp_path / "ds"
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    training, nifti_entries = [], []
    for index, geometry in enumerate(("lps", "oblique", "lps")):
        name = f"ct_{index:03d}"
        case = write_ct_case(root / "imagesTr", name, geometry, seed=index)
        shutil.move(case.label, root / "labelsTr" / f"{name}.nii.gz")
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}.nii.gz"})
        nifti_entries.append({"image": str(case.nifti), "label": str(root / "labelsTr" / f"{name}.nii.gz")})
    (root / "dataset.json").write_text(json.dumps({
        "name": "series", "modality": {"0": "CT"}, "labels": {"0": "background", "1": "organ", "2": "lesion"},
        "training": training, "test": []}))
    info = load_dataset(root, "msd")
    assert [e["case"] for e in info.training] == ["ct_000", "ct_001", "ct_002"]
    report = verify_dataset(info, progress=False)
    assert not report.errors, report.errors
    for entry, nifti in zip(info.training, nifti_entries):
        series, expected = LoadCased()(entry), LoadCased()(nifti)
        for key in ("image", "label"):
            np.testing.assert_array_equal(series[key].numpy(), expected[key].numpy())
            np.testing.assert_allclose(series[key].affine.numpy(), expected[key].affine.numpy(), atol=1e-6)
    fingerprint = compute_fingerprint(info, progress=False)
    np.testing.assert_allclose([c["spacing"] for c in fingerprint["cases"]], [[0.8, 0.9, 2.5]] * 3, atol=1e-5)
    metrics = train(micro_config(tmp_path / "run", root, "data=msd", "recipe=light", "data.patch_size=[16,16,8]",
                                 "trainer.max_epochs=1", "data.fold=all"))
    assert metrics["status"] == "completed" and set(metrics["val_dice_per_class"]) == {"organ", "lesion"}


def _copy_with_new_uid(path: Path, name: str) -> Path:
    ds = pydicom.dcmread(path)
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    ds.save_as(path.parent / name)
    return path.parent / name


def _as_segmentation(path: Path) -> None:
    ds = pydicom.dcmread(path)
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = SEGMENTATION
    ds.save_as(path)


def make_bad(kind: str, folder: Path) -> None:
    """A folder ``kind`` of wrong: a series with a problem, or a non-image object."""
    if kind in ("report", "segmentation"):
        if kind == "report":
            write_report(folder / "report.dcm")
            return
        series = write_series(folder, ct_case("c", np.random.default_rng(0), (16, 16, 1), (1.0, 1.0, 2.0)).image[0],
                              np.diag([1.0, 1.0, 2.0, 1.0]), intercept=-1024)
        _as_segmentation(series.files[0])
        return
    volume = ct_case("c", np.random.default_rng(0), SHAPE, (0.8, 0.9, 2.5)).image[0]
    series = write_series(folder, volume, LPS @ np.diag([0.8, 0.9, 2.5, 1.0]), intercept=-1024)
    if kind == "gap":
        series.files[5].unlink()
    elif kind == "twice":
        shutil.copy(series.files[3], folder / "copy.dcm")
    elif kind == "same position":
        _copy_with_new_uid(series.files[3], "other.dcm")
    elif kind in ("sizes", "orientations"):  # a second volume under the same SeriesInstanceUID
        other = volume[:30, :, :4] if kind == "sizes" else volume
        affine = LPS @ np.diag([0.8, 0.9, 2.5, 1.0]) if kind == "sizes" else oblique_affine()
        write_series(folder, other, affine, intercept=-1024, series_uid=series.series_uid, seed=1)


BAD = {
    "gap": r"uneven slice positions: \w+(\.dcm)? lies 1\.25 mm \(0\.45 of a slice\) off the regular grid from the "
           r"first slice to the last \(tolerance 0\.1 mm\); the steps run from 2\.5 to 5 mm \(median 2\.5 mm\); 5 mm "
           r"from \w+(\.dcm)? to \w+(\.dcm)? \(a missing slice\?\)$",
    "twice": r"one image twice: .* have the same SOPInstanceUID",
    "same position": r"two slices at one position, 7\.5 mm along the slice normal",
    "sizes": r"mixed image sizes within one series \(40x36 in 12 file\(s\), 30x36 in 4 file\(s\).*more than one "
             r"series under one SeriesInstanceUID\?",
    "orientations": r"mixed orientations \(ImageOrientationPatient\) within one series",
    "report": r"report\.dcm is a Basic Text SR Storage object without pixel data, not an image series",
    "segmentation": r"is a Segmentation Storage object \(DICOM-SEG\), not an image series",
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_series_are_refused_with_one_line_naming_the_folder(kind: str, tmp_path: Path) -> None:
    folder = tmp_path / "series"
    make_bad(kind, folder)
    with pytest.raises(ImageReadError) as refused:
        read_file(str(folder))
    message = str(refused.value)
    assert message.startswith(f"{folder}: ") and "\n" not in message
    assert refused.value.reason == message[len(f"{folder}: "):]
    assert re.search(BAD[kind], message), message


def test_single_files_and_empty_folders_are_refused(tmp_path: Path) -> None:
    series = write_ct_case(tmp_path, "case", "lps").series
    dcm = next(f for f in series.files if f.name.endswith(".dcm"))
    with pytest.raises(ImageReadError, match=r"a DICOM file: give the folder of its series"):
        read_file(str(dcm))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ImageReadError, match=r"empty: no DICOM files in this folder"):
        read_file(str(empty))
    (empty / "broken.dcm").write_bytes(b"not dicom at all")
    with pytest.raises(ImageReadError, match=r"empty: broken\.dcm: not a DICOM file pydicom reads"):
        read_file(str(empty))


def test_without_pydicom_the_extra_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    series = write_ct_case(tmp_path, "case", "lps").series
    monkeypatch.setitem(sys.modules, "pydicom", None)  # what importlib finds when a package is not installed
    with pytest.raises(ImageReadError, match=r'case: reading a DICOM series needs pydicom: pip install '
                                             r'"medseg\[dicom\]"$'):
        read_file(str(series.folder))
    with pytest.raises(ImageReadError, match=r'needs pydicom: pip install "medseg\[dicom\]"'):
        find_cases(tmp_path, "test", num_channels=1)


def test_series_sources_name_cases_readably(tmp_path: Path) -> None:
    """Two series with the same number and description keep apart by their UID."""
    volume = ct_case("c", np.random.default_rng(0), (16, 16, 3), (1.0, 1.0, 2.0)).image[0]
    first = write_series(tmp_path / "f", volume, np.diag([1.0, 1.0, 2.0, 1.0]), description="", seed=1)
    second = write_series(tmp_path / "f", volume, np.diag([1.0, 1.0, 2.0, 1.0]), description="", seed=2)
    names = [name for name, _ in series_sources(tmp_path / "f")]
    assert sorted(names) == sorted([f"f_s1_{first.series_uid}", f"f_s1_{second.series_uid}"])


def _rewrite(files: list[Path], change) -> None:
    """``change(dataset, k)`` for the k-th file of ``files`` (slice order), saved in place."""
    for k, path in enumerate(files):
        ds = pydicom.dcmread(path)
        change(ds, k)
        ds.save_as(path)


def _axial_series(folder: Path, slices: int = 12, step: float = 2.0):
    """An axial LPS series (row +x, column +y, normal +z) of 16x16x``slices`` voxels, 0.8 x 0.9 x ``step`` mm."""
    volume = ct_case("c", np.random.default_rng(0), (16, 16, slices), (0.8, 0.9, step)).image[0]
    return volume, write_series(folder, volume, LPS @ np.diag([0.8, 0.9, step, 1.0]), intercept=-1024)


def test_slice_positions_that_drift_off_the_grid_are_refused(tmp_path: Path) -> None:
    """Steps of 2.09, 2.0 and 1.91 mm, each within 5 % of the median 2 mm: the slices in the middle lie 15 x 0.09 =
    1.35 mm off the 2 mm grid that the first and last slices span, which is refused with that figure."""
    _, series = _axial_series(tmp_path / "drift", slices=32)
    along = np.concatenate([[0.0], np.cumsum([2.09] * 15 + [2.0] + [1.91] * 15)])
    _rewrite(series.files, lambda ds, k: setattr(ds, "ImagePositionPatient", [0.0, 0.0, float(along[k])]))
    with pytest.raises(ImageReadError, match=rf"^{re.escape(str(tmp_path / 'drift'))}: uneven slice positions: "
                                             rf"{series.files[15].name} lies 1\.35 mm \(0\.6[78] of a slice\) off the "
                                             r"regular grid .*; the steps run from 1\.91 to 2\.09 mm \(median 2 mm\)$"):
        read_file(str(series.folder))


def test_positions_jittered_within_the_tolerance_read_on_the_grid(tmp_path: Path) -> None:
    """Positions written to 0.05 mm off a 2 mm grid (a scanner's rounding) read as that grid."""
    volume, series = _axial_series(tmp_path / "jitter")
    jitter = np.where(np.arange(12) % 2, 0.05, -0.05)
    jitter[[0, -1]] = 0.0
    _rewrite(series.files, lambda ds, k: setattr(ds, "ImagePositionPatient", [0.0, 0.0, 2.0 * k + jitter[k]]))
    array, affine = read_file(str(series.folder))
    np.testing.assert_array_equal(array, volume)
    np.testing.assert_allclose(affine, LPS @ np.diag([0.8, 0.9, 2.0, 1.0]), atol=1e-9)


@pytest.mark.parametrize(("cosines", "figures"), [
    ([0.95, 0, 0, 0, 0.95, 0], r"lengths 0\.95 and 0\.95, dot product 0;"),
    ([1, 0, 0, 0.1, 0.995, 0], r"lengths 1 and 1, dot product 0\.1;"),
])
def test_orientation_cosines_must_be_orthogonal_unit_vectors(cosines: list[float], figures: str,
                                                             tmp_path: Path) -> None:
    """Cosines of length 0.95 would scale the spacing to 0.76 mm where PixelSpacing says 0.8; skewed ones leave the
    directions unknown: both refused, naming the series and the figures."""
    _, series = _axial_series(tmp_path / "skew")
    _rewrite(series.files, lambda ds, k: setattr(ds, "ImageOrientationPatient", cosines))
    with pytest.raises(ImageReadError, match=rf"^{re.escape(str(series.folder))}: ImageOrientationPatient "
                                             rf"\S+ is not two orthogonal unit vectors \({figures}"):
        read_file(str(series.folder))


def test_cosines_off_unit_length_within_the_tolerance_keep_the_pixel_spacing(tmp_path: Path) -> None:
    _, series = _axial_series(tmp_path / "near")
    _rewrite(series.files, lambda ds, k: setattr(ds, "ImageOrientationPatient", [1.0004, 0, 0, 0, 0.9996, 0]))
    spacing = np.linalg.norm(read_file(str(series.folder))[1][:3, :3], axis=0)
    np.testing.assert_allclose(spacing, [0.8, 0.9, 2.0], atol=1e-9)


def test_an_intercept_without_a_slope_is_applied_with_slope_one(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """RescaleIntercept -1024 without RescaleSlope: the intercept is applied (HU as the NIfTI), said once."""
    case = write_ct_case(tmp_path, "case", "lps")
    _rewrite(case.series.files, lambda ds, k: delattr(ds, "RescaleSlope"))
    with caplog.at_level(logging.WARNING, logger="medseg"):
        array, _ = read_file(str(case.series.folder))
    np.testing.assert_array_equal(array, read_file(str(case.nifti))[0])
    assert array.dtype == np.int16
    records = [r.getMessage() for r in caplog.records if "Rescale" in r.getMessage()]
    assert records == [f"{case.series.folder}: RescaleIntercept without RescaleSlope in 12 of 12 image(s), read "
                       f"with slope 1 and intercept 0 where absent (the standard's identity)"]


def test_series_at_any_depth_are_found_and_skipped_folders_named(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A DICOMDIR export (pydicom's FileSet: the images three folders down, under a DICOMDIR index) beside a series
    folder and a folder of notes: both series are cases, the notes folder is named as skipped."""
    from pydicom.fileset import FileSet

    source = write_ct_case(tmp_path / "sources", "ct", "lps")
    fileset = FileSet()
    for path in source.series.files:
        fileset.add(path)
    fileset.write(tmp_path / "input" / "export")
    assert (tmp_path / "input" / "export" / "DICOMDIR").is_file()
    shutil.copytree(source.series.folder, tmp_path / "input" / "single")
    (tmp_path / "input" / "notes").mkdir()
    (tmp_path / "input" / "notes" / "readme.txt").write_text("not an image")
    with caplog.at_level(logging.INFO, logger="medseg"):
        cases = find_cases(tmp_path / "input", "test", num_channels=1)
    (leaf,), _ = series_folders(tmp_path / "input" / "export")
    assert len(leaf.relative_to(tmp_path / "input" / "export").parts) == 3
    assert [c.case for c in cases] == ["_".join(("export", *leaf.relative_to(tmp_path / "input" / "export").parts)),
                                       "single"]
    for case in cases:
        np.testing.assert_array_equal(read_file(case.image)[0], read_file(str(source.nifti))[0])
    assert f"{tmp_path / 'input'}: skipped 1 folder(s) holding no DICOM file: notes" in caplog.text


def test_a_folder_with_a_file_pydicom_cannot_read_is_a_case_that_fails_alone(tmp_path: Path) -> None:
    """One broken file in one series folder: the folder is still a case (its reading names the file), the others
    are cases as before."""
    for name in ("good", "bad"):
        shutil.copytree(write_ct_case(tmp_path / "sources", name, "lps").series.folder, tmp_path / "input" / name)
    (tmp_path / "input" / "bad" / "broken.dcm").write_bytes(b"not dicom at all")
    cases = find_cases(tmp_path / "input", "test", num_channels=1)
    assert [(c.case, c.image) for c in cases] == [("bad", str(tmp_path / "input" / "bad")),
                                                  ("good", str(tmp_path / "input" / "good"))]
    with pytest.raises(ImageReadError, match=r"bad: broken\.dcm: not a DICOM file pydicom reads"):
        read_file(cases[0].image)
