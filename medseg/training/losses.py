"""The training loss (``trainer.loss``) and its class weights (``trainer.class_weights``), on labelled voxels only.

Two output modes, set by the dataset (:attr:`~medseg.data.datalist.DatasetInfo.region_based`):

* **classes** (softmax): ``output`` ``(B, K, *S)`` logits of the K classes, background included; ``label``
  ``(B, 1, *S)`` class indices.
* **regions** (sigmoid, nnU-Net's region-based training): ``output`` ``(B, R, *S)`` logits of R regions that may
  overlap; ``label`` ``(B, R, *S)`` 0/1 per region.

Label voxels equal to :data:`~medseg.data.labels.IGNORE_INDEX` (in every channel of a region label) take part
in no term. For Dice, the probabilities and the one-hot target are zeroed there before the soft Dice sums (nnU-Net's
way; MONAI's ``MaskedDiceLoss``); cross-entropy and focal terms are averaged over the valid voxels only. Without
ignore voxels each loss equals MONAI's of the same name up to float rounding: ``dice_ce`` =
``DiceCELoss(to_onehot_y=True, softmax=True)``, ``dice_focal`` = ``DiceFocalLoss(to_onehot_y=True, softmax=True)``
(whose focal term is MONAI's sigmoid focal loss on the one-hot classes, gamma 2), ``dice`` =
``DiceLoss(to_onehot_y=True, softmax=True)``, ``ce`` = ``torch.nn.CrossEntropyLoss``. With regions the Dice term is
``DiceLoss(sigmoid=True)`` and cross-entropy is binary (``BCEWithLogitsLoss``) per region: MONAI's ``DiceCELoss``
would take a softmax cross-entropy across the region channels.

``nnunet`` is nnU-Net v2's ``DC_and_CE_loss`` (``nnUNetTrainer._build_loss``): ``dice_ce`` whose Dice term leaves the
background out (``do_bg=False``; every region is kept) and, in 2D, sums over the batch before dividing (the
``batch_dice`` its planner writes: true for ``2d``, false for ``3d_fullres``): ``DiceLoss(include_background=False,
batch=...)`` with nnU-Net's smoothing 1e-5, MONAI's default.

Class weights, one per output channel, reach every term as MONAI applies its ``weight=``: each channel's Dice loss is
scaled by its weight; softmax cross-entropy is the weighted mean ``sum w_y l / sum w_y`` over the voxels (torch's);
binary cross-entropy and focal loss are scaled per channel and averaged over valid voxels and channels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from monai.losses import DeepSupervisionLoss, MaskedDiceLoss
from monai.losses.focal_loss import sigmoid_focal_loss
from monai.networks.utils import one_hot
from torch import nn

from medseg.config import TrainConfig
from medseg.data.datalist import DatasetInfo
from medseg.data.labels import IGNORE_INDEX
from medseg.errors import ConfigError

log = logging.getLogger("medseg")

FOCAL_GAMMA = 2.0
"""Focusing exponent of the focal term (MONAI's default)."""
AUTO_WEIGHT_RATIO = 10.0
"""``trainer.class_weights=auto``: the most the largest weight may exceed the smallest one."""

VoxelTerm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", bool], torch.Tensor]
"""``term(logits, target, valid, weight, region_based)`` -> a scalar: a voxel-wise loss on the valid voxels."""


def _channel_mean(values: torch.Tensor, valid: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``values`` ``(B, C, *S)``, scaled by ``weight`` ``(C,)`` per channel, over the channels of the
    ``valid`` ``(B, 1, *S)`` voxels; 0 when none is valid."""
    if weight is not None:
        values = values * weight.view(1, -1, *[1] * (values.ndim - 2))
    return torch.where(valid, values, 0).sum() / (valid.sum() * values.shape[1]).clamp_min(1)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, weight: torch.Tensor | None,
                  region_based: bool) -> torch.Tensor:
    """Cross-entropy of ``logits`` ``(B, C, *S)`` against ``target`` ``(B, C, *S)`` (one-hot classes, or 0/1 per
    region) over the ``valid`` ``(B, 1, *S)`` voxels.

    Classes: softmax cross-entropy, the weighted mean ``sum w_y l / sum w_y`` (torch's ``weight=``). Regions: binary
    cross-entropy with logits per channel, each scaled by its weight, averaged over valid voxels and channels.
    """
    if region_based:
        return _channel_mean(F.binary_cross_entropy_with_logits(logits, target, reduction="none"), valid, weight)
    per_voxel = F.cross_entropy(logits, target, weight=weight, reduction="none").unsqueeze(1)  # w_y * l, (B, 1, *S)
    voxel_weight = target if weight is None else target * weight.view(1, -1, *[1] * (target.ndim - 2))
    total_weight = torch.where(valid, voxel_weight.sum(1, keepdim=True), 0).sum()
    return torch.where(valid, per_voxel, 0).sum() / total_weight.clamp_min(torch.finfo(total_weight.dtype).eps)


def focal(logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, weight: torch.Tensor | None,
          region_based: bool) -> torch.Tensor:
    """MONAI's sigmoid focal loss (gamma :data:`FOCAL_GAMMA`) of each channel of ``logits`` ``(B, C, *S)`` against
    ``target`` ``(B, C, *S)``, scaled per channel by ``weight``, averaged over the ``valid`` ``(B, 1, *S)`` voxels and
    the channels (as ``DiceFocalLoss`` takes it, in both modes)."""
    return _channel_mean(sigmoid_focal_loss(logits, target, FOCAL_GAMMA), valid, weight)


class LossTerms(NamedTuple):
    """What a ``trainer.loss`` adds up."""

    dice: bool
    """With a soft Dice term."""
    voxelwise: VoxelTerm | None
    """The voxel-wise term, or None."""
    nnunet_dice: bool = False
    """The Dice term is nnU-Net's: without the background, summed over the batch in 2D (module docstring)."""


LOSSES: dict[str, LossTerms] = {
    "dice_ce": LossTerms(True, cross_entropy),
    "nnunet": LossTerms(True, cross_entropy, nnunet_dice=True),
    "dice_focal": LossTerms(True, focal),
    "dice": LossTerms(True, None),
    "ce": LossTerms(False, cross_entropy),
}
"""The values of ``trainer.loss`` -> their terms, which are added."""


class SegmentationLoss(nn.Module):
    """A Dice term and/or a voxel-wise term, on the voxels whose label is not :data:`IGNORE_INDEX`.

    Args:
        dice: with the soft Dice term (MONAI's ``MaskedDiceLoss``: softmax, or sigmoid per region).
        voxelwise: :func:`cross_entropy`, :func:`focal`, or None.
        region_based: sigmoid regions instead of softmax classes.
        class_weights: one weight per output channel, or None.
        background_dice: the Dice term includes the background class (MONAI's default; nnU-Net's leaves it out).
        batch_dice: the Dice term sums over the batch before dividing, as nnU-Net's ``batch_dice``.
    """

    def __init__(self, dice: bool, voxelwise: VoxelTerm | None, region_based: bool,
                 class_weights: Sequence[float] | None, background_dice: bool = True,
                 batch_dice: bool = False) -> None:
        super().__init__()
        self.region_based, self.voxelwise = region_based, voxelwise
        weight = None if class_weights is None else torch.tensor(list(class_weights), dtype=torch.float32)
        self.register_buffer("weight", weight)
        without_background = not (background_dice or region_based)
        dice_weight = weight[1:] if weight is not None and without_background else weight
        self.dice = (MaskedDiceLoss(sigmoid=region_based, softmax=not region_based, weight=dice_weight,
                                    include_background=not without_background, batch=batch_dice)
                     if dice else None)

    def forward(self, output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """``output`` ``(B, C, *S)`` logits; ``label`` ``(B, 1, *S)`` class indices or ``(B, C, *S)`` 0/1 regions,
        :data:`IGNORE_INDEX` at ignore voxels -> the scalar loss."""
        valid = label[:, :1] != IGNORE_INDEX
        known = torch.where(valid, label, 0)
        target = (known if self.region_based else one_hot(known, output.shape[1])).to(output.dtype)
        weight = None if self.weight is None else self.weight.to(output)
        loss = output.new_zeros(())
        if self.dice is not None:
            loss = loss + self.dice(output, target, mask=valid.to(output.dtype))
        if self.voxelwise is not None:
            loss = loss + self.voxelwise(output, target, valid, weight, self.region_based)
        return loss


def build_loss(cfg: TrainConfig, info: DatasetInfo, class_weights: Sequence[float] | None) -> nn.Module:
    """The ``trainer.loss`` of a dataset's outputs (classes or regions), weighted by ``class_weights`` (one per output
    channel, :func:`class_weight_names` order; None: unweighted).

    ``loss(output, label)``: ``output`` ``(B, C, *S)`` logits, or under ``model.deep_supervision`` a list of them,
    full resolution first, weighted by :func:`deep_supervision_weights` (MONAI's ``DeepSupervisionLoss``, whose
    nearest-neighbour downsampling of the label keeps the ignore voxels); ``label`` as
    :meth:`SegmentationLoss.forward` takes it.
    """
    terms = LOSSES[cfg.trainer.loss]
    loss = SegmentationLoss(terms.dice, terms.voxelwise, info.region_based, class_weights,
                            background_dice=not terms.nnunet_dice,
                            batch_dice=terms.nnunet_dice and cfg.model.spatial_dims == 2)
    return NnunetDeepSupervisionLoss(loss) if cfg.model.deep_supervision else loss


def deep_supervision_weights(outputs: int) -> list[float]:
    """nnU-Net's weights of the deep-supervision losses, for ``outputs`` outputs (full resolution first; medseg's U-Net
    gives one per down-sampling): ``1, 1/2, 1/4, ...``, the lowest-resolution output's 0 where there are several,
    normalised to sum 1."""
    weights = np.array([0.5**level for level in range(outputs)])
    if outputs > 1:
        weights[-1] = 0.0
    return (weights / weights.sum()).tolist()


class NnunetDeepSupervisionLoss(DeepSupervisionLoss):
    """MONAI's ``DeepSupervisionLoss`` with nnU-Net's weights (:func:`deep_supervision_weights`) for however many
    outputs the network gives; the label is downsampled to each by nearest neighbour (``nearest-exact``, as
    nnU-Net's)."""

    def get_weights(self, levels: int = 1) -> list[float]:
        return deep_supervision_weights(max(1, levels))


# --------------------------------------------------------------------------------------------- class weights


def class_weight_names(info: DatasetInfo) -> list[str]:
    """The name of each network output channel, the order of ``trainer.class_weights``: the background and each
    foreground class, or each region."""
    return list(info.output_names) if info.region_based else [info.labels[0], *info.output_names]


def output_voxels(info: DatasetInfo, class_voxels: Sequence[int]) -> list[int]:
    """Voxels of each network output channel, from the voxels of each class (the fingerprint's ``class_voxels``,
    background first): the class's own, or for a region the sum over its member classes."""
    if info.region_based:
        assert info.regions is not None
        return [sum(int(class_voxels[c]) for c in members) for members in info.regions.values()]
    return [int(n) for n in class_voxels[:info.num_outputs]]


def auto_class_weights(voxels: Sequence[int]) -> list[float]:
    """``trainer.class_weights=auto``: from each output's voxel count ``n_c``, the weight
    ``min(sqrt(n_max / n_c), AUTO_WEIGHT_RATIO)``, normalised so the weights average 1.

    The inverse square root of the voxel share (the share's total cancels out), capped so no weight exceeds the most
    frequent output's by more than :data:`AUTO_WEIGHT_RATIO` (a count of 0 counts as 1 and gets the cap).
    """
    counts = np.maximum(np.asarray(voxels, dtype=np.float64), 1.0)
    ratios = np.minimum(np.sqrt(counts.max() / counts), AUTO_WEIGHT_RATIO)
    return [float(w) for w in ratios / ratios.mean()]


def resolve_class_weights(setting: Any, info: DatasetInfo, class_voxels: Sequence[int]) -> list[float] | None:
    """``trainer.class_weights`` as one weight per network output channel: None for null, :func:`auto_class_weights`
    of :func:`output_voxels` for ``auto``, else the given list, checked.

    Raises:
        ConfigError: anything else, a list of the wrong length, or a weight that is not a finite positive number;
            the message names the expected length and the outputs.
    """
    if setting is None:
        return None
    if setting == "auto":
        return auto_class_weights(output_voxels(info, class_voxels))
    names = class_weight_names(info)
    if (isinstance(setting, (list, tuple)) and len(setting) == len(names)
            and all(isinstance(w, (int, float)) and not isinstance(w, bool) and 0 < w < float("inf") for w in setting)):
        return [float(w) for w in setting]
    raise ConfigError(f"trainer.class_weights={setting}: expected null, auto, or a list of {len(names)} positive "
                      f"numbers, one per network output: {', '.join(names)}")


def named_class_weights(class_weights: Sequence[float] | None, info: DatasetInfo) -> dict[str, float] | None:
    """``class_weights`` keyed by :func:`class_weight_names` (for the log and the checkpoint); None stays None."""
    return None if class_weights is None else dict(zip(class_weight_names(info), map(float, class_weights)))
