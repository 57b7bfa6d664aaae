"""``trainer.max_minutes``: the epochs a wall-clock budget spans, the schedule fitted to them, and the stop."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from medseg.errors import ConfigError
from medseg.runs.checkpoint import load_checkpoint
from medseg.training import trainer as trainer_module
from medseg.training.budget import TimeBudget
from medseg.training.checks import check_config
from medseg.training.run import train
from tests.helpers.runs import micro_config


def test_horizon_counts_the_first_epoch_and_shares_validation_over_val_every() -> None:
    budget = TimeBudget(seconds=60.0, max_epochs=100)
    # first epoch 14 s (10 training + 4 validation); then 10 s + 4 s / 2 per epoch: 1 + floor(46 / 12) = 4
    assert budget.horizon(elapsed=14.0, train_epoch=10.0, validation=4.0, val_every=2) == 4
    assert budget.horizon(elapsed=90.0, train_epoch=80.0, validation=10.0, val_every=1) == 1
    assert TimeBudget(seconds=1e6, max_epochs=7).horizon(1.0, 1.0, 0.0, 1) == 7
    # decided after two epochs (28 s): 2 + floor(32 / 12) = 4; never fewer than the epochs done
    assert budget.horizon(elapsed=28.0, train_epoch=10.0, validation=4.0, val_every=2, epochs_done=2) == 4
    assert budget.horizon(elapsed=70.0, train_epoch=10.0, validation=4.0, val_every=2, epochs_done=2) == 2


def test_spent_when_another_mean_epoch_would_overrun() -> None:
    budget = TimeBudget(seconds=60.0, max_epochs=100)
    assert not budget.spent(elapsed=40.0, epochs_done=2)  # 40 + 20 = 60: still fits
    assert budget.spent(elapsed=45.0, epochs_done=2)  # 45 + 22.5 > 60
    assert not budget.spent(elapsed=0.0, epochs_done=0)


def test_max_minutes_must_be_positive(tmp_path: Path, tiny_demo_root: Path) -> None:
    with pytest.raises(ConfigError, match="trainer.max_minutes"):
        check_config(micro_config(tmp_path, tiny_demo_root, "trainer.max_minutes=0"))


class FakeClock:
    """``time.perf_counter`` that moves only when the trainer trains (10 s an epoch) or validates (4 s)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_a_budget_sets_the_epochs_and_the_schedule_spans_them(
        tmp_path: Path, tiny_demo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    train_epoch, validate = trainer_module.Trainer.train_epoch, trainer_module.Trainer.validate

    def timed_train_epoch(self: trainer_module.Trainer, stop: object) -> float:
        clock.now += 10.0
        return train_epoch(self, stop)

    def timed_validate(self: trainer_module.Trainer) -> dict:
        clock.now += 4.0
        return validate(self)

    monkeypatch.setattr(trainer_module.Trainer, "train_epoch", timed_train_epoch)
    monkeypatch.setattr(trainer_module.Trainer, "validate", timed_validate)
    run_dir = tmp_path / "run"
    metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=100", "trainer.max_minutes=1",
                                 "trainer.val_every=2", "trainer.scheduler=cosine", "trainer.lr=0.01"))

    assert metrics["epochs"] == 4  # 1 + floor((60 - 14) / (10 + 4 / 2))
    validated = [record["epoch"] for record in metrics["history"] if "val_dice" in record]
    assert validated == [1, 2, 4]  # the first epoch (timed with its validation), every val_every, the last
    # cosine over the 4 epochs the budget spans, not over max_epochs=100
    expected = [0.01 * (1 + math.cos(math.pi * epoch / 4)) / 2 for epoch in range(4)]
    assert [record["lr"] for record in metrics["history"]] == pytest.approx(expected)
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["config"]["trainer"]["max_epochs"] == 4
