"""Cross-validation of a multirun of folds: the out-of-fold predictions are evaluate's, scored together (mean ±
std equal to the per-case rows, which equal an independent Dice of the written files), the postprocessing decided;
a wider sweep gets one cross-validation per setting, also from the multirun callback; bad multiruns stop with one
line and write nothing.

The multiruns are built as training writes them (``tests/helpers/sweeps.py``: job folders with overrides,
metrics.json, splits.json and a tiny checkpoint); a real `train.py -m data.fold=0,1` run is in the slow suite.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from omegaconf import OmegaConf

from medseg.errors import CheckpointError, ConfigError, DatasetError
from medseg.evaluation.crossval import cross_validate
from medseg.evaluation.evaluate import evaluate
from medseg.sweeps.callbacks import SummarizeSweep
from tests.helpers.configs import TINY_OVERRIDES, run_script
from tests.helpers.files import read_csv
from tests.helpers.references import reference_dice
from tests.helpers.sweeps import NUM_FOLDS, make_fold_sweep


@pytest.fixture(scope="module")
def crossvalidated(tmp_path_factory: pytest.TempPathFactory, tiny_demo_root: Path) -> Path:
    """A two-fold multirun of the tiny demo, cross-validated."""
    sweep = make_fold_sweep(tmp_path_factory.mktemp("cv") / "multirun", tiny_demo_root)
    cross_validate({"dir": str(sweep), "inference": {"progress": False}})
    return sweep


def test_out_of_fold_predictions_are_evaluates(crossvalidated: Path, tiny_demo_root: Path, tmp_path: Path) -> None:
    predictions = crossvalidated / "crossval" / "predictions"
    assert len(list(predictions.glob("*.nii.gz"))) == 8, "every case once"
    fold0 = json.loads((crossvalidated / "0" / "splits.json").read_text())["val"]
    result = evaluate({"ckpt": str(crossvalidated / "0" / "checkpoints" / "best.pt"), "input": str(tiny_demo_root),
                       "split": "validation", "output": str(tmp_path), "inference": {"progress": False}})
    assert sorted(r["case"] for r in result.rows[::2]) == sorted(fold0)
    for case in fold0:
        ours, theirs = nib.load(predictions / f"{case}.nii.gz"), nib.load(tmp_path / f"{case}.nii.gz")
        np.testing.assert_array_equal(np.asarray(ours.dataobj), np.asarray(theirs.dataobj))
        np.testing.assert_array_equal(ours.affine, nib.load(tiny_demo_root / "imagesTr" / f"{case}.nii.gz").affine)
    assert not list(crossvalidated.glob("crossval/*.tmp")) and not list(crossvalidated.glob(".crossval*"))


def test_all_cases_scored_together_mean_and_std(crossvalidated: Path, tiny_demo_root: Path) -> None:
    folder = crossvalidated / "crossval"
    rows = read_csv(folder / "metrics.csv")
    assert len(rows) == 8 * 2
    for row in rows[:4]:
        pred = np.asarray(nib.load(folder / "predictions" / f"{row['case']}.nii.gz").dataobj)
        label = np.asarray(nib.load(tiny_demo_root / "labelsTr" / f"{row['case']}.nii.gz").dataobj)
        index = int(row["class_index"])
        assert float(row["dice"]) == pytest.approx(reference_dice(pred == index, label == index))
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["num_scored"] == 8 and [f["fold"] for f in summary["folds"]] == [0, 1]
    markdown = (folder / "summary.md").read_text()
    for name, stats in summary["classes"].items():
        for metric in ("dice", "nsd", "hd95_mm"):
            values = [float(r[metric]) for r in rows if r["class_name"] == name]
            finite = [v for v in values if math.isfinite(v)]
            if not finite:
                continue
            assert stats[metric] == pytest.approx(np.mean(finite))
            assert stats[f"{metric}_std"] == pytest.approx(np.std(finite, ddof=1) if len(finite) > 1 else 0.0)
        assert f"| {name} | {stats['dice']:.4f} ± {stats['dice_std']:.4f} |" in markdown


def test_postprocessing_decided_on_the_out_of_fold_cases(crossvalidated: Path) -> None:
    folder = crossvalidated / "crossval"
    decision = json.loads((folder / "postprocessing.json").read_text())
    assert decision["checkpoints"] == ["0/checkpoints/best.pt", "1/checkpoints/best.pt"]
    summary = json.loads((folder / "summary.json").read_text())
    for name, entry in decision["classes"].items():
        none = entry["candidates"]["none"]
        assert none["dice"] == pytest.approx(summary["classes"][name]["dice"])
        assert summary["postprocessing"][name] == entry["step"]
        for step, scores in entry["candidates"].items():  # a step with more Dice than the chosen one worsens HD95
            hd95, hd95_none = (math.nan if v is None else v for v in (scores["hd95_mm"], none["hd95_mm"]))
            allowed = scores["hd95_excluded"] <= none["hd95_excluded"] and not hd95 > hd95_none
            if step == entry["step"]:
                assert step == "none" or (allowed and scores["dice"] > none["dice"])
            elif scores["dice"] > entry["candidates"][entry["step"]]["dice"]:
                assert not allowed


def test_a_sweep_over_gamma_and_folds_gets_a_cross_validation_per_gamma(tmp_path: Path, tiny_demo_root: Path) -> None:
    """The multirun callback cross-validates (data.fold is swept), and the sweep summary reports each gamma's mean
    over its folds, never a single fold."""
    sweep = tmp_path / "multirun"
    make_fold_sweep(sweep, tiny_demo_root, overrides=["model.attention.gamma=0.8"])
    make_fold_sweep(sweep, tiny_demo_root, overrides=["model.attention.gamma=0.9"], first_job=NUM_FOLDS)
    for job, dice in zip(range(4), (0.6, 0.8, 0.7, 0.75)):
        (sweep / str(job) / "metrics.json").write_text(json.dumps({"status": "completed", "best_val_dice": dice}))
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}, "trainer": {"progress": False}})
    callback = SummarizeSweep(reference="model.attention.gamma=0.8")
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)
    for gamma, jobs in (("0.8", ["0", "1"]), ("0.9", ["2", "3"])):
        summary = json.loads((sweep / "crossval" / f"model.attention.gamma={gamma}" / "summary.json").read_text())
        assert [f["run"] for f in summary["folds"]] == jobs and summary["num_scored"] == 8
    markdown = (sweep / "summary.md").read_text()
    assert "| 0.8 | 0,1 | 2/2 |" in markdown and "0.7000 ± 0.1414" in markdown
    # the two gammas' folds are the same networks (the checkpoints' seed is the fold): identical out-of-fold cases,
    # so the highest mean of the training's validation is no best setting, and the comparison finds no difference
    assert ("no best setting: model.attention.gamma=0.9 -> best_val_dice 0.7250 ± 0.0354 over 2 folds (runs 2, 3) "
            "has the highest mean but is not significantly better than the runner-up model.attention.gamma=0.8 on 8 "
            "out-of-fold cases (Dice difference +0.0000") in markdown
    assert "`compare.model.attention.gamma=0.8.md`" in markdown, "the summary links the report of its reference"
    compared = json.loads((sweep / "compare.model.attention.gamma=0.8.json").read_text())
    assert compared["reference"] == "model.attention.gamma=0.8"
    row = next(r for r in compared["comparisons"] if r["output"] == "foreground mean" and r["metric"] == "dice")
    assert (row["setting"], row["cases"], row["difference"], row["p"]) == ("model.attention.gamma=0.9", 8, 0.0, 1.0)
    assert row["verdict"] == "no evidence of a difference"
    assert (sweep / "compare.model.attention.gamma=0.8.png").is_file()


@pytest.mark.full
def test_a_multirun_without_finished_folds(tmp_path: Path, tiny_demo_root: Path) -> None:
    sweep = make_fold_sweep(tmp_path / "multirun", tiny_demo_root, status="failed")
    result = run_script("crossval.py", [str(sweep)], cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"error: dir={sweep}: no finished fold") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(CheckpointError, match=f"ckpt={sweep}: no finished fold"):
        evaluate({"ckpt": str(sweep), "input": str(tiny_demo_root), "output": str(tmp_path / "out")})
    assert not (sweep / "crossval").exists() and not (tmp_path / "out").exists()


def _rewrite_splits(job: Path, **changes: object) -> None:
    splits = json.loads((job / "splits.json").read_text())
    (job / "splits.json").write_text(json.dumps({**splits, **changes}))


@pytest.mark.parametrize(("change", "message"), [
    ({"val": []}, "fold 1 has no validation cases"),
    ({"fold": "all"}, "trained with data.fold=all"),
    ({"val": ["demo_000", "demo_001"]}, "case demo_00[01] is a validation case of both"),
])
def test_folds_that_cannot_be_cross_validated(tmp_path: Path, tiny_demo_root: Path, change: dict,
                                              message: str) -> None:
    sweep = make_fold_sweep(tmp_path / "multirun", tiny_demo_root)
    _rewrite_splits(sweep / "0", val=["demo_000", "demo_001"])
    _rewrite_splits(sweep / "1", **change)
    with pytest.raises(DatasetError, match=message):
        cross_validate({"dir": str(sweep), "inference": {"progress": False}})
    assert not (sweep / "crossval").exists()


def test_an_unfinished_fold_is_left_out_and_named(tmp_path: Path, tiny_demo_root: Path) -> None:
    sweep = make_fold_sweep(tmp_path / "multirun", tiny_demo_root, folds=[1])
    (result,) = cross_validate({"dir": str(sweep), "inference": {"progress": False}, "postprocessing": False})
    fold1 = json.loads((sweep / "0" / "splits.json").read_text())["val"]
    assert result.summary["missing_folds"] == [0] and result.summary["num_scored"] == len(fold1)
    assert sorted(p.name for p in (sweep / "crossval").iterdir()) == ["metrics.csv", "predictions", "summary.json",
                                                                     "summary.md"]
    assert "Not finished, left out: fold(s) [0]." in (sweep / "crossval" / "summary.md").read_text()


def test_not_a_multirun(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no Hydra job folders"):
        cross_validate({"dir": str(tmp_path)})


@pytest.mark.slow
def test_five_fold_training_cross_validated_by_the_callback(tmp_path: Path, tiny_demo_root: Path) -> None:
    """``train.py -m data.fold=0,1`` on the tiny demo: the callback writes crossval/, and the ensemble of the folds
    (ckpt=<multirun>) predicts every case into one label map."""
    sweep = tmp_path / "sweep"
    result = run_script("train.py", ["-m", *TINY_OVERRIDES, "trainer.max_epochs=1", f"data.root={tiny_demo_root}",
                                     "data.num_folds=2", "data.fold=0,1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((sweep / "crossval" / "summary.json").read_text())
    assert summary["num_scored"] == 8 and (sweep / "crossval" / "postprocessing.json").is_file()
    assert "over 2 folds" in (sweep / "summary.md").read_text()
    result = run_script("evaluate.py", [f"ckpt={sweep}", f"input={tiny_demo_root}", "split=training", "output=ens",
                                        "inference.progress=false"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list((tmp_path / "ens").glob("*.nii.gz"))) == 8
