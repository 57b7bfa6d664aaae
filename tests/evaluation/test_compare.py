"""The verdict of a cross-validated sweep: predictions made worse by a known amount are found worse, with an interval
that holds the true difference; ``scripts/compare.py`` writes its four files from the per-case rows (seeds averaged,
Holm across the settings, compute beside them); sweeps it cannot judge stop with one line.

The sweeps are built as training and cross-validation leave them (``tests/helpers/sweeps.py``: job folders with
overrides and metrics.json, ``crossval/<setting>/metrics.csv`` written by hand), without training.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy import ndimage

from medseg.commands import compare
from medseg.data.labels import LabelSpec
from medseg.errors import ConfigError, DatasetError
from medseg.evaluation.compare import FILES, build_comparison
from medseg.evaluation.compare_plots import plot_panels
from medseg.evaluation.compare_settings import FOREGROUND
from medseg.runs.folders import FLOPS_KEY
from medseg.scoring.detection import LESION_COLUMNS
from medseg.scoring.paired import BETTER, NO_EVIDENCE, RESAMPLES, WORSE
from medseg.scoring.per_case import score_masks
from medseg.sweeps.callbacks import SummarizeSweep
from tests.helpers.files import read_csv
from tests.helpers.sweeps import make_crossvalidated_sweep, metric_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIDES = range(5, 10)
"""The cube sides (voxels) of the synthetic cases, drawn uniformly."""


def shifted_then_eroded_dice(side: int) -> tuple[float, float]:
    """By hand: the Dice of a cube of ``side`` predicted shifted by one voxel, and of that prediction eroded by one
    voxel (a cube of side - 2, inside the reference)."""
    shifted = (side - 1) * side**2 / side**3
    eroded = 2 * (side - 2) ** 3 / ((side - 2) ** 3 + side**3)
    return shifted, eroded


def test_eroded_predictions_are_worse_by_the_true_amount(tmp_path: Path) -> None:
    """Reference: each cube predicted one voxel off; the other setting: those predictions eroded by one voxel. The
    true mean difference is the expectation over the cube sides, computed by hand; the interval must hold it."""
    rng = np.random.default_rng(7)
    labels = LabelSpec.plain({0: "background", 1: "cube"})
    rows: dict[str, list[dict[str, Any]]] = {"model.bottleneck=none": [], "model.bottleneck=masa": []}
    for number in range(30):
        side = int(rng.choice(SIDES))
        corner = rng.integers(2, 16 - side - 1, size=3)
        reference = np.zeros((16, 16, 16), np.int64)
        reference[tuple(slice(c, c + side) for c in corner)] = 1
        prediction = np.roll(reference.astype(bool), 1, axis=0)
        for setting, mask in zip(rows, (prediction, ndimage.binary_erosion(prediction))):
            rows[setting] += score_masks(f"case_{number:02d}", mask[None], reference, (1.0, 1.0, 1.0), labels, 1.0)
    sweep = make_crossvalidated_sweep(tmp_path / "multirun", {setting: [r] for setting, r in rows.items()})

    comparison = build_comparison(sweep)
    row = comparison.foreground()["model.bottleneck=masa"]
    true_difference = fmean(eroded - shifted for shifted, eroded in map(shifted_then_eroded_dice, SIDES))
    assert row.verdict == WORSE and row.difference.cases == 30
    assert row.difference.low <= true_difference <= row.difference.high < 0
    assert comparison.reference.label == "model.bottleneck=none"


CASES = [f"case_{i:02d}" for i in range(24)]
CLASSES = ("liver", "tumour")
COMPUTE = {"params": 1000, "train_seconds": 36.0, "peak_memory_mb": 100.0, "device": "cuda:0"}


def seed_rows(rng: np.random.Generator, base: dict[str, np.ndarray], shift: float) -> list[dict[str, Any]]:
    """One seed's metrics.csv rows: each class's base Dice per case, plus ``shift`` and noise."""
    rows = []
    for index, name in enumerate(CLASSES, start=1):
        rows += metric_rows(dict(zip(CASES, base[name] + shift + rng.normal(0, 0.02, len(CASES)))), name, index)
    return rows


def fake_sweep(tmp_path: Path) -> tuple[Path, dict[str, list[list[dict[str, Any]]]]]:
    """none (the reference), masa (+0.05 Dice) and identity (the same distribution as none), two seeds each."""
    rng = np.random.default_rng(3)
    base = {name: rng.uniform(0.6, 0.9, len(CASES)) for name in CLASSES}
    rows = {f"model.bottleneck={block}": [seed_rows(rng, base, shift) for _ in range(2)]
            for block, shift in (("none", 0.0), ("masa", 0.05), ("identity", 0.0))}
    metrics = {setting: COMPUTE for setting in rows}
    metrics["model.bottleneck=masa"] = {**COMPUTE, FLOPS_KEY: 2.0}
    return make_crossvalidated_sweep(tmp_path / "multirun", rows, metrics=metrics), rows


def foreground_dice(seeds: list[list[dict[str, Any]]]) -> np.ndarray:
    """By hand: per case (in CASES order), the mean over the seeds and classes of the Dice."""
    return np.array([fmean(row["dice"] for rows in seeds for row in rows if row["case"] == case) for case in CASES])


def test_compare_script_writes_the_four_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep, rows = fake_sweep(tmp_path)
    assert (sweep / "crossval" / "model.bottleneck=masa_trainer.seed=1" / "metrics.csv").is_file()  # crossval's layout
    assert compare([str(sweep), "reference=model.bottleneck=none"]) == 0
    out = capsys.readouterr().out
    assert "model.bottleneck=masa" in out and f"{sweep}/compare.png" in out
    assert all((sweep / name).is_file() for name in FILES) and not list(sweep.glob(".compare*"))
    assert (sweep / "compare.png").read_bytes().startswith(PNG_MAGIC)

    dice = {setting: foreground_dice(seeds) for setting, seeds in rows.items()}
    reference, masa = dice["model.bottleneck=none"], dice["model.bottleneck=masa"]

    compared = json.loads((sweep / "compare.json").read_text())
    settings = {s["setting"]: s for s in compared["settings"]}
    assert list(settings) == list(rows) and compared["reference"] == "model.bottleneck=none"
    for setting, values in dice.items():
        assert settings[setting]["dice"] == pytest.approx(values.mean()) and settings[setting]["cases"] == len(CASES)
        assert settings[setting]["compute"] == pytest.approx({k: v for k, v in COMPUTE.items() if k != "device"}
                                                             | ({FLOPS_KEY: 2.0} if "masa" in setting else {}))
        assert settings[setting]["dice_per_gpu_hour"] == pytest.approx(values.mean() / 0.01)  # 36 s = 0.01 h
    assert settings["model.bottleneck=masa"]["dice_per_gflop"] == pytest.approx(masa.mean() / 2)  # 2 GFLOPs
    foreground = {r["setting"]: r for r in compared["comparisons"]
                  if r["output"] == FOREGROUND and r["metric"] == "dice"}
    raw = {setting: row["p"] for setting, row in foreground.items()}  # two seeds: the bootstrap of cases and seeds
    low, high = sorted(raw, key=raw.get)
    holm = {low: min(1.0, 2 * raw[low])}
    holm[high] = max(holm[low], raw[high])
    assert raw["model.bottleneck=masa"] == pytest.approx(1 / (RESAMPLES + 1)), "no resample comes near +0.05"
    for setting, row in foreground.items():
        assert row["difference"] == pytest.approx((dice[setting] - reference).mean()) and row["training_noise"]
        assert row["p_holm"] == pytest.approx(holm[setting])
        assert row["ci_low"] < row["difference"] < row["ci_high"]
    assert foreground["model.bottleneck=masa"]["verdict"] == BETTER
    assert foreground["model.bottleneck=identity"]["verdict"] == NO_EVIDENCE

    table = read_csv(sweep / "compare.csv")
    assert len(table) == 2 * (len(CLASSES) + 1) * 3  # settings x (classes, foreground) x (dice, hd95, nsd)
    assert {"setting", "output", "metric", "cases", "difference", "ci_low", "ci_high", "p", "p_holm", "verdict",
            "params", "train_seconds", "peak_memory_mb", "dice_per_gpu_hour", "dice_per_gflop"} <= set(table[0])
    hd95 = next(r for r in table if r["setting"] == "model.bottleneck=masa" and r["metric"] == "hd95_mm"
                and r["output"] == "liver")
    assert hd95["verdict"] == WORSE, "the fake HD95 is the Dice: higher is worse"
    markdown = (sweep / "compare.md").read_text()
    assert "| model.bottleneck=none | 2 | 24 |" in markdown and "| reference |" in markdown
    assert "![forest plot](compare.png)" in markdown


def test_help_explains_the_method(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_code:
        compare(["--help"])
    assert exit_code.value.code == 0
    method = capsys.readouterr().out
    assert all(word in method for word in ("paired", "bootstrap", "Wilcoxon", "Holm", "no evidence"))


def test_pairing_refuses_settings_scored_on_different_cases(tmp_path: Path) -> None:
    dice = dict.fromkeys(CASES[:6], 0.8)
    fewer = {case: dice[case] for case in CASES[:4]}
    sweep = make_crossvalidated_sweep(tmp_path / "cases", {"model.bottleneck=none": [metric_rows(dice)],
                                                           "model.bottleneck=masa": [metric_rows(fewer)]})
    with pytest.raises(DatasetError, match="model.bottleneck=masa lacks 2 case\\(s\\): case_04, case_05"):
        build_comparison(sweep)
    seeds = make_crossvalidated_sweep(tmp_path / "seeds", {"model.bottleneck=none": [metric_rows(dice)] * 2,
                                                           "model.bottleneck=masa": [metric_rows(dice),
                                                                                     metric_rows(fewer)]})
    with pytest.raises(DatasetError, match="trainer.seed=1 lacks 2 case\\(s\\): case_04, case_05"):
        build_comparison(seeds)


def test_a_sweep_without_folds_needs_cross_validation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [metric_rows(dict.fromkeys(CASES[:4], 0.8))]
    sweep = make_crossvalidated_sweep(tmp_path / "multirun", {"model.bottleneck=none": rows,
                                                              "model.bottleneck=masa": rows}, folds=1)
    assert compare([str(sweep)]) == 1
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and error.startswith("error: ")
    assert "a verdict needs cross-validation (data.fold=0,1,2,3,4)" in error
    assert not any((sweep / name).exists() for name in FILES)


def test_the_reference_must_pick_one_setting(tmp_path: Path) -> None:
    rows = [metric_rows(dict.fromkeys(CASES[:4], 0.8))]
    settings = {f"model.bottleneck={b} model.attention.gamma={g}": rows for b in ("none", "masa") for g in (0.8, 0.9)}
    sweep = make_crossvalidated_sweep(tmp_path / "multirun", settings)
    with pytest.raises(ConfigError, match="reference=model.bottleneck=mha matches no cross-validated settings"):
        build_comparison(sweep, "model.bottleneck=mha")
    with pytest.raises(ConfigError, match="reference=model.bottleneck=none matches 2 "):
        build_comparison(sweep)
    chosen = build_comparison(sweep, "model.bottleneck=none model.attention.gamma=0.9")
    assert chosen.reference.label == "model.bottleneck=none model.attention.gamma=0.9"
    assert len(chosen.foreground()) == 3


def test_the_callback_compares_after_the_cross_validation_and_never_raises(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    sweep, _ = fake_sweep(tmp_path)
    monkeypatch.setattr(SummarizeSweep, "_cross_validate", staticmethod(lambda sweep_dir, config: True))  # crossval/ is
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})  # there already, written by hand
    with caplog.at_level(logging.INFO, logger="medseg"):
        SummarizeSweep().on_multirun_end(config)
    assert all((sweep / name).is_file() for name in FILES) and "comparison written to" in caplog.text
    for name in FILES:
        (sweep / name).unlink()
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="medseg"):
        SummarizeSweep(reference="model.bottleneck=mha").on_multirun_end(config)
    assert f"retry with: python scripts/compare.py {sweep} 'reference=model.bottleneck=mha'" in caplog.text
    assert (sweep / "summary.md").is_file() and not (sweep / "compare.md").exists()


def test_two_multiruns_of_different_keys_in_one_folder_are_labelled_by_what_each_set(tmp_path: Path) -> None:
    rows = [metric_rows(dict.fromkeys(CASES[:4], 0.8))]
    cnn = "experiment=resenc_m trainer.batch_size=2"
    sweep = make_crossvalidated_sweep(tmp_path / "multirun", {"model.bottleneck=none": rows, cnn: rows})
    comparison = build_comparison(sweep)
    assert [setting.label for setting in comparison.settings] == ["model.bottleneck=none", cnn]
    assert comparison.reference.label == "model.bottleneck=none"


LESION_CASES = 12
"""Cases of the lesion sweep; the last :data:`EMPTY_CASES` hold no lesion."""
EMPTY_CASES = 3
ORGAN_DICE = 5 / 6
"""By hand: a cube of side 6 predicted one voxel off along one axis."""


def lesion_sweep(tmp_path: Path) -> Path:
    """An organ (a cube of side 6, predicted one voxel off by every setting) and a lesion (a 2-voxel cube) in all but
    the last cases. none (the reference) predicts no lesion; masa finds every lesion exactly; identity misses them and
    predicts one stray lesion component in every case."""
    labels = LabelSpec.plain({0: "background", 1: "organ", 2: "lesion"})
    rows: dict[str, list[dict[str, Any]]] = {f"model.bottleneck={b}": [] for b in ("none", "masa", "identity")}
    for number in range(LESION_CASES):
        reference = np.zeros((16, 16, 16), np.int64)
        reference[2:8, 2:8, 2:8] = 1
        organ = np.roll(reference == 1, 1, axis=0)
        lesion = np.zeros_like(organ)
        if number < LESION_CASES - EMPTY_CASES:
            reference[11:13, 11:13, 11:13] = 2
            lesion[11:13, 11:13, 11:13] = True
        stray = np.zeros_like(organ)
        stray[13:15, 2:4, 12:14] = True
        for setting, predicted in zip(rows, (np.zeros_like(organ), lesion, stray)):
            rows[setting] += score_masks(f"case_{number:02d}", np.stack([organ, predicted]), reference,
                                         (1.0, 1.0, 1.0), labels, 1.0)
    return make_crossvalidated_sweep(tmp_path / "multirun", {setting: [r] for setting, r in rows.items()})


def test_lesions_found_and_false_positives_get_their_verdicts(tmp_path: Path) -> None:
    sweep = lesion_sweep(tmp_path)
    comparison = build_comparison(sweep)
    rows = {(row.setting, row.output, row.metric): row for row in comparison.rows}
    lesion_cases = LESION_CASES - EMPTY_CASES

    found = rows[("model.bottleneck=masa", "lesion", "lesion_sensitivity")]
    assert found.verdict == BETTER and found.difference.cases == lesion_cases, "no sensitivity without a lesion"
    assert (found.difference.mean, found.difference.low, found.difference.high) == (1.0, 1.0, 1.0)
    missed = rows[("model.bottleneck=identity", "lesion", "lesion_sensitivity")]
    assert missed.verdict == NO_EVIDENCE and missed.difference.mean == 0.0
    stray = rows[("model.bottleneck=identity", "lesion", "lesion_false_positives")]
    assert stray.verdict == WORSE and stray.difference.mean == 1.0 and stray.difference.cases == LESION_CASES
    assert rows[("model.bottleneck=masa", "lesion", "lesion_false_positives")].difference.mean == 0.0
    assert rows[("model.bottleneck=masa", "lesion", "lesion_dice")].difference.cases == 0, "none found by none"
    assert ("model.bottleneck=masa", FOREGROUND, "lesion_sensitivity") not in rows, "lesions are per output"

    # Metrics Reloaded: a case without the lesion in label and prediction has no Dice, here nor in the foreground
    dice = rows[("model.bottleneck=masa", "lesion", "dice")]
    assert dice.difference.cases == lesion_cases and dice.difference.reference_mean == 0.0
    assert rows[("model.bottleneck=identity", "lesion", "dice")].difference.cases == lesion_cases
    reference_foreground = (lesion_cases * ORGAN_DICE / 2 + EMPTY_CASES * ORGAN_DICE) / LESION_CASES
    assert comparison.reference.dice == pytest.approx(reference_foreground)
    masa = next(s for s in comparison.settings if s.label == "model.bottleneck=masa")
    assert masa.dice == pytest.approx((lesion_cases * (ORGAN_DICE + 1) / 2 + EMPTY_CASES * ORGAN_DICE) / LESION_CASES)


@pytest.mark.full
def test_the_report_shows_the_undefined_cases_and_a_panel_per_lesion_measure(tmp_path: Path) -> None:
    sweep = lesion_sweep(tmp_path)
    assert compare([str(sweep)]) == 0
    markdown = (sweep / "compare.md").read_text()
    assert (f"lesion: {EMPTY_CASES} of {LESION_CASES} in model.bottleneck=none, {EMPTY_CASES} of {LESION_CASES} in "
            f"model.bottleneck=masa, 0 of {LESION_CASES} in model.bottleneck=identity") in markdown
    assert "| model.bottleneck=identity | lesion | lesion_false_positives |" in markdown
    voxel, lesion = plot_panels(build_comparison(sweep))
    assert [metric for metric, _ in voxel] == ["dice", "hd95_mm", "nsd"]
    assert [metric for metric, _ in lesion] == ["lesion_sensitivity", "lesion_false_positives", "lesion_dice"]
    assert [label for label, _ in lesion[0][1]] == [f"model.bottleneck={b}: {o}" for b in ("masa", "identity")
                                                    for o in ("organ", "lesion")]
    assert (sweep / "compare.png").read_bytes().startswith(PNG_MAGIC)


def test_a_cross_validation_without_the_lesion_columns_still_compares(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An older metrics.csv (no lesion columns) beside newer ones: the lesion rows are left out, with a warning."""
    sweep = lesion_sweep(tmp_path)
    older = sweep / "crossval" / "model.bottleneck=identity" / "metrics.csv"
    table = read_csv(older)
    kept = [column for column in table[0] if column not in LESION_COLUMNS]
    with older.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=kept, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)
    with caplog.at_level(logging.WARNING, logger="medseg"):
        comparison = build_comparison(sweep)
    assert {row.metric for row in comparison.rows} == {"dice", "hd95_mm", "nsd"}
    assert "model.bottleneck=identity did not record them" in caplog.text
    assert len(plot_panels(comparison)) == 1


def test_the_report_names_the_weights_each_fold_started_from(tmp_path: Path) -> None:
    """A setting fine-tuned from nnU-Net's folds (trainer.init_from, recorded in each run's metrics.json): compare.md
    and compare.json say which weights each fold started from; settings trained from scratch say nothing."""
    sweep, _ = fake_sweep(tmp_path)
    started = {}
    for job in sweep.iterdir():
        overrides = OmegaConf.load(job / ".hydra" / "overrides.yaml") if (job / ".hydra").is_dir() else []
        if "model.bottleneck=masa" in overrides:
            fold = next(o.split("=")[1] for o in overrides if o.startswith("data.fold="))
            started[fold] = f"nnU-Net's nnUNetTrainer 3d_fullres fold {fold} (R/fold_{fold}/checkpoint_final.pth)"
            metrics = json.loads((job / "metrics.json").read_text())
            (job / "metrics.json").write_text(json.dumps({**metrics, "started_from": started[fold]}))
    assert compare([str(sweep), "reference=model.bottleneck=none"]) == 0
    folds = "\n".join(f"  - fold {fold}: {started[fold]}" for fold in sorted(started))
    assert f"Started from trained weights (`trainer.init_from`):\n- `model.bottleneck=masa`:\n{folds}\n" in (
        sweep / "compare.md").read_text()
    settings = {s["setting"]: s for s in json.loads((sweep / "compare.json").read_text())["settings"]}
    assert settings["model.bottleneck=masa"]["started_from"] == started
    assert "started_from" not in settings["model.bottleneck=none"]
