"""Whole-volume inference: gaussian sliding windows over 3D volumes, for 3D and 2D (slice-wise) models.

A 2D model runs on 3D volumes through windows one voxel thick along the slice axis, so validation and
prediction share MONAI's ``sliding_window_inference`` (gaussian blending, overlap) in both modes.

Windows that hold one value per channel (air outside the body, which CT normalisation clips to one value; the zero
background of MRI) all give the network the same input, and so the same output: :class:`ConstantWindows` runs the
network once for each such value and answers every other such window from that run. The result is the dense one; on
a CT whose body leaves the corners of the field of view in air it skips a share of the windows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch
from monai.inferers import sliding_window_inference
from torch import nn
from tqdm.auto import tqdm

from medseg.runtime.device import autocast

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "softmax": lambda logits: torch.softmax(logits, dim=1),
    "sigmoid": torch.sigmoid,
}
"""Logits ``(B, C, *spatial)`` -> probabilities: softmax over the classes, or a sigmoid per region channel."""


def slice_network(model: nn.Module, axis: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Wrap a 2D model to take windows ``(B, C, *crop)`` that are one voxel thick along spatial ``axis``."""

    def infer(window: torch.Tensor) -> torch.Tensor:
        return model(window.squeeze(axis + 2)).unsqueeze(axis + 2)

    return infer


CONSTANT_CACHE_SIZE = 8
"""Distinct constant windows whose output :class:`ConstantWindows` keeps (a volume has one or two: air, padding)."""


class ConstantWindows:
    """A sliding-window predictor that runs ``network`` on the windows that vary, and answers those holding one value
    per channel from one run of ``network`` on such a window, kept per value (:data:`CONSTANT_CACHE_SIZE`).

    ``windows`` ``(B, C, *roi)`` -> ``(B, K, *roi)``, as ``network``. ``answered`` counts the windows answered from
    a kept run, ``run`` those the network saw."""

    def __init__(self, network: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.network = network
        self.outputs: dict[tuple[float, ...], torch.Tensor] = {}
        self.answered = 0
        self.run = 0

    def __call__(self, windows: torch.Tensor) -> torch.Tensor:
        flat = windows.flatten(2)
        low = flat.amin(dim=2)
        constant = (low == flat.amax(dim=2)).all(dim=1)  # (B,)
        if not bool(constant.any()):
            self.run += len(windows)
            return self.network(windows)
        varying = (~constant).nonzero().squeeze(1)
        outputs: list[torch.Tensor | None] = [None] * len(windows)
        if len(varying):
            for index, output in zip(varying.tolist(), self.network(windows[varying])):
                outputs[index] = output
        for index in constant.nonzero().squeeze(1).tolist():
            outputs[index] = self._constant_output(windows[index:index + 1], tuple(low[index].tolist()))
        self.run += len(varying)
        return torch.stack(outputs)

    def _constant_output(self, window: torch.Tensor, values: tuple[float, ...]) -> torch.Tensor:
        """``network``'s output ``(K, *roi)`` for the constant ``window`` ``(1, C, *roi)``, from the kept run when there
        is one."""
        key = (*values, *window.shape, str(window.dtype))
        if key in self.outputs:
            self.answered += 1
            return self.outputs[key]
        self.run += 1
        output = self.network(window)[0]
        if len(self.outputs) < CONSTANT_CACHE_SIZE:
            self.outputs[key] = output
        return output


def window_count(shape: Sequence[int], roi_size: Sequence[int], overlap: float) -> int:
    """The windows MONAI's ``sliding_window_inference`` cuts from one volume of spatial ``shape`` (a volume smaller
    than ``roi_size`` along an axis is padded to it: one window there)."""
    count = 1
    for size, roi in zip(shape, roi_size):
        if size > roi:
            count *= math.ceil((size - roi) / max(int(roi * (1 - overlap)), 1)) + 1
    return count


def mirrorings(mirror_axes: Sequence[int]) -> list[tuple[int, ...]]:
    """The passes of mirroring test-time augmentation, nnU-Net's: the identity ``()`` and every non-empty combination
    of ``mirror_axes`` (spatial axes), flipped together; 8 passes for 3 axes, 4 for 2."""
    return [combo for size in range(len(mirror_axes) + 1) for combo in itertools.combinations(mirror_axes, size)]


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
    skip_constant: bool = True,
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
        mirror_axes: spatial axes for mirroring test-time augmentation, nnU-Net's: the identity and every combination
            of these axes (:func:`mirrorings`), averaged; empty = off.
        progress: one progress bar over the windows of every pass (mirrorings included), with its ETA.
        activation: a key of :data:`ACTIVATIONS` (``softmax``, or ``sigmoid`` for region outputs).
        skip_constant: answer the windows that hold one value per channel from one run of the network on such a
            window (:class:`ConstantWindows`); False runs the network on every window (the dense reference).

    Returns:
        ``(B, num_outputs, X, Y, Z)`` float32 probabilities on ``sw_device`` (or ``image``'s device), averaged over
        the mirrorings.
    """
    device = device or image.device
    sw_device = sw_device or image.device
    network = model if spatial_dims == 3 else slice_network(model, slice_axis)
    predictor = ConstantWindows(network) if skip_constant else network  # one per volume: the flips share it
    flips = [tuple(axis + 2 for axis in combo) for combo in mirrorings(mirror_axes)]  # the spatial axes of (B, C, ...)
    windows = len(image) * len(flips) * window_count(image.shape[2:], roi_size, overlap)
    with tqdm(total=windows, desc="windows", unit="window", disable=not progress, leave=False) as bar:

        def counted(batch: torch.Tensor) -> torch.Tensor:
            output = predictor(batch)
            bar.update(len(batch))
            return output

        def run(volume: torch.Tensor) -> torch.Tensor:
            with torch.no_grad(), autocast(device, amp_dtype):
                logits = sliding_window_inference(
                    volume, roi_size=list(roi_size), sw_batch_size=sw_batch_size, predictor=counted,
                    overlap=overlap, mode="gaussian", sw_device=device, device=sw_device,
                )
            return ACTIVATIONS[activation](logits.float())

        total = None
        for dims in flips:
            probs = run(image.flip(dims) if dims else image)
            probs = probs.flip(dims) if dims else probs
            total = probs if total is None else total.add_(probs)  # in place: no second whole-volume copy
    return total.div_(len(flips))
