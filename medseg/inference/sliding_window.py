"""Whole-volume inference: gaussian sliding windows over 3D volumes, for 3D and 2D (slice-wise) models.

A 2D model runs on 3D volumes through windows one voxel thick along the slice axis, so validation and
prediction share MONAI's ``sliding_window_inference`` (gaussian blending, overlap) in both modes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from monai.inferers import sliding_window_inference
from torch import nn

from medseg.runtime.device import autocast

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "softmax": lambda logits: torch.softmax(logits, dim=1),
    "sigmoid": torch.sigmoid,
}
"""Logits ``(B, C, *spatial)`` -> probabilities: softmax over the classes, or a sigmoid per region channel."""


def slice_inferer(model: nn.Module, axis: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Wrap a 2D model to take windows ``(B, C, *crop)`` that are one voxel thick along spatial ``axis``."""

    def infer(window: torch.Tensor) -> torch.Tensor:
        return model(window.squeeze(axis + 2)).unsqueeze(axis + 2)

    return infer


def infer_volume(
    model: nn.Module,
    image: torch.Tensor,
    roi_size: Sequence[int],
    spatial_dims: int,
    slice_axis: int,
    sw_batch_size: int = 4,
    overlap: float = 0.25,
    device: torch.device | None = None,
    sw_device: torch.device | None = None,
    amp_dtype: torch.dtype | None = None,
    mirror_axes: Sequence[int] = (),
    progress: bool = False,
    activation: str = "softmax",
) -> torch.Tensor:
    """Probabilities for whole volumes: softmax over the classes, or sigmoid per region.

    Args:
        model: a network in eval mode, 2D or 3D.
        image: ``(B, C, X, Y, Z)`` volumes (any size; windows are padded as needed).
        roi_size: the 3D window; in 2D it is 1 along ``slice_axis``.
        spatial_dims: the model's (2 or 3).
        slice_axis: spatial axis a 2D model slices across (ignored in 3D).
        device: where the model runs; ``sw_device``: where windows are stitched (CPU saves GPU memory).
        amp_dtype: autocast dtype (bf16 on CUDA) or None for fp32.
        mirror_axes: spatial axes for mirroring test-time augmentation (nnU-Net style); empty = off.
        activation: a key of :data:`ACTIVATIONS` (``softmax``, or ``sigmoid`` for region outputs).

    Returns:
        ``(B, num_outputs, X, Y, Z)`` float32 probabilities on ``sw_device`` (or ``image``'s device), averaged over
        the mirrorings.
    """
    device = device or image.device
    sw_device = sw_device or image.device
    inferer = model if spatial_dims == 3 else slice_inferer(model, slice_axis)

    def run(volume: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), autocast(device, amp_dtype):
            logits = sliding_window_inference(
                volume, roi_size=list(roi_size), sw_batch_size=sw_batch_size, predictor=inferer,
                overlap=overlap, mode="gaussian", sw_device=device, device=sw_device, progress=progress,
            )
        return ACTIVATIONS[activation](logits.float())

    flips = [()] + [(axis + 2,) for axis in mirror_axes]
    total = None
    for dims in flips:
        probs = run(image.flip(dims) if dims else image)
        probs = probs.flip(dims) if dims else probs
        total = probs if total is None else total.add_(probs)  # in place: no second whole-volume copy
    return total.div_(len(flips))
