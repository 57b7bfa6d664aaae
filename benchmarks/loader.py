"""``benchmark.py loader``: the CPU time a training patch costs the data loader, for each ``data.augment`` chain.

``python scripts/benchmark.py loader data.root=DIR [data=msd] [data.patch_size=[96,96,40]] [--patches 64]``

The dataset is planned and its training cases preprocessed as ``scripts/train.py`` does (resampling, normalisation:
the cache a run holds), once; then each chain of :data:`medseg.data.transforms.AUGMENTATIONS` (``none``, ``light``,
``nnunet``) draws patches from the cached cases as a loader worker does (:func:`medseg.data.transforms.patch_sampling`:
the chain's sampling of crops, its augmentation, the loss's target; what precedes its first random transform is
applied once, as the cache holds it), on one thread, round-robin over the chains
so that a change of the machine's load hits all of them alike. A chain's cost is the process CPU seconds per patch
(``time.process_time``), and its patches per second on one core the inverse; ``--step`` (seconds of a training step
of ``--batch`` patches on the training device) gives the worker processes each chain needs to keep that device fed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import monai.transforms as mt
import torch

from benchmarks.common import add_results_argument, compose_train_config, machine, write_report
from medseg.data.datalist import dataset_from_config
from medseg.data.transforms import AUGMENTATIONS, eval_transforms, patch_sampling, samples_per_volume
from medseg.tables import markdown_table
from medseg.training.checks import check_config
from medseg.training.planning import plan_config

DEFAULT_OUT = Path("outputs/benchmark/loader")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py loader``'s arguments."""
    parser.add_argument("overrides", nargs="*", help="training config overrides (data.root=DIR is required)")
    parser.add_argument("--patches", type=int, default=64, help="patches each chain draws (after --warmup)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed patches of each chain first")
    parser.add_argument("--cases", type=int, default=8, help="training cases preprocessed and drawn from")
    parser.add_argument("--step", type=float, default=None,
                        help="seconds of one training step on the training device: the workers each chain needs")
    parser.add_argument("--batch", type=int, default=2, help="patches per training step (for --step)")
    parser.add_argument("--out", type=Path, default=None, help=f"loader.md/.json (default {DEFAULT_OUT})")
    add_results_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Plan, preprocess the cases once, time every chain round-robin, write the report."""
    torch.set_num_threads(1)  # a loader worker's share
    cfg = check_config(compose_train_config(["data=msd", "output_dir=unused", *args.overrides]))
    info = dataset_from_config(cfg.data)
    cfg, _ = plan_config(cfg, info, progress=False)
    data, dims = cfg.data, cfg.model.spatial_dims
    preprocess = eval_transforms(data, labels=info.label_spec)
    cases = [preprocess(case) for case in info.training[:args.cases]]
    chains, cached = {}, {}
    for seed, name in enumerate(AUGMENTATIONS):
        transforms = patch_sampling(replace(data, augment=name), dims, info.label_spec)
        first_random = next(i for i, t in enumerate(transforms) if isinstance(t, mt.Randomizable))
        cached[name] = [mt.Compose(transforms[:first_random])(case) for case in cases]
        chains[name] = mt.Compose(transforms[first_random:]).set_random_state(seed)
    per_call = samples_per_volume(data, dims)
    seconds: dict[str, list[float]] = {name: [] for name in chains}
    for call in range(math.ceil((args.warmup + args.patches) / per_call)):
        for name, chain in chains.items():
            started = time.process_time()
            chain(cached[name][call % len(cases)])
            if call * per_call >= args.warmup:
                seconds[name].append((time.process_time() - started) / per_call)
    rows = [_row(name, times, seconds["light"], args) for name, times in seconds.items()]
    report = {"meta": {"machine": machine(torch.device("cpu")), "torch": torch.__version__,
                       "command": "python scripts/benchmark.py loader " + " ".join(args.overrides),
                       "date": time.strftime("%Y-%m-%d"), "patch": list(data.patch_size), "spatial_dims": dims,
                       "spacing": list(data.spacing), "patches": args.patches, "step_seconds": args.step,
                       "batch": args.batch},
              "chains": rows}
    markdown = to_markdown(report)
    print(markdown)
    write_report((args.out or DEFAULT_OUT).resolve(), "loader", markdown, report, args)
    return 0


def _row(name: str, times: list[float], light: list[float], args: argparse.Namespace) -> dict[str, Any]:
    """One chain's figures: mean CPU ms per patch (the mean: a transform drawn for a fifth of the patches costs
    throughput all the same), patches per second on one core, its cost against light's, and the worker processes a
    training step of ``args.step`` seconds needs."""
    per_patch = statistics.fmean(times)
    workers = None if args.step is None else math.ceil(per_patch * args.batch / args.step)
    return {"augment": name, "cpu_ms_per_patch": 1000 * per_patch, "patches_per_core_second": 1 / per_patch,
            "vs_light": per_patch / statistics.fmean(light), "workers_for_step": workers}


def to_markdown(report: dict[str, Any]) -> str:
    """The report's table, under the machine and the patch."""
    meta = report["meta"]
    rows = [[row["augment"], row["cpu_ms_per_patch"], row["patches_per_core_second"], row["vs_light"],
             row["workers_for_step"]] for row in report["chains"]]
    table = markdown_table(["data.augment", "CPU ms / patch", "patches / core-second", "× light",
                            "workers for the step"], rows,
                           formats={"CPU ms / patch": ".1f", "patches / core-second": ".1f", "× light": ".2f"},
                           missing="-")
    return (f"Loader cost per patch, {meta['machine']}, torch {meta['torch']}, {meta['date']}: patch "
            f"{meta['patch']} ({meta['spatial_dims']}D), the mean of {meta['patches']} patches on one thread\n"
            f"`{meta['command']}`\n\n{table}\n")
