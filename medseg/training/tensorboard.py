"""TensorBoard logging: scalars per epoch, a middle-slice overlay of image, label and prediction, and figures."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from monai.visualize import blend_images
from torch.utils.tensorboard import SummaryWriter

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def overlay_image(image: torch.Tensor, label: torch.Tensor, pred: torch.Tensor, axis: int) -> torch.Tensor:
    """A ``(3, H, 3W)`` RGB strip: the middle slice along ``axis`` of the image, with the label, with the prediction.

    ``image``, ``label``, ``pred`` are ``(X, Y, Z)`` volumes.
    """
    index = image.shape[axis] // 2
    image2d, label2d, pred2d = (t.select(axis, index).float()[None] for t in (image, label, pred))
    lo, hi = image2d.min(), image2d.max()
    gray = ((image2d - lo) / (hi - lo + 1e-8)).repeat(3, 1, 1)
    panels = [gray, *(torch.as_tensor(blend_images(image2d, seg, alpha=0.5)) for seg in (label2d, pred2d))]
    return torch.cat(panels, dim=2).clamp(0, 1)


class TensorBoardLogger:
    """Writes under ``log_dir``; one instance per run, on rank 0 only."""

    def __init__(self, log_dir: Path) -> None:
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def scalars(self, record: dict[str, Any], **extra: float) -> None:
        """Log an epoch record: ``loss``, ``lr``, and if present ``pseudo_dice`` with its average and
        ``val_dice`` with ``val_dice_per_class``."""
        step = record["epoch"]
        self.writer.add_scalar("train/loss", record["loss"], step)
        self.writer.add_scalar("train/lr", record["lr"], step)
        for name, value in extra.items():
            self.writer.add_scalar(f"train/{name}", value, step)
        if "pseudo_dice" in record:
            self.writer.add_scalar("val/pseudo_dice", record["pseudo_dice"], step)
            self.writer.add_scalar("val/pseudo_dice_ema", record["pseudo_dice_ema"], step)
        if "val_dice" in record:
            self.writer.add_scalar("val/dice_mean", record["val_dice"], step)
            for name, value in record["val_dice_per_class"].items():
                self.writer.add_scalar(f"val/dice_{name.replace(' ', '_')}", value, step)
        self.writer.flush()

    def overlay(self, tag: str, image: torch.Tensor, label: torch.Tensor, pred: torch.Tensor, axis: int,
                step: int) -> None:
        self.writer.add_image(tag, overlay_image(image, label, pred, axis), step, dataformats="CHW")

    def figure(self, tag: str, figure: Figure, step: int) -> None:
        """A matplotlib figure, rendered to an RGB image (the figure stays open)."""
        self.writer.add_figure(tag, figure, step, close=False)

    def values(self, values: Mapping[str, float], step: int) -> None:
        """Scalars by their full tags (``val/attention_distance_mm/bottleneck/block0/head0``)."""
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def hparams(self, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
        """Hyperparameters and final metrics for TensorBoard's HParams tab (works after :meth:`close` too)."""
        self.writer.add_hparams(hparams, metrics, run_name=".")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
