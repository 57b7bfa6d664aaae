"""In-process training runs on the tiny demo, and spies on what the training loop builds and calls.

The spies wrap production objects from the test side only (``monkeypatch``); production code has no hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from medseg.training import run as run_module
from medseg.training import trainer as trainer_module

from ..conftest import MICRO_OVERRIDES, compose_config


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
