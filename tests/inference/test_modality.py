"""A case not of its checkpoint's training modality is warned of, once per run for each kind of mismatch: a DICOM
series by its ``Modality``, another image by its least value (Hounsfield units hold air at -1000); the case is still
predicted. A checkpoint's modality comes from its channel names and its normalisation."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from medseg.inference.modality import trained_modality
from medseg.inference.model import load_model
from medseg.inference.predict import predict
from tests.helpers.checkpoints import save_test_checkpoint
from tests.helpers.realistic import ct_case

SPACING = (0.8, 0.9, 2.5)
CT_NORMALIZATION = {"scheme": "ct", "clip": [-200.0, 300.0], "mean": 50.0, "std": 40.0}


def checkpoint(folder: Path, name: str, channel: str, normalization: object = "zscore") -> Path:
    return save_test_checkpoint(folder / f"{name}.pt", channel_names=(channel,), normalization=normalization,
                                spacing=(1.0, 1.0, 2.5), patch=(32, 32, 8))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ckpt")
    return {"ct": checkpoint(folder, "ct", "CT"), "mri": checkpoint(folder, "mri", "MRI"),
            "ct_normalized": checkpoint(folder, "hu", "image", CT_NORMALIZATION),
            "unknown": checkpoint(folder, "unknown", "image")}


def test_a_checkpoints_modality_is_its_channels_or_its_ct_normalization(checkpoints: dict[str, Path]) -> None:
    modalities = {name: trained_modality(load_model(path)) for name, path in checkpoints.items()}
    assert modalities == {"ct": "CT", "mri": "MR", "ct_normalized": "CT", "unknown": None}


def hu_volume(seed: int) -> np.ndarray:
    return ct_case("c", np.random.default_rng(seed), (40, 36, 12), SPACING).image[0]


def mr_volume(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, 800.0, (40, 36, 12)).astype(np.float32)


def modality_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    messages = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    return [message for message in messages if "was trained on" in message]


def run(ckpt: Path, input: Path, output: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="medseg"):
        result = predict({"ckpt": str(ckpt), "input": str(input), "output": str(output),
                          "inference": {"progress": False}})
    assert result.exit_code == 0 and result.num_predicted == len(result.cases)
    return modality_warnings(caplog)


def test_mr_series_for_a_ct_checkpoint_are_warned_of_once(checkpoints: dict[str, Path], tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Two MR series and a CT series: one warning, naming the first MR series; a CT series alone: none."""
    pydicom = pytest.importorskip("pydicom")
    from tests.helpers.dicom import LPS, write_series

    for index, (name, modality) in enumerate((("ct", "CT"), ("mr_a", "MR"), ("mr_b", "MR"))):
        series = write_series(tmp_path / "input" / name, hu_volume(index), LPS @ np.diag([*SPACING, 1.0]),
                              intercept=-1024, seed=index)
        for path in series.files:
            ds = pydicom.dcmread(path)
            ds.Modality = modality
            ds.save_as(path)
    warnings = run(checkpoints["ct"], tmp_path / "input", tmp_path / "out", caplog)
    assert len(warnings) == 1, warnings
    assert (f"{checkpoints['ct']} was trained on CT (HU clipping and statistics), but case mr_a is a series of "
            f"Modality MR: its segmentation may mean nothing") in warnings[0]
    assert run(checkpoints["ct"], tmp_path / "input" / "ct", tmp_path / "out_ct", caplog) == []


@pytest.mark.parametrize(("ckpt", "volume", "expected"), [
    ("ct", mr_volume, r"case image holds no value below 0 \(its least is [\d.e+-]+; air is -1000 HU\): not "
                      r"Hounsfield units"),
    ("ct_normalized", mr_volume, r"case image holds no value below 0"),
    ("mri", hu_volume, r"trained on MR \(MR intensities\), but case image holds values down to -10\d\d(\.\d+)?, as "
                       r"a CT's air in Hounsfield units"),
    ("ct", hu_volume, None),
    ("mri", mr_volume, None),
    ("unknown", hu_volume, None),
    ("unknown", mr_volume, None),
])
def test_a_nifti_whose_intensities_clearly_differ_is_warned_of(ckpt: str, volume, expected: str | None,
                                                               checkpoints: dict[str, Path], tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "input").mkdir()
    nib.save(nib.Nifti1Image(volume(0), np.diag([*SPACING, 1.0])), tmp_path / "input" / "image.nii.gz")
    warnings = run(checkpoints[ckpt], tmp_path / "input", tmp_path / "out", caplog)
    if expected is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and re.search(expected, warnings[0]), warnings
