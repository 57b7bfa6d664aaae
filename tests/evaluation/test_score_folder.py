"""Prediction apart from scoring: ``predict`` writes the label maps of a folder without labels, and ``evaluate
pred=DIR`` scores any folder of label maps against references (a copy of the references scores Dice 1, the scores of
medseg's own predictions equal evaluate's with the checkpoint, a missing case, a case on another grid and a foreign
value are named), through the functions and the installed commands' scripts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from medseg.errors import PredictionError
from medseg.evaluation.evaluate import evaluate
from medseg.inference.predict import predict
from tests.helpers.checkpoints import save_test_checkpoint
from tests.helpers.configs import run_script
from tests.helpers.files import read_csv
from tests.helpers.volumes import assert_same_geometry

QUIET = {"progress": False}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_test_checkpoint(tmp_path_factory.mktemp("ckpt") / "best.pt")


def first_cases(source: Path, folder: Path) -> Path:
    """A new ``folder`` holding the files of the demo's first three cases in ``source``."""
    folder.mkdir()
    for index in range(3):
        shutil.copy(source / f"demo_{index:03d}.nii.gz", folder)
    return folder


@pytest.fixture
def images(tiny_demo_root: Path, tmp_path: Path) -> Path:
    """Three images, without labels."""
    return first_cases(tiny_demo_root / "imagesTr", tmp_path / "images")


@pytest.fixture
def references(tiny_demo_root: Path, tmp_path: Path) -> Path:
    """The three images' labels, in a folder of their own."""
    return first_cases(tiny_demo_root / "labelsTr", tmp_path / "references")


def test_predict_writes_the_label_maps_of_a_folder_without_labels(ckpt: Path, images: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = predict({"ckpt": str(ckpt), "input": str(images), "output": str(out), "inference": QUIET})
    assert result.exit_code == 0 and result.num_predicted == 3
    for path in sorted(images.iterdir()):
        assert_same_geometry(out / path.name, path)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_predicted"] == 3 and summary["failed"] == [] and "dice" not in json.dumps(summary)
    assert not (out / "metrics.csv").exists(), "predict scores nothing"


def test_a_copy_of_the_references_scores_dice_one(references: Path, tmp_path: Path) -> None:
    pred = tmp_path / "pred"
    shutil.copytree(references, pred)
    result = evaluate({"pred": str(pred), "input": str(references), "inference": QUIET})
    assert result.exit_code == 0 and result.output == pred, "metrics go beside the predictions by default"
    rows = read_csv(pred / "metrics.csv")
    assert len(rows) == 3 * 2 and {row["class_name"] for row in rows} == {"label_1", "label_2"}
    assert all(float(row["dice"]) == 1.0 for row in rows)
    assert result.summary["num_scored"] == 3 and result.summary["foreground_mean"]["dice"] == 1.0


def test_scored_predictions_equal_evaluate_with_the_checkpoint(ckpt: Path, tiny_demo_root: Path, images: Path,
                                                               tmp_path: Path) -> None:
    """The dataset.json names the classes; medseg's own predictions scored as a folder give evaluate's figures."""
    predicted = evaluate({"ckpt": str(ckpt), "input": str(tiny_demo_root), "split": "training",
                          "output": str(tmp_path / "with_ckpt"), "inference": QUIET})
    scored = evaluate({"pred": str(tmp_path / "with_ckpt"), "input": str(tiny_demo_root / "dataset.json"),
                       "split": "training", "output": str(tmp_path / "scores"), "inference": QUIET})
    assert scored.exit_code == 0 and scored.summary["num_scored"] == predicted.summary["num_scored"] == 8
    key = {(row["case"], row["class_name"]) for row in predicted.rows}
    assert {(row["case"], row["class_name"]) for row in scored.rows} == key
    by_case = {(row["case"], row["class_name"]): row for row in predicted.rows}
    for row in scored.rows:
        assert row["dice"] == pytest.approx(by_case[row["case"], row["class_name"]]["dice"])


def test_a_missing_case_and_a_case_on_another_grid_are_named_before_anything_is_scored(
        references: Path, tmp_path: Path) -> None:
    pred = tmp_path / "pred"
    shutil.copytree(references, pred)
    (pred / "demo_001.nii.gz").unlink()
    with pytest.raises(PredictionError, match=r"^pred=.*pred: no prediction for 1 of the 3 reference case\(s\): "
                                              r"demo_001 \(expected <case>\.nii\.gz for each\)$"):
        evaluate({"pred": str(pred), "input": str(references), "inference": QUIET})
    shutil.copy(references / "demo_001.nii.gz", pred)
    moved = nib.load(pred / "demo_002.nii.gz")
    affine = moved.affine.copy()
    affine[:3, 3] += 5.0
    nib.save(nib.Nifti1Image(np.asarray(moved.dataobj), affine), pred / "demo_002.nii.gz")
    with pytest.raises(PredictionError) as err:
        evaluate({"pred": str(pred), "input": str(references), "inference": QUIET})
    lines = str(err.value).splitlines()
    assert "1 prediction(s) on another voxel grid" in lines[0] and len(lines) == 2
    assert lines[1].strip().startswith("demo_002: demo_002.nii.gz is on another grid than") and "origin" in lines[1]
    assert not (pred / "metrics.csv").exists() and not (pred / "summary.json").exists()


def test_evaluate_needs_a_checkpoint_or_predictions(references: Path) -> None:
    with pytest.raises(PredictionError, match=r"^ckpt or pred is required: ckpt=<checkpoint> predicts input"):
        evaluate({"input": str(references), "inference": QUIET})


def test_extra_predictions_are_named_and_foreign_values_fail_their_case(references: Path, tmp_path: Path) -> None:
    pred = tmp_path / "pred"
    shutil.copytree(references, pred)
    shutil.copy(references / "demo_000.nii.gz", pred / "other.nii.gz")
    label = nib.load(pred / "demo_001.nii.gz")
    voxels = np.asarray(label.dataobj).copy()
    voxels[0, 0, 0] = 7
    nib.save(nib.Nifti1Image(voxels, label.affine), pred / "demo_001.nii.gz")
    result = evaluate({"pred": str(pred), "input": str(references), "output": str(tmp_path / "scores"),
                       "inference": QUIET})
    assert result.exit_code == 1 and result.summary["not_scored"] == ["other"]
    assert [failure["case"] for failure in result.failed] == ["demo_001"]
    assert "7" in result.failed[0]["reason"] and result.summary["num_scored"] == 2


@pytest.mark.full
def test_the_scripts_predict_then_score(ckpt: Path, images: Path, references: Path, tmp_path: Path) -> None:
    predicted = run_script("predict.py", [f"ckpt={ckpt}", f"input={images}", "output=out",
                                          "inference.progress=false"], cwd=tmp_path)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert "3/3 case(s) predicted" in predicted.stdout
    scored = run_script("evaluate.py", [f"pred={tmp_path / 'out'}", f"input={references}",
                                        "inference.progress=false"], cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "3/3 case(s) of" in scored.stdout and "foreground mean" in scored.stdout
    (tmp_path / "out" / "demo_000.nii.gz").unlink()
    missing = run_script("evaluate.py", [f"pred={tmp_path / 'out'}", f"input={references}"], cwd=tmp_path)
    assert missing.returncode == 1 and "no prediction for 1 of the 3 reference case(s): demo_000" in missing.stderr


@pytest.mark.parametrize("content", [b"", b"not a gzip stream"], ids=["empty", "not-gzip"])
def test_an_unreadable_prediction_fails_its_case_by_name(references: Path, tmp_path: Path, content: bytes) -> None:
    """An empty file or one that is no gzip stream under ``.nii.gz`` fails its case as a truncated stream does; the
    grid check, which reads headers only, leaves it to its case."""
    pred = tmp_path / "pred"
    shutil.copytree(references, pred)
    (pred / "demo_001.nii.gz").write_bytes(content)
    result = evaluate({"pred": str(pred), "input": str(references), "output": str(tmp_path / "scores"),
                       "inference": QUIET})
    assert result.exit_code == 1 and result.summary["num_scored"] == 2
    assert [failure["case"] for failure in result.failed] == ["demo_001"]
    assert "demo_001.nii.gz: cannot read file" in result.failed[0]["reason"]


@pytest.mark.parametrize("folder", ["pred", "references"])
def test_a_case_under_two_endings_is_refused_by_name(references: Path, tmp_path: Path, folder: str) -> None:
    pred = tmp_path / "pred"
    shutil.copytree(references, pred)
    twice = pred if folder == "pred" else references
    nib.save(nib.load(twice / "demo_002.nii.gz"), twice / "demo_002.nii")
    with pytest.raises(PredictionError, match=r"1 case\(s\) held by two or more files .*\(demo_002: demo_002\.nii, "
                                              r"demo_002\.nii\.gz\); keep one file per case$"):
        evaluate({"pred": str(pred), "input": str(references), "inference": QUIET})


def test_references_without_foreground_and_no_class_list_score_nothing(references: Path, tmp_path: Path) -> None:
    for path in references.iterdir():
        label = nib.load(path)
        nib.save(nib.Nifti1Image(np.zeros(label.shape, np.uint8), label.affine), path)
    pred = Path(shutil.copytree(references, tmp_path / "pred"))
    with pytest.raises(PredictionError, match=r"nothing to score: the 3 reference\(s\) hold only background \(0\) "
                                              r"and no class list names the classes"):
        evaluate({"pred": str(pred), "input": str(references), "inference": QUIET})
    assert not (pred / "summary.json").exists()
