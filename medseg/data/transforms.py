"""MONAI transform chains for training, validation and inference, built from the resolved data config.

Every chain loads, puts channels first, reorients to RAS, resamples to the target spacing and
normalises. Training then pads volumes smaller than the patch, samples foreground-balanced patches
and augments. In 2D mode the training patches are single slices across the thick axis, squeezed to
2D; validation and inference keep whole 3D volumes and run the 2D network slice by slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import torch
from monai import transforms as mt

from medseg.data.planning import thick_axis

IMAGE, LABEL = "image", "label"


def slice_axis(spacing: Sequence[float]) -> int:
    """The RAS axis 2D mode slices across: the thick axis of the (3-entry) target ``spacing``.

    The same rule as the plan's ``slice_axis`` (:func:`medseg.data.planning.thick_axis`: the largest
    spacing, the last one among near-ties), so training, validation and the plan always agree.
    """
    if len(spacing) != 3:
        raise ValueError(f"data.spacing={list(spacing)}: expected 3 entries (mm along R, A, S), also in 2D")
    return thick_axis(spacing)


def patch_size_3d(patch_size: Sequence[int], spatial_dims: int, axis: int) -> list[int]:
    """The 3D crop size: the patch itself in 3D; in 2D the in-plane patch with size 1 along ``axis``.

    In 2D, ``patch_size`` may hold two in-plane sizes or three sizes (the one along ``axis`` is dropped).
    """
    sizes = [int(s) for s in patch_size]
    if spatial_dims == 3:
        if len(sizes) != 3:
            raise ValueError(f"data.patch_size={sizes}: a 3D model needs three sizes")
        return sizes
    if len(sizes) == 3:
        sizes = [s for a, s in enumerate(sizes) if a != axis]
    sizes.insert(axis, 1)
    return sizes


class ClipZScored(mt.MapTransform):
    """Clip to ``[low, high]``, then ``(x - mean) / std``: planned CT normalisation (values in HU).

    ``clip`` is ``[low, high]`` and ``mean``/``std`` are numbers for every channel alike, or one
    ``[low, high]`` pair and one number per channel (multi-channel CT, as planning writes it).
    """

    def __init__(self, keys: str | Sequence[str], clip: Sequence[Any], mean: float | Sequence[float],
                 std: float | Sequence[float]) -> None:
        super().__init__(keys)
        bounds = np.asarray(clip, dtype=np.float64).reshape(-1, 2)
        self.low, self.high = bounds[:, 0], bounds[:, 1]
        self.mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        self.std = np.maximum(np.asarray(std, dtype=np.float64).reshape(-1), 1e-8)
        if len({len(self.low), len(self.mean), len(self.std)}) != 1:
            raise ValueError(f"data.normalization: clip {list(clip)}, mean {mean} and std {std} differ in channels")

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(data)
        for key in self.key_iterator(out):
            image = out[key]
            if len(self.mean) not in (1, image.shape[0]):
                raise ValueError(f"data.normalization has statistics for {len(self.mean)} channels, "
                                 f"the image has {image.shape[0]}")
            low, high, mean, std = (_per_channel(v, image) for v in (self.low, self.high, self.mean, self.std))
            out[key] = (torch.clamp(image, low, high) - mean) / std
        return out


def _per_channel(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """(C,) or (1,) ``values`` shaped to broadcast over the channels of ``like`` (C, *spatial)."""
    return torch.as_tensor(values, dtype=like.dtype, device=like.device).reshape((-1,) + (1,) * (like.ndim - 1))


def normalization_transform(normalization: str | Mapping[str, Any]) -> list[mt.Transform]:
    """``zscore``: per image and channel. ``ct`` dict: clip to ``clip`` then ``(x - mean) / std`` (see
    :class:`ClipZScored`; per channel when the dict holds lists)."""
    scheme = normalization if isinstance(normalization, str) else normalization["scheme"]
    if scheme == "zscore":
        return [mt.NormalizeIntensityd(keys=IMAGE, channel_wise=True)]
    if scheme == "none":
        return []
    if scheme == "ct":
        if isinstance(normalization, str):
            raise ValueError("data.normalization=ct needs dataset statistics; leave it null so planning fills them")
        return [ClipZScored(IMAGE, normalization["clip"], normalization["mean"], normalization["std"])]
    raise ValueError(f"data.normalization={scheme!r}: expected zscore, ct or none")


def preprocessing(spacing: Sequence[float], normalization: str | Mapping[str, Any],
                  keys: Sequence[str] = (IMAGE, LABEL)) -> list[mt.Transform]:
    """Load, channel-first, RAS, resample to ``spacing`` (mm), normalise: shared by every chain."""
    interpolation = ["bilinear" if key == IMAGE else "nearest" for key in keys]
    return [
        mt.LoadImaged(keys=list(keys), ensure_channel_first=True, image_only=False),
        mt.EnsureTyped(keys=list(keys), dtype=np.float32, track_meta=True),
        mt.Orientationd(keys=list(keys), axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
        mt.Spacingd(keys=list(keys), pixdim=list(spacing), mode=interpolation),
        *normalization_transform(normalization),
    ]


DEFAULT_SAMPLES_PER_VOLUME = {3: 2, 2: 16}
"""``data.samples_per_volume: null``: patches per volume and epoch. A 2D slice costs a small fraction of a 3D
patch, so 2D mode draws many more of them per volume (nnU-Net's 2D batches are larger for the same reason)."""


def samples_per_volume(data_cfg: Mapping[str, Any], spatial_dims: int) -> int:
    """``data.samples_per_volume``, or its default for ``spatial_dims`` when null."""
    value = data_cfg["samples_per_volume"]
    return DEFAULT_SAMPLES_PER_VOLUME[spatial_dims] if value is None else int(value)


def train_transforms(data_cfg: Mapping[str, Any], spatial_dims: int) -> mt.Compose:
    """The training chain; ``data_cfg`` must have ``spacing``, ``patch_size`` and ``normalization`` resolved."""
    axis = slice_axis(data_cfg["spacing"])
    crop = patch_size_3d(data_cfg["patch_size"], spatial_dims, axis)
    pos = float(data_cfg["pos_fraction"])
    chain: list[mt.Transform] = [
        *preprocessing(data_cfg["spacing"], data_cfg["normalization"]),
        mt.SpatialPadd(keys=[IMAGE, LABEL], spatial_size=crop),
        mt.RandCropByPosNegLabeld(
            keys=[IMAGE, LABEL], label_key=LABEL, spatial_size=crop, pos=pos, neg=1.0 - pos,
            num_samples=samples_per_volume(data_cfg, spatial_dims), allow_smaller=False,
        ),
    ]
    if spatial_dims == 2:
        chain.append(mt.SqueezeDimd(keys=[IMAGE, LABEL], dim=axis + 1))
    if data_cfg["augment"]:
        chain += [mt.RandFlipd(keys=[IMAGE, LABEL], prob=0.5, spatial_axis=a) for a in range(spatial_dims)]
        shape = crop if spatial_dims == 3 else [s for a, s in enumerate(crop) if a != axis]
        square = next(((a, b) for a, b in combinations(range(spatial_dims), 2) if shape[a] == shape[b]), None)
        if square is not None:
            chain.append(mt.RandRotate90d(keys=[IMAGE, LABEL], prob=0.5, spatial_axes=square))
        chain += [
            mt.RandScaleIntensityd(keys=IMAGE, factors=0.1, prob=0.5),
            mt.RandShiftIntensityd(keys=IMAGE, offsets=0.1, prob=0.5),
        ]
    chain.append(mt.EnsureTyped(keys=[IMAGE, LABEL], track_meta=False))
    return mt.Compose(chain)


def eval_transforms(data_cfg: Mapping[str, Any], with_label: bool = True) -> mt.Compose:
    """Whole-volume chain for validation and inference (3D volumes in both 2D and 3D mode)."""
    keys = (IMAGE, LABEL) if with_label else (IMAGE,)
    return mt.Compose([*preprocessing(data_cfg["spacing"], data_cfg["normalization"], keys)])
