"""Validation during training: sliding-window prediction of whole volumes and Dice per foreground class."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from monai.data import Dataset
from torch import nn

from medseg.config import TrainConfig
from medseg.data.transforms import Window
from medseg.engine.device import amp_dtype
from medseg.engine.distributed import gather_objects
from medseg.engine.inference import predict_volume
from medseg.engine.launch import DistInfo
from medseg.engine.metrics import dice_scores


@dataclass
class ValidationResult:
    """Mean foreground Dice over cases and classes, per class, and one case for the TensorBoard overlay."""

    dice: float
    per_class: dict[str, float]
    overlay: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    """``(image, label, prediction)`` ``(X, Y, Z)`` of this rank's first case (None without cases)."""


def validate(model: nn.Module, dataset: Dataset, window: Window, cfg: TrainConfig, class_names: list[str],
             device: torch.device, dist: DistInfo) -> ValidationResult:
    """Predict every case of ``dataset`` (this rank's share) whole and score each foreground class.

    Dice follows evaluate.py's convention (:func:`medseg.engine.metrics.dice_scores`): a class absent from both
    label and prediction scores 1, any prediction of a class the label lacks scores 0, so validation and
    evaluation agree. Per-case scores are gathered over the ranks before averaging.
    """
    model.eval()
    classes = range(1, len(class_names) + 1)
    rows, overlay = [], None
    for index in range(len(dataset)):
        item = dataset[index]
        image = item["image"].unsqueeze(0).to(device)
        probs = predict_volume(model, image, window.roi_size, cfg.model.spatial_dims, window.slice_axis,
                               sw_batch_size=cfg.trainer.sw_batch_size, overlap=cfg.trainer.sw_overlap, device=device,
                               amp_dtype=amp_dtype(cfg.trainer.precision, device))
        pred = probs[0].argmax(0).cpu()
        label = item["label"][0].round().long().cpu()
        rows.append(dice_scores(pred, label, classes))
        if overlay is None:
            overlay = (image[0, 0].cpu(), label, pred)
    all_rows = [row for part in gather_objects(rows, dist) for row in part]
    per_class = np.mean(np.asarray(all_rows, dtype=float), axis=0) if all_rows else [np.nan] * len(class_names)
    named = {name: float(value) for name, value in zip(class_names, per_class)}
    return ValidationResult(float(np.mean(list(named.values()))) if named else float("nan"), named, overlay)
