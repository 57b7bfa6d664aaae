"""nnU-Net's augmentation applied on the training device to a whole batch, each sample with its own draws.

The device half of ``data.augment_on=device`` (:mod:`medseg.data.nnunet_draws` is the workers' half): the loader
hands over a batch of nnU-Net's enlarged crops and each sample's :class:`~medseg.data.nnunet_draws.NnunetDraws`, and
:class:`BatchedNnunetAugment` applies the chain of :func:`~medseg.data.nnunet_augment.nnunet_augmentations` to the
batch: one affine grid and one ``grid_sample`` per input for the rotation, scaling and crop of every sample drawn for
them (the others cut from the centre, as the worker path cuts them), the noise fields added, one grouped convolution
per axis for every channel drawn for the blur, per-channel statistics as batched reductions for contrast and gamma,
and the mirroring as a selection between the batch and its flip. The low-resolution simulation resizes each drawn
channel to its own size, so it loops over them (a quarter of the samples, half their channels).

Each operation computes what the worker path's transform computes (the same grid coordinates, interpolation,
kernels and formulas), so a batch gives the worker path's patches to float tolerance (a test compares them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from monai import transforms as mt
from monai.transforms.utils import create_grid

from medseg.data.labels import IGNORE_INDEX
from medseg.data.nnunet_augment import SEG_SCORE_SCALE, gaussian_kernel, is_dummy_2d, low_resolution, spatial_matrix
from medseg.data.nnunet_draws import NnunetDraws


def centre_crop(volume: torch.Tensor, patch: Sequence[int]) -> torch.Tensor:
    """``(B, C, *S)`` -> ``(B, C, *patch)``: MONAI's ``CenterSpatialCrop`` of every sample (nnU-Net's integer
    centre)."""
    slices = mt.CenterSpatialCrop(list(patch)).compute_slices(volume.shape[2:])
    return volume[(slice(None), slice(None), *slices)]


def affine_grid(matrices: np.ndarray, size: Sequence[int], source: Sequence[int], device: torch.device) -> torch.Tensor:
    """``grid_sample``'s grid ``(K, *size, d)`` for ``K`` matrices ``(K, d, d)``: the output voxel at offset ``u`` from
    the centre of ``size`` samples the ``source``-sized input at ``matrix @ u`` from its centre, computed as MONAI's
    ``AffineGrid`` and ``Resample`` compute it (float32 homogeneous coordinates, axes reversed, each scaled by
    ``2 / max(2, source size)``, ``align_corners=False``)."""
    count, dims = len(matrices), len(size)
    affine = np.tile(np.eye(dims + 1), (count, 1, 1))
    affine[:, :dims, :dims] = matrices
    affine_t = torch.as_tensor(affine, dtype=torch.float32, device=device)
    base = create_grid(list(size), device=device, backend="torch", dtype=torch.float32)
    coords = (affine_t @ base.view(dims + 1, -1))[:, :dims]
    for axis, extent in enumerate(source):
        coords[:, axis] *= 2.0 / max(2, extent)
    return coords.flip(1).reshape(count, dims, *size).movedim(1, -1)


def _sample(volume: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """``volume`` ``(K, C, *S)`` sampled at ``grid`` (:func:`affine_grid`) with zeros outside, float32."""
    return F.grid_sample(volume.float(), grid, mode=mode, padding_mode="zeros", align_corners=False)


def warp_label(label: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The labels ``(K, L, *S)`` resampled at ``grid`` by nnU-Net's rule
    (:class:`~medseg.data.nnunet_augment.RandNNUNetSpatiald`): every value's indicator interpolated, the padding label
    outside, the largest float16 score wins, ties to the nearest neighbour's label when among them, else to the lowest;
    the padding label becomes 0. ``(K, L, *size)`` in the label's dtype.

    One padding label for the batch, below every value of it: a value absent from a sample scores 0 there and never
    wins, and the padding's score is 0 where a sample's grid stays inside, so each sample gets its own result."""
    padding = int(label.min()) - 1
    nearest = _sample(label.float() - padding, grid, mode="nearest") + padding
    best = nearest_score = torch.full_like(nearest, float("-inf"), dtype=torch.float16)
    winner = nearest
    outside = SEG_SCORE_SCALE - _sample(torch.full_like(label[:, :1], SEG_SCORE_SCALE, dtype=torch.float32), grid)
    scores = [(padding, outside.expand(-1, label.shape[1], *outside.shape[2:]).half())]
    scores += [(int(v), _sample((label == v).float() * SEG_SCORE_SCALE, grid).half())
               for v in torch.unique(label).tolist()]
    for value, score in scores:
        winner = torch.where(score > best, value, winner)  # a tie stays with the lower label
        best = torch.maximum(best, score)
        nearest_score = torch.where(nearest == value, score, nearest_score)
    winner = torch.where(nearest_score == best, nearest, winner)
    return winner.masked_fill(winner == padding, 0).to(label.dtype)


def _per_slice(warp: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], volume: torch.Tensor, grid: torch.Tensor,
               plane_axis: int | None) -> torch.Tensor:
    """``warp(volume, grid)``; in dummy 2D (``plane_axis``) on every slice across it, each sample's slices with its
    grid: ``(K, C, *S)`` -> ``(K, C, *out)``."""
    if plane_axis is None:
        return warp(volume, grid)
    count, slices = len(volume), volume.shape[plane_axis + 2]
    moved = volume.movedim(plane_axis + 2, 1)
    warped = warp(moved.reshape(count * slices, *moved.shape[2:]), grid.repeat_interleave(slices, dim=0))
    return warped.reshape(count, slices, *warped.shape[1:]).movedim(1, plane_axis + 2)


def warp_batch(image: torch.Tensor, label: torch.Tensor, matrices: Sequence[np.ndarray | None], patch: Sequence[int],
               plane_axis: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The spatial transform of a batch: image ``(B, C, *S)`` and label ``(B, L, *S)`` -> ``(B, C, *patch)`` float32
    and ``(B, L, *patch)`` (its dtype). Sample ``b`` is resampled by ``matrices[b]``
    (:func:`~medseg.data.nnunet_augment.spatial_matrix`; in dummy 2D a 2D matrix for every slice across
    ``plane_axis``), all of them with one grid and one ``grid_sample`` per input, or cut from the centre when None."""
    image_out, label_out = centre_crop(image, patch).float(), centre_crop(label, patch)
    moved = [b for b, matrix in enumerate(matrices) if matrix is not None]
    if not moved:
        return image_out.contiguous(), label_out.contiguous()
    in_plane = [a for a in range(len(patch)) if a != plane_axis]
    grid = affine_grid(np.stack([matrices[b] for b in moved]), [patch[a] for a in in_plane],
                       [image.shape[a + 2] for a in in_plane], image.device)
    index = torch.as_tensor(moved, device=image.device)
    image_out = image_out.index_copy(0, index, _per_slice(_sample, image[index], grid, plane_axis))
    label_out = label_out.index_copy(0, index, _per_slice(warp_label, label[index], grid, plane_axis))
    return image_out, label_out


def on_drawn(image: torch.Tensor, draws: Sequence[Sequence[Any] | None],
             apply: Callable[[torch.Tensor, list[Any]], torch.Tensor]) -> torch.Tensor:
    """``image`` ``(B, C, *S)`` with ``apply(channels, params)`` on the channels drawn for a per-channel transform:
    ``draws[b]`` holds channel ``c``'s parameter at ``[c]`` (None: left alone), or is None (the transform not drawn
    for sample ``b``). ``apply`` maps the ``(n, *S)`` drawn channels and their ``n`` parameters to ``(n, *S)``."""
    pairs = [(b, c, param) for b, per_channel in enumerate(draws) if per_channel is not None
             for c, param in enumerate(per_channel) if param is not None]
    if not pairs:
        return image
    samples = torch.as_tensor([b for b, _, _ in pairs], device=image.device)
    channels = torch.as_tensor([c for _, c, _ in pairs], device=image.device)
    out = image.clone()
    out[samples, channels] = apply(image[samples, channels], [param for _, _, param in pairs])
    return out


def _column(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """``(n,)`` float32 values shaped ``(n, 1, ..., 1)`` to broadcast over ``like`` ``(n, *S)``."""
    return torch.as_tensor(values, dtype=torch.float32, device=like.device).reshape(-1, *[1] * (like.ndim - 1))


def _stat(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-channel statistic ``(n,)`` shaped ``(n, 1, ..., 1)`` to broadcast over ``like`` ``(n, *S)``."""
    return values.reshape(-1, *[1] * (like.ndim - 1))


def blur(channels: torch.Tensor, sigmas: list[tuple[float, ...]]) -> torch.Tensor:
    """``(n, *S)`` channels, each blurred with its sigma per axis (:func:`~medseg.data.nnunet_augment.gaussian_kernel`,
    reflected borders): a grouped convolution per axis, every kernel zero-padded to the longest. ``(n, *S)``."""
    dims, count = channels.ndim - 1, len(channels)
    kernels = [[gaussian_kernel(sigma[axis]) for sigma in sigmas] for axis in range(dims)]
    halves = [max(len(k) for k in axis_kernels) // 2 for axis_kernels in kernels]
    pads = [p for half in reversed(halves) for p in (half, half)]
    out = F.pad(channels[None], pads, mode="reflect")  # every axis first, then the convolutions: MONAI's order
    conv = [F.conv1d, F.conv2d, F.conv3d][dims - 1]
    for axis, (axis_kernels, half) in enumerate(zip(kernels, halves)):
        weight = torch.stack([F.pad(k, (half - len(k) // 2,) * 2) for k in axis_kernels]).to(channels)
        shape = [count, 1, *[1] * dims]
        shape[axis + 2] = 2 * half + 1
        out = conv(out, weight.reshape(shape), groups=count)
    return out[0]


def contrast(channels: torch.Tensor, factors: list[float]) -> torch.Tensor:
    """nnU-Net's contrast of ``(n, *S)`` channels with their factors: ``(x - mean) * f + mean`` clipped to the
    channel's range (:class:`~medseg.data.nnunet_augment.RandContrastd`)."""
    flat = channels.flatten(1)
    mean, low, high = (_stat(values, channels) for values in (flat.mean(1), flat.amin(1), flat.amax(1)))
    out = (channels - mean) * _column(factors, channels) + mean
    return torch.minimum(torch.maximum(out, low), high)


def gamma(channels: torch.Tensor, gammas: list[float], invert: bool = False) -> torch.Tensor:
    """nnU-Net's gamma with retained statistics of ``(n, *S)`` channels, each with its gamma
    (:class:`~medseg.data.nnunet_augment.RandGammad`); ``invert``: of the negated channels."""
    x = -channels if invert else channels
    flat = x.flatten(1)
    mean, std, low = (_stat(values, x) for values in (flat.mean(1), flat.std(1), flat.amin(1)))
    span = _stat(flat.amax(1), x) - low
    x = ((x - low) / span.clamp(min=1e-7)) ** _column(gammas, x) * span + low
    flat = x.flatten(1)
    x = (x - _stat(flat.mean(1), x)) * (std / _stat(flat.std(1), x).clamp(min=1e-7)) + mean
    return -x if invert else x


def mirror(volume: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """``(B, C, *S)`` with sample ``b`` mirrored along axis ``a`` where ``flips[b, a]`` (bool ``(B, dims)``)."""
    for axis in range(flips.shape[1]):
        if bool(flips[:, axis].any()):
            chosen = flips[:, axis].reshape(-1, *[1] * (volume.ndim - 1))
            volume = torch.where(chosen, volume.flip(axis + 2), volume)
    return volume


def region_targets(label: torch.Tensor, regions: Sequence[Sequence[int]] | None) -> torch.Tensor:
    """The loss's target of class indices ``(B, 1, *S)``: themselves as float32, or with ``regions`` one channel per
    region, 1 where the class is a member, :data:`~medseg.data.labels.IGNORE_INDEX` at ignore voxels (as
    :class:`~medseg.data.labels.RegionTargetsd`). ``(B, 1 or R, *S)`` float32."""
    if regions is None:
        return label.float()
    classes = label[:, 0]
    members = [torch.isin(classes, torch.as_tensor(list(region), device=label.device)) for region in regions]
    targets = torch.stack(members, dim=1).float()
    return targets.masked_fill((classes == IGNORE_INDEX)[:, None], float(IGNORE_INDEX))


class BatchedNnunetAugment:
    """nnU-Net's chain (:func:`~medseg.data.nnunet_augment.nnunet_augmentations` with the same ``patch``,
    ``spatial_dims`` and ``slice_axis``) on a batch, each sample with its :class:`NnunetDraws`.

    Takes the image ``(B, C, *crop)`` (nnU-Net's enlarged crop, any float dtype) and the label ``(B, 1, *crop)``
    (class indices, -1 at ignore voxels), on the training device, and returns ``(B, C, *patch)`` and the loss's target
    ``(B, 1 or R, *patch)`` (``regions``: one channel per region), both float32, as the worker path's chain followed
    by the target transforms leaves them.
    """

    def __init__(self, patch: Sequence[int], spatial_dims: int, slice_axis: int,
                 regions: Sequence[Sequence[int]] | None = None) -> None:
        self.patch, self.spatial_dims = [int(p) for p in patch], spatial_dims
        self.plane_axis = slice_axis if spatial_dims == 3 and is_dummy_2d(patch, slice_axis) else None
        self.regions = None if regions is None else [list(region) for region in regions]

    @torch.no_grad()
    def __call__(self, image: torch.Tensor, label: torch.Tensor,
                 draws: Sequence[NnunetDraws]) -> tuple[torch.Tensor, torch.Tensor]:
        matrices = [spatial_matrix(d.angles, d.scale, self.spatial_dims, self.plane_axis) for d in draws]
        image, label = warp_batch(image, label, matrices, self.patch, self.plane_axis)
        noisy = [b for b, d in enumerate(draws) if d.noise is not None]
        if noisy:
            index = torch.as_tensor(noisy, device=image.device)
            noise = torch.stack([draws[b].noise for b in noisy]).to(image.device, non_blocking=True)
            image = image.index_copy(0, index, image[index] + noise)
        image = on_drawn(image, [d.blur for d in draws], blur)
        factors = [[1.0 + f for f in d.brightness] if d.brightness is not None else [1.0] * image.shape[1]
                   for d in draws]
        image = image * torch.as_tensor(factors, dtype=torch.float32, device=image.device).reshape(
            *image.shape[:2], *[1] * self.spatial_dims)
        image = on_drawn(image, [d.contrast for d in draws], contrast)
        image = on_drawn(image, [d.low_resolution for d in draws], self._low_resolution)
        image = on_drawn(image, [d.inverted_gamma for d in draws], lambda x, g: gamma(x, g, invert=True))
        image = on_drawn(image, [d.gamma for d in draws], gamma)
        flips = torch.as_tensor([list(d.flips) for d in draws], dtype=torch.bool, device=image.device)
        return mirror(image, flips).contiguous(), region_targets(mirror(label, flips), self.regions).contiguous()

    def _low_resolution(self, channels: torch.Tensor, zooms: list[float]) -> torch.Tensor:
        """Each channel to its own size and back: one resize pair per drawn channel."""
        return torch.stack([low_resolution(channel, zoom, self.plane_axis) for channel, zoom in zip(channels, zooms)])
