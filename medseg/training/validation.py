"""Validation during training: sliding-window prediction of whole volumes and Dice per output (foreground class or
region)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from monai.data import Dataset
from torch import nn

from medseg.config import TrainConfig
from medseg.data.labels import IGNORE_INDEX, LabelSpec, member_masks
from medseg.data.transforms import Window
from medseg.inference.inferer import sliding_window
from medseg.inference.sliding_window import infer_volume
from medseg.runtime.device import amp_dtype
from medseg.runtime.distributed import gather_objects
from medseg.runtime.host_memory import release_freed_memory
from medseg.runtime.launch import DistInfo
from medseg.scoring.metrics import defined_mean, dice


@dataclass
class ValidationResult:
    """Mean foreground Dice over cases and outputs, per output (class or region), and one case for the overlay."""

    dice: float
    per_class: dict[str, float]
    overlay: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    """``(image, label, prediction)`` ``(X, Y, Z)`` of this rank's first case, label maps in the dataset's values (None
    without cases)."""


def validate(model: nn.Module, dataset: Dataset, window: Window, cfg: TrainConfig, labels: LabelSpec,
             device: torch.device, dist: DistInfo) -> ValidationResult:
    """Predict every case of ``dataset`` (this rank's share) whole and score each output of ``labels``.

    The sliding window is ``cfg.inference``'s (overlap, windows per pass, stitching device, mirroring, constant
    windows), run on ``device`` in ``trainer.precision``.

    ``dataset`` gives labels as class indices (:func:`medseg.data.transforms.eval_transforms` with ``labels``). Dice
    follows medseg's one rule (:mod:`medseg.scoring.metrics`), so validation and evaluation agree: an output absent
    from both label and prediction has no Dice and is left out of the means, any prediction of an output the label
    lacks scores 0. A region's prediction is its sigmoid above 0.5, its reference the union of its classes; ignore
    voxels count in neither. Per-case scores are gathered over the ranks before averaging: per output over the cases
    where it is defined, then over the outputs whose mean is defined (NaN when none is).
    """
    model.eval()
    names = labels.output_names
    sliding = sliding_window(cfg.inference, device, window, cfg.model.spatial_dims,
                             amp_dtype(cfg.trainer.precision, device), labels.activation)
    rows, overlay = [], None
    for index in range(len(dataset)):
        item = dataset[index]
        image = item["image"].unsqueeze(0).to(device)
        probs = infer_volume(model, image, sliding)
        pred = labels.prediction_masks(probs[0].cpu().numpy())
        classes = item["label"][0].round().long().cpu().numpy()
        reference, valid = member_masks(classes, labels.output_classes), classes != IGNORE_INDEX
        rows.append([dice(mask & valid, ref) for mask, ref in zip(pred, reference)])
        if overlay is None:
            overlay = (image[0, 0].cpu(), *(torch.from_numpy(labels.label_map(m)) for m in (reference, pred)))
    release_freed_memory()  # the volumes' maps, before training allocates again
    all_rows = [row for part in gather_objects(rows, dist) for row in part]
    named = {name: defined_mean(row[index] for row in all_rows) for index, name in enumerate(names)}
    return ValidationResult(defined_mean(named.values()), named, overlay)
