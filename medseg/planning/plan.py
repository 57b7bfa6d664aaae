"""Automatic planning in the spirit of nnU-Net, done lightly: a dataset fingerprint, then a plan.

Axis convention: every per-axis value here (spacing in mm, shape in voxels, patch, strides) is in
**RAS voxel-axis order**, the order MONAI's ``Orientationd(axcodes="RAS")`` produces: axis 0 runs
left -> right (R), axis 1 posterior -> anterior (A), axis 2 inferior -> superior (S). Files stored in
another orientation (DICOM's LPS, or permuted axes) are reoriented on reading (:mod:`medseg.data.reading`).

1. :func:`compute_fingerprint` reads every training case once (:func:`~medseg.data.reading.read_case`) and records its
   spacing, shape, orientation, class voxel counts and foreground intensity statistics; a sample of
   foreground voxels per case is pooled into dataset-level statistics. The result is JSON, cached
   and reused while the case files are unchanged.
2. :func:`make_plan` turns the fingerprint into a :class:`Plan` (target spacing, patch size,
   per-level strides and, for a planned network, its depth and widths, normalisation) with nnU-Net's
   rules, except that a 3D patch covers at most ``MAX_PATCH_COVERAGE`` of the median volume;
   :func:`plan_from_config` fits the patch to a training-memory budget by the network's estimated
   memory (:mod:`medseg.planning.memory`), or on a CPU to a voxel budget; :func:`apply_plan` fills the
   ``null`` keys of the data and model configs from it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from medseg.config import DataConfig, ModelConfig, PlanningConfig, TrainerConfig
from medseg.data.datalist import DatasetInfo, dataset_cache_dir, dataset_from_config
from medseg.data.labels import LabelSpec
from medseg.data.reading import image_paths, read_case
from medseg.data.transforms import thick_axis
from medseg.errors import ConfigError, DatasetError
from medseg.io import atomic_write_json
from medseg.planning.memory import MemoryEstimate, estimate_training_memory
from medseg.runtime.device import amp_dtype, resolve_device
from medseg.tables import CellFormat, text_table

FINGERPRINT_VERSION = 2
"""Bumped when the fingerprint's content changes, which invalidates every cache."""
FINGERPRINT_FILE = "fingerprint.json"
SAMPLES_PER_CASE = 10_000
"""Foreground voxels sampled per case (all of them when a case has fewer) for the pooled statistics."""
SAMPLING_SEED = 1234
ANISO_THRESHOLD = 3.0
"""nnU-Net's anisotropy threshold: thick-axis spacing / other spacing, and other size / thick size."""
PERCENTILES = (0.5, 99.5)
BASE_VOXEL_BUDGET = {3: 48**3, 2: 256**2}
"""Patch voxels for a network whose first level has ``BASE_CHANNELS`` feature maps."""
BASE_CHANNELS = 32
"""First-level width of a planned network (``model.channels=null``; nnU-Net's ``UNet_base_num_features``)."""
MAX_CHANNELS = {3: 320, 2: 512}
"""Widest level of a planned network (nnU-Net's ``UNet_max_features_3d`` / ``_2d``)."""
REFERENCE_MEMORY_GB = 8.0
"""nnU-Net's reference GPU memory: the budget on a GPU with more, when ``plan.memory_gb`` is null."""
GB = 2**30
"""Bytes per GB of ``plan.memory_gb``."""
MAX_PATCH_COVERAGE = 0.5
"""Most of the median (resampled) volume one 3D patch may cover. nnU-Net takes the whole median volume
when it fits; medseg keeps random crops room to move, so that foreground oversampling still changes
what a patch sees and short trainings see more distinct views per epoch (measured on the demo data:
docs/data.md, "What is planned"). A 2D slice covers a small share of a volume and is not limited by it in
practice."""
AXIS_NAMES = ("R", "A", "S")


# ---------------------------------------------------------------------------------------------------
# Fingerprint
# ---------------------------------------------------------------------------------------------------


def _intensity_stats(values: np.ndarray) -> dict[str, float] | None:
    """Statistics of 1D float64 intensities: mean, std, min, max, 0.5 and 99.5 percentiles (None if empty)."""
    if values.size == 0:
        return None
    low, high = np.percentile(values, PERCENTILES)
    return {"mean": float(values.mean()), "std": float(values.std()), "min": float(values.min()),
            "max": float(values.max()), "percentile_00_5": float(low), "percentile_99_5": float(high)}


def _case_fingerprint(
    entry: Mapping[str, Any], num_channels: int, labels: LabelSpec, samples_per_case: int
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """One case's fingerprint entry, and up to ``samples_per_case`` foreground intensities per channel.

    ``class_voxels`` counts the voxels of each class index (label values mapped to ``labels``' classes); ignore
    voxels count as no class and are not foreground.
    """
    volume = read_case(entry)
    if volume.label is None:
        raise DatasetError(f"case {entry['case']}: a training case without label")
    if volume.image.shape[0] != num_channels:
        raise DatasetError(f"case {entry['case']}: {volume.image.shape[0]} channels, "
                           f"dataset.json names {num_channels}")
    classes = labels.class_indices(volume.label, entry["label"])
    counts = np.bincount(classes[classes >= 0], minlength=labels.num_classes)
    mask = classes > 0
    foreground = [channel[mask].astype(np.float64) for channel in volume.image]
    size = foreground[0].size
    pick = (np.random.default_rng(SAMPLING_SEED).choice(size, samples_per_case, replace=False)
            if size > samples_per_case else slice(None))
    summary = {
        "case": entry["case"],
        "spacing": list(volume.spacing),
        "shape": [int(n) for n in volume.image.shape[1:]],
        "orientation": volume.orientation,
        "class_voxels": [int(n) for n in counts],
        "intensity": [_intensity_stats(values) for values in foreground],
    }
    return summary, [values[pick] for values in foreground]


def files_digest(entries: Sequence[Mapping[str, Any]]) -> str:
    """Hash of the entries' image and label files (path, size, mtime): it changes when any file does.

    Raises:
        DatasetError: a file is missing (the message names the case and path).
    """
    digest = hashlib.sha256()
    for entry in entries:
        for path in [*image_paths(entry), *([str(entry["label"])] if entry.get("label") else [])]:
            try:
                stat = os.stat(path)
            except OSError as err:
                raise DatasetError(f"case {entry['case']}: {path} not found") from err
            digest.update(f"{entry['case']}|{path}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _cache_key(info: DatasetInfo, samples_per_case: int) -> str:
    """Hash of the fingerprint settings, classes, channels and each training case's files (path, size, mtime)."""
    return hashlib.sha256(json.dumps(
        [FINGERPRINT_VERSION, samples_per_case, info.channel_names, sorted(info.label_spec.declared.items()),
         files_digest(info.training)]
    ).encode()).hexdigest()


def _load_cached(cache_file: Path | None, key: str) -> dict[str, Any] | None:
    """The cached fingerprint if ``cache_file`` holds one for ``key``, else None."""
    if cache_file is None or not cache_file.is_file():
        return None
    try:
        cached = json.loads(cache_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return cached if isinstance(cached, dict) and cached.get("cache_key") == key else None


def _case_array(fingerprint: Mapping[str, Any], key: str) -> np.ndarray:
    """(N, 3) per-case ``spacing`` (mm) or ``shape`` (voxels), RAS order."""
    return np.asarray([case[key] for case in fingerprint["cases"]], dtype=float)


def _resampled_shapes(fingerprint: Mapping[str, Any], target: Sequence[float],
                      keep_axis: int | None = None) -> np.ndarray:
    """(N, 3) case shapes in voxels after resampling to ``target`` (3,) mm; ``keep_axis`` is not resampled."""
    factors = _case_array(fingerprint, "spacing") / np.asarray(target, dtype=float)
    if keep_axis is not None:
        factors[:, keep_axis] = 1.0
    return np.maximum(np.round(_case_array(fingerprint, "shape") * factors), 1).astype(np.int64)


def _dataset_bytes(fingerprint: Mapping[str, Any], shapes: np.ndarray) -> int:
    """Bytes of the dataset at ``shapes`` (N, 3): all channels and the label as float32 (as MONAI holds them)."""
    return int(shapes.prod(axis=1).sum()) * (len(fingerprint["channel_names"]) + 1) * 4


def compute_fingerprint(
    info: DatasetInfo,
    cache_file: Path | None = None,
    progress: bool = True,
    samples_per_case: int = SAMPLES_PER_CASE,
) -> dict[str, Any]:
    """The dataset fingerprint of ``info.training`` (JSON-serialisable), cached in ``cache_file``.

    Keys: ``cases`` (per case: ``case``, ``spacing`` mm and ``shape`` voxels in RAS order, the
    file's ``orientation`` codes, ``class_voxels`` indexed by class, foreground ``intensity`` stats
    per channel), ``intensity`` (per channel, from the pooled foreground samples: mean, std, min, max,
    percentile_00_5, percentile_99_5; None without foreground), ``class_voxels`` (totals),
    ``median_spacing``, ``median_shape`` (raw voxels), ``dataset_bytes`` (float32 images and labels
    resampled to the median spacing), ``num_cases``, ``channel_names``, ``labels``, ``is_ct``.

    The cache is reused while its key matches (fingerprint version, sampling, classes, channels,
    and each case's file paths, sizes and mtimes); otherwise the fingerprint is recomputed and the
    cache rewritten atomically. Intensities are cast to float64 first (int16 CT cannot overflow).
    """
    cache_file = Path(cache_file) if cache_file is not None else None
    key = _cache_key(info, samples_per_case)
    cached = _load_cached(cache_file, key)
    if cached is not None:
        return cached
    cases, pooled = [], [[] for _ in info.channel_names]
    for entry in tqdm(info.training, desc="fingerprint", disable=not progress):
        summary, samples = _case_fingerprint(entry, info.in_channels, info.label_spec, samples_per_case)
        cases.append(summary)
        for channel, values in zip(pooled, samples):
            channel.append(values)
    fingerprint: dict[str, Any] = {
        "version": FINGERPRINT_VERSION, "cache_key": key, "name": info.name,
        "channel_names": list(info.channel_names), "labels": {str(k): v for k, v in info.labels.items()},
        "is_ct": info.is_ct, "num_cases": len(cases), "samples_per_case": samples_per_case, "cases": cases,
    }
    median_spacing = np.median(_case_array(fingerprint, "spacing"), axis=0)
    fingerprint.update({
        "intensity": [_intensity_stats(np.concatenate(channel)) for channel in pooled],
        "class_voxels": [int(n) for n in np.sum([c["class_voxels"] for c in cases], axis=0)],
        "median_spacing": median_spacing.tolist(),
        "median_shape": np.median(_case_array(fingerprint, "shape"), axis=0).tolist(),
        "dataset_bytes": _dataset_bytes(fingerprint, _resampled_shapes(fingerprint, median_spacing)),
    })
    if cache_file is not None:
        try:
            atomic_write_json(cache_file, fingerprint)
        except OSError as err:
            warnings.warn(f"{cache_file}: fingerprint cache not written ({err})", stacklevel=2)
    return fingerprint


# ---------------------------------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------------------------------


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



def full_resolution_spacing(fingerprint: Mapping[str, Any]) -> np.ndarray:
    """nnU-Net's 3D target spacing (3,) mm: the per-axis median spacing, except on strongly anisotropic data.

    When the thickest median spacing exceeds ``ANISO_THRESHOLD`` x every other axis's and the median
    size along that axis is below 1/``ANISO_THRESHOLD`` of every other, that axis takes the 10th
    percentile of its spacings instead (never finer than the other axes), so that few thick-slice
    cases are not up-sampled into heavy interpolation.
    """
    spacings = _case_array(fingerprint, "spacing")
    target = np.median(spacings, axis=0)
    median_shape = np.median(_case_array(fingerprint, "shape"), axis=0)
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
            limit = f"{voxel_budget} voxels" + ("" if memory is None else f" and {_bytes_text(memory.limit)}")
            warnings.warn(f"patch {rounded.tolist()} exceeds the budget of {limit} with the given strides",
                          stacklevel=3)
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
            patch (pooling until the feature maps are about ``min_feature_size``, at most ``MAX_LEVELS``
            levels), or takes them from ``strides``.
        voxel_budget: most patch voxels without ``memory``; default ``BASE_VOXEL_BUDGET[spatial_dims]``
            (48**3 / 256**2). The patch also covers at most ``MAX_PATCH_COVERAGE`` of the median volume's voxels.
        min_feature_size: smallest feature-map size (voxels) an axis may be pooled down to.
        is_ct: selects CT normalisation; default the fingerprint's ``is_ct``.
        target_spacing, patch_size, strides: user-set values to keep (e.g. non-null config keys);
            the rest is planned around them. In 2D, 3-entry spacing/patch are read in RAS order.
        memory: fit the patch to this training-memory budget instead of ``voxel_budget``.
    """
    if spatial_dims not in (2, 3):
        raise ConfigError(f"spatial_dims={spatial_dims}: expected 2 or 3")
    full = full_resolution_spacing(fingerprint)
    if target_spacing is not None and len(target_spacing) == 3:
        full = np.asarray(list(target_spacing), dtype=float)
    slice_axis = thick_axis(full)
    axes = [0, 1, 2] if spatial_dims == 3 else [a for a in range(3) if a != slice_axis]
    if target_spacing is not None:
        full[axes] = _per_axis(target_spacing, axes, "spacing")
    shapes = _resampled_shapes(fingerprint, full, keep_axis=slice_axis if spatial_dims == 2 else None)
    median_volume = np.median(shapes, axis=0)
    median_shape = np.round(median_volume).astype(np.int64)[axes]
    if strides is not None:
        num_levels = len(strides) if num_levels is None else num_levels
        fixed_strides = _normalize_strides(strides, num_levels, spatial_dims)
    else:
        fixed_strides = None
    coverage = int(MAX_PATCH_COVERAGE * median_volume.prod())
    covered = f"{coverage:,} voxels ({MAX_PATCH_COVERAGE:.0%} of the median volume)"
    if patch_size is not None:
        patch = [int(n) for n in _per_axis(patch_size, axes, "patch_size")]
        level_strides = fixed_strides or _level_strides(full[axes], patch, num_levels, min_feature_size)
        budget = ""
    elif memory is not None:
        patch, level_strides = _fit_patch(full[axes], median_shape, coverage, num_levels, min_feature_size,
                                          fixed_strides, memory)
        budget = f"{_bytes_text(memory.limit)} of training memory and {covered}"
    else:
        voxels = voxel_budget or BASE_VOXEL_BUDGET[spatial_dims]
        patch, level_strides = _fit_patch(full[axes], median_shape, min(voxels, coverage), num_levels,
                                          min_feature_size, fixed_strides)
        budget = f"the voxel budget {voxels:,} and {covered}"
    return Plan(
        target_spacing=[float(s) for s in full],
        patch_size=patch,
        strides=level_strides,
        normalization=plan_normalization(fingerprint, fingerprint["is_ct"] if is_ct is None else is_ct),
        median_shape=[int(n) for n in median_shape],
        slice_axis=slice_axis,
        dataset_bytes=_dataset_bytes(fingerprint, shapes),
        class_voxels=[int(n) for n in fingerprint["class_voxels"]],
        channels=planned_channels(len(level_strides) + 1, spatial_dims),
        budget=budget,
    )


# ---------------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------------


def voxel_budget_for(model: ModelConfig) -> int:
    """Patch voxel budget for a model: ``BASE_VOXEL_BUDGET`` scaled by ``BASE_CHANNELS / channels[0]``.

    The first level's activations (channels[0] x patch voxels) dominate memory, so halving the width
    doubles the patch: 3D with channels[0]=32 -> 48**3 voxels, with 16 -> 2 * 48**3. A planned network
    (``model.channels`` null) starts with ``BASE_CHANNELS``.
    """
    first = model.channels[0] if model.channels else BASE_CHANNELS
    return int(BASE_VOXEL_BUDGET[model.spatial_dims] * BASE_CHANNELS / first)


def check_planning(planning: PlanningConfig) -> None:
    """Raise :class:`ConfigError` for a ``plan`` node that cannot be planned with (a memory budget of 0 or less)."""
    if planning.memory_gb is not None and not planning.memory_gb > 0:
        raise ConfigError(f"plan.memory_gb={planning.memory_gb:g}: expected a positive number of GB, or null for the "
                          "default (the GPU's memory up to 8 GB; the voxel budget on a CPU)")


def memory_budget(planning: PlanningConfig, device: torch.device) -> tuple[int | None, str]:
    """The training memory (bytes) a patch planned for ``device`` may need, and where that figure comes from.

    ``plan.memory_gb`` when set; else on CUDA the GPU's memory, at most ``REFERENCE_MEMORY_GB``; else None: on a
    CPU time, not memory, limits training, and the patch keeps the voxel budget (:func:`voxel_budget_for`).

    Raises:
        ConfigError: ``plan.memory_gb`` is not positive.
    """
    check_planning(planning)
    if planning.memory_gb is not None:
        return int(planning.memory_gb * GB), f"plan.memory_gb={planning.memory_gb:g}"
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return min(total, int(REFERENCE_MEMORY_GB * GB)), (
            f"plan.memory_gb=null: the GPU's {_bytes_text(total)}, at most nnU-Net's {REFERENCE_MEMORY_GB:g} GB")
    return None, "plan.memory_gb=null on a CPU"


def plan_from_config(fingerprint: Mapping[str, Any], data: DataConfig, model: ModelConfig,
                     trainer: TrainerConfig | None = None, planning: PlanningConfig | None = None) -> Plan:
    """:func:`make_plan` for the configs, keeping the user-set (non-null) spacing, patch, strides and channels.

    The patch is fit to :func:`memory_budget` (for ``trainer.device``), by the estimated training memory of the
    network for ``trainer.batch_size x data.samples_per_volume`` patches, ``trainer.precision`` and
    ``trainer.optimizer`` (:func:`~medseg.planning.memory.estimate_training_memory`); on a CPU without
    ``plan.memory_gb``, to :func:`voxel_budget_for`. ``model.channels`` null plans the depth with the patch and
    the widths by :func:`planned_channels`. The plan reports the estimate at its patch. ``trainer`` and ``planning``
    default to their configs' defaults.
    """
    from medseg.data.transforms import samples_per_volume  # that module imports this one

    trainer, planning = trainer or TrainerConfig(), planning or PlanningConfig()
    device = resolve_device(trainer.device)
    limit, source = memory_budget(planning, device)
    batch = trainer.batch_size * samples_per_volume(data, model.spatial_dims)
    amp = amp_dtype(trainer.precision, device)

    def estimate(patch: Sequence[int], strides: list[list[int]]) -> MemoryEstimate:
        channels = model.channels or planned_channels(len(strides) + 1, model.spatial_dims)
        return estimate_training_memory(
            replace(model, channels=list(channels), strides=strides), patch, len(fingerprint["channel_names"]),
            len(fingerprint["labels"]), batch, amp, trainer.optimizer)

    levels = len(model.channels) - 1 if model.channels else None
    plan = make_plan(
        fingerprint,
        spatial_dims=model.spatial_dims,
        num_levels=levels,
        voxel_budget=voxel_budget_for(model),
        target_spacing=data.spacing,
        patch_size=data.patch_size,
        strides=model.strides,
        memory=None if limit is None else MemoryBudget(limit, estimate),
    )
    return replace(plan, channels=list(model.channels or plan.channels), memory=estimate(plan.patch_size, plan.strides),
                   budget=f"{plan.budget}; {source}" if plan.budget else "")


def plan_for(info: DatasetInfo, data: DataConfig, model: ModelConfig, cache_dir: str | Path | None = None,
             progress: bool = True, trainer: TrainerConfig | None = None,
             planning: PlanningConfig | None = None) -> Plan:
    """Fingerprint ``info`` (cached in ``<cache_dir>/fingerprint.json``; none if None) and plan for the configs
    (:func:`plan_from_config`)."""
    cache_file = Path(cache_dir) / FINGERPRINT_FILE if cache_dir is not None else None
    return plan_from_config(compute_fingerprint(info, cache_file, progress), data, model, trainer, planning)


def plannable_values(data: DataConfig, model: ModelConfig) -> dict[str, Any]:
    """The keys planning fills when they are null, with their values in the configs."""
    return {"data.spacing": data.spacing, "data.patch_size": data.patch_size,
            "data.normalization": data.normalization, "model.strides": model.strides,
            "model.channels": model.channels}


def unset_keys(data: DataConfig, model: ModelConfig) -> list[str]:
    """The plannable keys the configs leave null: planning fills them."""
    return [key for key, value in plannable_values(data, model).items() if value is None]


def apply_plan(data: DataConfig, model: ModelConfig, plan: Plan) -> tuple[DataConfig, ModelConfig]:
    """Copies of the configs with their null plannable keys (:func:`plannable_values`) taken from ``plan``.

    User-set (non-null) values are kept; ``normalization`` becomes the plan's dict. A 2D model's two
    in-plane spacings become the plan's 3 RAS entries (which hold them), since volumes are resampled in 3D.
    """
    spacing = data.spacing if data.spacing is not None and len(data.spacing) == 3 else plan.target_spacing
    data = replace(
        data, spacing=list(spacing), patch_size=list(data.patch_size or plan.patch_size),
        normalization=copy.deepcopy(plan.normalization if data.normalization is None else data.normalization))
    model = replace(model, strides=copy.deepcopy(plan.strides if model.strides is None else model.strides),
                    channels=list(plan.channels if model.channels is None else model.channels))
    return data, model


# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------


def _bytes_text(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]],
           formats: Mapping[str, CellFormat] | None = None) -> list[str]:
    """The lines of an indented report table: numbers as :func:`_num` writes them (or by ``formats``), None as -."""
    formats = {**dict.fromkeys(header, _num), **(formats or {})}
    return text_table(header, rows, formats=formats, missing="-", indent="  ").splitlines()


def _num(value: Any) -> str:
    """Compact text of a number or a nested list of numbers."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_num(v) for v in value) + "]"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_plan(plan: Plan, fingerprint: Mapping[str, Any]) -> str:
    """A readable report (text) of the key fingerprint statistics and the plan."""
    spacings, shapes = _case_array(fingerprint, "spacing"), _case_array(fingerprint, "shape")
    orientations: dict[str, int] = {}
    for case in fingerprint["cases"]:
        orientations[case["orientation"]] = orientations.get(case["orientation"], 0) + 1
    lines = [f"dataset {fingerprint['name']}: {fingerprint['num_cases']} cases, channels "
             f"{', '.join(fingerprint['channel_names'])}; files "
             f"{', '.join(f'{k} x{n}' for k, n in orientations.items())}", "", "fingerprint (RAS axes)"]
    lines += _table(["", *AXIS_NAMES], [
        ["spacing median (mm)", *np.median(spacings, axis=0)],
        ["spacing min (mm)", *spacings.min(axis=0)],
        ["spacing max (mm)", *spacings.max(axis=0)],
        ["shape median (voxels)", *(int(n) for n in np.median(shapes, axis=0))],
        ["shape min (voxels)", *(int(n) for n in shapes.min(axis=0))],
        ["shape max (voxels)", *(int(n) for n in shapes.max(axis=0))],
    ])
    lines += ["", "foreground intensity"]
    lines += _table(["channel", "mean", "std", "min", "max", "p0.5", "p99.5"], [
        [name, *((None,) * 6 if s is None else (s["mean"], s["std"], s["min"], s["max"],
                                                 s["percentile_00_5"], s["percentile_99_5"]))]
        for name, s in zip(fingerprint["channel_names"], fingerprint["intensity"])
    ])
    total = max(sum(fingerprint["class_voxels"]), 1)
    lines += ["", "classes"]
    lines += _table(["class", "voxels", "share"], [
        [f"{k} {fingerprint['labels'].get(str(k), '')}", n, n / total]
        for k, n in enumerate(fingerprint["class_voxels"])
    ], formats={"share": ".2%"})
    axes = [0, 1, 2] if plan.spatial_dims == 3 else [a for a in range(3) if a != plan.slice_axis]
    lines += ["", f"plan ({plan.spatial_dims}D; thick axis {AXIS_NAMES[plan.slice_axis]})"]
    lines += _table(["", *(AXIS_NAMES[a] for a in axes)], [
        ["target spacing (mm)", *(plan.target_spacing[a] for a in axes)],
        ["median shape (resampled)", *plan.median_shape],
        ["patch size (voxels)", *plan.patch_size],
        *[[f"stride level {i + 1}", *level] for i, level in enumerate(plan.strides)],
        ["total stride", *total_stride(plan.strides, plan.spatial_dims)],
    ])
    norm = plan.normalization
    details = ", ".join(f"{k}={_num(v)}" for k, v in norm.items() if k != "scheme")
    lines += ["", f"normalization: {norm['scheme']}" + (f" ({details})" if details else ""),
              f"channels: {_num(plan.channels)} ({len(plan.channels)} levels)",
              f"patch voxels: {int(np.prod(plan.patch_size)):,}"
              + (f", fit to {plan.budget}" if plan.budget else " (data.patch_size)")]
    if plan.memory is not None:
        lines.append(f"training memory (estimate): {memory_text(plan.memory)}")
    lines.append(f"resampled dataset: {_bytes_text(plan.dataset_bytes)} (float32 images and labels)")
    return "\n".join(lines)


def memory_text(estimate: MemoryEstimate) -> str:
    """One line of an estimate: the step's total, and its parts."""
    shared = f", dense attention bias {_bytes_text(estimate.shared)}" if estimate.shared else ""
    return (f"{_bytes_text(estimate.total)} per training step: {estimate.batch} patches x "
            f"{_bytes_text(estimate.per_sample)} per sample, weights, gradients and optimizer state "
            f"{_bytes_text(estimate.states)}{shared}")


def plan_report(data: DataConfig, model: ModelConfig, progress: bool = True, trainer: TrainerConfig | None = None,
                planning: PlanningConfig | None = None) -> str:
    """The fingerprint-and-plan report of ``data`` for ``model`` (``scripts/plan.py``), for the training ``trainer``
    describes, sized by ``planning`` (:func:`plan_from_config`)."""
    info = dataset_from_config(data)
    fingerprint = compute_fingerprint(info, dataset_cache_dir(info.root, data.cache_dir) / FINGERPRINT_FILE,
                                      progress)
    text = format_plan(plan_from_config(fingerprint, data, model, trainer, planning), fingerprint)
    kept = [f"{key}={value}" for key, value in plannable_values(data, model).items() if value is not None]
    note = f"\nkept from the config (set them to null to plan them): {'; '.join(kept)}" if kept else ""
    return text + note
