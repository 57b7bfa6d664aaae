"""Another tool's out-of-fold predictions as a setting of the verdict (``compare.py DIR nnunet=RESULTS``,
``extra=NAME=DIR``): scored by medseg on the sweep's cases and paired with its settings; folds, cases and grids that
differ stop with one line before anything is written; settings scored on different datasets are refused.

The sweep is a two-fold multirun of the tiny demo with test checkpoints (``tests/helpers/sweeps.py``),
cross-validated; the nnU-Net results folder is laid out as nnU-Net v2 writes it, its "predictions" the labels
themselves (a perfect tool), its training logs written by hand.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from medseg.commands import compare
from medseg.errors import ConfigError, DatasetError
from medseg.evaluation.compare import build_comparison
from medseg.evaluation.compare_settings import FOREGROUND
from medseg.evaluation.crossval import cross_validate
from medseg.evaluation.external import NNUNET, log_times, parse_source
from medseg.scoring.paired import NO_EVIDENCE, WORSE
from tests.helpers.files import read_csv
from tests.helpers.references import reference_dice
from tests.helpers.sweeps import NUM_FOLDS, make_crossvalidated_sweep, make_fold_sweep, metric_rows

EPOCH_TIMES = {0: [12.5, 11.0, 10.25], 1: [13.0, 12.0]}
"""The ``Epoch time`` lines of each fold's training log."""


def training_log(times: list[float]) -> str:
    """An nnU-Net training log: time-stamped lines, one ``Epoch time`` per epoch, the last line 100 s after the
    first."""
    lines = ["2026-01-01 10:00:00.000000: This is the configuration used by this training:"]
    lines += [f"2026-01-01 10:00:{10 + i:02d}.500000: Epoch time: {t} s" for i, t in enumerate(times)]
    return "\n".join([*lines, "2026-01-01 10:01:40.000000: Training done."]) + "\n"


def nnunet_results(folder: Path, sweep: Path, root: Path) -> Path:
    """An nnU-Net trained-model folder whose fold k predicted fold k's validation cases of ``sweep`` perfectly (the
    labels copied), with a training log per fold."""
    results = folder / "nnUNetTrainer__nnUNetPlans__3d_fullres"
    for job in sorted(p for p in sweep.iterdir() if (p / "splits.json").is_file()):
        splits = json.loads((job / "splits.json").read_text())
        validation = results / f"fold_{splits['fold']}" / "validation"
        validation.mkdir(parents=True)
        for case in splits["val"]:
            shutil.copy(root / "labelsTr" / f"{case}.nii.gz", validation / f"{case}.nii.gz")
        (validation / "summary.json").write_text("{}")
        log = validation.parent / "training_log_2026_1_1_10_00_00.txt"
        log.write_text(training_log(EPOCH_TIMES[splits["fold"]]))
    return results


@pytest.fixture(scope="module")
def sweep_and_results(tmp_path_factory: pytest.TempPathFactory, tiny_demo_root: Path) -> tuple[Path, Path]:
    """A cross-validated two-fold multirun of the tiny demo (random test checkpoints), and a perfect nnU-Net."""
    base = tmp_path_factory.mktemp("external")
    sweep = make_fold_sweep(base / "multirun", tiny_demo_root)
    cross_validate({"dir": str(sweep), "inference": {"progress": False}})
    return sweep, nnunet_results(base / "nnunet", sweep, tiny_demo_root)


@pytest.fixture
def fresh(sweep_and_results: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the sweep and of the results, for a test that changes or writes into them."""
    sweep, results = sweep_and_results
    return (Path(shutil.copytree(sweep, tmp_path / "multirun")),
            Path(shutil.copytree(results, tmp_path / "nnunet" / results.name)))


def test_nnunet_is_a_setting_scored_on_the_same_cases(fresh: tuple[Path, Path], tiny_demo_root: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    sweep, results = fresh
    assert compare([str(sweep), f"nnunet={results}", "reference=nnunet"]) == 0
    scores = read_csv(sweep / "external" / NNUNET / "metrics.csv")
    assert len(scores) == 8 * 2, "every out-of-fold case, each class"
    for row in scores[:4]:
        label = np.asarray(nib.load(tiny_demo_root / "labelsTr" / f"{row['case']}.nii.gz").dataobj)
        index = int(row["class_index"])
        assert float(row["dice"]) == pytest.approx(reference_dice(label == index, label == index)) == 1.0

    report = json.loads((sweep / "compare.nnunet.json").read_text())
    assert report["reference"] == NNUNET
    settings = {s["setting"]: s for s in report["settings"]}
    assert settings[NNUNET]["dice"] == pytest.approx(1.0) and settings[NNUNET]["cases"] == 8
    fold_sums = [sum(times) for times in EPOCH_TIMES.values()]
    assert settings[NNUNET]["compute"]["train_seconds"] == pytest.approx(sum(fold_sums) / len(fold_sums))
    assert settings[NNUNET]["compute"]["wall_seconds"] == pytest.approx(100.0)
    medseg_row = next(c for c in report["comparisons"] if c["setting"] == "(all runs)" and c["output"] == FOREGROUND
                      and c["metric"] == "dice")
    assert medseg_row["cases"] == 8 and medseg_row["verdict"] == WORSE and medseg_row["ci_high"] < 0
    markdown = (sweep / "compare.nnunet.md").read_text()
    assert f"Reference: `{NNUNET}`" in markdown and str(results) in markdown
    if importlib.util.find_spec("nnunetv2") is None:
        assert "parameters blank: nnunetv2 is not installed" in markdown
    assert NNUNET in capsys.readouterr().out


def test_another_tools_folder_joins_as_a_named_setting(fresh: tuple[Path, Path]) -> None:
    """medseg's own out-of-fold predictions, given as another tool's, pair with medseg's setting at zero
    difference."""
    sweep, _ = fresh
    mine = sweep.parent / "mine"
    shutil.copytree(sweep / "crossval" / "predictions", mine, ignore=shutil.ignore_patterns("*.npz"))
    comparison = build_comparison(sweep, reference="mine", external=[parse_source(f"extra=mine={mine}")],
                                  progress=False)
    row = comparison.foreground()["(all runs)"]
    assert comparison.reference.label == "mine" and row.difference.cases == 8
    assert row.difference.mean == 0.0 and row.verdict == NO_EVIDENCE


def test_a_name_given_again_is_another_seed(fresh: tuple[Path, Path], tiny_demo_root: Path) -> None:
    """nnU-Net trained twice: a perfect run and one that missed a case; the setting holds both seeds, each scored into
    its own folder, its per-case scores their mean and its compute the mean of what each recorded."""
    sweep, results = fresh
    again = Path(shutil.copytree(results, results.parent.parent / "nnunet_again" / results.name))
    missed = sorted((again / "fold_0" / "validation").glob("*.nii.gz"))[0]
    image = nib.load(missed)
    nib.save(nib.Nifti1Image(np.zeros(image.shape, np.uint8), image.affine), missed)
    for log in again.glob("fold_*/training_log_*.txt"):
        log.write_text(training_log([2 * t for t in EPOCH_TIMES[int(log.parent.name.split("_")[1])]]))
    comparison = build_comparison(sweep, reference=NNUNET, progress=False,
                                  external=[parse_source(f"nnunet={results}"), parse_source(f"nnunet={again}")])
    setting = comparison.reference
    assert len(setting.seeds) == 2 and [p.parent.name for p in setting.crossvals] == ["seed_0", "seed_1"]
    dice = setting.scores[(FOREGROUND, "dice")]
    case = missed.name.removesuffix(".nii.gz")
    assert dice[case] == pytest.approx(0.5) and all(v == pytest.approx(1.0) for c, v in dice.items() if c != case)
    fold_sums = [sum(times) for times in EPOCH_TIMES.values()]
    assert setting.compute["train_seconds"] == pytest.approx(1.5 * sum(fold_sums) / len(fold_sums))
    assert str(results) in setting.source and str(again) in setting.source


def test_a_folder_given_twice_stops(fresh: tuple[Path, Path]) -> None:
    sweep, results = fresh
    with pytest.raises(ConfigError, match="given twice"):
        build_comparison(sweep, progress=False,
                         external=[parse_source(f"nnunet={results}"), parse_source(f"nnunet={results}/.")])
    assert _nothing_written(sweep)


def _nothing_written(sweep: Path) -> bool:
    return not (sweep / "compare.md").exists() and not (sweep / "external").exists()


@pytest.mark.parametrize("removed", ["fold_1/validation", "fold_1"])
def test_a_missing_fold_stops_with_one_line(fresh: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                            removed: str) -> None:
    sweep, results = fresh
    shutil.rmtree(results / removed)
    assert compare([str(sweep), f"nnunet={results}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no fold_1/validation" in err and _nothing_written(sweep)


def test_cases_that_differ_from_the_sweeps_stop_with_one_line(fresh: tuple[Path, Path],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    sweep, results = fresh
    dropped = sorted((results / "fold_0" / "validation").glob("*.nii.gz"))[0]
    moved = results / "fold_1" / "validation" / "not_in_the_sweep.nii.gz"
    dropped.rename(moved)
    assert compare([str(sweep), f"nnunet={results}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and _nothing_written(sweep)
    assert dropped.name.removesuffix(".nii.gz") in err and "not_in_the_sweep" in err and "data.splits=" in err


def test_a_prediction_on_another_grid_stops_before_scoring(fresh: tuple[Path, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    sweep, results = fresh
    path = sorted((results / "fold_0" / "validation").glob("*.nii.gz"))[0]
    image = nib.load(path)
    affine = image.affine.copy()
    affine[:3, 3] += 5.0
    nib.save(nib.Nifti1Image(np.asarray(image.dataobj), affine), path)
    assert compare([str(sweep), f"nnunet={results}"]) == 1
    err = capsys.readouterr().err
    assert path.name.removesuffix(".nii.gz") in err and "another voxel grid" in err and _nothing_written(sweep)


def test_bad_options_are_usage_errors(sweep_and_results: tuple[Path, Path],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    sweep, _ = sweep_and_results
    for option in ("extra=mine", "extra=nnunet=DIR", "extra=9x=DIR", "nnunet="):
        with pytest.raises(SystemExit) as stopped:
            compare([str(sweep), option])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and option in err and ("extra=NAME=FOLDER" in err or "must be a word" in err)


def test_a_log_without_epochs_gives_no_time(tmp_path: Path) -> None:
    log = tmp_path / "training_log.txt"
    log.write_text("2026-01-01 10:00:00.000000: start\n")
    train, wall = log_times(log)
    assert np.isnan(train) and np.isnan(wall)


def _with_digests(sweep: Path, label: str, digests: dict[str, str], root: str) -> None:
    folder = sweep / "crossval" / label
    (folder / "summary.json").write_text(json.dumps({"labels_sha256": digests, "data_root": root}))


def test_settings_scored_on_different_datasets_are_refused(tmp_path: Path) -> None:
    """Two settings whose case names coincide but whose labels differ (two datasets): no pairs, no verdict."""
    cases = [f"case_{i}" for i in range(8)]
    rows = metric_rows(dict.fromkeys(cases, 0.5))
    sweep = make_crossvalidated_sweep(tmp_path / "multirun", {"model.bottleneck=none": [rows],
                                                              "model.bottleneck=masa": [rows]})
    _with_digests(sweep, "model.bottleneck=none", dict.fromkeys(cases, "a"), "/data/A")
    _with_digests(sweep, "model.bottleneck=masa", {**dict.fromkeys(cases, "a"), "case_3": "b"}, "/data/B")
    with pytest.raises(DatasetError) as refused:
        build_comparison(sweep)
    message = str(refused.value)
    assert "model.bottleneck=masa" in message and "model.bottleneck=none" in message
    assert "/data/A" in message and "/data/B" in message and "case_3" in message


def test_two_datasets_with_the_same_case_names_are_told_apart(tmp_path: Path, tiny_demo_root: Path) -> None:
    """The real path: two settings trained and cross-validated on two copies of the demo, one with a label changed."""
    other = Path(shutil.copytree(tiny_demo_root, tmp_path / "other"))
    label = sorted((other / "labelsTr").glob("*.nii.gz"))[0]
    image = nib.load(label)
    values = np.asarray(image.dataobj).copy()
    values[0, 0, 0] = 1 - values[0, 0, 0] if values[0, 0, 0] in (0, 1) else 0
    nib.save(nib.Nifti1Image(values, image.affine), label)
    sweep = make_fold_sweep(tmp_path / "multirun", tiny_demo_root, overrides=["model.bottleneck=none"])
    make_fold_sweep(sweep, other, overrides=["model.bottleneck=masa"], first_job=NUM_FOLDS)
    cross_validate({"dir": str(sweep), "inference": {"progress": False}})
    with pytest.raises(DatasetError, match=rf"{other}.*{tiny_demo_root}|{tiny_demo_root}.*{other}"):
        build_comparison(sweep, resamples=99)


def _swap_values(path: Path) -> None:
    """Rewrite a label map with its values 1 and 2 swapped."""
    image = nib.load(path)
    values = np.asarray(image.dataobj)
    nib.save(nib.Nifti1Image(np.choose(values, [0, 2, 1]).astype(values.dtype), image.affine), path)


def _nnunet_dataset_json(results: Path, labels: dict[str, int]) -> None:
    (results / "dataset.json").write_text(json.dumps({"channel_names": {"0": "MRI"}, "labels": labels,
                                                      "numTraining": 8, "file_ending": ".nii.gz"}))


def test_nnunets_own_label_numbering_is_matched_by_name(fresh: tuple[Path, Path]) -> None:
    """nnU-Net's dataset.json numbers the demo's two classes the other way round and its label maps say so: perfect
    predictions score Dice 1 once the classes are matched by name."""
    sweep, results = fresh
    for path in results.glob("fold_*/validation/*.nii.gz"):
        _swap_values(path)
    _nnunet_dataset_json(results, {"background": 0, "bright sphere": 1, "dim sphere": 2})
    comparison = build_comparison(sweep, reference=NNUNET, external=[parse_source(f"nnunet={results}")],
                                  progress=False)
    assert comparison.reference.label == NNUNET
    scores = read_csv(sweep / "external" / NNUNET / "metrics.csv")
    assert len(scores) == 8 * 2 and all(float(row["dice"]) == 1.0 for row in scores)


def test_nnunet_classes_that_cannot_be_matched_stop_with_one_line(fresh: tuple[Path, Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    sweep, results = fresh
    _nnunet_dataset_json(results, {"background": 0, "spleen": 1, "dim sphere": 2})
    assert compare([str(sweep), f"nnunet={results}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and _nothing_written(sweep)
    assert "cannot be matched by name" in err and "spleen" in err and "bright sphere" in err


def test_a_fold_holding_other_cases_than_the_sweeps_fold_is_named(fresh: tuple[Path, Path],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The union of the folds is the sweep's, but one case of each fold was predicted by the other fold."""
    sweep, results = fresh
    first = sorted((results / "fold_0" / "validation").glob("*.nii.gz"))[0]
    second = sorted((results / "fold_1" / "validation").glob("*.nii.gz"))[0]
    first.rename(results / "fold_1" / "validation" / first.name)
    second.rename(results / "fold_0" / "validation" / second.name)
    assert compare([str(sweep), f"nnunet={results}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and _nothing_written(sweep)
    case = first.name.removesuffix(".nii.gz")
    assert "fold_0/validation predicts other cases than the sweep's fold 0" in err
    assert f"only the sweep's fold 0 holds {case}" in err and second.name.removesuffix(".nii.gz") in err


@pytest.mark.parametrize("content", [b"", b"not a gzip stream"], ids=["empty", "not-gzip"])
def test_an_unreadable_nnunet_prediction_stops_with_one_line(fresh: tuple[Path, Path],
                                                             capsys: pytest.CaptureFixture[str],
                                                             content: bytes) -> None:
    sweep, results = fresh
    path = sorted((results / "fold_0" / "validation").glob("*.nii.gz"))[0]
    path.write_bytes(content)
    assert compare([str(sweep), f"nnunet={results}"]) == 1
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]  # after the scoring's progress bar
    assert last.startswith("error: ") and "cannot be scored" in last and f"{path}: cannot read file" in last
    assert not (sweep / "external").exists()


def test_a_case_under_two_endings_in_a_fold_is_refused(fresh: tuple[Path, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    sweep, results = fresh
    path = sorted((results / "fold_0" / "validation").glob("*.nii.gz"))[0]
    nib.save(nib.load(path), path.with_name(path.name.removesuffix(".gz")))
    assert compare([str(sweep), f"nnunet={results}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and _nothing_written(sweep)
    assert "held by two or more files" in err and path.name in err
