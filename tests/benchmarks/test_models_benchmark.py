"""``benchmark.py models`` and ``benchmark.py quality`` run end to end in --quick mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from monai.losses import DeepSupervisionLoss

from benchmarks.cli import main
from benchmarks.models import QUICK_SIZES, Row, Sizes, all_rows, prepare, table, targets, train_config
from benchmarks.quality import MODELS
from medseg.attention import available_blocks
from medseg.models import MODELS as NETWORKS
from medseg.training.checks import check_config
from medseg.training.trainer import TrainStep

from ..helpers.configs import compose_config


def test_rows_cover_every_block_and_network() -> None:
    configs = [train_config(row).model for row in all_rows()]
    unets = [cfg.bottleneck for cfg in configs if cfg.name == "unet"]
    assert sorted(unets) == sorted(["none", *available_blocks()])
    assert {cfg.name for cfg in configs} == set(NETWORKS)
    assert len(all_rows()) == len(set(all_rows()))


def test_a_row_is_what_train_py_trains() -> None:
    """``unet+masa`` is the config of ``scripts/train.py model.bottleneck=masa``, composed independently."""
    trained = check_config(compose_config(["model.bottleneck=masa", "output_dir=unused"]))
    benchmarked = train_config("unet+masa")
    assert benchmarked.model == trained.model and benchmarked.trainer == trained.trainer
    assert train_config("monai_swinunetr", ["trainer.lr=0.01"]).trainer.lr == 0.01  # --override applies


TINY = Sizes((16, 16, 16), batch=1, precision="fp32", reps=1, warmup=1)
TINY_UNET = ["model.channels=[4,8]", "model.strides=[2]"]


def test_the_timed_step_is_the_trainers_step() -> None:
    cfg = train_config("unet+none", [*TINY_UNET, "trainer.optimizer=sgd", "trainer.grad_clip=0.5",
                                     "model.deep_supervision=true"])
    runnable = prepare("unet+none", cfg, TINY, torch.device("cpu"))
    assert runnable.row.status == "ok", runnable.row.detail
    step = runnable.trainer_step
    assert isinstance(step, TrainStep) and isinstance(step.optimizer, torch.optim.SGD)
    assert step.grad_clip == 0.5 and isinstance(step.loss_fn, DeepSupervisionLoss)
    before = [p.detach().clone() for p in step.model.parameters()]
    assert isinstance(runnable.step(), float)  # the step's loss, as the trainer records it
    assert any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters()))


def test_ratios_and_targets_against_swinunetr() -> None:
    rows = [Row("unet+masa", params=2_000_000, train_s=1.0, infer_s=0.2, train_peak_mib=100.0, infer_peak_mib=20.0),
            Row("monai_swinunetr", params=16_000_000, train_s=8.0, infer_s=1.0, train_peak_mib=400.0,
                infer_peak_mib=50.0),
            Row("monai_unetr", status="oom", detail="CUDA out of memory")]
    (target,) = targets(rows, QUICK_SIZES, torch.device("cpu"))
    assert target.value == 1.0 / 8.0 and target.met
    (gpu_target,) = targets(rows, QUICK_SIZES, torch.device("cuda"))
    assert gpu_target.value == 8.0 and gpu_target.met  # throughput: SwinUNETR's step time / ours
    headers, cells = table(rows)
    masa = dict(zip(headers, cells[0]))
    assert masa["train step (s)"] == 1.0 and masa["params (M)"] == 2.0
    assert cells[0][3] == 1.0 / 8.0 and cells[0][5] == 0.2 / 1.0 and cells[0][7] == 100.0 / 400.0
    assert cells[1][3] == 1.0  # SwinUNETR against itself
    assert "OOM" in cells[2] and "CUDA out of memory" in cells[2]


def _check_models_report(out: Path, rows: list[str]) -> dict:
    report = json.loads((out / "models.json").read_text())
    results = {r["model"]: r for r in report["results"]}
    assert list(results) == rows
    for r in results.values():
        assert r["status"] == "ok", r["detail"]
        assert r["params"] > 0 and r["train_s"] > 0 and r["infer_s"] > 0
        # training keeps weights, gradients and AdamW state (3x the parameters) plus activations
        assert r["train_peak_mib"] > r["infer_peak_mib"] > 4 * r["params"] / 2**20
    markdown = (out / "models.md").read_text()
    assert all(f"| {row} |" in markdown for row in rows) and "## targets" in markdown
    return report


def test_quick_models_benchmark(tmp_path: Path) -> None:
    rows = ["unet+masa", "monai_unet"]
    assert main(["models", "--quick", "--models", *rows, "--out", str(tmp_path)]) == 0
    report = _check_models_report(tmp_path, rows)
    assert report["meta"]["patch"] == list(QUICK_SIZES.patch) and report["targets"][0]["value"] is None


@pytest.mark.slow
def test_quick_models_benchmark_against_swinunetr(tmp_path: Path) -> None:
    rows = ["unet+masa", "monai_swinunetr"]
    assert main(["models", "--quick", "--models", *rows, "--out", str(tmp_path)]) == 0
    results = {r["model"]: r for r in _check_models_report(tmp_path, rows)["results"]}
    assert results["monai_swinunetr"]["params"] > results["unet+masa"]["params"]
    (target,) = json.loads((tmp_path / "models.json").read_text())["targets"]
    assert target["value"] == results["unet+masa"]["train_s"] / results["monai_swinunetr"]["train_s"]


def _check_quality_report(out: Path, models: list[str]) -> dict:
    report = json.loads((out / "quality.json").read_text())
    assert [r["model"] for r in report["results"]] == models
    for r in report["results"]:
        assert r["epochs"] == 1 and 0.0 <= r["val_dice"] <= 1.0 and r["train_seconds"] > 0
        assert r["seconds_per_step"] > 0  # SwinUNETR reads tensor values in its forward: no meta-device count
        assert r["gflops"] is None if r["model"] == "monai_swinunetr" else r["gflops"] > 0
        assert (Path(r["run_dir"]) / "metrics.json").is_file()
    assert all(f"| {m} |" in (out / "quality.md").read_text() for m in models)
    return report


def test_quick_quality_benchmark_one_model(tmp_path: Path, tiny_demo_root: Path) -> None:
    args = ["quality", "--quick", "--models", "monai_unet", "--override", f"data.root={tiny_demo_root}"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    assert _check_quality_report(tmp_path, ["monai_unet"])["targets"][0]["value"] is None


@pytest.mark.slow
def test_quick_quality_benchmark(tmp_path: Path, tiny_demo_root: Path) -> None:
    assert main(["quality", "--quick", "--override", f"data.root={tiny_demo_root}", "--out", str(tmp_path)]) == 0
    (target,) = _check_quality_report(tmp_path, list(MODELS))["targets"]
    assert target["value"] is not None
