"""The optimizer and learning-rate schedule of ``trainer.*``: the lr of every epoch against the formulas, and a
run with SGD, poly decay and warm-up that logs those lrs and steps torch's SGD with nesterov momentum."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from medseg.config import TrainerConfig
from medseg.optim import SCHEDULES, build_optimizer, build_scheduler
from medseg.training import trainer as trainer_module
from medseg.training.run import train
from tests.helpers.runs import micro_config

pytestmark = pytest.mark.usefixtures("one_thread")

DECAYS: dict[str, Callable[[int, int], float]] = {
    "poly": lambda t, total: (1 - t / total) ** 0.9,
    "cosine": lambda t, total: 0.5 * (1 + math.cos(math.pi * t / total)),
    "none": lambda t, total: 1.0,
}
"""``trainer.scheduler`` -> the lr factor ``t`` epochs after the warm-up of a decay spanning ``total`` epochs."""


def expected_lr(lr: float, epoch: int, warmup: int, max_epochs: int, scheduler: str) -> float:
    """The lr epoch ``epoch`` (0-based) trains with: ``(e + 1) / warmup`` of it in the warm-up, then the decay."""
    if epoch < warmup:
        return lr * (epoch + 1) / warmup
    return lr * DECAYS[scheduler](epoch - warmup, max_epochs - warmup)


@pytest.mark.parametrize("warmup", [0, 1, 3])
@pytest.mark.parametrize("scheduler", SCHEDULES)
def test_lr_of_every_epoch_follows_the_formula(scheduler: str, warmup: int) -> None:
    assert scheduler in DECAYS, f"trainer.scheduler={scheduler}: add its formula to DECAYS"
    settings = TrainerConfig(lr=0.02, max_epochs=9, warmup_epochs=warmup, scheduler=scheduler)
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(3))], settings)
    schedule = build_scheduler(optimizer, settings)
    lrs = []
    for _ in range(settings.max_epochs):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    expected = [expected_lr(settings.lr, e, warmup, settings.max_epochs, scheduler) for e in range(settings.max_epochs)]
    assert lrs == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_sgd_poly_with_warmup_run_logs_its_lrs(tmp_path: Path, tiny_demo_root: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[torch.optim.Optimizer] = []
    build = trainer_module.build_optimizer

    def build_and_keep(*args: Any, **kwargs: Any) -> torch.optim.Optimizer:
        built.append(build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(trainer_module, "build_optimizer", build_and_keep)
    run_dir = tmp_path / "run"
    lr, momentum, epochs, warmup = 0.01, 0.9, 5, 2
    train(micro_config(run_dir, tiny_demo_root, "trainer.optimizer=sgd", "trainer.scheduler=poly",
                       f"trainer.warmup_epochs={warmup}", f"trainer.max_epochs={epochs}", f"trainer.lr={lr}",
                       f"trainer.momentum={momentum}", "trainer.val_every=5"))

    history = json.loads((run_dir / "metrics.json").read_text())["history"]
    expected = [expected_lr(lr, e, warmup, epochs, "poly") for e in range(epochs)]
    assert [record["lr"] for record in history] == pytest.approx(expected, rel=1e-9)
    [optimizer] = built
    assert type(optimizer) is torch.optim.SGD
    [group] = optimizer.param_groups
    assert group["nesterov"] is True and group["momentum"] == momentum
