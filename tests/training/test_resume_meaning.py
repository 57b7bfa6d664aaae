"""Resuming keeps what the weights mean: a run resumed with another spacing, normalisation, network or dataset labels
stops with one line, though its weights may fit; how the network is run (the patch, activation checkpointing) may
change."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from medseg.cli import one_line_errors
from medseg.config import DataConfig, ModelConfig, TrainConfig, attention_config
from medseg.training.run import train, train_cli
from medseg.training.trainer import meaning_changes
from tests.helpers.runs import micro_config

pytestmark = pytest.mark.usefixtures("one_thread")

LABELS = {"labels": {"background": 0, "spleen": 1}, "channel_names": {"0": "CT"}}


def _described(cfg: TrainConfig, dataset: dict[str, Any] = LABELS) -> dict[str, Any]:
    return {**asdict(cfg), "dataset": dataset}


def test_the_keys_that_change_what_the_weights_mean_are_named_with_both_values() -> None:
    trained = TrainConfig(data=DataConfig(root="x", spacing=[0.8, 0.8, 2.0], patch_size=[32, 32, 16]),
                          model=ModelConfig(strides=[2, 2, 2]))
    resumed = replace(trained, data=replace(trained.data, spacing=[1.0, 1.0, 2.0], patch_size=[48, 48, 32]),
                      model=replace(trained.model, strides=[[2, 2, 1], 2, 2], checkpointing=True,
                                    attention=attention_config(gamma=0.5, drop_path=0.1)))
    other_labels = {**LABELS, "labels": {"background": 0, "liver": 1}}
    assert meaning_changes(_described(resumed, other_labels), _described(trained)) == [
        "model.strides=[[2, 2, 1], 2, 2] (checkpoint: [2, 2, 2])",
        "model.attention.gamma=0.5 (checkpoint: 0.9)",
        "data.spacing=[1.0, 1.0, 2.0] (checkpoint: [0.8, 0.8, 2.0])",
        "dataset.labels.liver=1 (checkpoint: null)",
        "dataset.labels.spleen=null (checkpoint: 1)",
    ], "the patch, activation checkpointing and drop-path change how the network is run, not what it computes"
    assert meaning_changes(_described(trained), _described(trained)) == []


def test_resuming_with_another_spacing_is_one_line_and_the_same_config_resumes(
        tmp_path: Path, tiny_demo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1", "data.spacing=[1.0,1.0,1.0]"))
    last = run_dir / "checkpoints" / "last.pt"
    capsys.readouterr()
    cfg = micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", "data.spacing=[1.5,1.5,1.0]",
                       "trainer.resume=true")
    with pytest.raises(SystemExit) as exit_info:
        one_line_errors(train_cli)(cfg)
    assert exit_info.value.code == 1
    [error] = capsys.readouterr().err.splitlines()
    assert error == (f"error: checkpoint {last} was trained with other values of keys that change what its weights "
                     f"mean: data.spacing=[1.5, 1.5, 1.0] (checkpoint: [1.0, 1.0, 1.0]). Resume with the checkpoint's "
                     f"values (data.plan_from=init takes its planned ones), or start a new run from its weights with "
                     f"trainer.init_from={last}")
    metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", "data.spacing=[1.0,1.0,1.0]",
                                 "trainer.resume=true"))
    assert metrics["epochs"] == 2, "the same config resumes"
