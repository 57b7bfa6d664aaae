"""Dataset verification: one run over a dataset with one broken case per problem reports them all."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from medseg.config import DataConfig
from medseg.data.datalist import load_dataset
from medseg.data.verify import (
    DatasetVerificationError,
    Problem,
    VerificationReport,
    check_data_cli,
    check_dataset,
    verify_dataset,
)

REPO = Path(__file__).resolve().parents[2]
SHAPE = (8, 9, 7)
SPACING = (0.8, 0.8, 2.0)
LABELS = {"0": "background", "1": "liver", "2": "tumour"}


def make_affine(
    spacing: tuple[float, ...] = SPACING, origin: tuple[float, ...] = (10.0, -20.0, 5.0)
) -> np.ndarray:
    affine = np.diag([-spacing[0], -spacing[1], spacing[2], 1.0])
    affine[:3, 3] = origin
    return affine


def save(path: Path, array: np.ndarray, affine: np.ndarray | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(array, make_affine() if affine is None else affine), str(path))
    return path


def image(seed: int, shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    return np.random.RandomState(seed).normal(100.0, 20.0, size=shape).astype(np.float32)


def label(shape: tuple[int, ...] = SHAPE, dtype: type = np.uint8) -> np.ndarray:
    array = np.zeros(shape, dtype)
    array[2:5, 2:5, 2:4] = 1
    array[5:7, 5:7, 4:6] = 2
    return array


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def corrupt_crc(path: Path) -> None:
    """Flip a byte of the gzip stream's CRC: the voxels decompress intact, the stream's check fails at its end."""
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF  # the trailer is CRC32 (4 bytes), then the length (4 bytes)
    path.write_bytes(bytes(data))


def write_case(root: Path, case: str, img: np.ndarray | None = None, lab: np.ndarray | None = None,
               label_affine: np.ndarray | None = None) -> dict[str, str]:
    """Write an MSD case (a good one unless arrays are given); returns its dataset.json entry."""
    save(root / "imagesTr" / f"{case}.nii.gz", image(len(case)) if img is None else img)
    save(root / "labelsTr" / f"{case}.nii.gz", label() if lab is None else lab, label_affine)
    return {"image": f"./imagesTr/{case}.nii.gz", "label": f"./labelsTr/{case}.nii.gz"}


def write_msd_json(root: Path, training: list[dict], modality: dict[str, str] | None = None) -> Path:
    (root / "dataset.json").write_text(json.dumps({
        "name": root.name, "modality": modality or {"0": "MRI"}, "labels": LABELS,
        "numTraining": len(training), "training": training, "test": [],
    }))
    return root


def build_good_msd(root: Path) -> Path:
    """Two good cases, one with a trailing singleton label axis (allowed)."""
    training = [write_case(root, "good_00"),
                write_case(root, "good_01", lab=label()[..., None])]
    return write_msd_json(root, training)


# case -> (file the problem names, words of the message, severity)
EXPECTED = {
    "missing_label": ("labelsTr/missing_label.nii.gz", "file not found", "error"),
    "truncated": ("imagesTr/truncated.nii.gz", "cannot read file", "error"),
    "shape_mismatch": ("labelsTr/shape_mismatch.nii.gz", "label shape (8, 9, 6) differs", "error"),
    "affine_mismatch": ("labelsTr/affine_mismatch.nii.gz", "origin", "error"),
    "image_4d": ("imagesTr/image_4d.nii.gz", "4D image of shape (8, 9, 7, 2) where 3D is expected", "error"),
    "two_files": ("imagesTr/two_files.nii.gz, imagesTr/two_files_extra.nii.gz", "2 image files", "error"),
    "label_255": ("labelsTr/label_255.nii.gz", "label values (255) are not in", "error"),
    "label_fraction": ("labelsTr/label_fraction.nii.gz", "non-integer label values (0.5)", "error"),
    "nan_image": ("imagesTr/nan_image.nii.gz", "3 NaN voxels", "error"),
    "inf_image": ("imagesTr/inf_image.nii.gz", "2 Inf voxels", "error"),
    "bad_crc": ("imagesTr/bad_crc.nii.gz", "cannot read file (BadGzipFile: CRC check failed", "error"),
    "no_foreground": ("labelsTr/no_foreground.nii.gz", "no foreground", "warning"),
}


def build_bad_msd(root: Path) -> Path:
    """A one-channel MSD folder: the good cases plus one broken case per entry of EXPECTED."""
    build_good_msd(root)
    training = json.loads((root / "dataset.json").read_text())["training"]
    missing = write_case(root, "missing_label")
    (root / "labelsTr" / "missing_label.nii.gz").unlink()
    training.append(missing)
    training.append(write_case(root, "truncated"))
    truncate(root / "imagesTr" / "truncated.nii.gz")
    training.append(write_case(root, "shape_mismatch", lab=label((8, 9, 6))))
    training.append(write_case(root, "affine_mismatch", label_affine=make_affine(origin=(11.0, -20.0, 5.0))))
    training.append(write_case(root, "image_4d", img=image(1, SHAPE + (2,))))
    two = write_case(root, "two_files")  # a second channel file in a one-channel dataset
    save(root / "imagesTr" / "two_files_extra.nii.gz", image(2))
    training.append({"image": [two["image"], "./imagesTr/two_files_extra.nii.gz"], "label": two["label"]})
    with_255 = label()
    with_255[0, 0, 0] = 255
    training.append(write_case(root, "label_255", lab=with_255))
    fraction = label(dtype=np.float32)
    fraction[0, 0, :2] = 0.5
    training.append(write_case(root, "label_fraction", lab=fraction))
    nan = image(3)
    nan[0, 0, :3] = np.nan
    training.append(write_case(root, "nan_image", img=nan))
    inf = image(4)
    inf[1, 1, :2] = [np.inf, -np.inf]
    training.append(write_case(root, "inf_image", img=inf))
    big = (20, 20, 20)  # large enough that nibabel reads the voxels without reaching the end of the stream
    training.append(write_case(root, "bad_crc", img=image(5, big), lab=label(big)))
    corrupt_crc(root / "imagesTr" / "bad_crc.nii.gz")
    training.append(write_case(root, "no_foreground", lab=np.zeros(SHAPE, np.uint8)))
    return write_msd_json(root, training)


def case_of(report: VerificationReport, case: str) -> list[Problem]:
    return [p for p in report.problems if p.case == case]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("verify")
    return {"bad": build_bad_msd(base / "bad"), "good": build_good_msd(base / "good")}


def test_one_run_reports_every_problem(datasets: dict[str, Path]) -> None:
    report = verify_dataset(load_dataset(datasets["bad"], "msd"), progress=False)
    assert report.num_cases == 2 + len(EXPECTED)
    assert {p.case for p in report.problems} == set(EXPECTED)  # good cases: no problems
    for case, (file, words, severity) in EXPECTED.items():
        problems = case_of(report, case)
        assert len(problems) == 1, problems
        assert problems[0].file == file
        assert words in problems[0].message
        assert problems[0].severity == severity
    assert not report.ok
    assert len(report.errors) == len(EXPECTED) - 1
    assert [p.case for p in report.warnings] == ["no_foreground"]


def test_report_format_groups_per_case(datasets: dict[str, Path]) -> None:
    text = verify_dataset(load_dataset(datasets["bad"], "msd"), progress=False).format()
    lines = text.splitlines()
    for case, (file, words, _) in EXPECTED.items():
        assert f"{case}:" in lines
        assert any(case in line and file in line and words in line for line in lines)
    errors, cases = len(EXPECTED) - 1, len(EXPECTED)
    assert lines[-1] == f"FAILED: {errors} errors, 1 warning in {cases} of {cases + 2} cases"
    assert "Traceback" not in text


def test_good_dataset_passes(datasets: dict[str, Path]) -> None:
    report = verify_dataset(load_dataset(datasets["good"], "msd"), progress=False)
    assert report.ok and report.problems == []
    assert report.format().splitlines()[-1] == "OK: no problems in 2 cases"


def test_no_foreground_is_only_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    empty = write_case(tmp_path, "empty", lab=np.zeros(SHAPE))
    write_msd_json(tmp_path, [write_case(tmp_path, "good"), empty])
    with caplog.at_level(logging.WARNING, logger="medseg.data.verify"):
        report = check_dataset(load_dataset(tmp_path, "msd"), progress=False)
    assert report.ok and [p.case for p in report.warnings] == ["empty"]
    assert "empty" in caplog.text and "no foreground" in caplog.text


def test_check_dataset_raises_with_every_problem(datasets: dict[str, Path]) -> None:
    with pytest.raises(DatasetVerificationError) as excinfo:
        check_dataset(load_dataset(datasets["bad"], "msd"), progress=False)
    assert isinstance(excinfo.value, ValueError)
    for case, (file, words, _) in EXPECTED.items():
        assert case in str(excinfo.value) and file in str(excinfo.value) and words in str(excinfo.value)


def test_empty_training_list_and_duplicate_ids(datasets: dict[str, Path]) -> None:
    info = load_dataset(datasets["good"], "msd")
    empty = verify_dataset(replace(info, training=[]), progress=False)
    assert not empty.ok and "training list is empty" in empty.errors[0].message
    duplicated = replace(info, training=[*info.training, dict(info.training[0])])
    report = verify_dataset(duplicated, progress=False)
    assert [(p.case, p.severity) for p in report.problems] == [("good_00", "error")]
    assert "appears 2 times" in report.problems[0].message and "#0, #2" in report.problems[0].message


def test_validation_repeating_training_cases_and_files_outside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    training = [write_case(root, "a"), write_case(root, "b")]
    outside = write_case(tmp_path / "elsewhere", "c")  # a relative path out of the root, and an absolute one
    training.append({"image": "../elsewhere/imagesTr/c.nii.gz",
                     "label": str(tmp_path / "elsewhere" / outside["label"])})
    write_msd_json(root, training)
    meta = json.loads((root / "dataset.json").read_text())
    meta["validation"] = [write_case(root, "v"), training[1]]
    (root / "dataset.json").write_text(json.dumps(meta))
    report = verify_dataset(load_dataset(root, "msd"), progress=False)
    assert [(p.case, p.file, p.severity) for p in report.errors] == [("b", "dataset.json", "error")]
    assert report.errors[0].message.startswith("validation entry #1 repeats training case b (training entry #1)")
    elsewhere = (tmp_path / "elsewhere").resolve()
    assert [(p.case, p.file) for p in report.warnings] == [("c", str(elsewhere / "imagesTr" / "c.nii.gz")),
                                                          ("c", str(elsewhere / "labelsTr" / "c.nii.gz"))]
    assert all(p.message.startswith("file outside the dataset folder") for p in report.warnings)


@pytest.mark.parametrize(("channels", "shape", "words"), [
    (2, SHAPE + (2,), None),
    (2, SHAPE, "3D image of shape (8, 9, 7), but dataset.json declares 2 channels: T2, ADC"),
    (2, SHAPE + (3,), "image has 3 channels on its last axis"),
    (1, SHAPE + (1,), None),
])
def test_msd_channel_axis(tmp_path: Path, channels: int, shape: tuple[int, ...], words: str | None) -> None:
    modality = {"0": "T2", "1": "ADC"} if channels == 2 else {"0": "CT"}
    write_msd_json(tmp_path, [write_case(tmp_path, "case", img=image(0, shape))], modality)
    messages = [p.message for p in verify_dataset(load_dataset(tmp_path, "msd"), progress=False).problems]
    assert messages == [] if words is None else len(messages) == 1 and words in messages[0], messages


def test_nnunet_two_channels(tmp_path: Path) -> None:
    (tmp_path / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "T2", "1": "ADC"}, "labels": {"background": 0, "lesion": 1},
        "numTraining": 3, "file_ending": ".nii.gz",
    }))
    for case in ("good", "missing", "shifted"):
        save(tmp_path / "imagesTr" / f"{case}_0000.nii.gz", image(0))
        save(tmp_path / "labelsTr" / f"{case}.nii.gz", np.clip(label(), 0, 1))
    save(tmp_path / "imagesTr" / "good_0001.nii.gz", image(1))
    save(tmp_path / "imagesTr" / "shifted_0001.nii.gz", image(1), make_affine(origin=(10.0, -20.0, 9.0)))
    report = verify_dataset(load_dataset(tmp_path, "nnunet"), progress=False)
    assert [(p.case, p.file) for p in report.problems] == [
        ("missing", "imagesTr/missing_0001.nii.gz"), ("shifted", "imagesTr/shifted_0001.nii.gz")]
    assert report.problems[0].message == "file not found"
    assert "channel affine differs" in report.problems[1].message
    assert "origin (10, -20, 9) vs (10, -20, 5)" in report.problems[1].message


def test_corrupt_non_nifti_file_is_reported(tmp_path: Path) -> None:
    write_msd_json(tmp_path, [write_case(tmp_path, "case")])
    meta = json.loads((tmp_path / "dataset.json").read_text())
    (tmp_path / "imagesTr" / "broken.nrrd").write_bytes(b"NRRD0004\nnot really\n")
    meta["training"].append({"image": "./imagesTr/broken.nrrd", "label": "./labelsTr/case.nii.gz"})
    (tmp_path / "dataset.json").write_text(json.dumps(meta))
    report = verify_dataset(load_dataset(tmp_path, "msd"), progress=False)
    assert [(p.case, p.file) for p in report.problems] == [("broken", "imagesTr/broken.nrrd")]
    assert report.problems[0].message.startswith("cannot read file (")


def test_check_data_reports_the_warnings_training_logs_beside_its_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "ds"
    training = [write_case(root, "a"), write_case(tmp_path / "outside_root", "x")]
    training[1] = {"image": "../outside_root/imagesTr/x.nii.gz", "label": "../outside_root/labelsTr/x.nii.gz"}
    write_msd_json(root, training)
    assert check_data_cli(DataConfig(format="msd", root=str(root)), progress=False) == 0
    lines = capsys.readouterr().out.splitlines()
    outside = (tmp_path / "outside_root").resolve()
    warned = [line for line in lines if line.startswith("  WARNING ")]
    assert warned == [f"  WARNING x: {outside / folder / 'x.nii.gz'}: file outside the dataset folder "
                      f"{root.resolve()}; dataset.json's paths should stay inside it"
                      for folder in ("imagesTr", "labelsTr")]
    assert lines[-1] == "OK: 0 errors, 2 warnings in 1 of 2 cases"
    with caplog.at_level(logging.WARNING):
        check_dataset(load_dataset(root, "msd"), progress=False)  # training's gate: the same warnings, logged
    assert [r.getMessage() for r in caplog.records] == [f"dataset check: {line.removeprefix('  WARNING ')}"
                                                        for line in warned]


def test_check_data_cli_demo_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = check_data_cli(DataConfig(format="demo", root=str(tmp_path / "demo"), num_cases=2), progress=False)
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[-1] == "OK: no problems in 2 cases"


def run_script(cwd: Path, *overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(REPO / "scripts" / "check_data.py"), *overrides],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def script_runs(datasets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """check_data.py on the bad, good and a missing folder, run concurrently (each start imports MONAI)."""
    cwd = tmp_path_factory.mktemp("cwd")
    roots = {**datasets, "missing": cwd / "nowhere"}
    procs = {key: run_script(cwd, "data=msd", f"data.root={root}", "progress=false")
             for key, root in roots.items()}
    results = {key: (*proc.communicate(timeout=120), proc.returncode) for key, proc in procs.items()}
    return {**results, "cwd_files": tuple(p.name for p in cwd.iterdir())}


@pytest.mark.full
def test_script_bad_dataset(script_runs: dict[str, tuple]) -> None:
    out, err, code = script_runs["bad"]
    assert code == 1
    assert "Traceback" not in out + err
    for case, (file, words, _) in EXPECTED.items():
        assert any(case in line and file in line and words in line for line in out.splitlines())


def test_script_good_dataset_and_no_output_folders(script_runs: dict[str, tuple]) -> None:
    out, err, code = script_runs["good"]
    assert code == 0, out + err
    assert out.splitlines()[-1] == "OK: no problems in 2 cases"
    assert script_runs["cwd_files"] == ()  # hydra wrote no outputs/.hydra/log files


def test_script_missing_root_is_one_clean_line(script_runs: dict[str, tuple]) -> None:
    out, err, code = script_runs["missing"]
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: data.root=") and lines[0].endswith("nowhere: folder not found")
