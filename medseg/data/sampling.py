"""nnU-Net v2's patch sampling with foreground oversampling, as two MONAI transforms.

nnU-Net 2.8.1's loader (``nnUNetDataLoader.get_bbox``, ``get_do_oversample``) and preprocessing
(``DefaultPreprocessor._sample_foreground_locations``), for a case of class indices:

1. :class:`ClassLocationsd` (deterministic, so ``CacheDataset``/``PersistentDataset`` keep its output): for each
   foreground class, or each region (a group of classes), the coordinates of some of its voxels, drawn with a fixed
   seed: all of them up to :data:`MIN_LOCATIONS`, else that many but at least :data:`MIN_COVERAGE` of them.
2. :class:`RandNnunetCropd`: ``num_samples`` crops of the case; the last of them are centred on foreground (as many as
   the loader's :class:`ForegroundBatchSampler` gives the case's place in its batch, nnU-Net's count per batch, or
   :func:`forced_foreground` of the case's own crops outside such a loader): a class (region) drawn uniformly among
   those the case holds, then one of its stored voxels uniformly. The others have their lower corner drawn uniformly
   over every position where the crop fits the case padded by the enlargement (crop minus the final patch), so the
   final patch, cut from the crop's centre, reaches the borders; a case without foreground gets such random crops
   only. Crops reaching beyond the case are padded with zeros (image) and background (label).

A class is chosen as often as any other the case holds, whatever its size: a lesion of a few voxels as often as an
organ (MONAI's ``RandCropByPosNegLabeld`` draws one foreground voxel among all, a class as often as its share).

With ignore voxels (:data:`~medseg.data.labels.IGNORE_INDEX`), nnU-Net's sparse-annotation rule: the locations also
hold :data:`ANNOTATED`, a sample of the annotated voxels (background and every class), and the crops not forced to
foreground are centred on one of them (so is a forced crop of a case without foreground).

Where medseg departs from nnU-Net, and why:

- A batch of B cases holds ``data.samples_per_volume`` crops of each, where nnU-Net's holds one crop per case; the
  last :func:`forced_foreground` crops of the batch are forced either way (:func:`forced_per_case` spreads them over
  the batch's cases, last first), so a batch of one case's two patches forces one, as nnU-Net's batch of two cases.
- Randomness comes from ``self.R`` (MONAI's), not numpy's global generator, so ``set_random_state`` reseeds it.
  The stored locations are nnU-Net's exactly (the same seed, order and draws; the tests compare them).
- The sparse-annotation rule applies to a case that holds ignore voxels; nnU-Net applies it to every case of a
  dataset that declares an ignore label (a fully annotated case there: crops centred on any voxel instead of
  uniform corners, nearly the same positions).
- The label is padded with background (0): nnU-Net pads it with -1, which becomes background at the end of its
  augmentation (see :mod:`medseg.data.nnunet_augment`).

Kept from nnU-Net although odd: a forced crop centred on its voxel is clamped at the lower end of the valid range
only, not at the upper one, so near the far border it reaches beyond the padded case (more padding, the chosen voxel
still at its centre).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from copy import deepcopy
from typing import Any

import numpy as np
import torch
from monai import transforms as mt
from monai.data import Dataset, MetaTensor
from monai.utils import ImageMetaKey, convert_to_numpy
from torch.utils.data import BatchSampler, Sampler

from medseg.data.labels import IGNORE_INDEX
from medseg.data.reading import LABEL

CLASS_LOCATIONS = "class_locations"
"""The dict key :class:`ClassLocationsd` adds: ``{group number: (N, D) int32 voxel coordinates}``."""
ANNOTATED = 0
"""The group number of the annotated voxels (background and every class; not ignore), stored only for a case with
ignore voxels. The foreground groups are numbered from 1, as the network's outputs."""
MIN_LOCATIONS = 10_000
"""Voxels stored per group: all of a smaller group, else this many (nnU-Net's ``min_num_samples``)..."""
MIN_COVERAGE = 0.01
"""... but at least this share of the group's voxels (nnU-Net's ``min_percent_coverage``)."""
LOCATIONS_SEED = 1234
"""The seed of the stored voxels' draw (nnU-Net's)."""


def class_locations(label: Any, groups: Sequence[Sequence[int]] | None = None, seed: int = LOCATIONS_SEED,
                    min_locations: int = MIN_LOCATIONS, min_coverage: float = MIN_COVERAGE) -> dict[int, np.ndarray]:
    """Voxel coordinates of each group of classes in ``label``, drawn as nnU-Net's preprocessing draws them.

    ``label``: ``(*spatial)`` class indices (:data:`~medseg.data.labels.IGNORE_INDEX` at ignore voxels), a numpy
    array or a tensor. ``groups``: the class indices of each group, numbered from 1 (a foreground class ``[c]``, or a
    region's members: :attr:`~medseg.data.labels.LabelSpec.output_classes`); None: each foreground class from 1 to
    the largest in ``label``.

    Returns ``{number: (N, D) int32}``, each group's coordinates, empty (``(0, D)``) for a group absent from the
    label, and under :data:`ANNOTATED` the annotated voxels' when ``label`` holds ignore voxels. A group of ``n``
    voxels keeps ``max(min(min_locations, n), ceil(n * min_coverage))`` of them, drawn without replacement by one
    ``RandomState(seed)`` through the groups in order, the annotated voxels last; a group's voxels are taken class
    by class in the group's order, each class's in C order (nnU-Net's draw, whose results these equal).
    """
    label = np.asarray(convert_to_numpy(label))
    shape = label.shape
    flat = label.reshape(-1)
    if groups is None:
        groups = [[c] for c in range(1, int(flat.max(initial=0)) + 1)]
    groups = [list(dict.fromkeys(int(c) for c in group)) for group in groups]
    sparse = bool((flat == IGNORE_INDEX).any())
    # every requested voxel's position, sorted by class (stably, so each class's positions stay in C order)
    if sparse:
        positions = np.flatnonzero(flat != IGNORE_INDEX)
    else:
        positions = np.flatnonzero(np.isin(flat, sorted({c for group in groups for c in group})))
    values = flat[positions]
    order = np.argsort(values, kind="stable")
    positions, values = positions[order], values[order]
    present, starts, counts = np.unique(values, return_index=True, return_counts=True)
    ranges = {int(v): (int(s), int(n)) for v, s, n in zip(present, starts, counts)}

    rng = np.random.RandomState(seed)

    def draw(classes: Sequence[int]) -> np.ndarray:
        spans = [ranges[c] for c in classes if c in ranges]
        total = sum(n for _, n in spans)
        if total == 0:
            return np.zeros((0, len(shape)), np.int32)
        keep = max(min(min_locations, total), int(math.ceil(total * min_coverage)))
        offsets = rng.choice(total, keep, replace=False)
        ends = np.cumsum([n for _, n in spans])
        which = np.searchsorted(ends, offsets, side="right")
        before = np.concatenate(([0], ends[:-1]))  # the group's voxels before each class's
        picked = np.asarray([s for s, _ in spans])[which] + offsets - before[which]
        return np.stack(np.unravel_index(positions[picked], shape), axis=1).astype(np.int32)

    locations = {number: draw(group) for number, group in enumerate(groups, start=1)}
    if sparse:
        locations[ANNOTATED] = draw(sorted(ranges))
    return locations


def forced_foreground(num_samples: int, fraction: float) -> int:
    """How many of ``num_samples`` crops are forced to foreground: ``num_samples - round(num_samples * (1 -
    fraction))``, nnU-Net's rule for a batch (Python's rounding, half to even); 1 of 2 or 3 at 0.33, none of 1."""
    return num_samples - round(num_samples * (1 - fraction))


def forced_per_case(cases: int, samples: int, fraction: float) -> list[int]:
    """How many of each case's ``samples`` crops are forced to foreground in a batch of ``cases`` cases: the last
    :func:`forced_foreground` of the batch's ``cases x samples`` crops (nnU-Net's rule for a batch), counted per case
    in the batch's order (``[0, 0, ..., 1, 1, 1]`` for 10 cases of one crop at 0.33)."""
    first = cases * samples - forced_foreground(cases * samples, fraction)
    return [min(samples, max(0, (case + 1) * samples - first)) for case in range(cases)]


class ClassLocationsd(mt.MapTransform):
    """Adds ``data[locations_key]``: the :func:`class_locations` of the label ``(1, *spatial)`` (class indices,
    :data:`~medseg.data.labels.IGNORE_INDEX` at ignore voxels). Deterministic: a cached dataset keeps its output.

    ``groups``: the class indices of each group (:attr:`~medseg.data.labels.LabelSpec.output_classes`: the foreground
    classes, or the regions); None: each foreground class up to the largest in the label.
    """

    def __init__(self, keys: Hashable = LABEL, groups: Sequence[Sequence[int]] | None = None,
                 locations_key: str = CLASS_LOCATIONS, seed: int = LOCATIONS_SEED,
                 min_locations: int = MIN_LOCATIONS, min_coverage: float = MIN_COVERAGE) -> None:
        super().__init__(keys)
        self.groups = None if groups is None else [list(group) for group in groups]
        self.locations_key, self.seed = locations_key, seed
        self.min_locations, self.min_coverage = min_locations, min_coverage

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        out = dict(data)
        for key in self.key_iterator(out):
            label = out[key]
            if label.shape[0] != 1:
                raise ValueError(f"ClassLocationsd: {key!r} has {label.shape[0]} channels; expected one (class "
                                 "indices)")
            out[self.locations_key] = class_locations(label[0], self.groups, self.seed, self.min_locations,
                                                      self.min_coverage)
        return out


class RandNnunetCropd(mt.Randomizable, mt.MapTransform):
    """nnU-Net's crops with foreground oversampling: a list of ``num_samples`` dicts, each with ``keys`` cropped to
    ``spatial_size`` (``(C, *spatial_size)``) and the other entries copied, as MONAI's ``RandCropByPosNegLabeld``
    returns them (MetaTensors cropped by MONAI's ``SpatialCrop``, padded by ``BorderPad``).

    Needs ``data[locations_key]`` (:class:`ClassLocationsd`; it is not passed on). ``spatial_size`` is the crop
    (nnU-Net's ``patch_size``, enlarged for the spatial augmentation), ``final_size`` the patch the augmentation
    cuts from its centre (nnU-Net's ``final_patch_size``; None: the crop itself). The last
    :func:`forced_foreground` crops (``fraction``: ``data.pos_fraction``) are centred on a stored voxel of a group
    drawn uniformly among those present, the lower corner raised to the valid range's (not lowered to its upper
    end: nnU-Net's); the others, and all of a case without foreground, have their lower corner drawn uniformly in
    the valid range (:meth:`bounds`): from ``-ceil(p / 2)`` to ``size - crop + ceil(p / 2)`` per axis, ``p`` the
    enlargement ``crop - final`` (at least ``crop - size``: a case smaller than the crop sits in its middle). A case
    with ignore voxels centres them on annotated voxels instead (module docstring). Beyond the case, the image is
    padded with 0 and the label with 0 (background). :attr:`starts` and :attr:`choices` say what was drawn.
    """

    def __init__(self, keys: Hashable | Sequence[Hashable], spatial_size: Sequence[int],
                 final_size: Sequence[int] | None = None, num_samples: int = 1, fraction: float = 0.33,
                 label_key: Hashable = LABEL, locations_key: str = CLASS_LOCATIONS,
                 allow_missing_keys: bool = False) -> None:
        super().__init__(keys, allow_missing_keys)
        self.spatial_size = np.asarray(spatial_size, dtype=np.int64)
        self.final_size = self.spatial_size if final_size is None else np.asarray(final_size, dtype=np.int64)
        if self.final_size.shape != self.spatial_size.shape or (self.final_size > self.spatial_size).any():
            raise ValueError(f"RandNnunetCropd: final_size {list(self.final_size)} must have the crop's dimensions "
                             f"and fit in it ({list(self.spatial_size)})")
        self.num_samples, self.fraction = int(num_samples), float(fraction)
        self.label_key, self.locations_key = label_key, locations_key
        self.forced: int | None = None
        """How many of the next case's crops are forced to foreground, set by :class:`PlacedCases` for the case's
        place in its batch; None: :func:`forced_foreground` of ``num_samples``."""
        self.starts: list[np.ndarray] = []
        """Each crop's lower corner in the case's voxels (negative, or the crop reaching beyond: padded)."""
        self.choices: list[int | None] = []
        """Each crop's group number (:data:`ANNOTATED` for an annotated voxel), None for a uniform corner."""

    def bounds(self, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The lowest and highest lower corner of a uniform crop of a case of spatial ``shape`` (nnU-Net's
        ``lbs``, ``ubs``)."""
        shape = np.asarray(shape, dtype=np.int64)
        pad = np.maximum(self.spatial_size - self.final_size, self.spatial_size - shape)
        return -((pad + 1) // 2), shape - self.spatial_size + (pad + 1) // 2

    def randomize(self, shape: Sequence[int], locations: Mapping[int, Any]) -> None:
        """Draw :attr:`starts` and :attr:`choices` for a case of spatial ``shape`` and its ``locations``."""
        low, high = self.bounds(shape)
        sizes = {number: len(points) for number, points in locations.items()}
        present = [number for number in sorted(sizes) if number != ANNOTATED and sizes[number]]
        annotated = sizes.get(ANNOTATED, 0) > 0
        forced = forced_foreground(self.num_samples, self.fraction) if self.forced is None else self.forced
        first_forced = self.num_samples - forced
        self.starts, self.choices = [], []
        for index in range(self.num_samples):
            if index >= first_forced and present:
                choice: int | None = present[self.R.randint(len(present))]
            else:
                choice = ANNOTATED if annotated else None
            if choice is None:
                start = np.asarray([self.R.randint(lo, hi + 1) for lo, hi in zip(low, high)], dtype=np.int64)
            else:
                points = locations[choice]
                voxel = np.asarray(convert_to_numpy(points[self.R.randint(sizes[choice])]), dtype=np.int64)
                start = np.maximum(low, voxel - self.spatial_size // 2)
            self.starts.append(start)
            self.choices.append(choice)

    def __call__(self, data: Mapping[Hashable, Any], randomize: bool = True) -> list[dict[Hashable, Any]]:
        d = dict(data)
        locations = d.pop(self.locations_key, None)
        if locations is None:
            raise KeyError(f"RandNnunetCropd needs {self.locations_key!r} (ClassLocationsd before it); a disk cache "
                           "written by another chain lacks it")
        shape = d[self.label_key].shape[1:]
        if randomize:
            self.randomize(shape, locations)
        results: list[dict[Hashable, Any]] = [dict(d) for _ in self.starts]
        for result in results:
            for key in set(d).difference(self.keys):
                result[key] = deepcopy(d[key])
        for key in self.key_iterator(d):
            for index, (result, start) in enumerate(zip(results, self.starts)):
                result[key] = self.crop(d[key], start, index)
        return results

    def crop(self, volume: torch.Tensor, start: np.ndarray, index: int = 0) -> torch.Tensor:
        """``volume`` ``(C, *spatial)`` cropped to ``spatial_size`` from ``start``, padded with 0 beyond it: what
        MONAI's ``SpatialCrop`` then ``BorderPad`` give (a MetaTensor's affine moved to the crop's first voxel), in
        one copy into a zeroed patch, without their per-call metadata work (most of a loader worker's time)."""
        shape = np.asarray(volume.shape[1:], dtype=np.int64)
        low, high = np.clip(start, 0, shape), np.clip(start + self.spatial_size, 0, shape)
        data = volume.as_tensor() if isinstance(volume, MetaTensor) else volume
        patch = data.new_zeros((data.shape[0], *self.spatial_size.tolist()))
        if (high > low).all():
            into = tuple(slice(int(a - s), int(b - s)) for a, b, s in zip(low, high, start))
            patch[(slice(None), *into)] = data[(slice(None), *(slice(int(a), int(b)) for a, b in zip(low, high)))]
        if not isinstance(volume, MetaTensor):
            return patch
        affine = volume.affine.clone()
        affine[:-1, -1] += affine[:-1, :-1] @ torch.as_tensor(start, dtype=affine.dtype)
        return MetaTensor(patch, meta={**volume.meta, "affine": affine,
                                       ImageMetaKey.PATCH_INDEX: index})  # as MONAI's list-returning crops


class ForegroundBatchSampler(BatchSampler):
    """The batches of ``sampler``'s case indices (as ``BatchSampler``), each index paired with the number of its
    case's ``samples`` crops forced to foreground at ``fraction`` (:func:`forced_per_case`): lists of
    ``(index, forced)`` for :class:`PlacedCases`."""

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool, samples: int, fraction: float) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.samples, self.fraction = samples, fraction

    def __iter__(self):  # noqa: ANN204 (BatchSampler's iterator type)
        for batch in super().__iter__():
            yield list(zip(batch, forced_per_case(len(batch), self.samples, self.fraction), strict=True))


class PlacedCases(torch.utils.data.Dataset):
    """``dataset`` read by ``(index, forced)`` (:class:`ForegroundBatchSampler`): its :class:`RandNnunetCropd` forces
    ``forced`` of the case's crops to foreground. A loader process reads one case at a time, so the count set before
    the read is the count its crop uses."""

    def __init__(self, dataset: Dataset, crop: RandNnunetCropd) -> None:
        self.dataset, self.crop = dataset, crop

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]) -> Any:
        index, self.crop.forced = item
        try:
            return self.dataset[index]
        finally:
            self.crop.forced = None


def cropper_of(dataset: Dataset) -> RandNnunetCropd | None:
    """The :class:`RandNnunetCropd` of ``dataset``'s transform chain, or None (another sampling)."""
    transform = getattr(dataset, "transform", None)
    chain = transform.flatten().transforms if isinstance(transform, mt.Compose) else [transform]
    return next((t for t in chain if isinstance(t, RandNnunetCropd)), None)
