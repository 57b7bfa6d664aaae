"""Sweep reports on fake sweep directories: job discovery, swept columns, failures, seed and fold groups, plots,
callbacks."""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

import numpy as np
import pytest
import yaml
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import OverrideParseException
from omegaconf import OmegaConf

from medseg.commands import summarize
from medseg.runs.folders import Sweep, as_number, parse_overrides, swept_keys
from medseg.sweeps.callbacks import FailedJobsFailTrials, SummarizeSweep, TrialFailed
from medseg.sweeps.report import build_summary, numeric_keys, summarize_sweep
from medseg.tables import format_mean_std, mean_std
from tests.helpers.files import read_csv
from tests.helpers.sweeps import make_crossvalidated_sweep, metric_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COMMON = ["data.root=/data/demo3d", "trainer.max_epochs=1"]


def completed(dice: float, per_class: Sequence[float] | None = None, seconds: float = 10.0) -> dict[str, Any]:
    """A ``metrics.json`` as ``Trainer.metrics()`` writes it (two classes)."""
    dim, bright = per_class if per_class is not None else (dice - 0.05, dice + 0.05)
    return {
        "status": "completed",
        "best_val_dice": dice,
        "best_epoch": 1,
        "epochs": 1,
        "val_dice_per_class": {"dim sphere": dim, "bright sphere": bright},
        "train_seconds": seconds,
        "wall_seconds": seconds + 5.0,
        "seconds_per_step": seconds / 100,
        "params": 1234,
        "gflops_per_patch_forward": 2.5,
        "peak_memory_mb": 512.5,
        "history": [],
    }


def make_job(sweep: Path, name: str, overrides: Sequence[str], metrics: dict[str, Any] | str | None) -> Path:
    """A Hydra job folder: ``.hydra/overrides.yaml`` and, unless None, ``metrics.json`` (a str is written raw)."""
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*COMMON, *overrides]))
    if metrics is not None:
        (job / "metrics.json").write_text(metrics if isinstance(metrics, str) else json.dumps(metrics))
    return job


def numbers(text: str) -> list[float]:
    """Every number written in ``text``, in order."""
    return [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", text)]


def markdown_tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table of ``text`` as rows of ``header -> cell``."""
    tables, lines = [], [line.strip() for line in text.splitlines()]
    for index, line in enumerate(lines):
        if line.startswith("|") and (index == 0 or not lines[index - 1].startswith("|")):
            block = list(itertools.takewhile(lambda row: row.startswith("|"), lines[index:]))
            headers, *rows = [[cell.strip() for cell in row.strip("|").split(" | ")] for row in block]
            tables.append([dict(zip(headers, row)) for row in rows[1:]])  # rows[0] is the rule
    return tables


def assert_shows_the_csv(table: list[dict[str, str]], csv_rows: list[dict[str, str]]) -> None:
    """Each cell of the shown ``table`` is the CSV's value, numbers rounded to the digits shown."""
    assert len(table) == len(csv_rows) and list(table[0]) == list(csv_rows[0])
    for shown, full in zip(table, csv_rows):
        for column, value in full.items():
            cell = shown[column]
            if as_number(value) is None or not cell:
                assert cell == value, (column, cell, value)
            else:
                decimals = len(cell.partition(".")[2])
                shown_number = float(cell.replace(",", ""))  # 1,234 parameters
                assert shown_number == pytest.approx(float(value), abs=0.5 * 10**-decimals), (column, cell, value)


@pytest.fixture
def grid_sweep(tmp_path: Path) -> Path:
    """2 blocks x 2 gammas; one job failed, one still running."""
    sweep = tmp_path / "multirun"
    make_job(sweep, "0", ["model.bottleneck=none", "model.attention.gamma=0.8"], completed(0.70))
    make_job(sweep, "1", ["model.bottleneck=none", "model.attention.gamma=0.9"], completed(0.72))
    make_job(
        sweep,
        "2",
        ["model.bottleneck=masa", "model.attention.gamma=0.8"],
        {"status": "failed", "reason": "ValueError: num_heads=3 must divide 32"},
    )
    make_job(sweep, "3", ["model.bottleneck=masa", "model.attention.gamma=0.9"], None)
    return sweep


@pytest.fixture
def seed_sweep(tmp_path: Path) -> Path:
    """2 blocks x 3 seeds; masa's seed 2 failed."""
    sweep = tmp_path / "seeds"
    values = {"none": [0.60, 0.62, 0.64], "masa": [0.70, 0.80, None]}
    for block_index, (block, dices) in enumerate(values.items()):
        for seed, dice in enumerate(dices):
            metrics = completed(dice, (dice, dice)) if dice is not None else {"status": "failed", "reason": "boom"}
            make_job(sweep, str(3 * block_index + seed), [f"model.bottleneck={block}", f"trainer.seed={seed}"], metrics)
    return sweep


def test_parse_overrides_reads_values_as_hydra_does() -> None:
    lines = ["model.bottleneck=masa", "+extra.key=1", "++forced='a=b'", "~removed", r"data.root=/x\ y",
             "model.channels=[8, 16]", "trainer.lr=1e-4"]
    parsed = parse_overrides(lines)
    assert list(parsed) == ["model.bottleneck", "extra.key", "forced", "removed", "data.root", "model.channels",
                            "trainer.lr"]  # prefixes dropped
    assert parsed["model.bottleneck"] == "masa" and parsed["removed"] == "~"
    assert parsed["forced"] == "a=b" and parsed["data.root"] == "/x y"  # quotes and escapes removed
    assert yaml.safe_load(parsed["model.channels"]) == [8, 16] and as_number(parsed["trainer.lr"]) == 1e-4
    assert as_number(parsed["extra.key"]) == 1
    with pytest.raises(OverrideParseException):
        parse_overrides(["model.bottleneck=a=b"])  # Hydra refuses it on the command line too


def test_as_number_accepts_numbers_only() -> None:
    assert as_number("0.8") == 0.8 and as_number("3") == 3.0 and as_number("1e-4") == 1e-4
    for text in ("masa", "[8,16]", "true", "nan", "null", None):
        assert as_number(text) is None


def test_jobs_in_numeric_order_with_status(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for index in (10, 2, 0):
        make_job(sweep, str(index), [f"trainer.seed={index}"], completed(0.5))
    make_job(sweep, "1", ["trainer.seed=1"], "{not json")
    jobs = Sweep.read(sweep).runs
    assert [job.name for job in jobs] == ["0", "1", "2", "10"]
    assert [job.status for job in jobs] == ["completed", "missing", "completed", "completed"]
    assert "unreadable" in jobs[1].reason


def test_reading_a_sweep_rejects_empty_or_absent_dirs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Sweep.read(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no Hydra job"):
        Sweep.read(tmp_path)


def test_swept_keys_are_the_differing_ones(grid_sweep: Path) -> None:
    jobs = Sweep.read(grid_sweep).runs
    assert swept_keys(jobs) == ["model.bottleneck", "model.attention.gamma"]
    assert numeric_keys(jobs, swept_keys(jobs)) == ["model.attention.gamma"]
    # a key present in some jobs only is swept too
    make_job(grid_sweep, "4", ["model.bottleneck=none", "model.attention.gamma=0.8", "trainer.lr=0.01"], None)
    assert swept_keys(Sweep.read(grid_sweep).runs)[-1] == "trainer.lr"


def test_summary_files_rows_and_failures(grid_sweep: Path) -> None:
    summary = summarize_sweep(grid_sweep)
    rows = read_csv(grid_sweep / "summary.csv")
    assert [(r["model.bottleneck"], r["model.attention.gamma"]) for r in rows] == [
        ("none", "0.8"),
        ("none", "0.9"),
        ("masa", "0.8"),
        ("masa", "0.9"),
    ]
    assert [r["status"] for r in rows] == ["completed", "completed", "failed", "missing"]
    assert float(rows[1]["best_val_dice"]) == pytest.approx(0.72)
    assert float(rows[1]["dice_bright_sphere"]) == pytest.approx(0.77)
    assert rows[0]["params"] == "1234" and rows[0]["best_epoch"] == "1" and rows[0]["reason"] == ""
    compute = {"gflops_per_patch_forward": 2.5, "seconds_per_step": 0.1, "train_seconds": 10.0, "wall_seconds": 15.0}
    assert {column: float(rows[0][column]) for column in compute} == compute
    assert all(rows[2][column] == "" for column in compute)  # the failed job's metrics.json has none
    assert rows[2]["reason"] == "ValueError: num_heads=3 must divide 32" and rows[2]["best_val_dice"] == ""
    assert "still running" in rows[3]["reason"]
    assert summary.counts == {"completed": 2, "failed": 1, "missing": 1}
    assert "model.bottleneck=none model.attention.gamma=0.9" in summary.best
    assert pytest.approx(0.72) in numbers(summary.best)
    markdown = (grid_sweep / "summary.md").read_text()
    (jobs,) = markdown_tables(markdown)  # no seed swept, no seed table
    assert_shows_the_csv(jobs, rows)
    assert summary.best in markdown
    assert (grid_sweep / "summary.png").read_bytes().startswith(PNG_MAGIC)
    assert not list(grid_sweep.glob(".summary*"))  # no temp files left behind by the atomic writes


def test_seed_groups_mean_and_std(seed_sweep: Path) -> None:
    summary = build_summary(seed_sweep)
    assert summary.swept == ["model.bottleneck", "trainer.seed"]
    assert summary.group_headers[:3] == ["model.bottleneck", "seeds", "completed"]
    by_block = {row[0]: dict(zip(summary.group_headers, row)) for row in summary.group_rows}
    assert by_block["none"]["seeds"] == "0,1,2" and by_block["none"]["completed"] == "3/3"
    none, masa = [0.60, 0.62, 0.64], [0.70, 0.80]  # masa's failed seed left out
    assert numbers(by_block["none"]["best_val_dice"]) == pytest.approx([fmean(none), stdev(none)], abs=1e-4)
    assert by_block["masa"]["completed"] == "2/3"
    assert numbers(by_block["none"]["gflops_per_patch_forward"]) == [2.5, 0.0]  # the compute of each setting too
    assert numbers(by_block["none"]["wall_seconds"]) == [15.0, 0.0] and "seconds_per_step" in by_block["masa"]
    assert numbers(by_block["masa"]["best_val_dice"]) == pytest.approx([fmean(masa), stdev(masa)], abs=1e-4)
    # the highest mean: its mean and std over its 2 completed seeds, and their jobs (3 and 4); without folds the
    # ranking is untested
    assert summary.best.startswith("highest mean: model.bottleneck=masa")
    assert numbers(summary.best)[:5] == pytest.approx([fmean(masa), stdev(masa), 2, 3, 4], abs=1e-4)
    assert summary.best.endswith("the ranking is by mean and untested against model.bottleneck=none: a verdict "
                                 "needs cross-validation (data.fold=0,1,2,3,4)")
    summarize_sweep(seed_sweep)
    _, seeds = markdown_tables((seed_sweep / "summary.md").read_text())
    assert [row["model.bottleneck"] for row in seeds] == ["none", "masa"]
    assert [row["best_val_dice"] for row in seeds] == [by_block[b]["best_val_dice"] for b in ("none", "masa")]


def test_folds_are_one_setting_ranked_by_the_cross_validation_mean(tmp_path: Path) -> None:
    """gamma x data.fold: a row per gamma with the mean ± std over its folds; the best setting is the best mean,
    although the single best fold belongs to the other gamma; folds are never a plot axis."""
    sweep = tmp_path / "folds"
    dice = {"0.8": [0.95, 0.60, 0.62], "0.9": [0.80, 0.78, 0.79]}
    for number, (gamma, fold) in enumerate(itertools.product(dice, range(3))):
        make_job(sweep, str(number), [f"model.attention.gamma={gamma}", f"data.fold={fold}"],
                 completed(dice[gamma][fold]))
    summary = summarize_sweep(sweep)
    assert summary.group_headers[:3] == ["model.attention.gamma", "folds", "completed"]
    rows = {row[0]: dict(zip(summary.group_headers, row)) for row in summary.group_rows}
    for gamma, values in dice.items():
        assert rows[gamma]["folds"] == "0,1,2" and rows[gamma]["completed"] == "3/3"
        assert numbers(rows[gamma]["best_val_dice"]) == pytest.approx([fmean(values), stdev(values)], abs=1e-4)
    assert summary.best.startswith("highest mean: model.attention.gamma=0.9 -> best_val_dice")
    assert numbers(summary.best)[:3] == pytest.approx([0.9, fmean(dice["0.9"]), stdev(dice["0.9"])], abs=1e-4)
    assert "over 3 folds" in summary.best and "data.fold" not in summary.best.partition(";")[0]
    assert "untested against model.attention.gamma=0.8: no cross-validation in crossval/" in summary.best
    assert numeric_keys(summary.runs, summary.swept) == ["model.attention.gamma"]
    markdown = (sweep / "summary.md").read_text()
    assert "## Over folds (`data.fold`): mean ± std (over folds: the cross-validation mean)" in markdown


@pytest.mark.parametrize("shift", [0.05, 0.0])
def test_the_best_mean_is_the_best_setting_only_when_significantly_better(tmp_path: Path, shift: float) -> None:
    """masa has the higher mean validation Dice; on the cross-validation's 20 paired cases its Dice is the reference's
    plus ``shift`` plus noise: named the best setting for a real difference, not for none."""
    rng = np.random.default_rng(11)
    cases = [f"case_{i:02d}" for i in range(20)]
    base = rng.uniform(0.6, 0.9, len(cases))
    rows = {f"model.bottleneck={block}": [metric_rows(dict(zip(cases, base + extra + rng.normal(0, 0.02, 20))))]
            for block, extra in (("none", 0.0), ("masa", shift))}
    metrics = {"model.bottleneck=none": completed(0.70), "model.bottleneck=masa": completed(0.75)}
    summary = build_summary(make_crossvalidated_sweep(tmp_path / "multirun", rows, metrics=metrics))
    described = "model.bottleneck=masa -> best_val_dice 0.7500 ± 0.0000 over 2 folds (runs 2, 3)"
    versus = "the runner-up model.bottleneck=none on 20 out-of-fold cases (Dice difference "
    if shift:
        assert summary.best.startswith(f"best setting: {described}; significantly better than {versus}+0.05")
    else:
        assert summary.best.startswith(f"no best setting: {described} has the highest mean but is not significantly "
                                       f"better than {versus}")
    assert re.search(r"95% CI \[[-+]0\.\d{4}, [-+]0\.\d{4}\], Wilcoxon p=", summary.best)


def test_mean_std_edge_cases() -> None:
    assert mean_std([0.5]) == (0.5, 0.0)
    assert all(math.isnan(v) for v in mean_std([math.nan]))
    assert format_mean_std([]) == "nan"


def test_other_metric_and_direction(grid_sweep: Path) -> None:
    (grid_sweep / "0" / "metrics.json").write_text(json.dumps(completed(0.70, seconds=5.0)))
    summary = build_summary(grid_sweep, metric="train_seconds", higher_is_better=False)
    assert "gamma=0.8" in summary.best and "train_seconds" in summary.best
    assert numbers(summary.best.partition(";")[0])[-2] == 5.0  # the value, then the job
    per_class = build_summary(grid_sweep, metric="dice_dim_sphere")
    assert "gamma=0.9" in per_class.best and "dice_dim_sphere" in per_class.best
    assert numbers(per_class.best.partition(";")[0])[-2] == pytest.approx(0.72 - 0.05)
    assert per_class.headers.count("dice_dim_sphere") == 1


def test_bar_chart_without_numeric_parameters(seed_sweep: Path) -> None:
    # model.bottleneck is a name and trainer.seed is never an x axis: one bar per block
    summarize_sweep(seed_sweep)
    assert (seed_sweep / "summary.png").read_bytes().startswith(PNG_MAGIC)


def test_nothing_completed_still_reports(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    make_job(sweep, "0", ["model.bottleneck=cswin"], {"status": "failed", "reason": "x"})
    make_job(sweep, "1", ["model.bottleneck=mha"], None)
    summary = summarize_sweep(sweep)
    assert summary.best.startswith("best setting: none")
    assert (sweep / "summary.png").is_file()


def test_callback_writes_summary_and_never_raises(
    grid_sweep: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    callback = SummarizeSweep()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(grid_sweep)}}})
    with caplog.at_level(logging.ERROR, logger="medseg"):
        callback.on_multirun_start(config)
        callback.on_multirun_end(config)
    assert (grid_sweep / "summary.csv").is_file() and (grid_sweep / "summary.png").is_file()
    assert not caplog.text and not (grid_sweep / "crossval").exists(), "data.fold is not swept: no cross-validation"

    broken = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "absent")}}})
    with caplog.at_level(logging.ERROR, logger="medseg"):
        SummarizeSweep().on_multirun_end(broken)
        SummarizeSweep().on_multirun_end(OmegaConf.create({}))  # no hydra node at all
    assert "could not summarise the sweep" in caplog.text and "scripts/summarize.py" in caplog.text

    caplog.clear()  # a fold sweep whose jobs left no checkpoint: the cross-validation fails, the summary is written
    folds = tmp_path / "folds"
    for fold in range(2):
        make_job(folds, str(fold), [f"data.fold={fold}"], completed(0.5))
    with caplog.at_level(logging.ERROR, logger="medseg"):
        SummarizeSweep().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(folds)}}}))
    assert f"retry with: python scripts/crossval.py {folds}" in caplog.text and "no finished fold" in caplog.text
    assert (folds / "summary.md").is_file() and not (folds / "crossval").exists()


def _job_return(output_dir: Path, value: Any) -> JobReturn:
    hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(output_dir)}}})
    return JobReturn(overrides=[], hydra_cfg=hydra_cfg, status=JobStatus.COMPLETED, _return_value=value)


def test_failed_jobs_become_failed_optuna_trials(grid_sweep: Path) -> None:
    callback = FailedJobsFailTrials()
    failed = _job_return(grid_sweep / "2", math.nan)
    callback.on_job_end(OmegaConf.create({}), failed)
    assert failed.status == JobStatus.FAILED
    with pytest.raises(TrialFailed, match="num_heads=3 must divide 32"):
        _ = failed.return_value
    fine = _job_return(grid_sweep / "0", 0.7)
    callback.on_job_end(OmegaConf.create({}), fine)
    assert fine.status == JobStatus.COMPLETED and fine.return_value == 0.7
    unknown = _job_return(grid_sweep / "3", math.nan)  # no metrics.json: a generic reason
    callback.on_job_end(OmegaConf.create({}), unknown)
    with pytest.raises(TrialFailed, match="NaN"):
        _ = unknown.return_value


def test_summarize_script(grid_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert summarize([str(grid_sweep), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "highest mean: model.bottleneck=none model.attention.gamma=0.9" in out
    assert (grid_sweep / "summary.md").is_file() and not (grid_sweep / "summary.png").exists()
    assert summarize([str(tmp_path / "absent")]) == 1
    assert "does not exist" in capsys.readouterr().err
