"""``benchmark.py prediction`` on a small volume: both paths run, the fast one runs fewer windows, same result."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.cli import main


def test_the_prediction_benchmark_reports_both_paths_and_the_dice_between_them(tmp_path: Path) -> None:
    code = main(["prediction", "--shape", "64", "64", "12", "--channels", "4", "8", "--strides", "2,2,1",
                 "--patch", "16", "16", "8", "--reps", "2", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "prediction.json").read_text())
    assert len(report["seconds"]["dense"]) == len(report["seconds"]["fast"]) == 2
    assert 0 < report["windows_run"] < report["windows"], "the windows in the air are answered, not run"
    assert all(value >= 0.999 for value in report["dice_fast_vs_dense"].values())
    assert "| fast (constant windows answered; torch, fp32) |" in (tmp_path / "prediction.md").read_text()
