"""``benchmark.py loader``: what a training patch costs the data pipeline, for each ``data.augment`` chain, for
nnU-Net's chain on the loader workers and on the training device (``data.augment_on``), and for nnU-Net v2's own
loader and transforms on the same data and patch (where ``nnunetv2`` is installed).

``python scripts/benchmark.py loader data.root=DIR [data=msd] [data.patch_size=[96,96,40]] [--patches 64]
[--step S] [--batch 2] [--device cuda]``

The dataset is planned and its training cases preprocessed as ``scripts/train.py`` does (resampling, normalisation:
the cache a run holds), once; then each chain draws patches from the cached cases as a loader worker does
(:func:`medseg.data.transforms.patch_sampling`: the chain's sampling of crops, its augmentation, the loss's target;
what precedes its first random transform is applied once, as the cache holds it), on one thread, round-robin over the
chains so that a change of the machine's load hits all of them alike:

- ``none``, ``light``, ``nnunet`` on the workers: the whole chain in the worker;
- ``nnunet`` on the device: the worker crops nnU-Net's enlarged patch and draws (:mod:`medseg.data.nnunet_draws`);
  every ``--batch`` patches, :class:`~medseg.data.batched_augment.BatchedNnunetAugment` applies the draws to the
  batch on ``--device`` (the CPU, one thread, where there is no GPU), timed apart;
- ``nnU-Net v2``: the same preprocessed cases written as nnU-Net's preprocessed dataset (unpacked ``.npy``, its
  ``class_locations``, the axes in its order: the thick one first), read by its ``nnUNetDataLoader`` with
  ``nnUNetTrainer.get_training_transforms`` (without deep supervision's downsampled targets, which medseg's loss
  makes on the device), in batches of ``data.samples_per_volume`` patches (its foreground oversampling per batch as
  medseg's per case).

A chain's worker cost is the process CPU seconds per patch (``time.process_time``), its patches per second on one
core the inverse; the device cost is the wall time of the batched application per patch (CUDA synchronised).
``--step`` (seconds of a training step of ``--batch`` patches on the training device) gives the worker processes each
chain needs to keep that device fed: ``ceil(worker seconds per patch * batch / step)``. The target: the device path's
workers spend at most a fifth of nnU-Net's CPU per patch.
"""

from __future__ import annotations

import argparse
import math
import pickle
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import monai.transforms as mt
import numpy as np
import torch

from benchmarks.common import (
    Target,
    add_results_argument,
    compose_train_config,
    machine,
    synchronize,
    targets_markdown,
    write_report,
)
from medseg.config import DataConfig
from medseg.data.datalist import dataset_from_config
from medseg.data.labels import LabelSpec
from medseg.data.nnunet_augment import is_dummy_2d, nnunet_crop, rotation_range
from medseg.data.nnunet_draws import DRAWS, collate_with_draws
from medseg.data.reading import IMAGE, LABEL
from medseg.data.sampling import class_locations
from medseg.data.transforms import (
    AUGMENTATIONS,
    batched_augmentation,
    eval_transforms,
    patch_sampling,
    samples_per_volume,
    window,
)
from medseg.tables import markdown_table
from medseg.training.checks import check_config
from medseg.training.planning import plan_config

DEFAULT_OUT = Path("outputs/benchmark/loader")
NNUNET = "nnU-Net v2"
WORKER_SHARE_GOAL = 0.2
"""The device path's worker CPU per patch, at most this share of nnU-Net's own loader's."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py loader``'s arguments."""
    parser.add_argument("overrides", nargs="*", help="training config overrides (data.root=DIR is required)")
    parser.add_argument("--patches", type=int, default=64, help="patches each chain draws (after --warmup)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed patches of each chain first")
    parser.add_argument("--cases", type=int, default=8, help="training cases preprocessed and drawn from")
    parser.add_argument("--step", type=float, default=None,
                        help="seconds of one training step on the training device: the workers each chain needs")
    parser.add_argument("--batch", type=int, default=2,
                        help="patches per training step (for --step, and the device path's batches)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the device path applies its draws (default: cuda where present, else cpu)")
    parser.add_argument("--no-nnunet", action="store_true", help="leave out nnU-Net v2's own loader")
    parser.add_argument("--out", type=Path, default=None, help=f"loader.md/.json (default {DEFAULT_OUT})")
    add_results_argument(parser)


@dataclass
class Chain:
    """One row of the table: what a worker runs per case (``worker(index)`` draws ``per_call`` patches of cached case
    ``index``), and for the device path what the device then runs; the seconds of each."""

    name: str
    where: str
    worker: Callable[[int], Any]
    device: Callable[[list[Any]], None] | None = None
    worker_seconds: list[float] = field(default_factory=list)
    device_seconds: list[float] = field(default_factory=list)
    pending: list[Any] = field(default_factory=list)


def run(args: argparse.Namespace) -> int:
    """Plan, preprocess the cases once, time every chain round-robin, write the report."""
    torch.set_num_threads(1)  # a loader worker's share
    device = torch.device(args.device)
    cfg = check_config(compose_train_config(["data=msd", "output_dir=unused", *args.overrides]))
    info = dataset_from_config(cfg.data)
    cfg, _ = plan_config(cfg, info, progress=False)
    data, dims = cfg.data, cfg.model.spatial_dims
    preprocess = eval_transforms(data, labels=info.label_spec)
    cases = [preprocess(case) for case in info.training[:args.cases]]
    per_call = samples_per_volume(data, dims)
    with tempfile.TemporaryDirectory() as folder:
        chains = medseg_chains(data, dims, info.label_spec, cases, args.batch, device)
        if not args.no_nnunet and dims == 3 and nnunet_installed():
            chains.append(nnunet_chain(data, info.label_spec, cases, per_call, Path(folder)))
        for call in range(math.ceil((args.warmup + args.patches) / per_call)):
            for chain in chains:
                timed = call * per_call >= args.warmup
                started = time.process_time()
                patches = chain.worker(call % len(cases))
                if timed:
                    chain.worker_seconds.append((time.process_time() - started) / per_call)
                if chain.device is not None:
                    run_device(chain, patches, args.batch, device, timed)
    light = statistics.fmean(next(c for c in chains if c.name == "light").worker_seconds)
    rows = [_row(chain, light, args) for chain in chains]
    by_name = {(row["augment"], row["where"]): row for row in rows}
    device_row, nnunet_row = by_name.get(("nnunet", "device")), by_name.get((NNUNET, "workers"))
    share = (None if device_row is None or nnunet_row is None
             else device_row["worker_cpu_ms_per_patch"] / nnunet_row["worker_cpu_ms_per_patch"])
    target = Target("worker CPU per patch, nnunet on the device / nnU-Net v2's loader", share, "<=", WORKER_SHARE_GOAL)
    report = {"meta": {"machine": machine(torch.device("cpu")), "device": machine(device), "torch": torch.__version__,
                       "command": "python scripts/benchmark.py loader " + " ".join(args.overrides),
                       "date": time.strftime("%Y-%m-%d"), "patch": list(data.patch_size), "spatial_dims": dims,
                       "spacing": list(data.spacing), "patches": args.patches, "step_seconds": args.step,
                       "batch": args.batch, "patches_per_case": per_call},
              "chains": rows, "targets": [vars(target)]}
    markdown = to_markdown(report)
    print(markdown)
    write_report((args.out or DEFAULT_OUT).resolve(), "loader", markdown, report, args, device)
    return 0


def medseg_chains(data: DataConfig, dims: int, labels: LabelSpec, cases: Sequence[dict[str, Any]], batch: int,
                  device: torch.device) -> list[Chain]:
    """Each ``data.augment`` on the workers, and those with a device path on the device too (the worker draws, the
    device applies)."""
    chains = []
    for seed, (name, on_device) in enumerate([(name, False) for name in AUGMENTATIONS] +
                                             [(name, True) for name, a in AUGMENTATIONS.items() if a.draws]):
        transforms = patch_sampling(replace(data, augment=name), dims, labels, on_device=on_device)
        first_random = next(i for i, t in enumerate(transforms) if isinstance(t, mt.Randomizable))
        cached = [mt.Compose(transforms[:first_random])(case) for case in cases]
        chain = mt.Compose(transforms[first_random:]).set_random_state(seed)
        augment = batched_augmentation(replace(data, augment=name), dims, labels) if on_device else None
        chains.append(Chain(name, "device" if on_device else "workers",
                            lambda index, chain=chain, cached=cached: chain(cached[index]),
                            None if augment is None else _device_half(augment, device)))
    return chains


def _device_half(augment: Callable[..., Any], device: torch.device) -> Callable[[list[Any]], None]:
    """The device's part of a batch of drawn patches: moved to ``device`` and augmented there."""

    def apply(samples: list[Any]) -> None:
        batch = collate_with_draws(samples)
        augment(batch[IMAGE].to(device), batch[LABEL].to(device), batch[DRAWS])

    return apply


def run_device(chain: Chain, patches: Any, batch: int, device: torch.device, timed: bool) -> None:
    """Queue a worker's patches; every ``batch`` of them, time the device's part per patch (wall, synchronised)."""
    chain.pending += patches if isinstance(patches, list) else [patches]
    while len(chain.pending) >= batch:
        samples, chain.pending = chain.pending[:batch], chain.pending[batch:]
        synchronize(device)
        started = time.perf_counter()
        assert chain.device is not None
        chain.device(samples)
        synchronize(device)
        if timed:
            chain.device_seconds.append((time.perf_counter() - started) / batch)


# ------------------------------------------------------------------------------------------- nnU-Net v2's loader


def nnunet_installed() -> bool:
    """Whether nnU-Net v2 (and its augmentation library) can be imported."""
    try:
        import batchgeneratorsv2  # noqa: F401
        import nnunetv2  # noqa: F401
    except ImportError:
        return False
    return True


def write_nnunet_cases(cases: Sequence[dict[str, Any]], folder: Path, slice_axis: int) -> list[str]:
    """The preprocessed ``cases`` as nnU-Net's unpacked preprocessed dataset in ``folder``: ``<id>.npy`` (the image,
    float32), ``<id>_seg.npy`` (the label, int8), ``<id>.npz`` (what nnU-Net lists) and ``<id>.pkl`` (the
    ``class_locations`` nnU-Net's preprocessing stores, channel index first), the axes in nnU-Net's order (the slice
    axis first); their identifiers."""
    order = [0, 1 + slice_axis, *(1 + a for a in range(3) if a != slice_axis)]
    identifiers = []
    for number, case in enumerate(cases):
        identifier = f"case_{number:03d}"
        image = np.ascontiguousarray(np.asarray(case[IMAGE], dtype=np.float32).transpose(order))
        label = np.ascontiguousarray(np.asarray(case[LABEL], dtype=np.int8).transpose(order))
        locations = {value: np.concatenate([np.zeros((len(points), 1), np.int64), points], axis=1)
                     for value, points in class_locations(label[0]).items()}
        np.save(folder / f"{identifier}.npy", image)
        np.save(folder / f"{identifier}_seg.npy", label)
        np.savez(folder / f"{identifier}.npz", data=np.zeros(1), seg=np.zeros(1))
        (folder / f"{identifier}.pkl").write_bytes(pickle.dumps({"class_locations": locations}))
        identifiers.append(identifier)
    return identifiers


def nnunet_chain(data: DataConfig, labels: LabelSpec, cases: Sequence[dict[str, Any]], per_call: int,
                 folder: Path) -> Chain:
    """nnU-Net v2's ``nnUNetDataLoader`` with ``nnUNetTrainer.get_training_transforms`` on ``cases`` (written by
    :func:`write_nnunet_cases`), nnU-Net's patch, enlarged patch, rotation and dummy-2D rule for medseg's patch."""
    from nnunetv2.training.dataloading.data_loader import nnUNetDataLoader
    from nnunetv2.training.dataloading.nnunet_dataset import nnUNetDatasetNumpy
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    from nnunetv2.utilities.label_handling.label_handling import LabelManager

    view = window(data, 3)
    axis = view.slice_axis
    identifiers = write_nnunet_cases(cases, folder, axis)
    order = [axis, *(a for a in range(3) if a != axis)]
    patch = [view.net_patch[a] for a in order]
    enlarged = [nnunet_crop(view.net_patch, 3, axis)[a] for a in order]
    rotation = max(rotation_range(view.net_patch, 3, axis))
    manager = LabelManager({name: value for value, name in labels.labels.items()}, None)
    transforms = nnUNetTrainer.get_training_transforms(
        patch, (-rotation, rotation), None, (0, 1, 2), is_dummy_2d(view.net_patch, axis),
        foreground_labels=manager.foreground_labels)
    loader = nnUNetDataLoader(nnUNetDatasetNumpy(str(folder), identifiers), per_call, enlarged, patch, manager,
                              oversample_foreground_percent=data.pos_fraction, transforms=transforms)
    return Chain(NNUNET, "workers", lambda index: loader.generate_train_batch())


# ------------------------------------------------------------------------------------------- report


def _row(chain: Chain, light: float, args: argparse.Namespace) -> dict[str, Any]:
    """One chain's figures: mean worker CPU ms per patch (the mean: a transform drawn for a fifth of the patches costs
    throughput all the same), the device's ms per patch, patches per second of one worker core, the worker cost
    against light's, and the worker processes a training step of ``args.step`` seconds needs."""
    per_patch = statistics.fmean(chain.worker_seconds)
    device = statistics.fmean(chain.device_seconds) if chain.device_seconds else None
    workers = None if args.step is None else math.ceil(per_patch * args.batch / args.step)
    return {"augment": chain.name, "where": chain.where, "worker_cpu_ms_per_patch": 1000 * per_patch,
            "device_ms_per_patch": None if device is None else 1000 * device,
            "patches_per_core_second": 1 / per_patch, "vs_light": per_patch / light, "workers_for_step": workers}


def to_markdown(report: dict[str, Any]) -> str:
    """The report's table and target, under the machine and the patch."""
    meta = report["meta"]
    rows = [[row["augment"], row["where"], row["worker_cpu_ms_per_patch"], row["device_ms_per_patch"],
             row["patches_per_core_second"], row["vs_light"], row["workers_for_step"]] for row in report["chains"]]
    table = markdown_table(["data.augment", "augmented on", "worker CPU ms / patch", "device ms / patch",
                            "patches / worker core-second", "worker × light", "workers for the step"], rows,
                           formats={"worker CPU ms / patch": ".1f", "device ms / patch": ".1f",
                                    "patches / worker core-second": ".1f", "worker × light": ".2f"},
                           missing="-")
    step = (f"; workers for a step of {meta['step_seconds']:g} s on {meta['batch']} patches"
            if meta["step_seconds"] else "")
    return (f"Loader cost per patch, {meta['machine']} (device: {meta['device']}), torch {meta['torch']}, "
            f"{meta['date']}: patch {meta['patch']} ({meta['spatial_dims']}D), the mean of {meta['patches']} patches "
            f"on one thread, the device path in batches of {meta['batch']}{step}\n"
            f"`{meta['command']}`\n\n{table}\n\n{targets_markdown(report['targets'])}\n")
