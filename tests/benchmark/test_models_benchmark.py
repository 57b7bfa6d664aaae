"""``benchmark.py models`` and ``benchmark.py quality`` run end to end in --quick mode."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from medseg.benchmark import main
from medseg.benchmark.models import ROWS, model_config
from medseg.benchmark.quality import MODELS, epochs_for_budget

from ..conftest import CONFIGS


def test_rows_use_the_default_model_config() -> None:
    default = OmegaConf.to_container(OmegaConf.load(CONFIGS / "model" / "unet.yaml"))
    masa = model_config("unet+masa")
    assert masa["bottleneck"] == "masa"
    assert {k: v for k, v in masa.items() if k != "bottleneck"} == {k: v for k, v in default.items()
                                                                    if k != "bottleneck"}
    assert model_config("monai_swinunetr")["name"] == "monai_swinunetr"
    assert len(ROWS) == 9


def test_quick_models_benchmark(tmp_path: Path) -> None:
    rows = ["unet+masa", "monai_swinunetr"]
    assert main(["models", "--quick", "--models", *rows, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "models.json").read_text())
    results = {r["model"]: r for r in report["results"]}
    assert list(results) == rows
    for r in results.values():
        assert r["status"] == "ok", r["detail"]
        assert r["params"] > 0 and r["train_s"] > 0 and r["infer_s"] > 0
        # training keeps weights, gradients and AdamW state (3x the parameters) plus activations
        assert r["train_peak_mib"] > r["infer_peak_mib"] > 4 * r["params"] / 2**20
    assert results["monai_swinunetr"]["params"] > results["unet+masa"]["params"]
    (target,) = report["targets"]
    assert target["value"] == results["unet+masa"]["train_s"] / results["monai_swinunetr"]["train_s"]
    markdown = (tmp_path / "models.md").read_text()
    assert "| unet+masa |" in markdown and "× Swin" in markdown and "## targets" in markdown


def test_epochs_for_budget() -> None:
    assert epochs_for_budget(100, 30) == 3
    assert epochs_for_budget(10, 30) == 1


def test_quick_quality_benchmark(tmp_path: Path, tiny_demo_root: Path) -> None:
    assert main(["quality", "--quick", "--override", f"data.root={tiny_demo_root}", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "quality.json").read_text())
    assert [r["model"] for r in report["results"]] == list(MODELS)
    for r in report["results"]:
        assert r["epochs"] == 1 and 0.0 <= r["val_dice"] <= 1.0 and r["train_seconds"] > 0
        assert (Path(r["run_dir"]) / "metrics.json").is_file()
    (target,) = report["targets"]
    assert target["value"] is not None
    assert "| unet+masa |" in (tmp_path / "quality.md").read_text()
