"""The data steps of a training run: plan the preprocessing, then split the fold and build cached datasets."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import monai.transforms as mt
from monai.data import CacheDataset, DataLoader, Dataset, PersistentDataset, partition_dataset

from medseg.config import DataConfig, TrainConfig
from medseg.data.datalist import DatasetInfo, dataset_cache_dir, split_cases, splits_path
from medseg.data.transforms import Window, eval_transforms, patch_sampling, train_transforms, window
from medseg.errors import CheckpointError, ConfigError
from medseg.io import atomic_write_json
from medseg.planning.fingerprint import files_digest
from medseg.planning.from_config import (
    apply_plan,
    dataset_fingerprint,
    plan_from_config,
    plannable_values,
    unset_keys,
    with_plannable,
)
from medseg.planning.plan import Plan
from medseg.planning.plan_file import apply_plan_file, read_plan_file
from medseg.planning.ram import GIB, RamEstimate, estimate_training_ram
from medseg.planning.report import memory_text
from medseg.runs.checkpoint import load_checkpoint
from medseg.runs.layout import RunLayout
from medseg.runtime.device import resolve_device
from medseg.runtime.host_memory import available_ram_bytes, release_freed_memory
from medseg.runtime.launch import DistInfo

log = logging.getLogger("medseg")

MEMORY_CACHE_FRACTION = 0.8
"""``data.cache=auto`` caches in RAM when training's estimated peak RAM with the cases in memory
(:func:`medseg.planning.ram.estimate_training_ram`) is below this share of the available RAM."""

CACHE_MODES: dict[str, Callable[[list[dict[str, Any]], Any, Path, int], Dataset] | None] = {
    "auto": None,
    "memory": lambda cases, transform, folder, workers: CacheDataset(cases, transform, cache_rate=1.0,
                                                                     num_workers=max(workers, 1), progress=False,
                                                                     copy_cache=False),
    "disk": lambda cases, transform, folder, workers: PersistentDataset(cases, transform, cache_dir=folder),
    "none": lambda cases, transform, folder, workers: Dataset(cases, transform),
}
"""The values of ``data.cache`` -> ``dataset(cases, transform, disk-cache folder, workers)``; ``auto`` chooses
``memory`` or ``disk`` from training's estimated peak RAM (:func:`choose_cache`). The memory cache hands out its
volumes without copying them (``copy_cache=False``): the training chain's first random transform is the crop, which
takes views, and no later transform writes into them."""


@dataclass
class PreparedData:
    """Everything the trainer needs about the data, with every planned value resolved."""

    info: DatasetInfo
    window: Window
    train_loader: DataLoader
    train_dataset: Dataset
    val_dataset: Dataset


PLAN_SOURCES = ("data", "init")
"""The values of ``data.plan_from``: plan the null plannable keys from the dataset, or take them all from the
checkpoint the run starts from (:func:`plan_of_checkpoint`)."""


def plan_config(cfg: TrainConfig, info: DatasetInfo, progress: bool,
                start: Path | None = None) -> tuple[TrainConfig, Plan]:
    """``cfg`` with its null plannable keys filled from the dataset's (cached) fingerprint, and the plan.

    Under ``data.plan_from=init`` the plannable keys are first taken from ``start``, the checkpoint the run starts
    from (``trainer.init_from`` or the one it resumes), so none is left to plan; with ``plan.file`` from that plan
    file (:mod:`medseg.planning.plan_file`), which must have been planned for this dataset. Logs the resolved
    preprocessing and network, where they came from, the machine the plan is for (a warning, once, when the run
    trains on another device) and the estimated training memory.

    Raises:
        ConfigError: ``plan.file`` with ``data.plan_from=init``, or a plan file that does not fit the data or network.
    """
    if cfg.plan.file and cfg.data.plan_from == "init":
        raise ConfigError(f"plan.file={cfg.plan.file} and data.plan_from=init both give the plan: keep one")
    if cfg.data.plan_from == "init":
        cfg = plan_of_checkpoint(cfg, start)
    fingerprint = dataset_fingerprint(info, cfg.data, progress)
    plan_file = read_plan_file(cfg.plan.file, fingerprint, cfg.model.spatial_dims) if cfg.plan.file else None
    kept = [key for key, value in plannable_values(cfg.data, cfg.model).items() if value is not None]
    if plan_file is not None:
        data, model, planning = apply_plan_file(cfg.data, cfg.model, cfg.plan, plan_file)
        cfg = replace(cfg, data=data, model=model, plan=planning)
    planned = unset_keys(cfg.data, cfg.model)
    plan = plan_from_config(fingerprint, cfg.data, cfg.model, cfg.trainer, cfg.plan)
    if plan_file is not None:
        plan = replace(plan, target=plan_file.target, budget=plan_file.budget)
    data, model = apply_plan(cfg.data, cfg.model, plan)
    normalization = data.normalization if isinstance(data.normalization, str) else data.normalization["scheme"]
    if cfg.data.plan_from == "init":
        origin = f"taken from {start}"
    elif plan_file is not None:
        origin = f"taken from plan.file={cfg.plan.file}"
        if kept:
            origin += f"; kept from the config: {', '.join(kept)}"
    else:
        origin = f"planned: {', '.join(planned) or 'nothing, all set in the config'}"
    spacing = ", ".join(f"{float(mm):.4g}" for mm in data.spacing)
    log.info("preprocessing: spacing [%s] mm, patch %s, strides %s, channels %s, normalization %s (%s)", spacing,
             data.patch_size, model.strides, model.channels, normalization, origin)
    log.info("planned for: %s", plan.target.text())
    trains_on = resolve_device(cfg.trainer.device).type
    if plan.target.device != trains_on:
        log.warning("the plan is for %s but this run trains on %s: its patch and network were sized for the other "
                    "device (plan.device=%s)", plan.target.device, trains_on, cfg.plan.device)
    if plan.memory is not None:
        log.info("memory: %s%s", memory_text(plan.memory), f"; the patch fits {plan.budget}" if plan.budget else "")
    return replace(cfg, data=data, model=model), plan


def plan_of_checkpoint(cfg: TrainConfig, path: Path | None) -> TrainConfig:
    """``cfg`` with the resolved ``data.spacing``, ``data.patch_size``, ``data.normalization``, ``model.strides`` and
    ``model.channels`` of the checkpoint at ``path`` (``data.plan_from=init``).

    Raises:
        ConfigError: no checkpoint (``path`` None: a resume without ``last.pt``).
        CheckpointError: the checkpoint is missing or foreign, or holds no resolved values for these keys.
    """
    if path is None:
        raise ConfigError("data.plan_from=init: there is no checkpoint to take the plan from (trainer.resume=true "
                          "but the run has no last.pt); set trainer.init_from=<checkpoint> or data.plan_from=data")
    source = load_checkpoint(path, needs=("config",))["config"] or {}
    try:
        values = {key: source[key.split(".")[0]][key.split(".")[1]] for key in plannable_values(cfg.data, cfg.model)}
    except (KeyError, TypeError):
        values = {}
    unset = [key for key in plannable_values(cfg.data, cfg.model) if values.get(key) is None]
    if unset:
        raise CheckpointError(f"checkpoint {path} holds no resolved {', '.join(unset)} for data.plan_from=init; "
                              f"use data.plan_from=data")
    data, model = with_plannable(cfg.data, cfg.model, values)
    return replace(cfg, data=data, model=model)


def choose_cache(mode: str, needed: RamEstimate, available: int) -> tuple[str, str]:
    """The cache mode ``data.cache=mode`` stands for, and why (for the log).

    ``auto`` is ``memory`` when ``needed``, training's estimated peak RAM with the cases in memory, is below
    :data:`MEMORY_CACHE_FRACTION` of the ``available`` bytes (:func:`medseg.runtime.host_memory.available_ram_bytes`),
    else ``disk``.
    """
    if mode not in ("auto", "memory"):
        return mode, f"data.cache={mode}"
    share = needed.total / available
    estimate = (f"training's peak RAM with the cases in memory, estimated {needed.text()}, is {100 * share:.2g}% of "
                f"the {available / GIB:.1f} GiB available")
    if mode == "memory":
        return mode, f"data.cache=memory; {estimate}"
    chosen = "memory" if share < MEMORY_CACHE_FRACTION else "disk"
    return chosen, f"auto: {estimate}; memory below {100 * MEMORY_CACHE_FRACTION:.0f}%"


def _disk_cache_dirs(cache_dir: Path, info: DatasetInfo, data: DataConfig, crop: list[int]) -> tuple[Path, Path]:
    """Training and validation folders for ``data.cache=disk``, keyed by what made their contents.

    A disk cache holds each case after the deterministic transforms: resampling, normalisation and the label
    values mapped to class indices, and in training also the padding to the patch ``crop``. The key covers those
    settings and the case files (path, size, mtime), so changed files or settings never reuse stale volumes.
    """
    files = files_digest([*info.training, *(info.validation or [])])
    labels = [info.label_values, info.ignore_value]
    key = hashlib.sha1(json.dumps([data.spacing, data.normalization, files, labels]).encode()).hexdigest()[:12]
    base = cache_dir / f"preprocessed_{key}"
    return base / f"train_pad{'x'.join(map(str, crop))}", base / "val"


def prepare_data(cfg: TrainConfig, info: DatasetInfo, plan: Plan, output_dir: Path, dist: DistInfo) -> PreparedData:
    """Split the fold, write ``splits.json``, and build the cached datasets and the training loader.

    ``cfg`` is planned (:func:`plan_config`). Under DDP each rank gets its own share of the training and
    validation cases.
    """
    data, spatial_dims = cfg.data, cfg.model.spatial_dims
    cache_dir = dataset_cache_dir(info.root, data.cache_dir)
    train_cases, val_cases = split_cases(info, data.fold, data.num_folds, data.split_seed,
                                         splits_file=splits_path(cache_dir, data))
    if dist.is_main:
        atomic_write_json(RunLayout(output_dir).splits_file, {
            "fold": data.fold, "train": [c["case"] for c in train_cases], "val": [c["case"] for c in val_cases]})
    if dist.enabled:
        train_cases = partition_dataset(train_cases, num_partitions=dist.world_size, shuffle=True,
                                        seed=data.split_seed, even_divisible=True)[dist.rank]
        val_cases = partition_dataset(val_cases, num_partitions=dist.world_size)[dist.rank]

    view = window(data, spatial_dims)
    shared = [c["case"] for c in train_cases] == [c["case"] for c in val_cases]
    on_cpu = resolve_device(cfg.trainer.device).type == "cpu"
    needed = estimate_training_ram(plan.dataset_bytes, len(info.training),
                                   len(val_cases) if shared else len(train_cases) + len(val_cases),
                                   info.in_channels, info.num_outputs, data.num_workers,
                                   plan.memory.total if on_cpu and plan.memory is not None else 0)
    cache, reason = choose_cache(data.cache, needed, available_ram_bytes())
    train_dir, val_dir = _disk_cache_dirs(cache_dir, info, data, view.roi_size)
    if dist.is_main:
        per_rank = f" (rank 0's share of {dist.world_size} ranks)" if dist.enabled else ""
        log.info("data: %d training / %d validation cases%s; cache=%s (%s)%s", len(train_cases), len(val_cases),
                 per_rank, cache, reason, f"; preprocessed cases in {train_dir.parent}" if cache == "disk" else "")
    make = CACHE_MODES[cache]
    val_ds = make(val_cases, eval_transforms(data, labels=info.label_spec), val_dir, data.num_workers)
    if shared:  # data.fold=all in one process: train on the validation cache, each case preprocessed and held once
        train_ds = Dataset(val_ds, mt.Compose(patch_sampling(data, spatial_dims, info.label_spec)))
    else:
        train_ds = make(train_cases, train_transforms(data, spatial_dims, info.label_spec), train_dir,
                        data.num_workers)
    release_freed_memory()  # what caching freed, before the loader workers fork
    batch = cfg.trainer.batch_size
    loader = DataLoader(train_ds, batch_size=batch, shuffle=True, num_workers=data.num_workers,
                        drop_last=len(train_ds) > batch)
    return PreparedData(info, view, loader, train_ds, val_ds)
