"""``benchmark.py quality``: validation Dice of medseg's U-Net (MaSA bottleneck), MONAI UNet and SwinUNETR.

All three train through medseg's own entry point (:func:`medseg.training.run.train`) on the same data (the demo
task unless overridden), seed, patch (``[64, 64, 32]``: SwinUNETR needs sizes divisible by 32) and budget,
from configs composed like ``scripts/train.py``'s (``configs/train.yaml`` + ``model.bottleneck=masa`` /
``model.name=monai_unet`` / ``model.name=monai_swinunetr``). Validation runs once, after the last epoch.

Budget:

* ``--epochs N``: every model trains N epochs.
* ``--seconds S``: every model trains for S seconds of wall clock, validation included (``trainer.max_minutes``:
  the first epoch is timed and the schedule spans the epochs that fit). The table shows the seconds each model
  actually used.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    Target,
    add_results_argument,
    compose_train_config,
    machine,
    targets_markdown,
    write_report,
)
from medseg.tables import CellFormat, markdown_table, text_table

MODELS: dict[str, tuple[str, ...]] = {
    "unet+masa": ("model.bottleneck=masa",),
    "monai_unet": ("model.name=monai_unet",),
    "monai_swinunetr": ("model.name=monai_swinunetr",),
}
REFERENCE = "monai_swinunetr"
COMMON = (
    "data.patch_size=[64,64,32]",
    "trainer.progress=false",
    "trainer.log_images=false",
    "trainer.check_data=false",
)
QUICK = ("data.num_cases=8", "data.patch_size=[32,32,64]", "data.samples_per_volume=1",
         "trainer.batch_size=2")
"""``--quick``: a tiny run for tests (SwinUNETR's deepest stage needs more than one voxel: 32x32x64 is the least)."""
BUDGET_MAX_EPOCHS = 100_000
"""Under ``--seconds`` the budget alone sets the epochs (validation after the first epoch and the last only)."""


@dataclass
class Result:
    """One model's run: its budget use and validation Dice (mean over foreground classes)."""

    model: str
    epochs: int
    train_seconds: float
    val_dice: float
    val_dice_per_class: dict[str, float]
    params: int
    run_dir: str
    gflops: float | None
    """GFLOPs of one training patch's forward pass (None: not counted)."""
    seconds_per_step: float | None


def run_config(model: str, run_dir: Path, epochs: int | None, seconds: float | None, seed: int,
               overrides: Sequence[str]) -> dict[str, Any]:
    """The composed training config of ``model`` for ``epochs`` epochs, or for ``seconds``, in ``run_dir``."""
    budget = [f"trainer.max_epochs={epochs}", f"trainer.val_every={epochs}"] if epochs else [
        f"trainer.max_minutes={seconds / 60.0}", f"trainer.max_epochs={BUDGET_MAX_EPOCHS}",
        f"trainer.val_every={BUDGET_MAX_EPOCHS}"]
    return compose_train_config(
        [*COMMON, *MODELS[model], *overrides, f"output_dir={run_dir}", f"trainer.seed={seed}", *budget])


def train_model(
    model: str, out: Path, seed: int, overrides: Sequence[str], epochs: int | None, seconds: float | None
) -> Result:
    """Train ``model`` for ``epochs``, or for ``seconds`` (see the module docstring)."""
    from medseg.training.run import train  # heavy: MONAI, the data pipeline

    run_dir = out / "runs" / model
    metrics = train(run_config(model, run_dir, epochs, seconds, seed, overrides))
    last = metrics["history"][-1]
    return Result(
        model,
        metrics["epochs"],
        metrics["train_seconds"],
        last["val_dice"],
        last["val_dice_per_class"],
        metrics["params"],
        str(run_dir),
        metrics["gflops_per_patch_forward"],
        metrics["seconds_per_step"],
    )


def targets(results: Sequence[Result]) -> list[Target]:
    """medseg's U-Net with MaSA at least as good as SwinUNETR on the same budget."""
    by_name = {r.model: r for r in results}
    masa, swin = by_name.get("unet+masa"), by_name.get(REFERENCE)
    value = None if masa is None or swin is None else masa.val_dice - swin.val_dice
    return [Target("val Dice: unet+masa - SwinUNETR (same data, seed, budget)", value, ">=", 0.0)]


TABLE_FORMATS: dict[str, CellFormat] = {"params (M)": ".3g", "GFLOPs": ".3g", "s/step": ".3g",
                                        "train time (s)": ".0f"}
"""How :func:`table` is shown (Dice to 4 decimals, the renderer's default)."""


def table(results: Sequence[Result]) -> tuple[list[str], list[list[Any]]]:
    """Headers and values of the results table: a row per model; render it with :data:`TABLE_FORMATS`."""
    names = sorted({name for r in results for name in r.val_dice_per_class})
    headers = ["model", "params (M)", "GFLOPs", "s/step", "epochs", "train time (s)", "val Dice",
               *(f"Dice {n}" for n in names)]
    rows = [[r.model, r.params / 1e6, r.gflops, r.seconds_per_step, r.epochs, r.train_seconds, r.val_dice,
             *(r.val_dice_per_class.get(n) for n in names)] for r in results]
    return headers, rows


def to_markdown(report: dict[str, Any], results: Sequence[Result]) -> str:
    meta = report["meta"]
    budget = f"{meta['epochs']} epochs" if meta["epochs"] else f"{meta['seconds']:g} s of training per model"
    lines = [
        "# Segmentation quality at a fixed budget",
        "",
        f"{meta['machine']}, torch {meta['torch']}; budget {budget}; seed {meta['seed']}; overrides "
        f"`{' '.join(meta['overrides'])}`. Val Dice: mean over foreground classes on the fold-0 validation cases "
        "(sliding window), after the last epoch.",
        "",
        markdown_table(*table(results), formats=TABLE_FORMATS),
        "",
        "## targets",
        "",
        targets_markdown(report["targets"], value_format="+.4f"),
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Train every model, print the table, and write ``quality.md`` / ``quality.json`` under ``--out``."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    epochs, seconds = (1, None) if args.quick else (args.epochs, None if args.epochs else args.seconds)
    overrides = [*(QUICK if args.quick else ()), *args.override]
    results = [train_model(m, args.out, args.seed, overrides, epochs, seconds) for m in args.models]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report = {
        "meta": {
            "machine": machine(device),
            "torch": torch.__version__,
            "epochs": epochs,
            "seconds": seconds,
            "seed": args.seed,
            "overrides": [*COMMON, *overrides],
        },
        "results": [asdict(r) for r in results],
        "targets": [asdict(t) for t in targets(results)],
    }
    print(text_table(*table(results), formats=TABLE_FORMATS))
    markdown = to_markdown(report, results)
    print("\n" + markdown.split("## targets", 1)[1].strip())
    write_report(args.out, "quality", markdown, report, args, device)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py quality``'s arguments."""
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, default=300.0, help="training seconds per model (default)")
    budget.add_argument("--epochs", type=int, default=None, help="epochs per model instead of seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="8 tiny cases, 1 epoch (for tests)")
    parser.add_argument("--override", nargs="*", default=[], help="extra config overrides, e.g. data.root=...")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("outputs/benchmark/quality"),
        help="run directories, quality.md and quality.json go here",
    )
    add_results_argument(parser)
