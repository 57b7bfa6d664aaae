"""The training loss: each ``trainer.loss`` against MONAI's own class, ignore voxels, class weights, regions, deep
supervision, ``trainer.class_weights=auto``, bad input, and one micro training run that records the weights."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from monai.losses import DiceCELoss, DiceFocalLoss, DiceLoss

from medseg.cli import one_line_errors
from medseg.config import ModelConfig, TrainConfig, TrainerConfig
from medseg.data.datalist import DatasetInfo, dataset_cache_dir
from medseg.data.labels import IGNORE_INDEX
from medseg.errors import ConfigError
from medseg.planning.fingerprint import FINGERPRINT_FILE
from medseg.runs.checkpoint import load_checkpoint, save_checkpoint
from medseg.training.checks import check_config
from medseg.training.losses import (
    AUTO_WEIGHT_RATIO,
    LOSSES,
    auto_class_weights,
    build_loss,
    class_weight_names,
    deep_supervision_weights,
    output_voxels,
    resolve_class_weights,
)
from medseg.training.run import train, train_cli
from tests.helpers.configs import compose_config
from tests.helpers.runs import micro_config

CLASSES = {0: "background", 1: "edema", 2: "core", 3: "enhancing"}
REGIONS = {"whole tumor": [1, 2, 3], "tumor core": [2, 3], "enhancing": [3]}
WEIGHTS = [0.5, 1.5, 2.0, 1.0]
"""Distinct weights, one per class; the region tests take the first three."""
SHAPE = (6, 6, 4)


def _dataset(regions: dict[str, list[int]] | None = None) -> DatasetInfo:
    return DatasetInfo(root=Path("."), format="msd", name="brain", labels=dict(CLASSES), channel_names=["T1"],
                       training=[], regions=regions)


def _loss(name: str, region_based: bool, weights: list[float] | None,
          deep_supervision: bool = False, spatial_dims: int = 3) -> torch.nn.Module:
    cfg = TrainConfig(model=ModelConfig(deep_supervision=deep_supervision, spatial_dims=spatial_dims),
                      trainer=TrainerConfig(loss=name))
    return build_loss(cfg, _dataset(REGIONS if region_based else None), weights)


def _classes(seed: int) -> torch.Tensor:
    """(2, 1, *SHAPE) float class indices 0..3."""
    return torch.randint(0, len(CLASSES), (2, 1, *SHAPE), generator=torch.Generator().manual_seed(seed)).float()


def _regions_of(classes: torch.Tensor) -> torch.Tensor:
    """(B, 3, *S) 0/1 region targets of a class map; ignore voxels stay IGNORE_INDEX in every channel."""
    regions = torch.cat([torch.isin(classes, torch.tensor(members)).float() for members in REGIONS.values()], 1)
    return torch.where(classes == IGNORE_INDEX, float(IGNORE_INDEX), regions)


def _with_ignore(classes: torch.Tensor) -> torch.Tensor:
    """``classes`` with an ignore block in the first case and scattered ignore voxels in the second."""
    label = classes.clone()
    label[0, :, :3, :, :2] = IGNORE_INDEX
    label[1, :, ::2, 1::3, 1] = IGNORE_INDEX
    return label


def _inputs(region_based: bool, ignore: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``(2, K or R, *SHAPE)`` and the matching label."""
    classes = _classes(seed)
    label = _with_ignore(classes) if ignore else classes
    label = _regions_of(label) if region_based else label
    channels = len(REGIONS) if region_based else len(CLASSES)
    logits = torch.randn(2, channels, *SHAPE, generator=torch.Generator().manual_seed(seed + 1))
    return logits, label


def _monai(name: str, region_based: bool, weights: list[float] | None):
    """MONAI's (or torch's) loss of the same name, for labels without ignore voxels."""
    weight = None if weights is None else torch.tensor(weights)
    if not region_based:
        foreground = DiceLoss(to_onehot_y=True, softmax=True, include_background=False,
                              weight=None if weight is None else weight[1:])
        return {
            "nnunet": lambda x, y: foreground(x, y) + F.cross_entropy(x, y[:, 0].long(), weight=weight),
            "dice_ce": DiceCELoss(to_onehot_y=True, softmax=True, weight=weight),
            "dice_focal": DiceFocalLoss(to_onehot_y=True, softmax=True, weight=weight),
            "dice": DiceLoss(to_onehot_y=True, softmax=True, weight=weight),
            "ce": lambda x, y: F.cross_entropy(x, y[:, 0].long(), weight=weight),
        }[name]
    per_channel = None if weight is None else weight.view(1, -1, 1, 1, 1)
    bce = torch.nn.BCEWithLogitsLoss(weight=per_channel)
    dice = DiceLoss(sigmoid=True, weight=weight)
    return {
        "dice_ce": lambda x, y: dice(x, y) + bce(x, y),
        "nnunet": lambda x, y: dice(x, y) + bce(x, y),  # no background channel to leave out
        "dice_focal": DiceFocalLoss(sigmoid=True, weight=weight),
        "dice": dice,
        "ce": bce,
    }[name]


def _reference(name: str, logits: torch.Tensor, label: torch.Tensor, weights: list[float] | None,
               region_based: bool, batch_dice: bool = False) -> torch.Tensor:
    """The loss from its formulas on the valid voxels alone (float64): each case's valid voxels are selected and
    the rest is never seen. Dice per case and channel ``1 - (2 sum pt + 1e-5) / (sum p + sum t + 1e-5)`` times the
    weight, averaged (``nnunet``, nnU-Net's ``MemoryEfficientSoftDiceLoss``: the foreground channels only, and with
    ``batch_dice`` the sums taken over the cases too); softmax CE ``sum w_y nll / sum w_y``; BCE and sigmoid focal
    (gamma 2) times the channel's weight, averaged over valid voxels and channels."""
    channels = logits.shape[1]
    w = torch.ones(channels, dtype=torch.float64) if weights is None else torch.tensor(weights, dtype=torch.float64)
    dice_channels = range(1 if name == "nnunet" and not region_based else 0, channels)
    sums, elementwise, ce_sum, ce_weight = [], [], torch.zeros((), dtype=torch.float64), 0.0
    for case in range(logits.shape[0]):
        keep = label[case, 0] != IGNORE_INDEX
        x = logits[case][:, keep].double()  # (C, N)
        if region_based:
            t, p = label[case][:, keep].double(), torch.sigmoid(x)
        else:
            y = label[case, 0][keep].long()
            t, p = F.one_hot(y, channels).T.double(), torch.softmax(x, 0)
            nll = -torch.log_softmax(x, 0)[y, torch.arange(y.numel())]
            ce_sum, ce_weight = ce_sum + (w[y] * nll).sum(), ce_weight + w[y].sum()
        sums.append(torch.stack([(p * t).sum(1), p.sum(1), t.sum(1)]))  # (3, C): intersection, prediction, target
        if name == "dice_focal":
            pt = torch.where(t == 1, torch.sigmoid(x), 1 - torch.sigmoid(x))
            elementwise.append(-(1 - pt) ** 2 * torch.log(pt) * w[:, None])
        elif region_based:
            elementwise.append(-(t * F.logsigmoid(x) + (1 - t) * F.logsigmoid(-x)) * w[:, None])
    groups = [torch.stack(sums).sum(0)] if batch_dice else sums
    dice = [w[c] * (1 - (2 * g[0, c] + 1e-5) / (g[1, c] + g[2, c] + 1e-5)) for g in groups for c in dice_channels]
    voxelwise = ((ce_sum / ce_weight) if not region_based and name in ("dice_ce", "ce", "nnunet")
                 else torch.cat(elementwise, 1).mean() if elementwise else 0.0)
    return (torch.stack(dice).mean() if name != "ce" else 0.0) + (voxelwise if name != "dice" else 0.0)


def _weights(region_based: bool, weighted: bool) -> list[float] | None:
    return (WEIGHTS[:len(REGIONS)] if region_based else WEIGHTS) if weighted else None


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("region_based", [False, True], ids=["classes", "regions"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_without_ignore_voxels_each_loss_is_monais(name: str, region_based: bool, weighted: bool) -> None:
    logits, label = _inputs(region_based, ignore=False)
    weights = _weights(region_based, weighted)
    ours = _loss(name, region_based, weights)(logits, label)
    torch.testing.assert_close(ours, _monai(name, region_based, weights)(logits, label), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("region_based", [False, True], ids=["classes", "regions"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_ignore_voxels_take_no_part(name: str, region_based: bool, weighted: bool) -> None:
    """The loss is the independent reference on the valid voxels alone; other logits under the mask change nothing
    and get no gradient."""
    logits, label = _inputs(region_based, ignore=True)
    weights = _weights(region_based, weighted)
    loss = _loss(name, region_based, weights)
    ignored = (label[:, :1] == IGNORE_INDEX).expand_as(logits)
    assert 0 < ignored.float().mean() < 0.5
    logits.requires_grad_(True)
    value = loss(logits, label)
    value.backward()
    assert logits.grad is not None and not logits.grad[ignored].any() and logits.grad[~ignored].any()
    torch.testing.assert_close(value.double(), _reference(name, logits.detach(), label, weights, region_based),
                               rtol=1e-5, atol=1e-6)
    changed = torch.where(ignored, 50 * torch.randn_like(logits), logits.detach())
    assert torch.equal(loss(changed, label), value.detach())
    other = _inputs(region_based, ignore=True, seed=7)[1]  # other labels outside the mask do change the loss
    assert not torch.equal(loss(logits.detach(), torch.where(label == IGNORE_INDEX, label, other)), value.detach())


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_nnunets_loss_sums_its_dice_over_the_batch_in_2d(weighted: bool) -> None:
    """nnU-Net's 2D plans set batch_dice: the Dice sums run over every case of the batch, without the background;
    its 3D plans do not."""
    logits, label = _inputs(False, ignore=True)
    logits, label = logits[..., 0], label[..., 0]  # (2, K, 6, 6): 2D
    weights = _weights(False, weighted)
    for dims, batch in ((2, True), (3, False)):
        value = _loss("nnunet", False, weights, spatial_dims=dims)(logits, label)
        torch.testing.assert_close(value.double(), _reference("nnunet", logits, label, weights, False, batch),
                                   rtol=1e-5, atol=1e-6)
    assert not torch.isclose(_reference("nnunet", logits, label, weights, False, True),
                             _reference("nnunet", logits, label, weights, False, False))


@pytest.mark.parametrize("region_based", [False, True], ids=["classes", "regions"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_a_patch_of_ignore_voxels_only_gives_zero_loss_and_gradient(name: str, region_based: bool) -> None:
    logits, label = _inputs(region_based, ignore=False)
    label = torch.full_like(label, IGNORE_INDEX)
    logits.requires_grad_(True)
    value = _loss(name, region_based, _weights(region_based, True))(logits, label)
    value.backward()
    assert value.item() == 0 and logits.grad is not None and not logits.grad.any()


def test_a_zero_class_weight_makes_that_class_irrelevant_to_cross_entropy() -> None:
    logits, label = _inputs(False, ignore=True)
    of_class_1 = (label == 1).expand_as(logits)
    changed = torch.where(of_class_1, 10 * torch.randn_like(logits), logits)
    muted, plain = _loss("ce", False, [1, 0, 1, 1]), _loss("ce", False, [1, 1, 1, 1])
    assert torch.equal(muted(changed, label), muted(logits, label))
    assert not torch.equal(plain(changed, label), plain(logits, label))


def test_a_class_weight_scales_that_class_dice() -> None:
    """Weights [1, 0, 1, 1] instead of all 1 drop exactly class 1's Dice loss (averaged over cases and classes)."""
    logits, label = _inputs(False, ignore=False)
    per_class = DiceLoss(to_onehot_y=True, softmax=True, reduction="none")(logits, label)  # (B, C, 1, 1, 1)
    difference = _loss("dice", False, [1, 1, 1, 1])(logits, label) - _loss("dice", False, [1, 0, 1, 1])(logits, label)
    torch.testing.assert_close(difference, per_class[:, 1].sum() / per_class[:, :, 0, 0, 0].numel())


@pytest.mark.parametrize("region_based", [False, True], ids=["classes", "regions"])
def test_deep_supervision_weighs_as_nnunet_and_keeps_the_ignore_voxels_at_every_level(region_based: bool) -> None:
    """nnU-Net's weights through MONAI's DeepSupervisionLoss: (full + 1/2 half-resolution + 0 quarter-resolution) / 1.5,
    each output against the label downsampled by nearest neighbour, ignore voxels included."""
    coarse_logits, coarse = _inputs(region_based, ignore=True)
    label = coarse.repeat_interleave(2, 2).repeat_interleave(2, 3).repeat_interleave(2, 4)  # 2x2x2 blocks
    logits = torch.randn(coarse_logits.shape[:2] + label.shape[2:], generator=torch.Generator().manual_seed(3))
    lowest = torch.randn(coarse_logits.shape[:2] + tuple(s // 2 for s in coarse.shape[2:]))
    single = _loss("dice_ce", region_based, None)
    deep = _loss("dice_ce", region_based, None, deep_supervision=True)
    value = deep([logits, coarse_logits, lowest], label)
    torch.testing.assert_close(value, (single(logits, label) + 0.5 * single(coarse_logits, coarse)) / 1.5)
    ignored = coarse[:, :1] == IGNORE_INDEX
    changed = torch.where(ignored, 50 * torch.randn_like(coarse_logits), coarse_logits)
    assert torch.equal(deep([logits, changed, 9 * lowest], label), value)


@pytest.mark.parametrize("outputs", [1, 2, 3, 5])
def test_deep_supervision_weights_are_nnunets(outputs: int) -> None:
    """nnU-Net's nnUNetTrainer: 1 / 2^i per output, the lowest resolution's 0 (with more than one), summing to 1."""
    raw = [0.0 if i == outputs - 1 and outputs > 1 else 1 / 2**i for i in range(outputs)]
    assert deep_supervision_weights(outputs) == pytest.approx([w / sum(raw) for w in raw])


def test_auto_weights_follow_the_inverse_square_root_of_the_voxel_share_capped_and_averaging_one() -> None:
    ratios = [1.0, math.sqrt(10), math.sqrt(100), AUTO_WEIGHT_RATIO]  # n_max / n_c = 1, 10, 100, 10000 (capped)
    expected = [r / (sum(ratios) / 4) for r in ratios]
    assert auto_class_weights([10_000, 1_000, 100, 1]) == pytest.approx(expected)
    assert auto_class_weights([10_000, 0]) == pytest.approx([2 / 11, 20 / 11]), "an absent class gets the cap"
    assert auto_class_weights([5, 5, 5]) == [1.0, 1.0, 1.0]


def test_auto_weights_of_regions_count_the_voxels_of_their_member_classes() -> None:
    fingerprint_voxels = [10_000, 500, 200, 200]  # background, edema, core, enhancing
    regions = _dataset(REGIONS)
    assert output_voxels(regions, fingerprint_voxels) == [900, 400, 200]
    ratios = [1.0, 1.5, math.sqrt(4.5)]
    assert resolve_class_weights("auto", regions, fingerprint_voxels) == pytest.approx(
        [r / (sum(ratios) / 3) for r in ratios])
    assert class_weight_names(regions) == list(REGIONS)
    assert class_weight_names(_dataset()) == list(CLASSES.values())
    assert resolve_class_weights(None, regions, fingerprint_voxels) is None
    assert resolve_class_weights([1, 2, 3], regions, fingerprint_voxels) == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("setting", [[1, 2, 3], [1, -1, 1, 1], [1, 0, 1, 1], "often", [1, "a", 1, 1]])
def test_bad_class_weights_name_the_key_the_length_and_the_outputs(setting: object) -> None:
    expected = ("trainer.class_weights=.*: expected null, auto, or a list of 4 positive numbers, one per network "
                "output: background, edema, core, enhancing$")
    with pytest.raises(ConfigError, match=expected):
        resolve_class_weights(setting, _dataset(), [1, 1, 1, 1])


def test_an_unknown_loss_lists_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.loss='dicece' is not valid\. Valid values: "
                                          r"dice_ce, nnunet, dice_focal, dice, ce$"):
        check_config(compose_config(["trainer.loss=dicece", "output_dir=unused"]))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("weights", "expected"), [
    ("[1,2]", "expected null, auto, or a list of 3 positive numbers, one per network output: background, dim sphere, "
              "bright sphere"),
    ("[1,-1,1]", "expected each entry > 0"),  # the schema's range, checked first
])
def test_bad_class_weights_stop_the_run_in_one_line_before_training(
        weights: str, expected: str, tmp_path: Path, tiny_demo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        one_line_errors(train_cli)(micro_config(run_dir, tiny_demo_root, f"trainer.class_weights={weights}"))
    assert exit_info.value.code == 1
    [error] = capsys.readouterr().err.splitlines()
    assert error.startswith("error: trainer.class_weights=") and error.endswith(expected)
    assert not (run_dir / "splits.json").exists() and not (run_dir / "checkpoints").exists()


@pytest.mark.usefixtures("one_thread")
def test_auto_weights_of_the_demo_reach_the_log_and_the_checkpoint(
        tmp_path: Path, tiny_demo_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    cfg = micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1", "trainer.class_weights=auto",
                       "trainer.loss=dice_focal")
    with caplog.at_level(logging.INFO, logger="medseg"):
        metrics = train(cfg)
    assert math.isfinite(metrics["history"][0]["loss"]) and metrics["nonfinite_steps"] == 0
    class_voxels = json.loads((dataset_cache_dir(tiny_demo_root) / FINGERPRINT_FILE).read_text())["class_voxels"]
    weights = dict(zip(["background", "dim sphere", "bright sphere"], auto_class_weights(class_voxels)))
    assert weights["background"] < 1 < weights["dim sphere"], "the demo's background is the most frequent class"
    for name in ("last.pt", "best.pt"):
        assert load_checkpoint(run_dir / "checkpoints" / name)["loss"] == {"name": "dice_focal",
                                                                          "class_weights": weights}
    line = "loss dice_focal; class weights " + ", ".join(f"{k} {w:.3g}" for k, w in weights.items())
    assert [r.getMessage() for r in caplog.records].count(line) == 1

    last = run_dir / "checkpoints" / "last.pt"  # a checkpoint of an older run, without the loss, still resumes
    save_checkpoint(last, {key: value for key, value in load_checkpoint(last).items() if key != "loss"})
    train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", "trainer.class_weights=auto",
                       "trainer.loss=dice_focal", "trainer.resume=true"))
    resumed = load_checkpoint(last)
    assert resumed["epoch"] == 2 and resumed["loss"]["class_weights"] == weights
