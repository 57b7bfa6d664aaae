"""In-process training runs on the tiny demo, spies on what the training loop builds and calls, and the check of
the folder a tiny run leaves.

The spies wrap production objects from the test side only (``monkeypatch``); production code has no hooks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from medseg.models import build_model
from medseg.runs.checkpoint import load_checkpoint
from medseg.training import run as run_module
from medseg.training import trainer as trainer_module
from tests.helpers.configs import MICRO_OVERRIDES, compose_config

METRIC_KEYS = {"best_val_dice", "best_epoch", "epochs", "val_dice_per_class", "train_seconds", "params", "device",
               "gflops_per_patch_forward", "peak_memory_mb", "seconds_per_step", "wall_seconds"}


def micro_config(run_dir: Path, root: Path, *overrides: str) -> DictConfig:
    """The micro run (``MICRO_OVERRIDES``) on the dataset at ``root``, writing into ``run_dir``."""
    return compose_config([*MICRO_OVERRIDES, f"data.root={root}", f"output_dir={run_dir}", *overrides])


@dataclass(frozen=True)
class Forward:
    """One forward pass of the model: its mode and the dtype and shape of each output (a list under deep
    supervision in training, else one)."""

    training: bool
    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]


def _outputs(output: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    return list(output) if isinstance(output, (list, tuple)) else [output]


def record_forwards(monkeypatch: pytest.MonkeyPatch) -> list[Forward]:
    """Every forward pass of the model that :func:`medseg.training.run.train` builds, in order (filled as it runs)."""
    calls: list[Forward] = []
    build = run_module.build_model

    def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        outputs = _outputs(output)
        calls.append(Forward(module.training, tuple(o.dtype for o in outputs), tuple(tuple(o.shape) for o in outputs)))

    def build_and_watch(*args: Any, **kwargs: Any) -> torch.nn.Module:
        model = build(*args, **kwargs)
        model.register_forward_hook(hook)
        return model

    monkeypatch.setattr(run_module, "build_model", build_and_watch)
    return calls


class StepRecord:
    """The :class:`~medseg.training.trainer.TrainStep` a run built, and the output shapes its loss received."""

    def __init__(self) -> None:
        self.step: trainer_module.TrainStep | None = None
        self.loss_inputs: list[list[tuple[int, ...]]] = []


def record_step(monkeypatch: pytest.MonkeyPatch) -> StepRecord:
    """Watch the training step the Trainer builds: the step itself and every call of its loss (filled as it runs)."""
    record = StepRecord()

    class WatchedStep(trainer_module.TrainStep):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            loss_fn = self.loss_fn

            def watched_loss(output: Any, label: torch.Tensor) -> torch.Tensor:
                record.loss_inputs.append([tuple(o.shape) for o in _outputs(output)])
                return loss_fn(output, label)

            self.loss_fn = watched_loss
            record.step = self

    monkeypatch.setattr(trainer_module, "TrainStep", WatchedStep)
    return record


def check_run_outputs(run_dir: Path, spatial_dims: int) -> dict:
    """The folder of a finished ``TINY_OVERRIDES`` run on the tiny demo (2 epochs, validated each): metrics.json,
    both checkpoints (each rebuilds its model), TensorBoard scalars and overlays, disjoint splits; returns the
    metrics."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert set(metrics) >= METRIC_KEYS and metrics["status"] == "completed"
    assert metrics["epochs"] == 2 and metrics["best_epoch"] in (1, 2)
    assert set(metrics["val_dice_per_class"]) == {"dim sphere", "bright sphere"}
    validated = [record["val_dice"] for record in metrics["history"] if "val_dice" in record]
    assert metrics["best_val_dice"] == max(validated) and 0.0 <= metrics["best_val_dice"] <= 1.0
    # the compute: the steps' time is part of the training time (validation too), which is part of the wall time
    steps = sum(record["steps"] for record in metrics["history"])
    assert 0.0 < metrics["seconds_per_step"] * steps <= metrics["train_seconds"] + 0.01
    assert metrics["train_seconds"] <= metrics["wall_seconds"]
    assert metrics["gflops_per_patch_forward"] > 0.0 and metrics["peak_memory_mb"] > 0.0
    for name in ("last.pt", "best.pt"):
        state = load_checkpoint(run_dir / "checkpoints" / name)
        cfg = state["config"]
        assert cfg["model"]["spatial_dims"] == spatial_dims and cfg["data"]["spacing"] == [0.8, 0.8, 2.0]
        # the checkpoint alone rebuilds its model
        model = build_model(cfg["model"], len(state["dataset"]["channel_names"]), len(state["dataset"]["labels"]),
                            cfg["data"]["patch_size"])
        model.load_state_dict(state["model"])
    best = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    assert best["best_metric"] == pytest.approx(metrics["best_val_dice"])
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0}).Reload()
    tags = events.Tags()
    assert {"train/loss", "train/lr", "val/dice_mean", "val/dice_dim_sphere"} <= set(tags["scalars"])
    assert "val/overlay" in tags["images"]
    assert len(events.Scalars("train/loss")) == 2
    splits = json.loads((run_dir / "splits.json").read_text())
    assert not set(splits["train"]) & set(splits["val"]) and len(splits["train"]) + len(splits["val"]) == 8
    return metrics
