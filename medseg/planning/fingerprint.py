"""The dataset fingerprint nnU-Net plans from, computed once and cached while the case files are unchanged.

Axis convention: every per-axis value here (spacing in mm, shape in voxels) is in **RAS voxel-axis order**, the
order MONAI's ``Orientationd(axcodes="RAS")`` produces: axis 0 runs left -> right (R), axis 1 posterior ->
anterior (A), axis 2 inferior -> superior (S). Files stored in another orientation (DICOM's LPS, or permuted axes)
are reoriented on reading (:mod:`medseg.data.reading`).

:func:`compute_fingerprint` reads every training case once (:func:`~medseg.data.reading.read_case`) and records its
spacing, shape, orientation, class voxel counts and foreground intensity statistics; a sample of foreground voxels
per case is pooled into dataset-level statistics. The result is JSON, cached and reused while the case files are
unchanged (:func:`files_digest`).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from medseg.data.datalist import DatasetInfo
from medseg.data.labels import LabelSpec
from medseg.data.reading import image_paths, read_case
from medseg.errors import DatasetError
from medseg.io import atomic_write_json

FINGERPRINT_VERSION = 2
"""Bumped when the fingerprint's content changes, which invalidates every cache."""
FINGERPRINT_FILE = "fingerprint.json"
"""Name of the fingerprint's cache file in a dataset's cache folder."""
SAMPLES_PER_CASE = 10_000
"""Foreground voxels sampled per case (all of them when a case has fewer) for the pooled statistics."""
SAMPLING_SEED = 1234
PERCENTILES = (0.5, 99.5)

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
    """Hash of the entries' image and label files (path, size, mtime; a DICOM series folder: each of its files'): it
    changes when any file does.

    Raises:
        DatasetError: a file is missing (the message names the case and path).
    """
    digest = hashlib.sha256()
    for entry in entries:
        for path in [*image_paths(entry), *([str(entry["label"])] if entry.get("label") else [])]:
            files = sorted(p for p in Path(path).iterdir() if p.is_file()) if Path(path).is_dir() else [path]
            for file in files:
                try:
                    stat = os.stat(file)
                except OSError as err:
                    raise DatasetError(f"case {entry['case']}: {path} not found") from err
                digest.update(f"{entry['case']}|{file}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
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


def case_array(fingerprint: Mapping[str, Any], key: str) -> np.ndarray:
    """(N, 3) per-case ``spacing`` (mm) or ``shape`` (voxels), RAS order."""
    return np.asarray([case[key] for case in fingerprint["cases"]], dtype=float)


def resampled_shapes(fingerprint: Mapping[str, Any], target: Sequence[float],
                      keep_axis: int | None = None) -> np.ndarray:
    """(N, 3) case shapes in voxels after resampling to ``target`` (3,) mm; ``keep_axis`` is not resampled."""
    factors = case_array(fingerprint, "spacing") / np.asarray(target, dtype=float)
    if keep_axis is not None:
        factors[:, keep_axis] = 1.0
    return np.maximum(np.round(case_array(fingerprint, "shape") * factors), 1).astype(np.int64)


def dataset_bytes(fingerprint: Mapping[str, Any], shapes: np.ndarray) -> int:
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
    median_spacing = np.median(case_array(fingerprint, "spacing"), axis=0)
    fingerprint.update({
        "intensity": [_intensity_stats(np.concatenate(channel)) for channel in pooled],
        "class_voxels": [int(n) for n in np.sum([c["class_voxels"] for c in cases], axis=0)],
        "median_spacing": median_spacing.tolist(),
        "median_shape": np.median(case_array(fingerprint, "shape"), axis=0).tolist(),
        "dataset_bytes": dataset_bytes(fingerprint, resampled_shapes(fingerprint, median_spacing)),
    })
    if cache_file is not None:
        try:
            atomic_write_json(cache_file, fingerprint)
        except OSError as err:
            warnings.warn(f"{cache_file}: fingerprint cache not written ({err})", stacklevel=2)
    return fingerprint
