"""nnU-Net's training recipe: which configs train with it, its pseudo-Dice and moving average against references written
from nnU-Net's definitions, its epoch of random cases, and a micro run that chooses best.pt by the average."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.data import Dataset

from medseg.data.labels import IGNORE_INDEX, LabelSpec
from medseg.runs.checkpoint import load_checkpoint
from medseg.training.checks import check_config
from medseg.training.prepare import patch_loader
from medseg.training.pseudo_dice import EMA_MOMENTUM, moving_average, output_masks, overlap_counts, summarize
from medseg.training.run import train
from medseg.training.trainer import Trainer
from tests.helpers.configs import compose_config
from tests.helpers.runs import micro_config

pytestmark = pytest.mark.usefixtures("one_thread")

NNUNET_TRAINER = {"optimizer": "sgd", "lr": 0.01, "momentum": 0.99, "weight_decay": 3e-5, "scheduler": "poly",
                  "max_epochs": 1000, "iterations_per_epoch": 250, "val_iterations": 50, "val_every": None,
                  "grad_clip": 12.0}
"""nnUNetTrainer's settings, as the recipe's trainer keys."""


def _typed(*overrides: str):
    return check_config(compose_config(["data.root=/nowhere", "output_dir=/nowhere", *overrides]))


@pytest.mark.parametrize("data", ["msd", "nnunet"])
def test_real_data_trains_with_nnunets_recipe_by_default(data: str) -> None:
    cfg = _typed(f"data={data}")
    assert {key: getattr(cfg.trainer, key) for key in NNUNET_TRAINER} == NNUNET_TRAINER
    assert (cfg.data.augment, cfg.data.pos_fraction, cfg.inference.tta) == ("nnunet", 0.33, True)
    model = cfg.model
    assert (model.conv_stages, model.encoder_blocks, model.decoder_convs, model.deep_supervision) == (
        "nnunet", 2, 2, True)
    assert (model.channels, model.strides) == (None, None), "planned with the patch"


def test_the_demo_keeps_its_light_recipe_and_real_data_can_ask_for_it() -> None:
    demo, light = _typed(), _typed("data=msd", "recipe=light")
    for cfg in (demo, light):
        assert (cfg.trainer.optimizer, cfg.trainer.iterations_per_epoch, cfg.trainer.val_iterations) == (
            "adamw", None, 0)
        assert (cfg.data.augment, cfg.model.conv_stages, cfg.trainer.val_every) == ("light", "medseg", 2)
    assert demo.model.channels == [16, 32, 64, 128] and demo.trainer.max_epochs == 6


def test_experiment_presets_sit_on_the_recipe() -> None:
    """experiment=nnunet brings the recipe to the demo; ResEnc M on real data is nnU-Net's ResEnc in its recipe."""
    demo = _typed("experiment=nnunet")
    assert (demo.trainer.optimizer, demo.data.augment, demo.model.conv_stages) == ("sgd", "nnunet", "nnunet")
    resenc = _typed("data=msd", "experiment=resenc_m")
    assert (resenc.model.conv_stages, resenc.model.decoder_convs, resenc.trainer.optimizer) == (
        "nnunet_resenc", 1, "sgd")


def test_an_unknown_augmentation_is_refused_by_name() -> None:
    with pytest.raises(Exception, match=r"data\.augment.*light.*nnunet.*none"):
        _typed("data.augment=heavy")


def _reference_counts(logits: np.ndarray, label: np.ndarray, classes: int) -> np.ndarray:
    """TP, FP, FN per foreground class, voxel by voxel: the argmax against the label, ignore voxels skipped."""
    predicted = logits.argmax(1)
    counts = np.zeros((3, classes - 1), dtype=np.int64)
    for p, r in zip(predicted.ravel(), label[:, 0].ravel()):
        if r == IGNORE_INDEX:
            continue
        for k in range(1, classes):
            counts[0, k - 1] += p == k and r == k
            counts[1, k - 1] += p == k and r != k
            counts[2, k - 1] += p != k and r == k
    return counts


def test_pseudo_dice_counts_and_ratio_are_nnunets() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 5, 6, 3, generator=generator)
    label = torch.randint(0, 3, (2, 1, 5, 6, 3), generator=generator).float()  # class 3 never in the reference
    label[0, 0, :2, :2] = IGNORE_INDEX
    spec = LabelSpec.plain({0: "bg", 1: "a", 2: "b", 3: "c"})
    counts = overlap_counts(*output_masks(logits, label, spec))
    expected = _reference_counts(logits.numpy(), label.numpy(), 4)
    np.testing.assert_array_equal(counts.numpy(), expected)
    result = summarize(counts, spec.output_names)
    per_class = [2 * tp / (2 * tp + fp + fn) for tp, fp, fn in expected.T]
    assert list(result.per_class.values()) == pytest.approx(per_class)
    assert result.dice == pytest.approx(np.mean(per_class))


def test_pseudo_dice_leaves_out_an_output_no_patch_has() -> None:
    result = summarize(np.array([[3, 0], [1, 0], [2, 0]]), ["a", "b"])
    assert result.dice == pytest.approx(6 / 9) and math.isnan(result.per_class["b"])


def test_pseudo_dice_of_regions_thresholds_each_sigmoid_at_one_half() -> None:
    spec = LabelSpec({0: "bg", 1: "a", 2: "b"}, [0, 1, 2], regions={"whole": [1, 2], "b": [2]},
                     regions_class_order=[1, 2])
    logits = torch.tensor([[[[0.5, -0.5, 2.0]], [[-1.0, 1.0, -3.0]]]])  # (1, 2 regions, 1, 3)
    label = torch.tensor([[[[1.0, 1.0, IGNORE_INDEX]], [[0.0, 1.0, IGNORE_INDEX]]]])
    counts = overlap_counts(*output_masks(logits, label, spec))
    np.testing.assert_array_equal(counts.numpy(), [[1, 1], [0, 0], [1, 0]])


def test_moving_average_is_nnunets() -> None:
    values = [0.2, 0.5, float("nan"), 0.9]
    average, expected = None, []
    for value in values:
        average = moving_average(average, value)
        expected.append(average)
    first = 0.2
    second = EMA_MOMENTUM * first + 0.1 * 0.5
    assert expected == pytest.approx([first, second, second, EMA_MOMENTUM * second + 0.1 * 0.9])


def test_an_epoch_of_iterations_draws_cases_with_replacement() -> None:
    dataset = Dataset(list(range(3)))
    loader = patch_loader(dataset, batch=2, workers=0, iterations=7)
    torch.manual_seed(1)
    first = [batch.tolist() for batch in loader]
    torch.manual_seed(1)
    again = [batch.tolist() for batch in loader]
    assert len(loader) == 7 and len(first) == 7 and first == again
    drawn = [case for batch in first for case in batch]
    assert len(drawn) == 14 and set(drawn) <= {0, 1, 2} and len(set(drawn)) < len(drawn), "with replacement"
    one_pass = patch_loader(dataset, batch=2, workers=0, iterations=None)
    assert len(one_pass) == 1, "one pass, the last short batch dropped"


def test_a_micro_run_chooses_best_by_the_moving_average_and_validates_it_whole(tmp_path: Path,
                                                                               tiny_demo_root: Path) -> None:
    """Each epoch has iterations_per_epoch steps and a pseudo-Dice; the full validation runs at the end only, on
    best.pt's weights, whose epoch is the one of the highest moving average."""
    run_dir = tmp_path / "run"
    metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=3", "trainer.iterations_per_epoch=2",
                                 "trainer.val_iterations=2", "trainer.val_every=null", "trainer.lr=0.01",
                                 "data.augment=nnunet"))
    history = metrics["history"]
    assert [record["steps"] for record in history] == [2, 2, 2]
    assert all("pseudo_dice" in record for record in history)
    assert ["val_dice" in record for record in history] == [False, False, True]
    averages = [record["pseudo_dice_ema"] for record in history]
    best = int(np.argmax(averages)) + 1
    assert metrics["best_epoch"] == best
    assert load_checkpoint(run_dir / "checkpoints" / "best.pt")["epoch"] == best
    assert metrics["best_val_dice"] == history[-1]["val_dice"]
    assert json.loads((run_dir / "metrics.json").read_text())["best_epoch"] == best


class _Stop(Exception):
    """Ends a run after an epoch's checkpoint, as a kill would."""


@pytest.mark.parametrize("augment_on", ["workers", "device"])
def test_a_run_of_the_recipe_resumed_after_a_stop_ends_as_the_uninterrupted_one(
        tmp_path: Path, tiny_demo_root: Path, monkeypatch: pytest.MonkeyPatch, augment_on: str) -> None:
    """The random epochs, nnU-Net's augmentation (on the workers, or drawn there and applied on the device), the
    validation patches and the moving average are functions of (seed, epoch): a run stopped after epoch 2 and resumed
    ends with the same history, best.pt and weights."""
    recipe = ["experiment=nnunet", "model.channels=[4,8]", "model.strides=[2]", "trainer.max_epochs=3",
              "trainer.iterations_per_epoch=2", "trainer.val_iterations=2", "trainer.batch_size=1",
              f"data.augment_on={augment_on}"]
    whole = train(micro_config(tmp_path / "whole", tiny_demo_root, *recipe))
    log_epoch = Trainer.log_epoch

    def stop_after_two(self: Trainer, record: dict) -> None:
        log_epoch(self, record)
        if record["epoch"] == 2:
            raise _Stop

    monkeypatch.setattr(Trainer, "log_epoch", stop_after_two)
    with pytest.raises(_Stop):
        train(micro_config(tmp_path / "resumed", tiny_demo_root, *recipe))
    monkeypatch.setattr(Trainer, "log_epoch", log_epoch)
    resumed = train(micro_config(tmp_path / "resumed", tiny_demo_root, *recipe, "trainer.resume=true"))

    def untimed(metrics: dict) -> list[dict]:
        return [{k: v for k, v in record.items() if k != "train_seconds"} for record in metrics["history"]]

    assert untimed(resumed) == untimed(whole) and resumed["best_epoch"] == whole["best_epoch"]
    assert resumed["best_val_dice"] == whole["best_val_dice"]
    for name in ("last.pt", "best.pt"):
        got, want = (load_checkpoint(tmp_path / run / "checkpoints" / name)["model"] for run in ("resumed", "whole"))
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-6)


def test_a_run_with_the_augmentation_on_the_device_trains_as_one_on_the_workers(tmp_path: Path,
                                                                               tiny_demo_root: Path) -> None:
    """data.augment_on=device (the draws of a loader worker process applied to the batch by the trainer) trains on
    the same patches as the worker path: the same losses and pseudo-Dice to float tolerance, epoch for epoch."""
    recipe = ["experiment=nnunet", "model.channels=[4,8]", "model.strides=[2]", "trainer.max_epochs=2",
              "trainer.iterations_per_epoch=2", "trainer.val_iterations=1", "trainer.batch_size=1",
              "data.num_workers=1"]
    runs = {where: train(micro_config(tmp_path / where, tiny_demo_root, *recipe, f"data.augment_on={where}"))
            for where in ("workers", "device")}
    workers, device = (runs[where]["history"] for where in ("workers", "device"))
    for a, b in zip(workers, device):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4) and b["loss"] != 0
        assert b["pseudo_dice"] == pytest.approx(a["pseudo_dice"], abs=1e-4)
    assert load_checkpoint(tmp_path / "device" / "checkpoints" / "last.pt")["config"]["data"]["augment_on"] == "device"
