"""Resampling to the target spacing (``data.resampling``): MONAI's ``Spacingd``, with linear or nnU-Net's interpolation.

``linear``: the image (tri)linearly, the label by nearest neighbour, in one pass.

``nnunet``: nnU-Net v2's rule (``default_resampling``): the image by a third-order spline; when the case is anisotropic
(its largest spacing more than :data:`ANISO_THRESHOLD` times its smallest, by its own spacing or else by the
target's) and one axis alone is the thickest, "separate z": the spline in the plane across that axis only, then nearest
neighbour along it, so that thick slices are not blended into one another. Both passes are MONAI's ``Spacing``: the
first keeps the thick axis's spacing (a non-positive ``pixdim`` entry), the second changes it alone, so the output grid
is the one-pass grid, and prediction resamples back as for ``linear``.

Where medseg departs from nnU-Net: the label is resampled by nearest neighbour (nnU-Net interpolates each label's
mask linearly and thresholds it at 0.5: smoother boundaries, one float volume per class); and the output grid is
MONAI's (the first voxel's centre kept, the spacing exact), where nnU-Net stretches the volume to
``round(shape * spacing / target)`` voxels (a spacing off by up to half a voxel over the extent).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from monai import transforms as mt
from monai.utils import TraceKeys

from medseg.errors import check_choice

ANISO_THRESHOLD = 3.0
"""nnU-Net's ``ANISO_THRESHOLD``, the one ratio of its anisotropy rules: a case is resampled with separate z when its
largest spacing exceeds this many times its smallest (here); a 3D patch this many times longer than its slice axis is
augmented slice by slice (:mod:`medseg.data.nnunet_augment`); a thick axis takes a finer target spacing
(:mod:`medseg.planning.plan`)."""
SPLINE_ORDER = 3
"""nnU-Net's interpolation order of the image."""
RESAMPLINGS = ("linear", "nnunet")
"""The values of ``data.resampling``."""


def separate_axis(spacing: Sequence[float], target: Sequence[float]) -> int | None:
    """The axis nnU-Net resamples apart (by nearest neighbour), or None for one pass.

    The case's own ``spacing`` decides when it is anisotropic, else the ``target`` spacing; the axis is the one whose
    spacing is the largest, None when two or three axes share it.
    """
    for candidate in (np.asarray(spacing, dtype=float), np.asarray(target, dtype=float)):
        if candidate.max() / candidate.min() > ANISO_THRESHOLD:
            thickest = np.flatnonzero(candidate == candidate.max())
            return int(thickest[0]) if len(thickest) == 1 else None
    return None


class ResampleToSpacingd(mt.MapTransform, mt.InvertibleTransform):
    """Resample every key to ``pixdim`` (mm per axis) by ``data.resampling``; the first key is the image, the rest
    label maps (nearest neighbour). Invertible as MONAI's ``Spacingd`` is (``Invertd``), in the process that applied
    it.

    ``(C, *spatial)`` MetaTensors in, the same on the target grid out (float32 image).
    """

    def __init__(self, keys: Sequence[Hashable], pixdim: Sequence[float], resampling: str) -> None:
        super().__init__(keys)
        check_choice("data.resampling", resampling, RESAMPLINGS)
        self.pixdim = [float(s) for s in pixdim]
        nnunet = resampling == "nnunet"
        self.one_pass = self._spacing(self.pixdim, SPLINE_ORDER if nnunet else "bilinear")
        self.separate = {  # nnunet: per thick axis, the spline across it, then nearest neighbour along it
            axis: (self._spacing([-1.0 if a == axis else s for a, s in enumerate(self.pixdim)], SPLINE_ORDER),
                   self._spacing([s if a == axis else -1.0 for a, s in enumerate(self.pixdim)], "nearest"))
            for axis in range(len(self.pixdim))} if nnunet else {}

    def _spacing(self, pixdim: list[float], image_mode: Any) -> mt.Spacingd:
        """MONAI's ``Spacingd`` to ``pixdim`` (non-positive entries: kept), the image by ``image_mode``."""
        modes = [image_mode, *["nearest"] * (len(self.keys) - 1)]
        return mt.Spacingd(list(self.keys), pixdim=pixdim, mode=modes, dtype=np.float32, allow_missing_keys=True)

    def passes(self, spacing: Sequence[float]) -> tuple[mt.Spacingd, ...]:
        """The ``Spacingd`` passes for a case of ``spacing`` (mm per axis)."""
        axis = separate_axis(spacing, self.pixdim) if self.separate else None
        return (self.one_pass,) if axis is None else self.separate[axis]

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        out = dict(data)
        image = out[self.first_key(out)]
        for spacing in self.passes([float(s) for s in image.pixdim[:len(self.pixdim)]]):
            out = spacing(out)
        return out

    def inverse(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        """Undo the passes this transform applied, the last first (each ``Spacingd``'s own inverse)."""
        out = dict(data)
        image_key = self.first_key(out)
        resamplers = {id(spacing.spacing_transform.sp_resample): spacing
                      for spacing in (self.one_pass, *(p for pair in self.separate.values() for p in pair))}
        while out[image_key].applied_operations and (
                spacing := resamplers.get(out[image_key].applied_operations[-1][TraceKeys.ID])) is not None:
            out = spacing.inverse(out)
        return out
