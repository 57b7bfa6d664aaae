"""The plan nnU-Net makes from a dataset fingerprint (:mod:`medseg.planning.fingerprint`), done lightly.

Per-axis values (spacing in mm, shape in voxels, patch, strides) are in RAS voxel-axis order, as in the
fingerprint. :func:`make_plan` turns the fingerprint into a :class:`Plan` (target spacing, patch size, per-level
strides and, for a planned network, its depth and widths, normalisation) with nnU-Net's rules, except that a 3D
patch covers at most ``MAX_PATCH_COVERAGE`` of the median volume. The patch is fit to a voxel budget or to a
training-memory budget (:class:`MemoryBudget`); :mod:`medseg.planning.from_config` plans for a training config.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from medseg.attention.common import check_spatial_dims
from medseg.data.resampling import ANISO_THRESHOLD
from medseg.data.transforms import thick_axis
from medseg.errors import ConfigError, DatasetError, keyed
from medseg.planning.fingerprint import case_array, dataset_bytes, resampled_shapes
from medseg.planning.memory import MemoryEstimate

BASE_VOXEL_BUDGET = {3: 48**3, 2: 256**2}
"""Patch voxels for a network whose first level has ``BASE_CHANNELS`` feature maps."""
BASE_CHANNELS = 32
"""First-level width of a planned network (``model.channels=null``; nnU-Net's ``UNet_base_num_features``)."""
MAX_CHANNELS = {3: 320, 2: 512}
"""Widest level of a planned network (nnU-Net's ``UNet_max_features_3d`` / ``_2d``)."""
MAX_PATCH_COVERAGE = 0.5
"""Most of the median (resampled) volume one 3D patch may cover. nnU-Net takes the whole median volume
when it fits; medseg keeps random crops room to move, so that foreground oversampling still changes
what a patch sees and short trainings see more distinct views per epoch (measured on the demo data:
docs/data.md, "What is planned"). A 2D slice covers a small share of a volume and is not limited by it in
practice."""


@dataclass(frozen=True)
class PlanTarget:
    """The machine a plan is sized for: the device that will train, its precision and its memory budget."""

    device: str
    """``cuda`` or ``cpu``."""
    precision: str
    """``bf16``, ``fp16`` or ``fp32``: the autocast the training memory is estimated for."""
    memory_bytes: int | None
    """Training memory a step may need; None on a CPU, whose patch is fit to a voxel budget."""
    source: str
    """Where the budget comes from, in words (``plan.memory_gb=null: plan.reference_gb=8 GB, ...``)."""

    def text(self) -> str:
        """``cuda, bf16, 8.0 GiB of training memory (plan.memory_gb=...)``, for the log and the report."""
        memory = self.memory_bytes
        budget = "the voxel budget" if memory is None else f"{bytes_text(memory)} of training memory"
        return f"{self.device}, {self.precision}, {budget} ({self.source})"

    def as_dict(self) -> dict[str, Any]:
        """The record of ``metrics.json`` and of a plan file: device, precision, memory_gb (None on a CPU)."""
        memory_gb = None if self.memory_bytes is None else round(self.memory_bytes / 2**30, 3)
        return {"device": self.device, "precision": self.precision, "memory_gb": memory_gb, "source": self.source}


@dataclass
class Plan:
    """Planned preprocessing and network geometry; per-axis lists follow the RAS axes in use.

    ``target_spacing`` always has 3 entries (R, A, S): volumes are resampled in 3D in both modes.
    In 3D every other per-axis list has 3 entries too. In 2D they have 2: the in-plane axes, i.e.
    the RAS axes other than ``slice_axis``, in increasing order.
    """

    target_spacing: list[float]
    """Resampling target in mm per RAS axis (3 entries, also in 2D)."""
    patch_size: list[int]
    """Training patch in voxels; each entry divisible by the product of its axis's strides."""
    strides: list[list[int]]
    """One entry per down-sampling level, each the per-axis stride (1 or 2)."""
    normalization: dict[str, Any]
    """``{"scheme": "ct", "clip": [lo, hi], "mean": m, "std": s}`` (HU) or ``{"scheme": "zscore"}``."""
    median_shape: list[int]
    """Median case shape in voxels after resampling (the slice axis is not resampled in 2D)."""
    slice_axis: int
    """The RAS axis with the largest target spacing (0, 1 or 2); 2D slices are cut across it."""
    dataset_bytes: int
    """Estimated bytes of the resampled dataset (images and labels as float32)."""
    class_voxels: list[int]
    """Voxels of each class over the training cases (the fingerprint's), for ``trainer.class_weights=auto``."""
    channels: list[int] = field(default_factory=list)
    """Feature width per level (``len(strides) + 1`` entries): the model's, else :func:`planned_channels`."""
    memory: MemoryEstimate | None = None
    """Estimated training memory of the network at the patch (:func:`plan_from_config`; None from :func:`make_plan`)."""
    budget: str = ""
    """What the patch was fit to, in words ("" for a given patch)."""
    target: PlanTarget | None = None
    """The machine the plan is sized for (:func:`medseg.planning.from_config.plan_target`; None from
    :func:`make_plan`)."""

    @property
    def spatial_dims(self) -> int:
        return len(self.patch_size)


@dataclass(frozen=True)
class MemoryBudget:
    """A limit on the estimated training memory of the network a patch is planned for."""

    limit: int
    """Bytes."""
    estimate: Callable[[Sequence[int], list[list[int]]], MemoryEstimate]
    """``estimate(patch, strides)``: the training memory of the network with those strides at that patch."""


def bytes_text(size: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB``, ... up to GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


def axes_in_use(spatial_dims: int, slice_axis: int) -> list[int]:
    """The RAS axes a ``spatial_dims``-D network sees: all three in 3D, the two other than ``slice_axis`` in 2D."""
    return [0, 1, 2] if spatial_dims == 3 else [a for a in range(3) if a != slice_axis]


def full_resolution_spacing(fingerprint: Mapping[str, Any]) -> np.ndarray:
    """nnU-Net's 3D target spacing (3,) mm: the per-axis median spacing, except on strongly anisotropic data.

    When the thickest median spacing exceeds ``ANISO_THRESHOLD`` x every other axis's and the median
    size along that axis is below 1/``ANISO_THRESHOLD`` of every other, that axis takes the 10th
    percentile of its spacings instead (never finer than the other axes), so that few thick-slice
    cases are not up-sampled into heavy interpolation.
    """
    spacings = case_array(fingerprint, "spacing")
    target = np.median(spacings, axis=0)
    median_shape = np.median(case_array(fingerprint, "shape"), axis=0)
    thick = int(np.argmax(target))
    others = [axis for axis in range(3) if axis != thick]
    if (target[thick] > ANISO_THRESHOLD * target[others].max()
            and median_shape[thick] * ANISO_THRESHOLD < median_shape[others].min()):
        finer = float(np.percentile(spacings[:, thick], 10))
        target[thick] = finer if finer >= target[others].max() else target[others].max() + 1e-5
    return target


def plan_strides(
    spacing: Sequence[float], patch_size: Sequence[int], num_levels: int, min_feature_size: int = 4
) -> list[list[int]]:
    """nnU-Net's anisotropic pooling: ``num_levels`` levels of per-axis strides (2 or 1).

    At each level an axis is pooled when its current feature size (voxels) is at least
    ``2 * min_feature_size`` and its current spacing (mm) is at most twice the smallest current spacing
    among such axes; pooling doubles the axis's spacing and halves its size.
    """
    spacing, size = [float(s) for s in spacing], [float(n) for n in patch_size]
    strides = []
    for _ in range(num_levels):
        eligible = [axis for axis, n in enumerate(size) if n >= 2 * min_feature_size]
        finest = min((spacing[axis] for axis in eligible), default=0.0)
        level = [2 if axis in eligible and spacing[axis] <= 2 * finest * (1 + 1e-6) else 1
                 for axis in range(len(size))]
        for axis, stride in enumerate(level):
            spacing[axis] *= stride
            size[axis] /= stride
        strides.append(level)
    return strides


def planned_channels(num_levels: int, spatial_dims: int) -> list[int]:
    """nnU-Net's widths for ``num_levels`` levels: ``BASE_CHANNELS`` doubling per level up to ``MAX_CHANNELS``."""
    return [min(BASE_CHANNELS * 2**level, MAX_CHANNELS[spatial_dims]) for level in range(num_levels)]


def _level_strides(spacing: Sequence[float], patch: Sequence[int], num_levels: int | None,
                   min_feature_size: int) -> list[list[int]]:
    """:func:`plan_strides` for ``num_levels`` levels; None plans the depth too, as nnU-Net does: every level that
    pools an axis (at least one level)."""
    if num_levels is not None:
        return plan_strides(spacing, patch, num_levels, min_feature_size)
    levels = plan_strides(spacing, patch, max(int(np.log2(max(patch))), 1), min_feature_size)
    pooling = [level for level in levels if max(level) > 1]  # once a level pools nothing, no later one does
    return pooling or levels[:1]


def total_stride(strides: Sequence[Sequence[int]], dims: int) -> np.ndarray:
    """(dims,) product of the per-level strides per axis: what the patch must be divisible by."""
    return np.prod(np.asarray(strides, dtype=np.int64).reshape(-1, dims), axis=0)


def _fit_patch(
    spacing: np.ndarray, median_shape: np.ndarray, voxel_budget: int, num_levels: int | None,
    min_feature_size: int, strides: list[list[int]] | None, memory: MemoryBudget | None = None,
) -> tuple[list[int], list[list[int]]]:
    """Patch (voxels) and strides: the median shape, shrunk until it fits ``voxel_budget`` (and ``memory``).

    Each round derives the strides (unless fixed; ``num_levels`` None plans the depth too), rounds the
    patch up to a multiple of the total stride, and, while over budget, shrinks the axis with the largest
    patch / median-shape ratio (ties go to the larger extent in mm) by one total stride: the one of the
    patch shrunk by the current total stride, as nnU-Net steps, so that a size the smaller patch pools less
    often is not skipped (256 -> 224, whose 7 voxels after five pools are not pooled again, not 192).
    """
    dims = len(spacing)
    patch = np.maximum(median_shape.astype(np.int64), 1)
    while True:
        level_strides = strides or _level_strides(spacing, patch, num_levels, min_feature_size)
        total = total_stride(level_strides, dims)
        rounded = -(-patch // total) * total
        if rounded.prod() <= voxel_budget and (
                memory is None or memory.estimate(rounded.tolist(), level_strides).total <= memory.limit):
            break
        shrinkable = [a for a in range(dims) if rounded[a] > total[a] or (strides is None and patch[a] > 1)]
        if not shrinkable:
            limit = f"{voxel_budget} voxels" + ("" if memory is None else f" and {bytes_text(memory.limit)}")
            warnings.warn(f"patch {rounded.tolist()} exceeds the budget of {limit} with the given strides",
                          stacklevel=4)
            break
        axis = max(shrinkable, key=lambda a: (rounded[a] / median_shape[a], rounded[a] * spacing[a]))
        step = total[axis]
        if strides is None:
            smaller = patch.copy()
            smaller[axis] = max(rounded[axis] - step, 1)
            step = total_stride(_level_strides(spacing, smaller, num_levels, min_feature_size), dims)[axis]
        patch[axis] = max(rounded[axis] - step, 1)
    return [int(n) for n in rounded], [list(map(int, level)) for level in level_strides]


def _per_axis(values: Sequence[Any], axes: list[int], name: str) -> list[Any]:
    """``values`` for ``axes``: as given when it has one entry per axis, else picked from 3 RAS entries."""
    values = list(values)
    if len(values) == len(axes):
        return values
    if len(values) == 3:
        return [values[axis] for axis in axes]
    raise ConfigError(f"{name}={values}: expected {len(axes)} entries (or 3 in RAS order)")


def _normalize_strides(strides: Sequence[Any], num_levels: int, dims: int) -> list[list[int]]:
    """User strides (per level an int or one int per axis) as ``num_levels`` lists of ``dims`` ints."""
    levels = [[int(s)] * dims if isinstance(s, int) else [int(v) for v in s] for s in strides]
    if len(levels) != num_levels or any(len(level) != dims for level in levels):
        raise ConfigError(f"model.strides={list(strides)}: expected {num_levels} levels of {dims} axes")
    return levels


def plan_normalization(fingerprint: Mapping[str, Any], is_ct: bool) -> dict[str, Any]:
    """CT: clip to the pooled foreground 0.5-99.5 percentiles, then z-score with the foreground mean/std.

    Other modalities: per-image z-score. Multi-channel CT gives per-channel lists for clip/mean/std.
    """
    if not is_ct:
        return {"scheme": "zscore"}
    stats = fingerprint["intensity"]
    if any(s is None for s in stats):
        raise DatasetError("no foreground voxels in the training labels: CT normalisation cannot be planned")
    clip = [[s["percentile_00_5"], s["percentile_99_5"]] for s in stats]
    mean, std = [s["mean"] for s in stats], [s["std"] for s in stats]
    if len(stats) == 1:
        return {"scheme": "ct", "clip": clip[0], "mean": mean[0], "std": std[0]}
    return {"scheme": "ct", "clip": clip, "mean": mean, "std": std}


def _target_spacing(fingerprint: Mapping[str, Any], spatial_dims: int,
                    target_spacing: Sequence[float] | None) -> tuple[np.ndarray, int]:
    """The (3,) mm resampling target and its thick axis (the 2D slice axis).

    nnU-Net's :func:`full_resolution_spacing`, or ``target_spacing`` where given: 3 RAS entries set every axis and
    the thick axis; in 2D, 2 entries set the in-plane axes of the planned spacing's thick axis.
    """
    spacing = full_resolution_spacing(fingerprint)
    if target_spacing is not None and len(target_spacing) == 3:
        spacing = np.asarray(list(target_spacing), dtype=float)
    slice_axis = thick_axis(spacing)
    if target_spacing is not None:
        axes = axes_in_use(spatial_dims, slice_axis)
        spacing[axes] = _per_axis(target_spacing, axes, "spacing")
    return spacing, slice_axis


def _fit_to_budget(
    spacing: np.ndarray, median_shape: np.ndarray, coverage: int, num_levels: int | None, min_feature_size: int,
    strides: list[list[int]] | None, voxel_budget: int | None, memory: MemoryBudget | None,
) -> tuple[list[int], list[list[int]], str]:
    """Patch (voxels), strides and what the patch was fit to, in words, from the median shape (:func:`_fit_patch`).

    ``spacing`` (mm) and ``median_shape`` (voxels) cover the axes in use. The patch fits at most ``coverage``
    voxels, and ``memory`` when given, else ``voxel_budget`` (default ``BASE_VOXEL_BUDGET``).
    """
    covered = f"{coverage:,} voxels ({MAX_PATCH_COVERAGE:.0%} of the median volume)"
    if memory is not None:
        voxels, budget = coverage, f"{bytes_text(memory.limit)} of training memory and {covered}"
    else:
        allowed = voxel_budget or BASE_VOXEL_BUDGET[len(median_shape)]
        voxels, budget = min(allowed, coverage), f"the voxel budget {allowed:,} and {covered}"
    patch, level_strides = _fit_patch(spacing, median_shape, voxels, num_levels, min_feature_size, strides, memory)
    return patch, level_strides, budget


def make_plan(
    fingerprint: Mapping[str, Any],
    spatial_dims: int = 3,
    num_levels: int | None = 4,
    voxel_budget: int | None = None,
    min_feature_size: int = 4,
    is_ct: bool | None = None,
    target_spacing: Sequence[float] | None = None,
    patch_size: Sequence[int] | None = None,
    strides: Sequence[Any] | None = None,
    memory: MemoryBudget | None = None,
) -> Plan:
    """Plan spacing, patch, strides (and depth) and normalisation from a fingerprint.

    Args:
        spatial_dims: 3, or 2 for slices across the thick axis (per-axis values then cover the two
            in-plane axes).
        num_levels: down-sampling steps of the network (``len(channels) - 1``); None plans them with the
            patch (pooling until the feature maps are about ``min_feature_size``, at most log2 of the
            patch's largest size), or takes them from ``strides``.
        voxel_budget: most patch voxels without ``memory``; default ``BASE_VOXEL_BUDGET[spatial_dims]``
            (48**3 / 256**2). The patch also covers at most ``MAX_PATCH_COVERAGE`` of the median volume's voxels.
        min_feature_size: smallest feature-map size (voxels) an axis may be pooled down to.
        is_ct: selects CT normalisation; default the fingerprint's ``is_ct``.
        target_spacing, patch_size, strides: user-set values to keep (e.g. non-null config keys);
            the rest is planned around them. In 2D, 3-entry spacing/patch are read in RAS order.
        memory: fit the patch to this training-memory budget instead of ``voxel_budget``.
    """
    with keyed("model"):
        check_spatial_dims(spatial_dims)
    spacing, slice_axis = _target_spacing(fingerprint, spatial_dims, target_spacing)
    axes = axes_in_use(spatial_dims, slice_axis)
    shapes = resampled_shapes(fingerprint, spacing, keep_axis=slice_axis if spatial_dims == 2 else None)
    median_volume = np.median(shapes, axis=0)
    median_shape = np.round(median_volume).astype(np.int64)[axes]
    if strides is not None:
        num_levels = len(strides) if num_levels is None else num_levels
    fixed_strides = None if strides is None else _normalize_strides(strides, num_levels, spatial_dims)
    if patch_size is not None:
        patch = [int(n) for n in _per_axis(patch_size, axes, "patch_size")]
        level_strides = fixed_strides or _level_strides(spacing[axes], patch, num_levels, min_feature_size)
        budget = ""
    else:
        patch, level_strides, budget = _fit_to_budget(
            spacing[axes], median_shape, int(MAX_PATCH_COVERAGE * median_volume.prod()), num_levels,
            min_feature_size, fixed_strides, voxel_budget, memory)
    return Plan(
        target_spacing=[float(s) for s in spacing],
        patch_size=patch,
        strides=level_strides,
        normalization=plan_normalization(fingerprint, fingerprint["is_ct"] if is_ct is None else is_ct),
        median_shape=[int(n) for n in median_shape],
        slice_axis=slice_axis,
        dataset_bytes=dataset_bytes(fingerprint, shapes),
        class_voxels=[int(n) for n in fingerprint["class_voxels"]],
        channels=planned_channels(len(level_strides) + 1, spatial_dims),
        budget=budget,
    )
