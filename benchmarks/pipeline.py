"""``benchmark.py pipeline``: the training device's busy share and the step time of a training run with its loader, for
each place of the random augmentation (``data.augment_on``: workers, device) and each number of loader workers.

``python scripts/benchmark.py pipeline data.root=DIR [training overrides] [--workers 2 4 8] [--steps 20]``

The run is planned and its data prepared as ``scripts/train.py`` does (once per ``data.augment_on``, the cases cached
in memory); for each number of workers a fresh loader of that many worker processes feeds ``--steps`` training steps
(the trainer's own step, after ``--warmup`` untimed ones), and the device's part of each step (the batched
augmentation of the device path, forward, loss, backward, update; synchronised) is timed apart from the wait for the
next batch. The busy share is the device's part over the wall time of the steps: 1 when the loader keeps up, lower
when the device waits for the workers. The step time is the wall time per step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import add_results_argument, compose_train_config, machine, synchronize, write_report
from medseg.data.datalist import dataset_from_config
from medseg.data.nnunet_draws import DRAWS, collate_with_draws
from medseg.models import build_model
from medseg.runtime.device import resolve_device
from medseg.runtime.launch import SINGLE_PROCESS
from medseg.tables import markdown_table
from medseg.training.checks import check_config
from medseg.training.planning import plan_config
from medseg.training.prepare import patch_loader, prepare_data
from medseg.training.trainer import Trainer, seed_everything

DEFAULT_OUT = Path("outputs/benchmark/pipeline")
PATHS = ("workers", "device")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py pipeline``'s arguments."""
    parser.add_argument("overrides", nargs="*", help="training config overrides (data.root=DIR is required)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8], help="loader worker processes to try")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per setting")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (the workers start, caches fill)")
    parser.add_argument("--out", type=Path, default=None, help=f"pipeline.md/.json (default {DEFAULT_OUT})")
    add_results_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Plan once; per ``data.augment_on``, prepare the data and a trainer; per worker count, time the steps."""
    base = check_config(compose_train_config(["output_dir=unused", "data.cache=memory", *args.overrides]))
    info = dataset_from_config(base.data)
    planned, plan = plan_config(base, info, progress=False)
    device = resolve_device(planned.trainer.device)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for path in PATHS:
            cfg = replace(planned, data=replace(planned.data, augment_on=path, num_workers=0))
            seed_everything(cfg.trainer.seed)
            data = prepare_data(cfg, info, plan, Path(folder) / path, SINGLE_PROCESS)
            model = build_model(cfg.model, info.in_channels, info.num_outputs, data.window.net_patch).to(device)
            trainer = Trainer(cfg, data, model, device, Path(folder) / path, SINGLE_PROCESS, None)
            model.train()
            for workers in args.workers:
                loader = patch_loader(data.train_dataset, cfg.trainer.batch_size, workers, args.warmup + args.steps,
                                      collate_with_draws if data.batch_augment is not None else None)
                rows.append({"augment_on": path, "workers": workers,
                             **time_steps(trainer, loader, device, args.warmup)})
    meta = {"machine": machine(device), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "augment": planned.data.augment, "patch": list(planned.data.patch_size),
            "batch": planned.trainer.batch_size, "patches_per_step": rows[0]["patches_per_step"] if rows else None,
            "channels": list(planned.model.channels or []), "steps": args.steps,
            "overrides": list(args.overrides)}
    report = {"meta": meta, "settings": rows}
    markdown = to_markdown(report)
    print(markdown)
    write_report((args.out or DEFAULT_OUT).resolve(), "pipeline", markdown, report, args, device)
    return 0


def time_steps(trainer: Trainer, loader: Any, device: torch.device, warmup: int) -> dict[str, Any]:
    """``loader``'s batches through ``trainer``'s step (the device path's augmentation first); the wall time per
    step, the device's part of it, their ratio (the busy share) and the wait for the loader, over the steps after
    ``warmup``."""
    busy, waits, patches = [], [], 0
    started = wall_start = time.perf_counter()
    for step, batch in enumerate(loader):
        fetched = time.perf_counter()
        image, label = batch["image"], batch["label"]
        if trainer.data.batch_augment is not None:
            image, label = trainer.data.batch_augment(image.to(device), label.to(device), batch[DRAWS])
        trainer.step(image, label)
        synchronize(device)
        done = time.perf_counter()
        if step == warmup - 1:
            wall_start = done
        if step >= warmup:
            busy.append(done - fetched)
            waits.append(fetched - started)
            patches = len(image)
        started = done
    wall = time.perf_counter() - wall_start if busy else float("nan")
    return {"step_s": wall / len(busy), "busy_share": sum(busy) / wall, "device_s_per_step": statistics.fmean(busy),
            "wait_s_per_step": statistics.fmean(waits), "patches_per_step": patches}


def to_markdown(report: dict[str, Any]) -> str:
    """The settings' table under the machine and the run."""
    meta = report["meta"]
    rows = [[r["augment_on"], r["workers"], r["step_s"], r["device_s_per_step"], r["wait_s_per_step"],
             r["busy_share"]] for r in report["settings"]]
    table = markdown_table(["data.augment_on", "workers", "step (s)", "device's part (s)", "waiting (s)",
                            "busy share"], rows,
                           formats={"step (s)": ".3f", "device's part (s)": ".3f", "waiting (s)": ".3f",
                                    "busy share": ".2f"})
    return (f"Training steps with their loader, {meta['machine']}, torch {meta['torch']}, {meta['date']}: "
            f"data.augment={meta['augment']}, patch {meta['patch']}, {meta['patches_per_step']} patches a step, "
            f"channels {meta['channels']}, the mean of {meta['steps']} steps\n\n{table}\n")
