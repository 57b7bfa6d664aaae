"""DICOM series in evaluation and DICOM-SEG output: ``output_format=dicom_seg`` writes one SEG per DICOM series case,
equal voxel for voxel to the NIfTI prediction of the same evaluation, its frames on the source slices, segments named,
the source series referenced; refused with one line for inputs that are no DICOM series and for models of two
channels. Series with labels are scored; a bad series fails alone.

The SEG is read back with highdicom, its frames taken in the slice order the test's series writer used (the
``SOPInstanceUID`` s of the slices by position), independent of the reader's sorting.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom")
hd = pytest.importorskip("highdicom")

from medseg.data.reading import ImageReadError, read_file  # noqa: E402
from medseg.errors import ConfigError, PredictionError  # noqa: E402
from medseg.evaluation.evaluate import evaluate  # noqa: E402
from medseg.inference.checks import check_config  # noqa: E402
from tests.helpers.checkpoints import save_test_checkpoint  # noqa: E402
from tests.helpers.configs import run_script  # noqa: E402
from tests.helpers.dicom import SeriesCase, two_series_folder, write_ct_case  # noqa: E402
from tests.helpers.volumes import LABELS  # noqa: E402

NAMES = [LABELS["1"], LABELS["2"]]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny one-channel CT model whose random weights predict both classes on these volumes."""
    return save_test_checkpoint(tmp_path_factory.mktemp("ckpt") / "best.pt", channel_names=("CT",),
                                spacing=(1.0, 1.0, 2.0), patch=(32, 32, 8), seed=3)


@pytest.fixture(scope="module")
def series_input(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, SeriesCase]]:
    """An input folder of two series (oblique and rescaled; LPS), one sub-folder each."""
    root = tmp_path_factory.mktemp("series")
    cases = {name: write_ct_case(root / "sources", name, geometry, seed=index)
             for index, (name, geometry) in enumerate((("oblique", "oblique"), ("axial", "lps")))}
    (root / "input").mkdir()
    for name, case in cases.items():
        shutil.copytree(case.series.folder, root / "input" / name)
    return root / "input", cases


def run(ckpt: Path, input: Path, output: Path, **settings: object):
    return evaluate({"ckpt": str(ckpt), "input": str(input), "output": str(output), "inference": {"progress": False},
                     **settings})


def test_dicom_seg_equals_the_nifti_prediction(ckpt: Path, series_input: tuple[Path, dict[str, SeriesCase]],
                                               tmp_path: Path) -> None:
    folder, cases = series_input
    seg_result = run(ckpt, folder, tmp_path / "seg", output_format="dicom_seg")
    nifti_result = run(ckpt, folder, tmp_path / "nifti")
    assert seg_result.exit_code == nifti_result.exit_code == 0
    assert sorted(p.name for p in (tmp_path / "seg").iterdir()) == ["axial.seg.dcm", "oblique.seg.dcm",
                                                                     "summary.json"]
    assert json.loads((tmp_path / "seg" / "summary.json").read_text())["config"]["output_format"] == "dicom_seg"
    for name, case in cases.items():
        prediction = nib.load(tmp_path / "nifti" / f"{name}.nii.gz")
        labels = np.asarray(prediction.dataobj)
        # the NIfTI prediction lies on the series' grid, which is the source NIfTI's
        np.testing.assert_allclose(prediction.affine, nib.load(case.nifti).affine, atol=1e-5)
        assert labels.shape == read_file(str(folder / name))[0].shape
        assert set(np.unique(labels)) == {0, 1, 2}, "the test model predicts both classes"
        seg = hd.seg.segread(tmp_path / "seg" / f"{name}.seg.dcm")
        assert [item.SegmentLabel for item in seg.SegmentSequence] == NAMES
        assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == case.series.series_uid
        source = pydicom.dcmread(case.series.files[0])
        assert (seg.StudyInstanceUID, seg.FrameOfReferenceUID) == (source.StudyInstanceUID,
                                                                   source.FrameOfReferenceUID)
        assert seg.SeriesInstanceUID != case.series.series_uid and seg.SegmentationType == "BINARY"
        frames = seg.get_pixels_by_source_instance(source_sop_instance_uids=case.series.sop_uids,
                                                   segment_numbers=[1, 2])  # (slices, rows, columns, segments)
        masks = np.transpose(frames, (3, 2, 1, 0)).astype(bool)  # (segments, columns, rows, slices)
        np.testing.assert_array_equal(masks, np.stack([labels == 1, labels == 2]))
        # a SEG is an output: given back as input, it is refused
        reread = tmp_path / "reread" / name
        reread.mkdir(parents=True)
        shutil.copy(tmp_path / "seg" / f"{name}.seg.dcm", reread)
        with pytest.raises(ImageReadError, match=r"is a Segmentation Storage object \(DICOM-SEG\), not an image"):
            read_file(str(reread))


def test_series_in_images_ts_are_scored_against_labels_ts(ckpt: Path, tmp_path: Path,
                                                          series_input: tuple[Path, dict[str, SeriesCase]]) -> None:
    """``imagesTs/`` of series folders with ``labelsTs/<case>.nii.gz`` on their grids: every case is scored, with the
    Dice of the written prediction against the label."""
    folder, cases = series_input
    shutil.copytree(folder, tmp_path / "data" / "imagesTs")
    (tmp_path / "data" / "labelsTs").mkdir()
    for name, case in cases.items():
        shutil.copy(case.label, tmp_path / "data" / "labelsTs" / f"{name}.nii.gz")
    result = run(ckpt, tmp_path / "data", tmp_path / "out")
    assert result.exit_code == 0 and result.summary["num_scored"] == 2
    for row in result.rows:
        prediction = np.asarray(nib.load(tmp_path / "out" / f"{row['case']}.nii.gz").dataobj) == row["class_index"]
        label = np.asarray(nib.load(cases[row["case"]].label).dataobj) == row["class_index"]
        dice = 2 * (prediction & label).sum() / (prediction.sum() + label.sum())
        assert row["dice"] == pytest.approx(dice)


def test_a_bad_series_fails_alone_and_writes_nothing(ckpt: Path, series_input: tuple[Path, dict[str, SeriesCase]],
                                                    tmp_path: Path) -> None:
    """An input of a good series, a series with a missing slice, one with a file that is no DICOM and a study folder
    of two series: the gap and the broken file fail alone (nothing written for them), the study's series are cases
    of their own, each with its SEG."""
    folder, cases = series_input
    shutil.copytree(folder / "axial", tmp_path / "input" / "axial")
    gap = tmp_path / "input" / "gap"
    shutil.copytree(folder / "axial", gap)
    (gap / cases["axial"].series.files[4].name).unlink()  # a slice in the middle
    shutil.copytree(folder / "axial", tmp_path / "input" / "junk")
    (tmp_path / "input" / "junk" / "broken.dcm").write_bytes(b"not dicom at all")
    study = two_series_folder(tmp_path / "input" / "study")
    result = run(ckpt, tmp_path / "input", tmp_path / "out", output_format="dicom_seg")
    assert result.exit_code == 1 and [f["case"] for f in result.failed] == ["gap", "junk"]
    assert "uneven slice positions" in result.failed[0]["reason"] and "(a missing slice?)" in result.failed[0]["reason"]
    assert result.failed[1]["reason"].startswith(f"{tmp_path / 'input' / 'junk'}: broken.dcm: not a DICOM file")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "axial.seg.dcm", "study_s2_axial.seg.dcm", "study_s5_T2_tse.seg.dcm", "summary.json"]
    for name, (_, series) in zip(("study_s2_axial", "study_s5_T2_tse"), study):
        seg = hd.seg.segread(tmp_path / "out" / f"{name}.seg.dcm")
        (source,) = seg.ReferencedSeriesSequence
        assert source.SeriesInstanceUID == series.series_uid
        assert {item.ReferencedSOPInstanceUID for item in source.ReferencedInstanceSequence} <= set(series.sop_uids)


DEIDENTIFIED = ("PatientBirthDate", "PatientSex", "StudyID", "StudyTime", "AccessionNumber")
"""Type 2 attributes that de-identification often removes."""


def test_a_de_identified_series_gets_a_seg_with_its_type_2_attributes_empty(
        ckpt: Path, series_input: tuple[Path, dict[str, SeriesCase]], tmp_path: Path) -> None:
    folder, cases = series_input
    shutil.copytree(folder / "axial", tmp_path / "input" / "anonymous")
    for path in (tmp_path / "input" / "anonymous").iterdir():
        ds = pydicom.dcmread(path)
        for keyword in DEIDENTIFIED:
            delattr(ds, keyword)
        ds.save_as(path)
    result = run(ckpt, tmp_path / "input", tmp_path / "seg", output_format="dicom_seg")
    assert result.exit_code == 0, result.failed
    seg = hd.seg.segread(tmp_path / "seg" / "anonymous.seg.dcm")
    assert all(keyword in seg and seg.data_element(keyword).is_empty for keyword in DEIDENTIFIED)
    assert (seg.PatientID, seg.StudyDate) == ("PHANTOM01", "20240102")  # those the source has are copied
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == cases["axial"].series.series_uid
    assert [item.SegmentLabel for item in seg.SegmentSequence] == NAMES


def test_dicom_seg_is_refused_for_nifti_and_two_channel_inputs(ckpt: Path, tmp_path: Path,
                                                               series_input: tuple[Path, dict[str, SeriesCase]]
                                                               ) -> None:
    folder, cases = series_input
    nifti = tmp_path / "nifti"
    nifti.mkdir()
    shutil.copy(cases["axial"].nifti, nifti / "axial.nii.gz")
    with pytest.raises(PredictionError, match=r"^output_format=dicom_seg: case axial \(.*axial\.nii\.gz\) is not a "
                                              r"DICOM series; a DICOM-SEG is written onto the series it segments"):
        run(ckpt, nifti, tmp_path / "out", output_format="dicom_seg")
    two = save_test_checkpoint(tmp_path / "two.pt", channel_names=("T2", "ADC"), patch=(32, 32, 8))
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "dataset.json").write_text(json.dumps({
        "name": "two", "modality": {"0": "T2", "1": "ADC"}, "labels": LABELS, "training": [],
        "test": [{"image": [str(folder / "axial"), str(folder / "oblique")]}]}))
    with pytest.raises(PredictionError, match=r"^output_format=dicom_seg: the model takes 2 input channels \(T2, "
                                              r"ADC\); a DICOM-SEG is written onto one source series"):
        run(two, tmp_path / "ds" / "dataset.json", tmp_path / "out", output_format="dicom_seg")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()), "nothing written"
    with pytest.raises(ConfigError, match=r"output_format='seg' is not valid. Valid values: nifti, dicom_seg"):
        check_config({"ckpt": "a.pt", "input": "x", "output_format": "seg"})


def test_without_highdicom_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "highdicom", None)  # what importlib finds when a package is not installed
    with pytest.raises(PredictionError, match=r'^output_format=dicom_seg needs highdicom: pip install '
                                              r'"medseg\[dicom\]"$'):
        check_config({"ckpt": "a.pt", "input": "x", "output_format": "dicom_seg"})


@pytest.mark.full
def test_script_refuses_a_nifti_input_with_one_line(ckpt: Path, series_input: tuple[Path, dict[str, SeriesCase]],
                                                    tmp_path: Path) -> None:
    _, cases = series_input
    result = run_script("evaluate.py", [f"ckpt={ckpt}", f"input={cases['axial'].nifti}", "output=out",
                                        "output_format=dicom_seg"], cwd=tmp_path, timeout=300)
    assert result.returncode == 1
    assert result.stderr.startswith("error: output_format=dicom_seg: case axial")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
