"""Hydra multiruns end to end on tiny demo data: the summary the callback writes, failed jobs, TensorBoard
hparams, the experiment presets and the Optuna search."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2

from medseg.attention import available_blocks
from medseg.hydra_config import CONFIG_DIR
from medseg.training.checks import check_config
from tests.helpers.configs import TINY_OVERRIDES, compose_config, run_script
from tests.helpers.files import read_csv

EXPERIMENTS = sorted(path.stem for path in (CONFIG_DIR / "experiment").glob("*.yaml"))
SUMMARY_FILES = ("summary.md", "summary.csv", "summary.png")


def multirun(tmp_path: Path, root: Path, *overrides: str, timeout: float = 600) -> Path:
    """``scripts/train.py -m`` on the tiny demo data, one epoch per job; returns the sweep dir."""
    sweep_dir = tmp_path / "sweep"
    args = [
        "-m",
        *TINY_OVERRIDES,
        "trainer.max_epochs=1",
        f"data.root={root}",
        f"hydra.sweep.dir={sweep_dir}",
        *overrides,
    ]
    result = run_script("train.py", args, cwd=tmp_path, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return sweep_dir


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory: pytest.TempPathFactory, tiny_demo_root: Path) -> Path:
    """A real 2 x 2 sweep: two bottleneck blocks x two MaSA decays."""
    return multirun(
        tmp_path_factory.mktemp("grid"), tiny_demo_root, "model.bottleneck=none,masa", "model.attention.gamma=0.8,0.9"
    )


@pytest.mark.full
def test_multirun_summary_written_by_the_callback(grid_sweep: Path) -> None:
    rows = read_csv(grid_sweep / "summary.csv")
    assert len(rows) == 4
    assert [(row["model.bottleneck"], row["model.attention.gamma"]) for row in rows] == list(
        itertools.product(["none", "masa"], ["0.8", "0.9"])
    )
    assert all(row["status"] == "completed" for row in rows)
    assert all(0.0 <= float(row["best_val_dice"]) <= 1.0 and row["best_epoch"] == "1" for row in rows)
    assert {"dice_dim_sphere", "dice_bright_sphere", "train_seconds", "params", "peak_memory_mb"} <= set(rows[0])
    assert int(rows[2]["params"]) > int(rows[0]["params"])  # the masa bottleneck adds parameters
    assert float(rows[2]["gflops_per_patch_forward"]) > float(rows[0]["gflops_per_patch_forward"])  # and FLOPs
    assert all(float(row["seconds_per_step"]) > 0.0 and float(row["train_seconds"]) <= float(row["wall_seconds"])
               for row in rows)
    assert (grid_sweep / "summary.png").stat().st_size > 0
    assert "highest mean: model.bottleneck=" in (grid_sweep / "summary.md").read_text()  # no folds: untested


@pytest.mark.full
def test_summarize_script_rewrites_the_summary(grid_sweep: Path, tmp_path: Path) -> None:
    before = (grid_sweep / "summary.csv").read_text()
    for name in SUMMARY_FILES:
        (grid_sweep / name).unlink()
    result = run_script("summarize.py", [str(grid_sweep)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "highest mean: model.bottleneck=" in result.stdout
    assert all((grid_sweep / name).is_file() for name in SUMMARY_FILES)
    assert (grid_sweep / "summary.csv").read_text() == before


def test_tensorboard_hparams_session_per_job(grid_sweep: Path) -> None:
    events = EventAccumulator(str(grid_sweep / "2" / "tensorboard")).Reload()
    content = events.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    assert hparams_metadata.SESSION_START_INFO_TAG in content
    start = plugin_data_pb2.HParamsPluginData.FromString(content[hparams_metadata.SESSION_START_INFO_TAG])
    hparams = start.session_start_info.hparams
    assert hparams["model.bottleneck"].string_value == "masa"
    assert hparams["model.attention.gamma"].number_value == pytest.approx(0.8)
    assert hparams["trainer.max_epochs"].number_value == 1
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content[hparams_metadata.EXPERIMENT_TAG])
    assert "hparam/best_val_dice" in [info.name.tag for info in experiment.experiment.metric_infos]
    assert "hparam/best_val_dice" in events.Tags()["scalars"]


@pytest.mark.full
def test_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path: Path, tiny_demo_root: Path) -> None:
    # 3 heads cannot split the 32-channel bottleneck of the tiny U-Net: masa fails, "none" has no attention
    sweep_dir = multirun(tmp_path, tiny_demo_root, "model.bottleneck=none,masa", "model.attention.num_heads=3")
    rows = {row["model.bottleneck"]: row for row in read_csv(sweep_dir / "summary.csv")}
    assert rows["none"]["status"] == "completed" and rows["none"]["reason"] == ""
    assert rows["masa"]["status"] == "failed" and rows["masa"]["best_val_dice"] == ""
    assert "num_heads" in rows["masa"]["reason"]
    assert "failed" in (sweep_dir / "summary.md").read_text()


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_presets_compose_and_validate(name: str) -> None:
    preset = OmegaConf.load(CONFIG_DIR / "experiment" / f"{name}.yaml")
    cfg = check_config(compose_config([f"experiment={name}", "output_dir=unused"]))
    if "bottleneck" in preset.get("model", {}):  # the preset's choice reaches the validated config
        assert cfg.model.bottleneck == preset.model.bottleneck


def test_experiment_preset_values() -> None:
    assert set(EXPERIMENTS) >= {"rmt_official", "seed_masa", "flatten_default", "compare_blocks"}
    rmt = compose_config(["experiment=rmt_official"]).model
    assert (rmt.bottleneck, rmt.attention.gamma, rmt.attention.heads_range) == ("masa", 0.75, 4.0)
    seed = compose_config(["experiment=seed_masa"]).model
    assert (seed.bottleneck, seed.attention.gamma, seed.attention.heads_range) == ("masa", 0.9, 0.0)
    flatten = compose_config(["experiment=flatten_default"]).model
    assert (flatten.bottleneck, flatten.attention.focusing_factor, flatten.attention.kernel_size) == (
        "focused_linear",
        3.0,
        5,
    )
    # a preset composes with the user's own overrides on top
    assert compose_config(["experiment=rmt_official", "model.attention.gamma=0.8"]).model.attention.gamma == 0.8


def test_compare_blocks_is_a_multirun_over_every_block() -> None:
    cfg = compose_config(["experiment=compare_blocks"], return_hydra_config=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    blocks = cfg.hydra.sweeper.params["model.bottleneck"].split(",")
    assert blocks == ["none", *available_blocks()]
    assert cfg.hydra.callbacks.summarize_sweep._target_ == "medseg.sweeps.callbacks.SummarizeSweep"


def test_optuna_search_two_trials(tmp_path: Path, tiny_demo_root: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    cfg = compose_config(["hparams_search=masa_optuna"], return_hydra_config=True)
    assert check_config(compose_config(["hparams_search=masa_optuna"])).model.bottleneck == "masa"
    assert cfg.hydra.sweeper.direction == "maximize"

    sweep_dir = multirun(tmp_path, tiny_demo_root, "hparams_search=masa_optuna", "hydra.sweeper.n_trials=2")
    rows = read_csv(sweep_dir / "summary.csv")
    assert len(rows) == 2 and all(row["status"] == "completed" for row in rows)
    for row in rows:
        assert 0.7 <= float(row["model.attention.gamma"]) <= 0.95
        assert 0.0 <= float(row["model.attention.heads_range"]) <= 4.0
        assert 1e-4 <= float(row["trainer.lr"]) <= 1e-2
    job_cfg = yaml.safe_load((sweep_dir / "0" / ".hydra" / "config.yaml").read_text())
    assert job_cfg["model"]["bottleneck"] == "masa"
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(max(float(row["best_val_dice"]) for row in rows))
