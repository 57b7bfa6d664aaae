"""The data of a training run, once its config is planned (:mod:`.planning`): split the fold, choose the cache and
build the cached datasets and the training loader."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import monai.transforms as mt
import torch
from monai.data import CacheDataset, DataLoader, Dataset, PersistentDataset, partition_dataset
from torch.utils.data import RandomSampler

from medseg.config import DataConfig, TrainConfig
from medseg.data.datalist import DatasetInfo, dataset_cache_dir, split_cases, splits_path
from medseg.data.nnunet_draws import collate_with_draws
from medseg.data.sampling import ForegroundBatchSampler, PlacedCases, cropper_of
from medseg.data.transforms import (
    Window,
    augment_on_device,
    batched_augmentation,
    cached_sampling_name,
    eval_transforms,
    patch_sampling,
    train_transforms,
    window,
)
from medseg.io import atomic_write_json
from medseg.planning.fingerprint import files_digest
from medseg.planning.plan import Plan
from medseg.planning.ram import GIB, RamEstimate, estimate_training_ram
from medseg.runs.layout import RunLayout
from medseg.runtime.device import resolve_device
from medseg.runtime.host_memory import available_ram_bytes, release_freed_memory
from medseg.runtime.launch import DistInfo
from medseg.training.loop import loader_worker_init

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


BatchAugment = Callable[[torch.Tensor, torch.Tensor, Sequence[Any]], tuple[torch.Tensor, torch.Tensor]]
"""``augment(image, label, draws)``: a training batch augmented on the training device."""


@dataclass
class PreparedData:
    """Everything the trainer needs about the data, with every planned value resolved."""

    info: DatasetInfo
    window: Window
    train_loader: DataLoader
    train_dataset: Dataset
    val_dataset: Dataset
    val_patch_loader: DataLoader | None = None
    """``trainer.val_iterations`` batches of validation patches (:func:`validation_patches`); None without them."""
    batch_augment: BatchAugment | None = None
    """``data.augment_on`` resolved to the device: ``batch_augment(image, label, batch[DRAWS])`` augments a training
    batch on the training device (:func:`~medseg.data.transforms.batched_augmentation`); None: the workers did."""


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


def _disk_cache_dirs(cache_dir: Path, info: DatasetInfo, data: DataConfig, spatial_dims: int) -> tuple[Path, Path]:
    """Training and validation folders for ``data.cache=disk``, keyed by what made their contents.

    A disk cache holds each case after the deterministic transforms: resampling, normalisation and the label
    values mapped to class indices, and in training also the deterministic head of the sampling (the padding to the
    crop, or nnU-Net's class locations: :func:`~medseg.data.transforms.cached_sampling_name`). The key covers those
    settings and the case files (path, size, mtime), so changed files or settings never reuse stale volumes.
    """
    files = files_digest([*info.training, *(info.validation or [])])
    labels = [info.label_values, info.ignore_value]
    made_by = [data.spacing, data.normalization, files, labels]
    if data.resampling != "linear":  # linear's caches keep the key they had before data.resampling
        made_by.append(data.resampling)
    key = hashlib.sha1(json.dumps(made_by).encode()).hexdigest()[:12]
    base = cache_dir / f"preprocessed_{key}"
    return base / f"train_{cached_sampling_name(data, spatial_dims)}", base / "val"


def prepare_data(cfg: TrainConfig, info: DatasetInfo, plan: Plan, output_dir: Path, dist: DistInfo) -> PreparedData:
    """Split the fold, write ``splits.json``, and build the cached datasets and the training loader.

    ``cfg`` is planned (:func:`medseg.training.planning.plan_config`). Under DDP each rank gets its own share of the
    training and validation cases.
    """
    data, spatial_dims = cfg.data, cfg.model.spatial_dims
    cache_dir = dataset_cache_dir(info.root, data.cache_dir)
    train_cases, val_cases = split_cases(info, data.fold, data.num_folds, data.split_seed,
                                         splits_file=splits_path(cache_dir, data), given=data.splits)
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
    train_dir, val_dir = _disk_cache_dirs(cache_dir, info, data, spatial_dims)
    if dist.is_main:
        per_rank = f" (rank 0's share of {dist.world_size} ranks)" if dist.enabled else ""
        log.info("data: %d training / %d validation cases%s; cache=%s (%s)%s", len(train_cases), len(val_cases),
                 per_rank, cache, reason, f"; preprocessed cases in {train_dir.parent}" if cache == "disk" else "")
    on_device = augment_on_device(data, resolve_device(cfg.trainer.device).type)
    if dist.is_main:
        log.info("data.augment=%s runs on the %s (data.augment_on=%s)", data.augment,
                 "training device" if on_device else "loader workers", data.augment_on)
    make = CACHE_MODES[cache]
    val_ds = make(val_cases, eval_transforms(data, labels=info.label_spec), val_dir, data.num_workers)
    if shared:  # data.fold=all in one process: train on the validation cache, each case preprocessed and held once
        train_ds = Dataset(val_ds, mt.Compose(patch_sampling(data, spatial_dims, info.label_spec, on_device=on_device)))
    else:
        train_ds = make(train_cases, train_transforms(data, spatial_dims, info.label_spec, on_device), train_dir,
                        data.num_workers)
    release_freed_memory()  # what caching freed, before the loader workers fork
    trainer = cfg.trainer
    loader = patch_loader(train_ds, trainer.batch_size, data.num_workers, trainer.iterations_per_epoch,
                          collate_with_draws if on_device else None)
    val_patches = (validation_patches(val_ds, data, spatial_dims, info, trainer.batch_size, trainer.val_iterations)
                   if trainer.val_iterations and len(val_ds) else None)
    batch_augment = batched_augmentation(data, spatial_dims, info.label_spec) if on_device else None
    return PreparedData(info, view, loader, train_ds, val_ds, val_patches, batch_augment)


def patch_loader(dataset: Dataset, batch: int, workers: int, iterations: int | None,
                 collate: Callable[[Sequence[Any]], Any] | None = None) -> DataLoader:
    """The loader of a patch dataset: ``iterations`` batches of ``batch`` cases drawn at random with replacement
    (nnU-Net's epoch), or with ``iterations`` None one pass over the cases in a shuffled order. Either draws its
    order from torch's global RNG, which the trainer seeds each epoch. With nnU-Net's sampling
    (:class:`~medseg.data.sampling.RandNnunetCropd`) the foreground crops are counted per batch, as nnU-Net counts
    them (:class:`~medseg.data.sampling.ForegroundBatchSampler`). ``collate``: the batches' collate (MONAI's
    ``list_data_collate`` when None)."""
    extra: dict[str, Any] = {} if collate is None else {"collate_fn": collate}
    if iterations is None:
        sampler, drop_last = RandomSampler(dataset), len(dataset) > batch
    else:
        sampler, drop_last = RandomSampler(dataset, replacement=True, num_samples=iterations * batch), False
    crop = cropper_of(dataset)
    if crop is None:
        return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=drop_last, num_workers=workers,
                          worker_init_fn=loader_worker_init, **extra)
    batches = ForegroundBatchSampler(sampler, batch, drop_last, crop.num_samples, crop.fraction)
    return DataLoader(PlacedCases(dataset, crop), batch_sampler=batches, num_workers=workers,
                      worker_init_fn=loader_worker_init, **extra)


def validation_patches(val_ds: Dataset, data: DataConfig, spatial_dims: int, info: DatasetInfo, batch: int,
                       iterations: int) -> DataLoader:
    """``trainer.val_iterations`` batches of patches of the (preprocessed, cached) validation cases, sampled as the
    training patches are (a share of them centred on foreground) without augmentation: the pseudo-Dice's input."""
    patches = Dataset(val_ds, mt.Compose(patch_sampling(data, spatial_dims, info.label_spec, augment=False)))
    return patch_loader(patches, batch, data.num_workers, iterations)
