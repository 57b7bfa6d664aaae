"""Maps on a case's preprocessed grid back to its image file's voxel grid, slab by slab.

The eval chain (:func:`medseg.data.transforms.eval_transforms`) reads the image in RAS and resamples it to the
network's spacing (MONAI's ``Spacingd``, once, or twice for nnU-Net's separate z: each recorded as a
``SpatialResample`` in the image's applied operations). Its inverse, as MONAI's ``Invertd`` would run it for linear
resampling, is one ``SpatialResample`` from the network's grid onto the RAS grid (the first resampling's source) with
the forward pass's interpolation (linear for the image; linear too where the forward pass took a spline, which would
over- and undershoot probabilities), border padding and corner alignment; then the RAS voxel order is undone
(:func:`medseg.data.reading.from_ras`). :class:`Grids` runs both on one slab of the file's last axis (its slices) at
a time: MONAI's ``SpatialResample`` on the slab of preprocessed maps that the slab's voxels interpolate from (the
halo: a voxel beyond the farthest one on each side), with both affines shifted to the slabs' first voxels. Where the
network's spacing is the file's, a slab is copied, not interpolated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import SpatialResample
from nibabel.orientations import axcodes2ornt, io_orientation, ornt_transform

from medseg.data.reading import from_ras


def _shifted(affine: np.ndarray, axis: int, start: int) -> np.ndarray:
    """``affine`` of a grid whose voxel 0 along ``axis`` is voxel ``start`` of ``affine``'s grid."""
    offset = np.eye(4)
    offset[axis, 3] = start
    return affine @ offset


@dataclass(frozen=True)
class Grids:
    """A preprocessed case's grid and the image file's: what undoing the resampling and the RAS order needs."""

    affine: np.ndarray
    """(4, 4) the preprocessed grid's voxel-to-world affine."""
    shape: tuple[int, int, int]
    """The preprocessed grid's spatial shape."""
    ras_affine: np.ndarray
    """(4, 4) the image's affine in RAS voxel order (before the resampling)."""
    ras_shape: tuple[int, int, int]
    """The image's spatial shape in RAS voxel order."""
    file_affine: np.ndarray
    """(4, 4) the image file's own affine (its axis order)."""
    resample: dict[str, Any]
    """The forward resampling's ``mode``, ``padding_mode`` and ``align_corners`` (none recorded: no resampling)."""

    @classmethod
    def of(cls, image: MetaTensor) -> Grids:
        """The grids of a preprocessed image ``(C, X', Y', Z')`` (as ``Inferer.preprocess`` leaves it)."""
        affine = np.asarray(image.affine, np.float64)
        shape = tuple(int(n) for n in image.shape[1:])
        file_affine = np.asarray(image.meta["original_affine"], np.float64)
        ops = [op for op in image.applied_operations if op["class"] == "SpatialResample"]
        if not ops:
            return cls(affine, shape, affine, shape, file_affine, {})
        info = ops[0]["extra_info"]  # the first resampling's source is the RAS grid
        ras_affine, ras_shape = np.asarray(info["src_affine"], np.float64), tuple(int(n) for n in ops[0]["orig_size"])
        if ras_shape == shape and np.allclose(ras_affine, affine):  # the network's grid is the file's
            return cls(affine, shape, affine, shape, file_affine, {})
        mode = info["mode"] if isinstance(info["mode"], str) else "bilinear"  # a spline order: linear back
        return cls(affine, shape, ras_affine, ras_shape, file_affine,
                   {"mode": mode, "padding_mode": info["padding_mode"], "align_corners": info["align_corners"]})

    @property
    def file_shape(self) -> tuple[int, ...]:
        """The file's spatial shape, in its own axis order."""
        shape = [0, 0, 0]
        for size, (axis, _) in zip(self.ras_shape, self._orientation):
            shape[int(axis)] = size
        return tuple(shape)

    @property
    def axis(self) -> int:
        """The RAS axis that is the file's last axis (its slices): the one the slabs cut."""
        return int(np.flatnonzero(self._orientation[:, 0] == 2)[0])

    @property
    def _orientation(self) -> np.ndarray:
        """Per RAS axis: the file axis it becomes, and -1 where it is flipped (nibabel's orientation transform)."""
        return ornt_transform(axcodes2ornt("RAS"), io_orientation(self.file_affine))

    def source(self, start: int, stop: int) -> tuple[int, int]:
        """The positions ``[low, high)`` along :attr:`axis` of the preprocessed grid that the RAS grid's slab
        ``[start, stop)`` interpolates from, a voxel of halo on each side."""
        if not self.resample:
            return start, stop
        corners = np.array(np.meshgrid(*[[0, n - 1] for n in self.ras_shape], indexing="ij")).reshape(3, -1)
        corners[self.axis] = np.where(corners[self.axis] == 0, start, stop - 1)
        mapped = (np.linalg.inv(self.affine) @ self.ras_affine @ np.vstack([corners, np.ones(corners.shape[1])]))
        along = mapped[self.axis]
        return max(int(np.floor(along.min())) - 1, 0), min(int(np.ceil(along.max())) + 2, self.shape[self.axis])

    def to_ras(self, maps: torch.Tensor, low: int, start: int, stop: int) -> torch.Tensor:
        """``maps`` ``(K, *)``, positions ``[low, low + n)`` along :attr:`axis` of the preprocessed grid (covering
        :meth:`source`), -> float32 ``(K, *)`` on the RAS grid's slab ``[start, stop)``."""
        if not self.resample:
            return maps.narrow(self.axis + 1, start - low, stop - start).float()
        size = list(self.ras_shape)
        size[self.axis] = stop - start
        affine = torch.as_tensor(_shifted(self.affine, self.axis, low))
        source = MetaTensor(maps.as_subclass(torch.Tensor), affine=affine)
        resampled = SpatialResample(dtype=torch.float32)(
            source, dst_affine=torch.as_tensor(_shifted(self.ras_affine, self.axis, start)), spatial_size=size,
            **self.resample)
        return (resampled.as_tensor() if isinstance(resampled, MetaTensor) else resampled).float()

    def file_range(self, start: int, stop: int) -> tuple[int, int]:
        """Where the RAS grid's slab ``[start, stop)`` lies along the file's last axis."""
        if self._orientation[self.axis, 1] < 0:
            length = self.ras_shape[self.axis]
            return length - stop, length - start
        return start, stop

    def to_file(self, maps: torch.Tensor) -> np.ndarray:
        """``(K, *)`` maps on a slab of the RAS grid -> float32 ``(K, *)`` in the file's axis order (a view)."""
        return np.moveaxis(from_ras(np.moveaxis(maps.cpu().numpy(), 0, -1), self.file_affine), -1, 0)


def back_to_file(grids: Grids, slabs: Iterator[tuple[int, torch.Tensor]],
                 slab: int | None) -> Iterator[tuple[int, int, np.ndarray]]:
    """The preprocessed maps ``slabs`` (``(start, (K, *))`` along :attr:`Grids.axis`, in increasing ``start``, as
    :func:`~medseg.inference.sliding_window.infer_slabs` gives them) on the file's grid, ``slab`` slices at a time
    (None: all at once).

    Yields:
        ``(first, stop, maps)``: float32 ``(K, X, Y, stop - first)`` on slices ``[first, stop)`` of the file, in the
        order of the RAS grid's slabs (decreasing slices where the file's last axis runs against RAS).
    """
    length = grids.ras_shape[grids.axis]
    step = length if slab is None else max(int(slab), 1)
    held: list[tuple[int, torch.Tensor]] = []  # the preprocessed slabs a coming output slab may need
    for start in range(0, length, step):
        stop = min(start + step, length)
        low, high = grids.source(start, stop)
        while not held or held[-1][0] + held[-1][1].shape[grids.axis + 1] < high:
            held.append(next(slabs))
        held = [(first, part) for first, part in held if first + part.shape[grids.axis + 1] > low]
        base = held[0][0]
        maps = torch.cat([part for _, part in held], dim=grids.axis + 1)
        ras = grids.to_ras(maps.narrow(grids.axis + 1, low - base, high - low), low, start, stop)
        yield *grids.file_range(start, stop), grids.to_file(ras)
    for _ in slabs:  # the rest, which no slab of the file's grid interpolates from: the stream ends, not waits
        pass
