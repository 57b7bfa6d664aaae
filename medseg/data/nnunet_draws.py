"""The random draws of nnU-Net's augmentation (:mod:`medseg.data.nnunet_augment`), taken apart from their application.

With ``data.augment_on=device`` the loader workers run the chain's transforms in draw-only mode (:class:`Drawn`):
each transform draws from its own ``self.R`` exactly what it draws when it applies itself (the same calls in the same
order, hence the same numbers: a run of one seed draws the same on the workers and on the device), and the sample
carries its draws (:class:`NnunetDraws`) beside its crop, still nnU-Net's enlarged patch. The loader batches them
(:func:`collate_with_draws`) and :class:`medseg.data.batched_augment.BatchedNnunetAugment` applies them on the training
device to the whole batch at once. Nothing random happens on the device: the random streams are the workers', seeded
per epoch as the worker path's, so runs stay reproducible and resumable alike.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from monai import transforms as mt
from monai.data import list_data_collate
from monai.utils import convert_to_tensor

from medseg.data.nnunet_augment import (
    RandContrastd,
    RandGammad,
    RandGaussianBlurd,
    RandLowResolutiond,
    RandNNUNetSpatiald,
    nnunet_augmentations,
)
from medseg.data.reading import IMAGE

DRAWS = "augment_draws"
"""The sample's key of its :class:`NnunetDraws` (a list of them once batched)."""

ChannelDraws = list[Any] | None
"""One draw per channel (None: that channel left alone), or None: the transform not drawn for the sample."""


@dataclass
class NnunetDraws:
    """One sample's draws of the nnU-Net chain (:func:`~medseg.data.nnunet_augment.nnunet_augmentations`), in the
    chain's order. ``C`` is the image's channels, ``patch`` the network's patch."""

    angles: tuple[float, ...] = ()
    """The spatial transform's angle about each rotation axis (radians, 0: none)."""
    scale: float = 1.0
    """The spatial transform's scale factor (1: none)."""
    noise: torch.Tensor | None = None
    """The Gaussian noise field ``(C, *patch)`` float32, as MONAI's ``RandGaussianNoise`` draws it; None: no noise."""
    blur: ChannelDraws = None
    """Per channel, the blur's sigma per spatial axis."""
    brightness: list[float] | None = None
    """Per channel, ``f`` of the brightness ``x * (1 + f)`` (MONAI's ``RandScaleIntensity``)."""
    contrast: ChannelDraws = None
    """Per channel, the contrast factor."""
    low_resolution: ChannelDraws = None
    """Per channel, the low-resolution zoom."""
    inverted_gamma: ChannelDraws = None
    """Per channel, the gamma of the inverted image."""
    gamma: ChannelDraws = None
    """Per channel, the gamma."""
    flips: tuple[bool, ...] = field(default_factory=tuple)
    """Per spatial axis, whether it is mirrored."""


Draw = Callable[[Any, Sequence[int], "NnunetDraws"], "NnunetDraws"]
"""``draw(transform, shape, draws)``: ``draws`` with what ``transform`` draws for an image of ``shape``."""


def _draw_spatial(transform: RandNNUNetSpatiald, shape: Sequence[int], draws: NnunetDraws) -> NnunetDraws:
    transform.randomize()
    return replace(draws, angles=tuple(float(a) for a in transform.angles), scale=float(transform.scale))


def _draw_noise(transform: mt.RandGaussianNoised, shape: Sequence[int], draws: NnunetDraws) -> NnunetDraws:
    transform.randomize(None)
    if not transform._do_transform:
        return draws
    noise = transform.rand_gaussian_noise
    noise.randomize(torch.empty(tuple(shape)))  # draws the field of the image's shape (its values unused)
    return replace(draws, noise=convert_to_tensor(noise.noise, dtype=torch.float32, track_meta=False))


def _draw_brightness(transform: mt.RandScaleIntensityd, shape: Sequence[int], draws: NnunetDraws) -> NnunetDraws:
    transform.randomize(None)
    if not transform._do_transform:
        return draws
    transform.scaler.randomize(torch.empty(tuple(shape)))  # one factor per channel (channel_wise)
    return replace(draws, brightness=[float(f) for f in transform.scaler.factor])


def _draw_flip(transform: mt.RandFlipd, shape: Sequence[int], draws: NnunetDraws) -> NnunetDraws:
    transform.randomize(None)
    return replace(draws, flips=(*draws.flips, bool(transform._do_transform)))


def _draw_per_channel(name: str) -> Draw:
    def draw(transform: Any, shape: Sequence[int], draws: NnunetDraws) -> NnunetDraws:
        transform.randomize(shape)
        return replace(draws, **{name: list(transform.params) if transform._do_transform else None})

    return draw


PER_CHANNEL_DRAWS = {RandGaussianBlurd: "blur", RandContrastd: "contrast", RandLowResolutiond: "low_resolution"}
"""The :class:`NnunetDraws` field of each per-channel transform of the chain (:class:`RandGammad`'s: by ``invert``)."""


def _drawer(transform: mt.Transform) -> Draw:
    """How one transform of the chain draws."""
    if isinstance(transform, RandNNUNetSpatiald):
        return _draw_spatial
    if isinstance(transform, mt.RandGaussianNoised):
        return _draw_noise
    if isinstance(transform, mt.RandScaleIntensityd):
        return _draw_brightness
    if isinstance(transform, mt.RandFlipd):
        return _draw_flip
    if isinstance(transform, RandGammad):
        return _draw_per_channel("inverted_gamma" if transform.invert else "gamma")
    return _draw_per_channel(PER_CHANNEL_DRAWS[type(transform)])


class Drawn(mt.Randomizable, mt.MapTransform):
    """A transform of the nnU-Net chain in draw-only mode: it draws what ``transform`` draws, from ``transform``'s own
    random state (which :meth:`set_random_state` sets, so a ``Compose`` seeds it as it seeds ``transform``), records
    it in ``data[DRAWS]`` (a :class:`NnunetDraws`, made by the first of the chain) and leaves the image and label
    alone. ``shape``, which the draws follow, is the image's ``(C, *patch)`` at that point of the chain (the network's
    patch: the spatial transform comes first).
    """

    def __init__(self, transform: mt.Randomizable, patch: Sequence[int], image_key: str = IMAGE) -> None:
        mt.MapTransform.__init__(self, [image_key])
        self.transform, self.patch = transform, [int(p) for p in patch]
        self.draw: Draw = _drawer(transform)

    def set_random_state(self, seed: int | None = None, state: Any = None) -> Drawn:
        super().set_random_state(seed, state)
        self.transform.set_random_state(seed, state)
        return self

    def randomize(self, data: Any = None) -> None:
        """Nothing of its own: ``transform`` draws in :meth:`__call__`."""

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        out = dict(data)
        shape = (int(out[self.keys[0]].shape[0]), *self.patch)
        out[DRAWS] = self.draw(self.transform, shape, out.get(DRAWS) or NnunetDraws())
        return out


def nnunet_draws(patch: Sequence[int], spatial_dims: int, slice_axis: int) -> list[mt.Transform]:
    """The draw-only twin of :func:`~medseg.data.nnunet_augment.nnunet_augmentations` with the same arguments: the
    same transforms, each wrapped in :class:`Drawn`, so that a ``Compose`` of them seeded alike draws the same numbers.
    Leaves the image ``(C, *crop)`` and label as they are and adds ``DRAWS``: a :class:`NnunetDraws`."""
    return [Drawn(transform, patch) for transform in nnunet_augmentations(patch, spatial_dims, slice_axis)]


def collate_with_draws(samples: Sequence[Any]) -> dict[str, Any]:
    """The loader's collate for samples that carry :data:`DRAWS`: MONAI's ``list_data_collate`` of the rest (a
    list of samples per case flattened, as for every training chain), ``DRAWS`` the list of the samples'
    :class:`NnunetDraws` in the batch's order."""
    flat = [s for item in samples for s in (item if isinstance(item, list) else [item])]
    draws = [sample[DRAWS] for sample in flat]
    batch = list_data_collate([{k: v for k, v in sample.items() if k != DRAWS} for sample in flat])
    batch[DRAWS] = draws
    return batch
