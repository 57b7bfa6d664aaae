"""``benchmark.py scan_prediction`` on a small scan with a test checkpoint: every medseg setting runs in its own
process, each stage is timed, the fast settings equal the dense result, and the report says so; nnU-Net's side
runs where nnU-Net is installed (the ``peers`` extra), not here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cli import main
from tests.helpers.checkpoints import save_test_checkpoint
from tests.helpers.realistic import write_ct_mosaic


@pytest.mark.full
def test_the_scan_benchmark_times_each_stage_and_compares_every_setting_with_the_dense_one(tmp_path: Path) -> None:
    ckpt = save_test_checkpoint(tmp_path / "best.pt")
    image, label = write_ct_mosaic(tmp_path / "scan.nii.gz", tmp_path / "label.nii.gz", tiles=(3, 3, 1),
                                   tile=(24, 24, 10), spacing=(1.0, 1.0, 1.5))
    settings = ["dense", "fast", "fast_bf16"]
    code = main(["scan_prediction", "--image", str(image), "--ckpt", str(ckpt), "--label", str(label),
                 "--settings", *settings, "--out", str(tmp_path / "out")])
    assert code == 0
    report = json.loads((tmp_path / "out" / "scan_prediction.json").read_text())
    runs = {r["run"]: r for r in report["runs"]}
    assert list(runs) == settings
    for run in runs.values():
        assert run["seconds"] > 0 and run["peak_rss_mb"] > 0 and set(run["dice_vs_label"]) == {"1", "2"}
        assert all(seconds >= 0 for seconds in run["stages"].values()) and run["stages"]["network"] > 0
    assert runs["fast"]["windows_run"] <= runs["dense"]["windows_run"]
    assert report["meta"]["fp32_matmul_gflops"] > 0
    for run in runs.values():  # the network's rate: its windows' GFLOP over its seconds
        result = json.loads((tmp_path / "out" / run["run"] / "result.json").read_text())
        assert result["window_gflop"] > 0
        assert run["network_gflops"] == pytest.approx(run["windows_run"] * result["window_gflop"] / run["network_s"])
    assert all(value >= 0.999 for value in runs["fast"]["dice_vs_dense"].values())
    targets = {t["label"]: t for t in report["targets"]}
    assert targets["fast: Dice vs medseg's dense result, class 1"]["met"]
    assert "medseg's largest peak RSS (GB)" in targets
    markdown = (tmp_path / "out" / "scan_prediction.md").read_text()
    assert "## medseg's stages (seconds)" in markdown and "| fast_bf16 |" in markdown


def test_the_scan_benchmark_refuses_unknown_settings() -> None:
    with pytest.raises(SystemExit, match="turbo"):
        main(["scan_prediction", "--image", "x.nii.gz", "--ckpt", "x.pt", "--settings", "dense", "turbo"])


@pytest.mark.full
def test_the_int8_setting_is_calibrated_on_the_training_cases_and_compared_with_the_dense_one(
        tiny_demo_root: Path, tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    ckpt = save_test_checkpoint(tmp_path / "run" / "best.pt", data={"root": str(tiny_demo_root), "format": "msd"})
    image, _ = write_ct_mosaic(tmp_path / "scan.nii.gz", tmp_path / "label.nii.gz", tiles=(2, 2, 1), tile=(24, 24, 10),
                               spacing=(1.0, 1.0, 1.5))
    assert main(["scan_prediction", "--image", str(image), "--ckpt", str(ckpt), "--settings", "dense", "openvino_int8",
                 "--out", str(tmp_path / "out")]) == 0
    runs = {r["run"]: r for r in json.loads((tmp_path / "out" / "scan_prediction.json").read_text())["runs"]}
    assert set(runs["openvino_int8"]["dice_vs_dense"]) == {"1", "2"}  # the Dice of int8 against dense fp32
    assert (tmp_path / "run" / "openvino_int8").is_dir()  # calibrated on the checkpoint's training cases, cached


@pytest.mark.full
def test_nnunets_predictor_runs_the_same_windows_as_medsegs_dense_setting_and_its_network_is_timed(
        tmp_path: Path) -> None:
    pytest.importorskip("nnunetv2", reason="nnU-Net v2 is an optional extra (peers)")
    from benchmarks.long_scan import NETWORK_SPACING, untrained_checkpoint
    from benchmarks.scaling import write_nnunet_model

    ckpt = untrained_checkpoint(tmp_path / "medseg.pt", classes=3, patch=[32, 32, 16], channels=[4, 8])
    folder = write_nnunet_model(tmp_path / "nnunet", ckpt)
    image, _ = write_ct_mosaic(tmp_path / "scan.nii.gz", tmp_path / "label.nii.gz", tiles=(3, 2, 2), tile=(24, 24, 10),
                               spacing=NETWORK_SPACING)
    assert main(["scan_prediction", "--image", str(image), "--ckpt", str(ckpt), "--nnunet-model", str(folder),
                 "--settings", "dense", "--out", str(tmp_path / "out")]) == 0
    runs = {r["run"]: r for r in json.loads((tmp_path / "out" / "scan_prediction.json").read_text())["runs"]}
    # 72 x 48 x 20 voxels, windows of 32 x 32 x 16 at half overlap: 4 x 2 x 2 on both sides
    assert runs["nnunet"]["windows_run"] == runs["dense"]["windows_run"] == 16
    assert runs["nnunet"]["network_gflops"] > 0 and runs["nnunet"]["network_s"] < runs["nnunet"]["seconds"]
