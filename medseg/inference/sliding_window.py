"""Sliding-window inference, slab by slab: gaussian windows over 3D volumes, for 3D and 2D (slice-wise) models.

The windows are MONAI's (``dense_patch_slices`` at ``sliding_window_inference``'s scan interval, the volume padded
to a window where it is smaller, its gaussian ``compute_importance_map``), and their logits are blended as MONAI
blends them (weighted sum, divided by the summed weights), but into a ring buffer along one spatial axis: the windows
run in the order of their start along that axis, and a slab of the volume is given out (:func:`infer_slabs`) as soon
as no later window reaches it. The blended maps held are a window's depth plus a slab along that axis, whatever the
volume's length; a slab of the whole length is the whole volume (:func:`infer_volume`). Every voxel sums the same
windows in the same order whatever the slab, so the slabs equal the whole volume bit for bit.

A 2D model runs on 3D volumes through windows one voxel thick along the slice axis, so validation and prediction
share the windows in both modes. Mirroring (test-time augmentation) is nnU-Net's, per window: the network's logits on
the window and on its flips (flipped back) are averaged before the blending.

Windows that hold one value per channel (air outside the body, which CT normalisation clips to one value; the zero
background of MRI) all give the network the same input, and so the same output: :class:`ConstantWindows` runs the
network once for each such value and answers every other such window from that run. The result is the dense one; on
a CT whose body leaves the corners of the field of view in air it skips a share of the windows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from monai.data.utils import compute_importance_map, dense_patch_slices
from torch import nn
from tqdm.auto import tqdm

from medseg.runtime.device import autocast


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the classes of ``(B, C, *spatial)`` logits, computed voxel by voxel along a contiguous class axis:
    the CPU kernel then does the same arithmetic for a voxel whatever the slab's shape (along the spatial axes its
    vectorised and scalar parts round ``exp`` differently)."""
    return torch.softmax(logits.movedim(1, -1).contiguous(), dim=-1).movedim(-1, 1)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"softmax": _softmax, "sigmoid": torch.sigmoid}
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


def mirrored(predictor: Callable[[torch.Tensor], torch.Tensor],
             flips: Sequence[tuple[int, ...]]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``predictor`` on windows ``(B, C, *roi)`` averaged over ``flips`` (dims of the windows, ``()`` the identity):
    each flip's logits flipped back, nnU-Net's mirroring."""
    if flips == [()]:
        return predictor

    def predict(windows: torch.Tensor) -> torch.Tensor:
        total = None
        for dims in flips:
            logits = predictor(windows.flip(dims) if dims else windows).float()
            logits = logits.flip(dims) if dims else logits
            total = logits if total is None else total.add_(logits)
        return total.div_(len(flips))

    return predict


def scan_interval(size: int, roi: int, overlap: float) -> int:
    """The step between windows along an axis of ``size`` voxels (MONAI's: a window's ``1 - overlap``, at least 1;
    one window when it is the axis' size)."""
    return roi if roi == size else max(int(roi * (1 - overlap)), 1)


def _ring(start: int, length: int, capacity: int) -> list[tuple[int, int, int]]:
    """The pieces of ``[start, start + length)`` in a ring of ``capacity`` positions: (ring position, offset in the
    range, length) each; one piece, or two where the range wraps."""
    position = start % capacity
    first = min(length, capacity - position)
    return [(position, 0, first)] + ([(0, first, length - first)] if first < length else [])


class _Blend:
    """The weighted sum of window logits and the summed weights over ``capacity`` positions of spatial ``axis`` of a
    padded volume ``(B, *, *padded)``, as a ring: position ``p`` of the axis lives at ``p % capacity``."""

    def __init__(self, axis: int, capacity: int) -> None:
        self.dim, self.capacity = axis + 2, capacity
        self.sums: torch.Tensor | None = None
        self.weights: torch.Tensor | None = None

    def add(self, window: tuple[slice, ...], logits: torch.Tensor, weight: torch.Tensor, padded: Sequence[int]) -> None:
        """Add ``logits * weight`` (``(B, K, *roi)``, ``weight`` ``(*roi)``) at the ``window`` slices of ``padded``."""
        if self.sums is None:
            shape = [*padded]
            shape[self.dim - 2] = self.capacity
            self.sums = logits.new_zeros((*logits.shape[:2], *shape))
            self.weights = logits.new_zeros((1, 1, *shape))
        along = window[self.dim - 2]
        for position, offset, length in _ring(along.start, along.stop - along.start, self.capacity):
            place = (slice(None), slice(None), *(slice(position, position + length) if i == self.dim - 2 else s
                                                 for i, s in enumerate(window)))
            part = (slice(None), slice(None), *(slice(offset, offset + length) if i == self.dim - 2 else slice(None)
                                                for i in range(len(window))))
            self.sums[place] += logits[part] * weight[part[2:]]
            self.weights[place] += weight[part[2:]]

    def take(self, start: int, stop: int) -> torch.Tensor:
        """The blended logits ``(B, K, *padded)`` of positions ``[start, stop)`` along the axis, which are cleared."""
        assert self.sums is not None and self.weights is not None
        pieces = []
        for position, _, length in _ring(start, stop - start, self.capacity):
            sums = self.sums.narrow(self.dim, position, length)
            weights = self.weights.narrow(self.dim, position, length)
            pieces.append(sums / weights)
            sums.zero_()
            weights.zero_()
        return torch.cat(pieces, dim=self.dim)


@dataclass(frozen=True)
class SlidingWindow:
    """How volumes are cut into windows, run and blended: the one value prediction and validation pass
    (:func:`~medseg.inference.inferer.sliding_window` reads it from the ``inference`` node)."""

    roi_size: tuple[int, ...]
    """The 3D window; in 2D it is 1 along ``slice_axis``."""
    spatial_dims: int = 3
    """The model's (2 or 3)."""
    slice_axis: int = 2
    """The spatial axis a 2D model slices across (ignored in 3D)."""
    sw_batch_size: int = 4
    """Windows per run of the network."""
    overlap: float = 0.25
    """The windows' overlap, as MONAI's ``sliding_window_inference`` takes it."""
    device: torch.device | None = None
    """Where the model runs (None: the image's device)."""
    sw_device: torch.device | None = None
    """Where the windows are blended (None: the image's device; the CPU saves GPU memory)."""
    amp_dtype: torch.dtype | None = None
    """The autocast dtype (bf16 on CUDA), or None for fp32."""
    mirror_axes: tuple[int, ...] = ()
    """Spatial axes of nnU-Net's mirroring: each window and its flips along every combination of them
    (:func:`mirrorings`), logits averaged; empty: off."""
    activation: str = "softmax"
    """A key of :data:`ACTIVATIONS` (``softmax``, or ``sigmoid`` for region outputs)."""
    skip_constant: bool = True
    """Answer the windows that hold one value per channel from one run of the network on such a window
    (:class:`ConstantWindows`); False runs the network on every window (the dense reference)."""


def infer_slabs(model: nn.Module, image: torch.Tensor, window: SlidingWindow, axis: int = 2, slab: int | None = None,
                progress: bool = False) -> Iterator[tuple[int, torch.Tensor]]:
    """Probabilities of volumes, slab by slab along spatial ``axis``: softmax over the classes, or sigmoid per region.

    Args:
        model: a network in eval mode, 2D or 3D.
        image: ``(B, C, X, Y, Z)`` volumes (any size; a volume smaller than a window is padded with zeros to it).
        window: the windows, where they run and how they blend.
        axis: the spatial axis the slabs cut; ``slab``: voxels per slab along it (None: the whole length at once).
        progress: one progress bar over the network's windows (mirrorings included), with its ETA.

    Yields:
        ``(start, probabilities)``: ``(B, num_outputs, *spatial)`` float32 on ``window.sw_device`` (or ``image``'s
        device) with ``axis`` cut to ``[start, start + length)``, in increasing ``start``, covering the volume once.
    """
    device = window.device or image.device
    sw_device = window.sw_device or image.device
    image = image.as_subclass(torch.Tensor)  # a MONAI MetaTensor's metadata would follow every window and slab
    network = model if window.spatial_dims == 3 else slice_network(model, window.slice_axis)
    flips = [tuple(a + 2 for a in combo) for combo in mirrorings(window.mirror_axes)]  # spatial axes of (B, C, ...)
    predictor = mirrored(ConstantWindows(network) if window.skip_constant else network, flips)
    shape, roi = list(image.shape[2:]), list(window.roi_size)
    padded = [max(size, r) for size, r in zip(shape, roi)]
    front = [(p - size) // 2 for p, size in zip(padded, shape)]  # MONAI's: half the padding before, the rest after
    if padded != shape:
        image = F.pad(image, [n for f, size, p in reversed(list(zip(front, shape, padded))) for n in (f, p - size - f)])
    windows = dense_patch_slices(padded, roi, [scan_interval(p, r, window.overlap) for p, r in zip(padded, roi)])
    windows = sorted(windows, key=lambda cut: cut[axis].start)  # stable: MONAI's order within a start
    weight = compute_importance_map(roi, mode="gaussian", sigma_scale=0.125, device=sw_device, dtype=torch.float32)
    length, first = padded[axis], front[axis]
    step = length if slab is None else max(min(int(slab), length), 1)
    blend = _Blend(axis, min(length, roi[axis] + step))
    keep = tuple(slice(f, f + size) if i != axis else slice(None) for i, (f, size) in enumerate(zip(front, shape)))

    def given(start: int, stop: int) -> Iterator[tuple[int, torch.Tensor]]:
        """The slab of padded positions ``[start, stop)`` along the axis, cropped to the volume (if any of it is)."""
        logits = blend.take(start, stop)
        low, high = max(start, first), min(stop, first + shape[axis])
        if low < high:
            crop = list(keep)
            crop[axis] = slice(low - start, high - start)
            yield low - first, ACTIVATIONS[window.activation](logits[(slice(None), slice(None), *crop)])

    done = 0  # positions before this along the axis are given out
    total = len(image) * len(flips) * len(windows)
    with tqdm(total=total, desc="windows", unit="window", disable=not progress, leave=False) as bar:
        for begin in range(0, len(windows), window.sw_batch_size):
            batch = windows[begin:begin + window.sw_batch_size]
            # no_grad around the network only: a context held across a yield would leak to the caller
            with torch.no_grad(), autocast(device, window.amp_dtype):
                crops = torch.cat([image[(slice(None), slice(None), *cut)] for cut in batch]).to(device)
                logits = predictor(crops).float().to(sw_device)
            bar.update(len(crops) * len(flips))
            for index, cut in enumerate(batch):
                while done + step <= cut[axis].start:  # no later window reaches these positions
                    yield from given(done, done + step)
                    done += step
                blend.add(cut, logits[index * len(image):(index + 1) * len(image)], weight, padded)
        while done < length:
            yield from given(done, min(done + step, length))
            done += step


def infer_volume(model: nn.Module, image: torch.Tensor, window: SlidingWindow, progress: bool = False) -> torch.Tensor:
    """Probabilities for whole volumes: :func:`infer_slabs` with one slab of the whole length.

    Returns:
        ``(B, num_outputs, X, Y, Z)`` float32 probabilities on ``window.sw_device`` (or ``image``'s device).
    """
    ((_, probabilities),) = infer_slabs(model, image, window, progress=progress)
    return probabilities
