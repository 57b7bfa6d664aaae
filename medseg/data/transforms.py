"""MONAI transform chains for training, validation and inference, built from the resolved data config.

Every chain reads the case in RAS voxel order (:class:`medseg.data.reading.LoadCased`, the reader planning
uses too), resamples to the target spacing and normalises. Training then samples patches, a share of them on
foreground (each ``data.augment`` its own way: :data:`AUGMENTATIONS`), and augments. In 2D mode the training
patches are single slices across the thick axis, squeezed to 2D; validation and inference keep whole 3D volumes and
run the 2D network slice by slice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import torch
from monai import transforms as mt

from medseg.config import DataConfig
from medseg.data.batched_augment import BatchedNnunetAugment
from medseg.data.labels import LabelSpec, RandCropByPosNegForegroundd, target_transforms, value_transforms
from medseg.data.nnunet_augment import nnunet_augmentations, nnunet_crop
from medseg.data.nnunet_draws import nnunet_draws
from medseg.data.reading import IMAGE, LABEL, LoadCased
from medseg.data.resampling import ResampleToSpacingd
from medseg.data.sampling import ClassLocationsd, RandNnunetCropd
from medseg.errors import ConfigError, check_choice


def thick_axis(spacing: Sequence[float]) -> int:
    """The axis with the largest spacing; among (near-)ties the last one, so isotropic data slices along S."""
    spacing = np.asarray(spacing, dtype=float)
    return int(np.flatnonzero(spacing >= spacing.max() * (1 - 1e-3))[-1])



@dataclass(frozen=True)
class Window:
    """What the network sees of a volume, in RAS voxel axes: computed here, and only here."""

    slice_axis: int
    """The axis a 2D network slices across: the thick axis of the target spacing, by the plan's own rule
    (:func:`thick_axis`), so training, validation and the plan always agree. Unused in 3D."""
    roi_size: list[int]
    """The 3D crop and sliding window: the patch in 3D; in 2D the in-plane patch, 1 voxel along ``slice_axis``."""
    net_patch: list[int]
    """The network's own input patch: ``roi_size`` in 3D, its two in-plane sizes in 2D."""


def window(data: DataConfig, spatial_dims: int) -> Window:
    """The :class:`Window` of a resolved ``data`` config (``spacing`` and ``patch_size`` set) for a 2D/3D model.

    In 2D, ``data.patch_size`` may hold two in-plane sizes or three sizes (the one along the slice axis is
    dropped).
    """
    axis = thick_axis(data.spacing)
    sizes = [int(s) for s in data.patch_size]
    if spatial_dims == 3:
        if len(sizes) != 3:
            raise ConfigError(f"data.patch_size={sizes}: a 3D model needs three sizes")
        return Window(axis, sizes, sizes)
    in_plane = [s for a, s in enumerate(sizes) if a != axis] if len(sizes) == 3 else sizes
    return Window(axis, [*in_plane[:axis], 1, *in_plane[axis:]], in_plane)


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
            raise ConfigError(f"data.normalization: clip {list(clip)}, mean {mean} and std {std} differ in channels")

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(data)
        for key in self.key_iterator(out):
            image = out[key]
            if len(self.mean) not in (1, image.shape[0]):
                raise ConfigError(f"data.normalization has statistics for {len(self.mean)} channels, "
                                 f"the image has {image.shape[0]}")
            low, high, mean, std = (_per_channel(v, image) for v in (self.low, self.high, self.mean, self.std))
            out[key] = (torch.clamp(image, low, high) - mean) / std
        return out


class CompactLabeld(mt.MapTransform):
    """Integer label maps (class indices, ignore -1) in the smallest signed integer type that holds their values:
    int8 up to 127 classes, else int16 (int32, int64). A cached label then takes 1 byte a voxel instead of float32's
    4; the training chain turns its patches back to float32, so the batches are unchanged."""

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(data)
        for key in self.key_iterator(out):
            label = out[key]
            low, high = (int(label.min()), int(label.max())) if label.numel() else (0, 0)
            dtype = next(t for t in (torch.int8, torch.int16, torch.int32, torch.int64)
                         if torch.iinfo(t).min <= low and high <= torch.iinfo(t).max)
            out[key] = label.to(dtype)
        return out


def _per_channel(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """(C,) or (1,) ``values`` shaped to broadcast over the channels of ``like`` (C, *spatial)."""
    return torch.as_tensor(values, dtype=like.dtype, device=like.device).reshape((-1,) + (1,) * (like.ndim - 1))


def _ct_normalization(normalization: str | Mapping[str, Any]) -> list[mt.Transform]:
    if isinstance(normalization, str):
        raise ConfigError("data.normalization=ct needs dataset statistics; leave it null so planning fills them")
    return [ClipZScored(IMAGE, normalization["clip"], normalization["mean"], normalization["std"])]


NORMALIZATIONS: dict[str, Callable[[str | Mapping[str, Any]], list[mt.Transform]]] = {
    "zscore": lambda normalization: [mt.NormalizeIntensityd(keys=IMAGE, channel_wise=True)],
    "ct": _ct_normalization,
    "none": lambda normalization: [],
}
"""The schemes of ``data.normalization`` -> their transforms. ``zscore``: per image and channel. ``ct``: a planned
dict, clip to ``clip`` then ``(x - mean) / std`` (:class:`ClipZScored`; per channel when it holds lists)."""


def normalization_transform(normalization: str | Mapping[str, Any]) -> list[mt.Transform]:
    """The transforms of a ``data.normalization`` value: a scheme name, or a planned dict with its ``scheme``."""
    return NORMALIZATIONS[check_normalization(normalization)](normalization)


def check_normalization(normalization: str | Mapping[str, Any]) -> str:
    """The scheme of a ``data.normalization`` value (a name, or a planned dict with its ``scheme``); refuses one
    that :data:`NORMALIZATIONS` lacks."""
    scheme = normalization if isinstance(normalization, str) else normalization["scheme"]
    check_choice("data.normalization", scheme, NORMALIZATIONS)
    return scheme


def preprocessing(spacing: Sequence[float], normalization: str | Mapping[str, Any],
                  with_label: bool = True, labels: LabelSpec | None = None,
                  resampling: str = "linear") -> list[mt.Transform]:
    """Read in RAS (channels first), resample to ``spacing`` (mm) by ``resampling`` (``data.resampling``,
    :class:`~medseg.data.resampling.ResampleToSpacingd`), normalise: shared by every chain.

    With ``labels``, the label's values become class indices (:func:`medseg.data.labels.value_transforms`). The
    resampling computes in float32 (MONAI's default float64 doubles its transient memory) and the label leaves as a
    small integer type (:class:`CompactLabeld`), so the cached volumes take 4 bytes a voxel per channel plus 1.
    """
    load = LoadCased(with_label)
    return [
        load,
        ResampleToSpacingd(keys=list(load.keys), pixdim=spacing, resampling=resampling),
        *(value_transforms(labels, LABEL) if with_label and labels is not None else []),
        *normalization_transform(normalization),
        *([CompactLabeld(LABEL)] if with_label else []),
    ]


DEFAULT_SAMPLES_PER_VOLUME = {3: 2, 2: 16}
"""``data.samples_per_volume: null``: patches per volume and epoch. A 2D slice costs a small fraction of a 3D
patch, so 2D mode draws many more of them per volume (nnU-Net's 2D batches are larger for the same reason)."""


def samples_per_volume(data: DataConfig, spatial_dims: int) -> int:
    """``data.samples_per_volume``, or its default for ``spatial_dims`` when null."""
    value = data.samples_per_volume
    return DEFAULT_SAMPLES_PER_VOLUME[spatial_dims] if value is None else int(value)


def train_transforms(data: DataConfig, spatial_dims: int, labels: LabelSpec | None = None,
                     on_device: bool = False) -> mt.Compose:
    """The training chain; ``data`` must have ``spacing``, ``patch_size`` and ``normalization`` resolved.

    With ``labels``, the label becomes the loss's target: class indices (``(1, *patch)``) or, for regions, one
    channel per region (``(R, *patch)``), :data:`~medseg.data.labels.IGNORE_INDEX` at ignore voxels. It is
    :func:`preprocessing` followed by :func:`patch_sampling` (``on_device``: its draws only, see there).
    """
    return mt.Compose([*preprocessing(data.spacing, data.normalization, labels=labels, resampling=data.resampling),
                       *patch_sampling(data, spatial_dims, labels, on_device=on_device)])


def patch_sampling(data: DataConfig, spatial_dims: int, labels: LabelSpec | None = None,
                   augment: bool = True, on_device: bool = False) -> list[mt.Transform]:
    """The training chain after :func:`preprocessing`: sample ``samples_per_volume`` crops (the
    :class:`Augmentation`'s ``sampling``: its deterministic transforms first, so that a cached dataset keeps their
    output), squeeze them to 2D for a 2D network, augment, and make the loss's target. Takes a preprocessed case
    (as :func:`eval_transforms` leaves it). ``augment=False``: the same sampling of the network's patch, not
    augmented (the validation patches of the pseudo-Dice, as nnU-Net samples them).

    ``on_device`` (:func:`augment_on_device`): the augmentation only draws (its ``draws``), and the patch leaves as
    the crop (image float32, label class indices in their integer type) with its draws under
    :data:`~medseg.data.nnunet_draws.DRAWS`, for :func:`batched_augmentation` on the training device; batch it with
    :func:`~medseg.data.nnunet_draws.collate_with_draws`."""
    view = window(data, spatial_dims)
    augmentation = AUGMENTATIONS[check_augment(data.augment)]
    crop = augmentation.crop(view, spatial_dims) if augment else view.roi_size
    chain = augmentation.sampling(data, view, spatial_dims, crop, labels)
    if spatial_dims == 2:
        chain.append(mt.SqueezeDimd(keys=[IMAGE, LABEL], dim=view.slice_axis + 1))
    if augment and on_device:
        if augmentation.draws is None:
            raise ConfigError(f"data.augment={data.augment} has no device path: its transforms run on the workers")
        return [*chain, *augmentation.draws(view, spatial_dims),
                mt.EnsureTyped(keys=IMAGE, dtype=torch.float32, track_meta=False),
                mt.EnsureTyped(keys=LABEL, track_meta=False)]
    if augment:
        chain += augmentation.transforms(view, spatial_dims)
    return [*chain, *(target_transforms(labels, LABEL) if labels is not None else []),
            mt.EnsureTyped(keys=[IMAGE, LABEL], dtype=torch.float32, track_meta=False)]


AUGMENT_ON = ("auto", "workers", "device")
"""The values of ``data.augment_on``: where the random transforms of an :class:`Augmentation` with a device path run."""


def augment_on_device(data: DataConfig, device_type: str) -> bool:
    """Whether ``data.augment``'s random transforms run on the training device (of type ``device_type``: ``cuda``,
    ``cpu``, ...): ``data.augment_on`` is ``device``, or ``auto`` on CUDA, and the augmentation has a device path
    (``nnunet``; ``light`` and ``none`` always run on the workers)."""
    check_choice("data.augment_on", data.augment_on, AUGMENT_ON)
    if AUGMENTATIONS[check_augment(data.augment)].draws is None:
        return False
    return data.augment_on == "device" or (data.augment_on == "auto" and device_type == "cuda")


def batched_augmentation(data: DataConfig, spatial_dims: int,
                         labels: LabelSpec | None = None) -> BatchedNnunetAugment:
    """The device half of :func:`patch_sampling` with ``on_device``: ``augmentation(image, label, draws)`` maps a batch
    of crops and their draws to the augmented patches and the loss's targets, as the worker path's chain does."""
    view = window(data, spatial_dims)
    regions = labels.output_classes if labels is not None and labels.region_based else None
    return BatchedNnunetAugment(view.net_patch, spatial_dims, view.slice_axis, regions)


def augmentations(patch: Sequence[int]) -> list[mt.Transform]:
    """Random flips on every axis, a 90-degree rotation in the first square plane of ``patch``, intensity jitter.

    The spatial ones move image and label together.
    """
    dims = len(patch)
    chain: list[mt.Transform] = [mt.RandFlipd(keys=[IMAGE, LABEL], prob=0.5, spatial_axis=a) for a in range(dims)]
    square = next(((a, b) for a, b in combinations(range(dims), 2) if patch[a] == patch[b]), None)
    if square is not None:
        chain.append(mt.RandRotate90d(keys=[IMAGE, LABEL], prob=0.5, spatial_axes=square))
    return [*chain, mt.RandScaleIntensityd(keys=IMAGE, factors=0.1, prob=0.5),
            mt.RandShiftIntensityd(keys=IMAGE, offsets=0.1, prob=0.5)]


Sampling = Callable[[DataConfig, Window, int, list[int], LabelSpec | None], list[mt.Transform]]
"""``sampling(data, window, spatial_dims, crop, labels)``: the transforms that turn a preprocessed case into a list
of ``samples_per_volume`` crops of the 3D size ``crop``; deterministic ones first."""


def pos_neg_sampling(data: DataConfig, view: Window, spatial_dims: int, crop: list[int],
                     labels: LabelSpec | None = None) -> list[mt.Transform]:
    """MONAI's sampling: pad a case smaller than ``crop`` (symmetrically), then centre each crop on a foreground
    voxel (any class, so each class as often as its share of the voxels) with probability ``data.pos_fraction``,
    else on a background voxel (:class:`~medseg.data.labels.RandCropByPosNegForegroundd`); the crop stays inside."""
    return [
        mt.SpatialPadd(keys=[IMAGE, LABEL], spatial_size=crop),
        RandCropByPosNegForegroundd(
            keys=[IMAGE, LABEL], label_key=LABEL, spatial_size=crop, pos=data.pos_fraction,
            neg=1.0 - data.pos_fraction, num_samples=samples_per_volume(data, spatial_dims), allow_smaller=False,
        ),
    ]


def nnunet_sampling(data: DataConfig, view: Window, spatial_dims: int, crop: list[int],
                    labels: LabelSpec | None = None) -> list[mt.Transform]:
    """nnU-Net's sampling (:mod:`medseg.data.sampling`): the voxels of each output's classes (a foreground class, or
    a region's members; without ``labels`` each foreground class), then the last
    :func:`~medseg.data.sampling.forced_foreground` crops of ``data.pos_fraction`` centred on a voxel of an output
    drawn uniformly among those the case holds, the others uniform over the case padded so that the network's patch
    (``view.roi_size``, cut from the crop's centre) reaches its borders."""
    return [
        ClassLocationsd(LABEL, labels.output_classes if labels is not None else None),
        RandNnunetCropd([IMAGE, LABEL], crop, view.roi_size, samples_per_volume(data, spatial_dims),
                        data.pos_fraction),
    ]


@dataclass(frozen=True)
class Augmentation:
    """One value of ``data.augment``: how the patches are sampled, the crop they take, and the random transforms
    that follow."""

    crop: Callable[[Window, int], list[int]]
    """``crop(window, spatial_dims)``: the 3D crop (in 2D, 1 voxel along the slice axis), the window's ``roi_size`` or
    larger where a spatial transform crops the patch out of it."""
    transforms: Callable[[Window, int], list[mt.Transform]]
    """``transforms(window, spatial_dims)``: the chain on the crop (squeezed to 2D for a 2D network), ending at the
    network's patch ``window.net_patch``."""
    sampling: Sampling = pos_neg_sampling
    """The crops' sampler (:data:`Sampling`): MONAI's foreground/background balance (:func:`pos_neg_sampling`) or
    nnU-Net's foreground oversampling (:func:`nnunet_sampling`)."""
    draws: Callable[[Window, int], list[mt.Transform]] | None = None
    """``draws(window, spatial_dims)``: the draw-only twin of ``transforms`` for ``data.augment_on=device``, whose
    draws :func:`batched_augmentation` applies on the training device; None: no device path."""


def _nnunet_crop(view: Window, spatial_dims: int) -> list[int]:
    """nnU-Net's enlarged patch (:func:`~medseg.data.nnunet_augment.nnunet_crop`), so that no corner of the rotated
    and scaled patch falls outside the crop; in 2D the in-plane sizes, 1 voxel along the slice axis."""
    enlarged = nnunet_crop(view.net_patch, spatial_dims, view.slice_axis)
    if spatial_dims == 3:
        return enlarged
    return [*enlarged[:view.slice_axis], 1, *enlarged[view.slice_axis:]]


AUGMENTATIONS: dict[str, Augmentation] = {
    "light": Augmentation(lambda view, dims: view.roi_size, lambda view, dims: augmentations(view.net_patch)),
    "nnunet": Augmentation(_nnunet_crop, lambda view, dims: nnunet_augmentations(view.net_patch, dims,
                                                                                  view.slice_axis),
                           nnunet_sampling,
                           lambda view, dims: nnunet_draws(view.net_patch, dims, view.slice_axis)),
    "none": Augmentation(lambda view, dims: view.roi_size, lambda view, dims: []),
}
"""The values of ``data.augment``. ``light`` and ``none`` sample with :func:`pos_neg_sampling`, ``nnunet`` with
nnU-Net's foreground oversampling (:func:`nnunet_sampling`) on its enlarged crop; ``nnunet`` alone has a device path
(``data.augment_on``)."""


def cached_sampling_name(data: DataConfig, spatial_dims: int) -> str:
    """What the deterministic head of ``data.augment``'s sampling leaves in a cached training case, as a folder name
    (:func:`medseg.training.prepare.prepare_data`'s disk cache): ``pad<crop>`` for :func:`pos_neg_sampling` (the
    case padded to the crop), ``class_locations`` for :func:`nnunet_sampling`."""
    augmentation = AUGMENTATIONS[check_augment(data.augment)]
    if augmentation.sampling is nnunet_sampling:
        return "class_locations"
    return "pad" + "x".join(map(str, augmentation.crop(window(data, spatial_dims), spatial_dims)))


def check_augment(augment: str) -> str:
    """``data.augment``, refused with the valid values when :data:`AUGMENTATIONS` lacks it."""
    check_choice("data.augment", augment, AUGMENTATIONS)
    return augment


def eval_transforms(data: DataConfig, with_label: bool = True, labels: LabelSpec | None = None) -> mt.Compose:
    """Whole-volume chain for validation and inference (3D volumes in both 2D and 3D mode); with ``labels``, the
    label holds class indices (:data:`~medseg.data.labels.IGNORE_INDEX` at ignore voxels)."""
    return mt.Compose(preprocessing(data.spacing, data.normalization, with_label, labels, data.resampling))
