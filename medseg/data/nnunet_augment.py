"""nnU-Net v2's default training augmentation as a MONAI transform chain.

The chain reproduces ``nnUNetTrainer.get_training_transforms`` of nnU-Net 2.8.1 (with batchgeneratorsv2 0.3):
the same transforms in the same order, each drawing from nnU-Net's distribution with nnU-Net's probability and
per-channel behaviour. MONAI's transforms are used where one does exactly what nnU-Net does (Gaussian noise,
multiplicative brightness, mirroring, and the affine grid, resampling and centre crop of the spatial transform);
the others are small MONAI transforms written here, each saying in its docstring how MONAI's own differs.

The chain, for a sample that the loader cropped at :func:`nnunet_crop` (nnU-Net's enlarged patch) around its centre:

1. rotation (p 0.2) and scaling (p 0.2) about the centre, resampled onto the final patch (:class:`RandNNUNetSpatiald`);
2. Gaussian noise (p 0.1), blur (p 0.2), brightness (p 0.15), contrast (p 0.15), low resolution (p 0.25),
   gamma of the inverted image (p 0.1), gamma (p 0.3);
3. mirroring along every axis (p 0.5 each).

Where medseg departs from nnU-Net, and why:

- Randomness comes from each transform's ``self.R`` (MONAI's), not from torch's and numpy's global generators, so
  ``set_random_state`` reseeds the chain: the same distributions, other streams.
- Axes are medseg's (RAS voxel order). nnU-Net moves the thick axis first; where its rules depend on that order
  (:func:`is_dummy_2d`, :func:`enlarged_patch`), the thick axis is passed as ``slice_axis``.
- Labels: medseg marks ignore voxels with -1, nnU-Net with its highest label value. Both treat the ignore value
  as one more label in the spatial transform. nnU-Net pads the segmentation with -1 there and maps -1 to 0 at the
  end of the chain; here the padding is an extra label that becomes 0 at once, so a -1 in the output is always
  an ignore voxel of the input.
- Gaussian noise: nnU-Net's ``noise_variance=(0, 0.1)`` is used as the standard deviation by its transform; so
  is it here (MONAI's ``RandGaussianNoise`` with ``sample_std``), which is what nnU-Net does, not what it says.
- The crop is the caller's: where it pads beyond the volume, the label padding should be 0 (nnU-Net's loader pads
  with -1, which competes as its own label in the interpolation before it becomes 0).

Kept from nnU-Net although odd: the enlarged patch divides by the smallest factor of ``(0.85, 1.25)``, not of the
``(0.7, 1.4)`` actually drawn, so a scale above ~1.18 (with rotation, less) samples beyond the crop: zeros in the
image, background in the label, as in nnU-Net.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from monai import transforms as mt
from monai.networks.layers import separable_filtering
from monai.transforms.utils import create_rotate
from monai.utils import convert_to_tensor

from medseg.data.reading import IMAGE, LABEL
from medseg.data.resampling import ANISO_THRESHOLD
from medseg.errors import ConfigError

SCALING = (0.7, 1.4)
"""The spatial transform's scale factor range (> 1 samples a larger region: structures shrink)."""
INITIAL_PATCH_SCALING = (0.85, 1.25)
"""The scale range nnU-Net passes to ``get_patch_size`` (not :data:`SCALING`, kept from nnU-Net v1)."""
SEG_SCORE_SCALE = 1000.0
"""nnU-Net compares the interpolated label scores as float16 values of ``score * 1000``: near-ties become ties."""


def is_dummy_2d(patch: Sequence[int], slice_axis: int) -> bool:
    """nnU-Net's rule for augmenting a 3D patch slice by slice: ``max(patch) / patch[slice_axis] > 3``.

    ``patch`` holds the 3D patch sizes in medseg's axes; ``slice_axis`` is the axis a 2D network slices across
    (:func:`medseg.data.transforms.thick_axis` of the spacing), nnU-Net's first axis. A 2D patch is never dummy 2D.
    """
    return len(patch) == 3 and max(patch) / patch[slice_axis] > ANISO_THRESHOLD


def rotation_range(patch: Sequence[int], spatial_dims: int, slice_axis: int | None = None) -> tuple[float, ...]:
    """nnU-Net's rotation: the half-width (radians) of the uniform angle drawn about each rotation axis.

    2D (``patch`` = the two in-plane sizes): one angle, ±15° for an elongated patch (``max / min > 1.5``), else ±180°.
    3D: ±30° about each of the three axes. Dummy 2D (:func:`is_dummy_2d`): ±180° about ``slice_axis`` and 0 about
    the others, an in-plane rotation of each slice. ``slice_axis=None`` means nnU-Net's order (the slice axis first).
    """
    if spatial_dims == 2:
        return (np.pi / 12,) if max(patch) / min(patch) > 1.5 else (np.pi,)
    axis = 0 if slice_axis is None else slice_axis
    if is_dummy_2d(patch, axis):
        return tuple(np.pi if a == axis else 0.0 for a in range(3))
    return (np.pi / 6,) * 3


def enlarged_patch(patch: Sequence[int], rotation: float | Sequence[float],
                   scale: tuple[float, float] = INITIAL_PATCH_SCALING, dummy_2d: bool = False,
                   slice_axis: int | None = None) -> list[int]:
    """nnU-Net's ``get_patch_size``: the patch the loader crops before :class:`RandNNUNetSpatiald` cuts ``patch``.

    The vector of patch sizes is rotated about each axis alone by its largest angle (``rotation``: one value for
    all axes, or :func:`rotation_range`'s tuple; at most 90°); each size becomes the largest absolute component
    among these vectors and the patch, divided by ``min(scale)`` and floored. Dummy 2D keeps the size along the slice
    axis. The rule depends on the axis order, so the sizes are taken in nnU-Net's (``slice_axis`` first, the others
    in order; ``None``: ``patch`` is in that order already). Example: ``(128, 128, 128)``, ±30° -> ``[205, 205, 205]``.
    """
    dims = len(patch)
    order = _nnunet_order(dims, slice_axis)
    sizes = np.asarray(patch, dtype=float)[order]
    limits = np.minimum(np.abs(np.broadcast_to(np.asarray(rotation, dtype=float), (3 if dims == 3 else 1,))), np.pi / 2)
    if dims == 3:
        turns = [_rotation(3, np.eye(3)[axis] * angle) for axis, angle in enumerate(limits[order])]
    else:
        turns = [_rotation(2, limits)]
    # nnU-Net rotates the sizes as a row vector: sizes @ R
    largest = np.max(np.abs([sizes, *(sizes @ turn for turn in turns)]), axis=0) / min(scale)
    enlarged = largest.astype(int)
    if dummy_2d:
        enlarged[0] = int(sizes[0])
    return [int(s) for s in enlarged[np.argsort(order)]]


def nnunet_crop(patch: Sequence[int], spatial_dims: int, slice_axis: int) -> list[int]:
    """The crop for :func:`nnunet_augmentations` with the same arguments: :func:`enlarged_patch` with
    :func:`rotation_range`, dummy 2D by :func:`is_dummy_2d` (3D); the in-plane sizes in 2D. Example: a 3D patch
    ``(20, 160, 160)`` with slice axis 0 -> ``[20, 188, 188]``."""
    if spatial_dims == 2:
        return enlarged_patch(patch, rotation_range(patch, 2))
    return enlarged_patch(patch, rotation_range(patch, 3, slice_axis), dummy_2d=is_dummy_2d(patch, slice_axis),
                          slice_axis=slice_axis)


def _nnunet_order(dims: int, slice_axis: int | None) -> list[int]:
    """medseg's axes in nnU-Net's order: ``slice_axis`` first, then the others as they come."""
    if dims == 2 or slice_axis is None:
        return list(range(dims))
    return [slice_axis, *(a for a in range(dims) if a != slice_axis)]


def _rotation(dims: int, angles: Sequence[float]) -> np.ndarray:
    """nnU-Net's rotation matrix ``(dims, dims)``: in 3D ``Rz @ Ry @ Rx`` (about axes 2, 1, 0), in 2D ``angles[0]``."""
    return np.asarray(create_rotate(dims, list(angles), rotate_order="xyz"))[:dims, :dims]


class RandNNUNetSpatiald(mt.Randomizable, mt.MapTransform):
    """nnU-Net's ``SpatialTransform`` as configured for training: rotation and scaling, no elastic deformation.

    Takes an image ``(C, *S)`` and a label ``(L, *S)`` (class indices, :data:`medseg.data.labels.IGNORE_INDEX` at
    ignore voxels, any int or float dtype) at least ``patch`` large, and returns ``(C, *patch)`` and ``(L, *patch)``
    (the label in its dtype). With probability ``p_rotation`` it draws one angle per rotation axis, uniform within
    ``±rotation``; with probability ``p_scaling`` one scale factor for all axes, uniform in ``scaling``. The output
    voxel at offset ``u`` from the patch centre samples the input at ``R @ S @ u`` from the input centre, with
    ``R = Rz @ Ry @ Rx`` (nnU-Net's composition); the image bilinearly with zeros outside, the label by nnU-Net's
    rule: each label value's indicator interpolated bilinearly, outside the input an extra padding label, the
    largest score wins (float16 resolution of ``score * 1000``), ties go to the nearest neighbour's label when it
    is among them, else to the lowest label, and the padding label becomes 0. Without rotation and scaling the
    patch is cut from the centre (MONAI's ``CenterSpatialCrop``, nnU-Net's integer centre), not resampled.

    ``slice_axis`` (dummy 2D): the transform acts on each slice across that axis in-plane, with the angle drawn
    within ``±rotation[slice_axis]``; the input must already have the final size along it.

    MONAI's ``RandAffined`` differs: one probability for rotation and scaling together, a scale factor per axis,
    its rotation composed ``Rx @ Ry @ Rz``, and labels resampled by nearest neighbour.
    """

    def __init__(self, patch: Sequence[int], rotation: Sequence[float], scaling: tuple[float, float] = SCALING,
                 p_rotation: float = 0.2, p_scaling: float = 0.2, slice_axis: int | None = None,
                 image_key: str = IMAGE, label_key: str = LABEL) -> None:
        super().__init__(keys=[image_key, label_key], allow_missing_keys=True)
        self.patch = [int(p) for p in patch]
        self.rotation, self.scaling = tuple(rotation), scaling
        self.p_rotation, self.p_scaling = p_rotation, p_scaling
        self.slice_axis, self.label_key = slice_axis, label_key
        self.angles: tuple[float, ...] = (0.0,) * len(self.rotation)
        """The drawn angle about each rotation axis (radians)."""
        self.scale = 1.0
        """The drawn scale factor, the same on every axis."""

    def randomize(self, data: Any = None) -> None:
        """Draw ``angles`` (one per rotation axis, 0 without rotation) and ``scale`` (1 without scaling)."""
        rotate, scale = self.R.rand() < self.p_rotation, self.R.rand() < self.p_scaling
        self.angles = tuple(self.R.uniform(-r, r) if rotate else 0.0 for r in self.rotation)
        self.scale = self.R.uniform(*self.scaling) if scale else 1.0

    def matrix(self) -> np.ndarray | None:
        """The drawn ``R @ S`` (:func:`spatial_matrix`), or None when neither was drawn."""
        return spatial_matrix(self.angles, self.scale, len(self.patch), self.slice_axis)

    def __call__(self, data: Mapping[Hashable, Any], randomize: bool = True) -> dict[Hashable, Any]:
        if randomize:
            self.randomize()
        out = dict(data)
        matrix = self.matrix()
        for key in self.key_iterator(out):
            volume = convert_to_tensor(out[key], track_meta=False)
            if matrix is None:
                out[key] = convert_to_tensor(mt.CenterSpatialCrop(self.patch)(volume), track_meta=False)
            else:
                warp = _warp_label if key == self.label_key else _warp_image
                out[key] = self._per_slice(warp, volume, matrix)
        return out

    def _per_slice(self, warp: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], volume: torch.Tensor,
                   matrix: np.ndarray) -> torch.Tensor:
        """``warp(volume, grid)`` in 2D/3D; in dummy 2D on the slices, stacked as channels ``(C * n, *in_plane)``."""
        if self.slice_axis is None:
            return warp(volume, _grid(matrix, self.patch))
        axis = self.slice_axis + 1
        slices = volume.movedim(axis, 1)
        in_plane = [p for a, p in enumerate(self.patch) if a != self.slice_axis]
        warped = warp(slices.reshape(-1, *slices.shape[2:]), _grid(matrix, in_plane))
        return warped.reshape(*slices.shape[:2], *in_plane).movedim(1, axis)


def spatial_matrix(angles: Sequence[float], scale: float, dims: int,
                   slice_axis: int | None = None) -> np.ndarray | None:
    """:class:`RandNNUNetSpatiald`'s ``R @ S`` of drawn ``angles`` (one per rotation axis) and ``scale``: ``(3, 3)``
    in 3D, ``(2, 2)`` in 2D and in dummy 2D (``slice_axis`` set: the rotation about it alone); None when neither was
    drawn (no rotation, scale 1)."""
    if scale == 1.0 and not any(angles):
        return None
    rotation = _rotation(2, [angles[slice_axis]]) if slice_axis is not None else _rotation(dims, angles)
    return rotation * scale


def _grid(matrix: np.ndarray, size: Sequence[int]) -> torch.Tensor:
    """MONAI's affine grid ``(dims + 1, *size)``: ``matrix @ u`` for the offset ``u`` of each output voxel from the
    centre (``size`` has ``dims`` sizes)."""
    dims = len(size)
    affine = np.eye(dims + 1)
    affine[:dims, :dims] = matrix
    grid, _ = mt.AffineGrid(affine=torch.as_tensor(affine, dtype=torch.float32), dtype=torch.float32)(
        spatial_size=list(size))
    return grid


def _sample(volume: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """``volume`` ``(N, *S)`` sampled at ``grid`` (from :func:`_grid`) with zeros outside: ``(N, *size)`` float32."""
    resample = mt.Resample(mode=mode, padding_mode="zeros", dtype=torch.float32)
    return convert_to_tensor(resample(volume.float(), grid=grid), track_meta=False)


def _warp_image(image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The image ``(C, *S)`` resampled bilinearly at ``grid``: ``(C, *size)``."""
    return _sample(image, grid).to(image.dtype)


def _warp_label(label: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The label ``(L, *S)`` resampled at ``grid`` by nnU-Net's rule (:class:`RandNNUNetSpatiald`): ``(L, *size)``.

    Every channel is resampled alike and at once: a value absent from a channel scores 0 there and never wins.
    """
    padding = int(label.min()) - 1  # below every label, as nnU-Net's -1 padding label is below its labels
    nearest = _sample(label.float() - padding, grid, mode="nearest") + padding
    best = nearest_score = torch.full_like(nearest, float("-inf"), dtype=torch.float16)
    winner = nearest
    for value, score in _label_scores(label, grid, padding):
        winner = torch.where(score > best, value, winner)  # a tie stays with the lower label
        best = torch.maximum(best, score)
        nearest_score = torch.where(nearest == value, score, nearest_score)
    winner = torch.where(nearest_score == best, nearest, winner)
    return winner.masked_fill(winner == padding, 0).to(label.dtype)


def _label_scores(label: torch.Tensor, grid: torch.Tensor, padding: int) -> Iterator[tuple[int, torch.Tensor]]:
    """``(value, score)`` for each label value, lowest first: its indicator ``(L, *S)`` resampled at ``grid``,
    ``(L, *size)`` float16 of ``score * 1000``; first the ``padding`` label's (the weight outside the input) when
    the grid reaches outside."""
    outside = SEG_SCORE_SCALE - _sample(torch.full_like(label[:1], SEG_SCORE_SCALE, dtype=torch.float32), grid)
    if bool((outside > 0).any()):
        yield padding, outside.expand(len(label), *outside.shape[1:]).half()
    for value in torch.unique(label).tolist():
        yield int(value), _sample((label == value).float() * SEG_SCORE_SCALE, grid).half()


class _PerChannelIntensityd(mt.RandomizableTransform, mt.MapTransform):
    """An image-only transform applied with probability ``prob``; then to each channel with ``p_per_channel``, with
    that channel's own draw (nnU-Net's ``RandomTransform`` around a transform with ``synchronize_channels=False``).

    Subclasses say what one channel draws (:meth:`draw`) and what it does with it (:meth:`apply_channel`).
    """

    def __init__(self, keys: str | Sequence[str], prob: float, p_per_channel: float = 1.0) -> None:
        mt.MapTransform.__init__(self, keys)
        mt.RandomizableTransform.__init__(self, prob)
        self.p_per_channel = p_per_channel
        self.params: list[Any] = []

    def draw(self, spatial_dims: int) -> Any:
        """One channel's parameter."""
        raise NotImplementedError

    def apply_channel(self, channel: torch.Tensor, param: Any) -> torch.Tensor:
        """``channel`` ``(*spatial)`` transformed with ``param``: ``(*spatial)``."""
        raise NotImplementedError

    def randomize(self, shape: Sequence[int]) -> None:
        """Draw whether to apply, then for each of the ``shape[0]`` channels its parameter (None: left alone)."""
        super().randomize(None)
        channels = shape[0] if self._do_transform else 0
        self.params = [self.draw(len(shape) - 1) if self.R.rand() < self.p_per_channel else None
                       for _ in range(channels)]

    def __call__(self, data: Mapping[Hashable, Any], randomize: bool = True) -> dict[Hashable, Any]:
        out = dict(data)
        keys = list(self.key_iterator(out))
        if randomize and keys:
            self.randomize(out[keys[0]].shape)
        if not self._do_transform:
            return out
        for key in keys:
            image = convert_to_tensor(out[key], track_meta=False)
            out[key] = torch.stack([channel if param is None else self.apply_channel(channel, param)
                                    for channel, param in zip(image, self.params)])
        return out


def bg_contrast(R: np.random.RandomState, low: float, high: float) -> float:
    """batchgeneratorsv2's ``BGContrast((low, high))``: with chance 1/2 uniform in ``[low, 1)`` (when ``low < 1``),
    else uniform in ``[max(low, 1), high)``; so as often below 1 as above, whatever the range's asymmetry."""
    if R.rand() < 0.5 and low < 1:
        return R.uniform(low, 1.0)
    return R.uniform(max(low, 1.0), high)


def gaussian_kernel(sigma: float) -> torch.Tensor:
    """batchgeneratorsv2's blur kernel ``(k,)``: the Gaussian sampled at integer offsets and normalised to sum 1,
    ``k`` the odd number nearest to ``6 * sigma + 0.5`` (half-way: the larger one)."""
    half = int(np.floor((6 * sigma + 0.5 - 1) / 2 + 0.5))
    x = torch.arange(-half, half + 1, dtype=torch.float32)
    kernel = torch.exp(-0.5 * (x / sigma) ** 2)
    return kernel / kernel.sum()


class RandGaussianBlurd(_PerChannelIntensityd):
    """nnU-Net's Gaussian blur: each channel with ``p_per_channel``, a sigma per axis uniform in ``sigma``, a
    separable :func:`gaussian_kernel` with reflected borders. ``(C, *spatial) -> (C, *spatial)``.

    MONAI's ``RandGaussianSmoothd`` differs: one sigma set for all channels, a kernel truncated at 4 sigma (with an
    erf approximation), zero-padded borders.
    """

    def __init__(self, keys: str | Sequence[str], prob: float = 0.2, sigma: tuple[float, float] = (0.5, 1.0),
                 p_per_channel: float = 0.5) -> None:
        super().__init__(keys, prob, p_per_channel)
        self.sigma = sigma

    def draw(self, spatial_dims: int) -> tuple[float, ...]:
        return tuple(self.R.uniform(*self.sigma) for _ in range(spatial_dims))

    def apply_channel(self, channel: torch.Tensor, param: tuple[float, ...]) -> torch.Tensor:
        kernels = [gaussian_kernel(s) for s in param]
        return separable_filtering(channel[None, None], kernels, mode="reflect")[0, 0]


class RandContrastd(_PerChannelIntensityd):
    """nnU-Net's contrast: per channel ``(x - mean) * f + mean``, clipped to the channel's original range when
    ``preserve_range``; ``f`` drawn by :func:`bg_contrast`. ``(C, *spatial) -> (C, *spatial)``.

    MONAI has no contrast about the mean (its ``RandAdjustContrastd`` is a gamma).
    """

    def __init__(self, keys: str | Sequence[str], prob: float = 0.15, factor: tuple[float, float] = (0.75, 1.25),
                 preserve_range: bool = True) -> None:
        super().__init__(keys, prob)
        self.factor, self.preserve_range = factor, preserve_range

    def draw(self, spatial_dims: int) -> float:
        return bg_contrast(self.R, *self.factor)

    def apply_channel(self, channel: torch.Tensor, param: float) -> torch.Tensor:
        mean = channel.mean()
        out = (channel - mean) * param + mean
        return out.clamp(channel.min(), channel.max()) if self.preserve_range else out


class RandLowResolutiond(_PerChannelIntensityd):
    """nnU-Net's low-resolution simulation: each channel with ``p_per_channel``, one zoom for all axes (but
    ``ignore_axis``, kept) uniform in ``zoom``; downsampled to ``round(size * zoom)`` by nearest neighbour
    (``nearest-exact``), upsampled back (bi/trilinear). ``(C, *spatial) -> (C, *spatial)``.

    MONAI's ``RandSimulateLowResolutiond`` differs: all channels together with one zoom, on every axis.
    """

    def __init__(self, keys: str | Sequence[str], prob: float = 0.25, zoom: tuple[float, float] = (0.5, 1.0),
                 p_per_channel: float = 0.5, ignore_axis: int | None = None) -> None:
        super().__init__(keys, prob, p_per_channel)
        self.zoom, self.ignore_axis = zoom, ignore_axis

    def draw(self, spatial_dims: int) -> float:
        return self.R.uniform(*self.zoom)

    def apply_channel(self, channel: torch.Tensor, param: float) -> torch.Tensor:
        return low_resolution(channel, param, self.ignore_axis)


def low_resolution(channel: torch.Tensor, zoom: float, ignore_axis: int | None = None) -> torch.Tensor:
    """:class:`RandLowResolutiond` on one channel ``(*spatial)``: down to ``round(size * zoom)`` on every axis but
    ``ignore_axis`` by ``nearest-exact``, back up (bi/trilinear). ``(*spatial) -> (*spatial)``."""
    size = list(channel.shape)
    low = [s if a == ignore_axis else round(s * zoom) for a, s in enumerate(size)]
    coarse = F.interpolate(channel[None, None], low, mode="nearest-exact")
    mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[channel.ndim]
    return F.interpolate(coarse, size, mode=mode)[0, 0]


class RandGammad(_PerChannelIntensityd):
    """nnU-Net's gamma with retained statistics: per channel (negated first when ``invert``) ``x`` is mapped to
    ``((x - min) / range) ** g * range + min``, then shifted and scaled back to its mean and (unbiased) standard
    deviation; ``g`` drawn by :func:`bg_contrast`. ``(C, *spatial) -> (C, *spatial)``.

    MONAI's ``RandAdjustContrastd`` (``invert_image``, ``retain_stats``) differs: one gamma and one range for all
    channels, the gamma uniform in its range.
    """

    def __init__(self, keys: str | Sequence[str], prob: float, gamma: tuple[float, float] = (0.7, 1.5),
                 invert: bool = False) -> None:
        super().__init__(keys, prob)
        self.gamma, self.invert = gamma, invert

    def draw(self, spatial_dims: int) -> float:
        return bg_contrast(self.R, *self.gamma)

    def apply_channel(self, channel: torch.Tensor, param: float) -> torch.Tensor:
        x = -channel if self.invert else channel
        mean, std = x.mean(), x.std()
        low, span = x.min(), x.max() - x.min()
        x = ((x - low) / span.clamp(min=1e-7)) ** param * span + low
        x = (x - x.mean()) * (std / x.std().clamp(min=1e-7)) + mean
        return -x if self.invert else x


def nnunet_augmentations(patch: Sequence[int], spatial_dims: int, slice_axis: int) -> list[mt.Transform]:
    """nnU-Net's training augmentation after the :func:`enlarged_patch` crop: spatial, intensity, mirroring.

    Acts on ``IMAGE`` ``(C, *S)`` (float) and ``LABEL`` ``(1, *S)`` (class indices, -1 at ignore voxels) and leaves
    ``(C, *patch)`` and ``(1, *patch)``. ``patch`` is the network's patch (two sizes in 2D, three in 3D);
    ``slice_axis`` is the thick axis of the spacing: it decides dummy 2D (:func:`is_dummy_2d`), and is unused in 2D.
    """
    if spatial_dims not in (2, 3) or len(patch) != spatial_dims:
        raise ConfigError(f"nnU-Net augmentation: spatial_dims={spatial_dims} and patch {list(patch)}; expected 2 or 3 "
                          "and as many sizes")
    plane_axis = slice_axis if spatial_dims == 3 and is_dummy_2d(patch, slice_axis) else None
    return [
        RandNNUNetSpatiald(patch, rotation_range(patch, spatial_dims, slice_axis), slice_axis=plane_axis),
        mt.RandGaussianNoised(IMAGE, prob=0.1, mean=0.0, std=0.1, sample_std=True),
        RandGaussianBlurd(IMAGE),
        mt.RandScaleIntensityd(IMAGE, factors=0.25, prob=0.15, channel_wise=True),  # = bg_contrast over (0.75, 1.25)
        RandContrastd(IMAGE),
        RandLowResolutiond(IMAGE, ignore_axis=plane_axis),
        RandGammad(IMAGE, prob=0.1, invert=True),
        RandGammad(IMAGE, prob=0.3),
        *(mt.RandFlipd([IMAGE, LABEL], prob=0.5, spatial_axis=a, allow_missing_keys=True)
          for a in range(spatial_dims)),
    ]
