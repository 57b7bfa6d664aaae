"""From the ``data`` config to loaders: demo generation, dataset reading, verification, planning, folds, caching."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monai.data import CacheDataset, DataLoader, Dataset, PersistentDataset, partition_dataset

from medseg.data.datalist import DatasetInfo, dataset_from_config, split_cases, splits_path
from medseg.data.planning import PLANNED_DATA_KEYS, apply_plan, default_cache_dir, files_digest, plan_for
from medseg.data.transforms import eval_transforms, patch_size_3d, slice_axis, train_transforms
from medseg.data.verify import check_dataset
from medseg.engine.distributed import DistInfo, barrier, broadcast_object
from medseg.io import atomic_write_json

log = logging.getLogger("medseg")

MEMORY_CACHE_FRACTION = 0.25
"""``data.cache=auto`` caches in RAM when the preprocessed dataset needs less than this share of it."""


@dataclass
class PreparedData:
    """Everything the trainer needs about the data, with every planned value resolved."""

    info: DatasetInfo
    data_cfg: dict[str, Any]
    model_cfg: dict[str, Any]
    train_loader: DataLoader
    train_dataset: Dataset
    val_dataset: Dataset
    slice_axis: int
    roi_size: list[int]
    """The 3D sliding window: the patch, 1 voxel thick along ``slice_axis`` in 2D."""
    net_patch_size: list[int]
    """The network's own input patch (in-plane only in 2D)."""


def read_dataset(data_cfg: dict[str, Any], dist_info: DistInfo) -> DatasetInfo:
    """Read the dataset of ``data_cfg``; rank 0 generates the demo data on first use while the others wait."""
    info = dataset_from_config(data_cfg) if dist_info.is_main else None
    barrier(dist_info)
    return info or dataset_from_config(data_cfg)


def _physical_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _choose_cache(mode: str, dataset_bytes: int) -> str:
    if mode != "auto":
        return mode
    return "memory" if dataset_bytes < MEMORY_CACHE_FRACTION * _physical_memory_bytes() else "disk"


def _cache_reason(mode: str, dataset_bytes: int) -> str:
    """Why :func:`_choose_cache` chose what it did, for the log."""
    if mode != "auto":
        return f"data.cache={mode}"
    share = dataset_bytes / _physical_memory_bytes()
    return (f"auto: the preprocessed data, about {dataset_bytes / 2**20:.1f} MB, is {100 * share:.2g}% of the RAM; "
            f"memory below {100 * MEMORY_CACHE_FRACTION:.0f}%")


def _disk_cache_dirs(cache_dir: Path, info: DatasetInfo, data_cfg: dict[str, Any],
                     crop: list[int]) -> tuple[Path, Path]:
    """Training and validation folders for ``data.cache=disk``, keyed by what made their contents.

    A disk cache holds each case after the deterministic transforms: resampling and normalisation, and
    in training also the padding to the patch ``crop``. The key covers those settings and the case
    files (path, size, mtime), so changed files or settings never reuse stale volumes.
    """
    files = files_digest([*info.training, *(info.validation or [])])
    key = hashlib.sha1(json.dumps([data_cfg["spacing"], data_cfg["normalization"], files]).encode()).hexdigest()[:12]
    base = cache_dir / f"preprocessed_{key}"
    return base / f"train_pad{'x'.join(map(str, crop))}", base / "val"


def _dataset(entries: list[dict[str, Any]], transform: Any, cache: str, cache_dir: Path, workers: int) -> Dataset:
    if cache == "memory":
        return CacheDataset(entries, transform, cache_rate=1.0, num_workers=max(workers, 1), progress=False)
    if cache == "disk":
        return PersistentDataset(entries, transform, cache_dir=cache_dir)
    return Dataset(entries, transform)


def prepare_data(cfg: dict[str, Any], output_dir: Path, dist_info: DistInfo, progress: bool) -> PreparedData:
    """Read, verify and plan the dataset, split the fold, and build cached datasets and the train loader.

    ``cfg`` is the whole plain config. Planned values (``data.spacing``, ``data.patch_size``,
    ``data.normalization``, ``model.strides`` when null) come from the dataset fingerprint, computed
    once and cached. Under DDP each rank gets its own share of the training and validation cases.
    """
    data_cfg, model_cfg = cfg["data"], cfg["model"]
    info = read_dataset(data_cfg, dist_info)
    cache_dir = default_cache_dir(info, data_cfg)
    if dist_info.is_main:
        error = None
        try:
            if cfg["trainer"]["check_data"]:
                check_dataset(info, progress=progress)
            plan = plan_for(info, data_cfg, model_cfg, cache_dir, progress=progress)
        except ValueError as err:
            error = err
        broadcast_object(str(error) if error else None, dist_info)
        if error:
            raise error
    else:
        message = broadcast_object(None, dist_info)
        if message:
            raise ValueError(message)
        plan = plan_for(info, data_cfg, model_cfg, cache_dir, progress=False)
    planned = [f"data.{k}" for k in PLANNED_DATA_KEYS if data_cfg[k] is None]
    planned += ["model.strides"] if model_cfg.get("strides") is None else []
    data_cfg, model_cfg = apply_plan(data_cfg, model_cfg, plan)
    if dist_info.is_main:
        normalization = data_cfg["normalization"]
        spacing = ", ".join(f"{float(mm):.4g}" for mm in data_cfg["spacing"])
        log.info("preprocessing: spacing [%s] mm, patch %s, strides %s, normalization %s (planned: %s)",
                 spacing, data_cfg["patch_size"], model_cfg["strides"],
                 normalization if isinstance(normalization, str) else normalization["scheme"],
                 ", ".join(planned) or "nothing, all set in the config")

    train_cases, val_cases = split_cases(info, data_cfg["fold"], data_cfg["num_folds"], data_cfg["split_seed"],
                                         splits_file=splits_path(cache_dir, data_cfg))
    if dist_info.is_main:
        atomic_write_json(output_dir / "splits.json", {
            "fold": data_cfg["fold"], "train": [c["case"] for c in train_cases], "val": [c["case"] for c in val_cases],
        })
    if dist_info.enabled:
        train_cases = partition_dataset(train_cases, num_partitions=dist_info.world_size, shuffle=True,
                                        seed=data_cfg["split_seed"], even_divisible=True)[dist_info.rank]
        val_cases = partition_dataset(val_cases, num_partitions=dist_info.world_size)[dist_info.rank]

    cache = _choose_cache(data_cfg["cache"], plan.dataset_bytes)
    spatial_dims = model_cfg["spatial_dims"]
    axis = slice_axis(data_cfg["spacing"])
    roi = patch_size_3d(data_cfg["patch_size"], spatial_dims, axis)
    train_dir, val_dir = _disk_cache_dirs(cache_dir, info, data_cfg, roi)
    if dist_info.is_main:
        per_rank = f" (rank 0's share of {dist_info.world_size} ranks)" if dist_info.enabled else ""
        log.info("data: %d training / %d validation cases%s; cache=%s (%s)%s", len(train_cases), len(val_cases),
                 per_rank, cache, _cache_reason(data_cfg["cache"], plan.dataset_bytes),
                 f"; preprocessed cases in {train_dir.parent}" if cache == "disk" else "")
    workers = data_cfg["num_workers"]
    train_ds = _dataset(train_cases, train_transforms(data_cfg, spatial_dims), cache, train_dir, workers)
    val_ds = _dataset(val_cases, eval_transforms(data_cfg), cache, val_dir, workers)
    loader = DataLoader(train_ds, batch_size=cfg["trainer"]["batch_size"], shuffle=True, num_workers=workers,
                        drop_last=len(train_ds) > cfg["trainer"]["batch_size"])
    net_patch = roi if spatial_dims == 3 else [s for a, s in enumerate(roi) if a != axis]
    return PreparedData(info, data_cfg, model_cfg, loader, train_ds, val_ds, axis, roi, net_patch)
