"""The cheap validation of every epoch (``trainer.val_iterations``): nnU-Net's pseudo-Dice and its moving average.

nnU-Net does not predict its validation volumes during training: each epoch it scores the network on 50 batches of
validation patches, sums the true positives, false positives and false negatives of each foreground class (or region)
over all of them, and reports ``2 TP / (2 TP + FP + FN)`` per output, averaged over the outputs that have any (an
output with no voxel in the references nor the predictions of any patch is left out, numpy's ``nanmean``). Its
exponential moving average, ``0.9 * old + 0.1 * new``, chooses ``checkpoint_best``. Predictions are the argmax over
the classes (or each region's logit above 0, its sigmoid above 0.5) of the full-resolution output; ignore voxels count
nowhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from medseg.data.labels import IGNORE_INDEX, LabelSpec
from medseg.runtime.device import autocast
from medseg.runtime.distributed import gather_objects
from medseg.runtime.launch import DistInfo

EMA_MOMENTUM = 0.9
"""The weight of the old average in nnU-Net's moving average of the pseudo-Dice."""


@dataclass(frozen=True)
class PseudoDice:
    """The pseudo-Dice of one epoch: the mean over the outputs that have any voxel, and each output's (NaN: none)."""

    dice: float
    per_class: dict[str, float]


def overlap_counts(predicted: torch.Tensor, reference: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """True positives, false positives and false negatives of each output, summed over the batch and the voxels.

    Args:
        predicted: ``(B, K, *S)`` bool, one mask per output.
        reference: ``(B, K, *S)`` bool.
        valid: ``(B, 1, *S)`` bool, the voxels that count (not ignore).

    Returns:
        ``(3, K)`` int64: TP, FP, FN per output.
    """
    predicted, reference = predicted & valid, reference & valid
    dims = [0, *range(2, predicted.ndim)]
    tp = (predicted & reference).sum(dims)
    return torch.stack([tp, predicted.sum(dims) - tp, reference.sum(dims) - tp])


def output_masks(logits: torch.Tensor, label: torch.Tensor, labels: LabelSpec) -> tuple[torch.Tensor, ...]:
    """The predicted and reference masks of each output and the valid voxels, as :func:`overlap_counts` takes them.

    Args:
        logits: ``(B, C, *S)``: the classes (background first), or one per region.
        label: ``(B, 1, *S)`` class indices, or ``(B, R, *S)`` 0/1 region targets; :data:`IGNORE_INDEX` at ignore
            voxels.
        labels: the dataset's classes or regions.

    Returns:
        ``predicted``, ``reference`` ``(B, K, *S)`` bool over the K foreground classes or regions, ``valid``
        ``(B, 1, *S)`` bool.
    """
    valid = label[:, :1] != IGNORE_INDEX
    if labels.region_based:
        return logits > 0, label > 0.5, valid
    classes = torch.arange(1, logits.shape[1], device=logits.device).view(1, -1, *[1] * (logits.ndim - 2))
    return logits.argmax(1, keepdim=True) == classes, label.long() == classes, valid


def summarize(counts: torch.Tensor | np.ndarray, names: list[str]) -> PseudoDice:
    """The pseudo-Dice of ``(3, K)`` summed counts (:func:`overlap_counts`): per output ``2 TP / (2 TP + FP + FN)``
    (NaN where the output has none), and their mean over the outputs that have any."""
    tp, fp, fn = np.asarray(counts, dtype=np.float64)
    denominator = 2 * tp + fp + fn
    per_output = np.divide(2 * tp, denominator, out=np.full_like(tp, np.nan), where=denominator > 0)
    finite = per_output[~np.isnan(per_output)]
    return PseudoDice(float(finite.mean()) if finite.size else float("nan"),
                      {name: float(value) for name, value in zip(names, per_output)})


@torch.no_grad()
def pseudo_dice(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], labels: LabelSpec,
                device: torch.device, amp: torch.dtype | None, dist: DistInfo) -> PseudoDice:
    """Score ``model`` on ``batches`` of validation patches (``image`` ``(B, C_in, *S)``, ``label`` as
    :func:`output_masks` takes it), the counts summed over every batch and every rank before the ratio."""
    model.eval()
    total = torch.zeros(3, labels.num_outputs - (0 if labels.region_based else 1), dtype=torch.int64)
    for batch in batches:
        with autocast(device, amp):
            output = model(batch["image"].to(device, non_blocking=True))
        logits = output[0] if isinstance(output, list | tuple) else output
        total += overlap_counts(*output_masks(logits.float(), batch["label"].to(device), labels)).cpu()
    summed = np.sum([np.asarray(part) for part in gather_objects(total.numpy(), dist)], axis=0)
    return summarize(summed, labels.output_names)


def moving_average(previous: float | None, new: float) -> float:
    """nnU-Net's moving average of the pseudo-Dice: ``new`` alone at first (``previous`` None), then
    ``0.9 * previous + 0.1 * new``; a NaN epoch (no output in any patch) leaves it as it was."""
    if previous is None or np.isnan(previous):
        return new
    return previous if np.isnan(new) else EMA_MOMENTUM * previous + (1 - EMA_MOMENTUM) * new
