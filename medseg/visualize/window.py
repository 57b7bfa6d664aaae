"""The network window around a query voxel of a preprocessed volume, and token maps brought onto its voxels.

Volumes here are what evaluation's preprocessing gives: ``(C, X, Y, Z)`` in RAS voxel order at the training spacing.
The window is the sliding window's (the training patch; one voxel thick along the slice axis for a 2D network),
centred on the query where the volume allows, and zero-padded as MONAI's sliding window pads a volume smaller than
the window (half before, half after).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from medseg.data.transforms import Window

if TYPE_CHECKING:
    from medseg.models.inspect import AttentionMap


@dataclass(frozen=True)
class QueryWindow:
    """Where the network looks for one query voxel of a preprocessed volume (RAS voxel axes)."""

    query: tuple[int, int, int]
    """The query voxel of the volume."""
    start: tuple[int, int, int]
    """The window's first voxel in the volume; negative where the volume is smaller than the window (zero-padded)."""
    size: tuple[int, int, int]
    """The window in 3D: the patch, or in 2D the in-plane patch and 1 along ``slice_axis``."""
    spatial_dims: int
    slice_axis: int

    @property
    def net_axes(self) -> list[int]:
        """The volume axes the network sees: all three in 3D, the two in-plane ones in 2D."""
        return [a for a in range(3) if self.spatial_dims == 3 or a != self.slice_axis]

    @property
    def net_query(self) -> tuple[int, ...]:
        """The query voxel in the network's input window (2 or 3 indices)."""
        return tuple(self.query[a] - self.start[a] for a in self.net_axes)

    def crop(self, volume: torch.Tensor) -> torch.Tensor:
        """``(C, X, Y, Z)`` -> the network's input window ``(C, *net window)``, zero outside the volume."""
        before = [max(-s, 0) for s in self.start]
        after = [max(s + n - v, 0) for s, n, v in zip(self.start, self.size, volume.shape[1:])]
        padded = F.pad(volume, [p for axis in reversed(range(3)) for p in (before[axis], after[axis])])
        window = padded[(slice(None), *(slice(s + b, s + b + n) for s, b, n in zip(self.start, before, self.size)))]
        return window if self.spatial_dims == 3 else window.squeeze(self.slice_axis + 1)

    def paste(self, values: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        """``(K, *net window)`` values of the window placed into a ``(K, X, Y, Z)`` volume of ``shape``, zeros
        elsewhere."""
        if self.spatial_dims == 2:
            values = values.unsqueeze(self.slice_axis + 1)
        volume = values.new_zeros((values.shape[0], *shape))
        low = [max(s, 0) for s in self.start]
        high = [min(s + n, v) for s, n, v in zip(self.start, self.size, shape)]
        inside = tuple(slice(lo - s, hi - s) for lo, hi, s in zip(low, high, self.start))
        volume[(slice(None), *(slice(lo, hi) for lo, hi in zip(low, high)))] = values[(slice(None), *inside)]
        return volume


def foreground_voxel(labels: np.ndarray) -> tuple[int, ...] | None:
    """The foreground voxel (label > 0) of a label map nearest the centre of mass of its foreground, which is the
    centre of mass itself when that is foreground; None when there is no foreground."""
    foreground = np.argwhere(labels > 0)
    if not len(foreground):
        return None
    return tuple(int(v) for v in foreground[np.square(foreground - foreground.mean(0)).sum(1).argmin()])


def query_window(query: Sequence[int], shape: Sequence[int], view: Window, spatial_dims: int) -> QueryWindow:
    """The window of a network (``view``, :func:`medseg.data.transforms.window`) around voxel ``query`` of a
    preprocessed volume of spatial ``shape``: centred on it, shifted to lie inside the volume where the volume is
    at least as large as the window, centred on the volume (and zero-padded) where it is smaller."""
    start = []
    for q, size, n in zip(query, shape, view.roi_size):
        start.append(min(max(q - n // 2, 0), size - n) if size >= n else -((n - size) // 2))
    return QueryWindow(tuple(int(q) for q in query), tuple(start), tuple(int(n) for n in view.roi_size),  # type: ignore[arg-type]
                       spatial_dims, view.slice_axis)


def token_stride(attention: AttentionMap) -> tuple[int, ...]:
    """Voxels of the network input per token of ``attention``'s grid, per axis (the slot's down-sampling)."""
    if attention.stride is None:
        raise ValueError(f"{attention.slot} block {attention.block}: the map has no stride")
    return attention.stride


def to_voxels(values: torch.Tensor, stride: Sequence[int], size: Sequence[int]) -> torch.Tensor:
    """Token values ``(K, *grid)`` on the network input's voxels ``(K, *size)``: linear interpolation between token
    centres (each token covers ``stride`` voxels, from the window's first voxel), cropped to ``size`` (the network
    pads its input up to a multiple of its strides)."""
    full = [g * s for g, s in zip(values.shape[1:], stride)]
    mode = "bilinear" if len(full) == 2 else "trilinear"
    upsampled = F.interpolate(values[None].float(), size=full, mode=mode, align_corners=False)[0]
    return upsampled[(slice(None), *(slice(0, n) for n in size))]
