"""nnU-Net v2's side of ``benchmark.py peers``, run in its own process: plan, preprocess, train for a budget, predict.

``python -m benchmarks.nnunet_peer <dataset id> <configuration> <fold> <length> <result.json>`` in the clone's root,
with ``nnUNet_raw``, ``nnUNet_preprocessed`` and ``nnUNet_results`` set by :mod:`benchmarks.peers` (nnU-Net reads
them when it is imported). Everything is nnU-Net's default (planner, preprocessor, network, augmentation, loss, deep
supervision, poly schedule, mirroring at prediction) except the length of training, ``<length>``:

- seconds of wall clock (``600``): :class:`BudgetTrainer` sets the epochs from the budget with the rule medseg's
  ``trainer.max_minutes`` uses (:class:`medseg.training.budget.TimeBudget`), timed on its second epoch (the first
  waits for nnU-Net's augmentation processes to start), and the iterations per epoch: nnU-Net's 250 (and 50
  validation iterations), or fewer when the first epoch would take more than a tenth of the budget;
- ``<epochs>x<iterations>`` (``40x25``): :class:`FixedTrainer` trains that many epochs of that many iterations, the
  poly schedule spanning them, with 50 validation iterations per 250 training iterations (at least one), as
  medseg's ``trainer.max_epochs`` and ``trainer.iterations_per_epoch`` set it on medseg's side.

nnU-Net seeds nothing: each run is an independent draw of its training noise.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from medseg.io import atomic_write_json

BUDGET_TRAINER, FIXED_TRAINER = "BudgetTrainer", "FixedTrainer"
"""The class names of :func:`budget_trainer`'s and :func:`fixed_trainer`'s trainers, which name nnU-Net's trained-model
folder (``<trainer>__<plans>__<configuration>``)."""
VAL_PER_TRAIN = 50 / 250
"""nnU-Net's validation iterations per training iteration (50 per epoch of 250)."""


def val_iterations(iterations: int) -> int:
    """The validation iterations of an epoch of ``iterations`` training iterations, in nnU-Net's proportion (at least
    one)."""
    return max(1, round(VAL_PER_TRAIN * iterations))
MIN_EPOCHS = 10
"""The first epoch may take at most ``budget / MIN_EPOCHS``: its iterations set every epoch's."""


def budget_trainer(seconds: float) -> type:
    """nnU-Net's default trainer, trained for ``seconds`` of wall clock (validation included)."""
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

    from medseg.training.budget import TimeBudget

    class BudgetTrainer(nnUNetTrainer):
        """``run_training`` of nnU-Net with the epochs and iterations per epoch taken from the budget."""

        budget = TimeBudget(seconds, max_epochs=1000)

        def run_training(self) -> None:
            self.on_train_start()
            self.steps = 0
            started = time.perf_counter()
            self.budget_epoch(first=True)
            second = time.perf_counter()
            self.budget_epoch(first=False)  # the first waits for the augmentation workers: the second sets the pace
            epoch = time.perf_counter() - second
            self.num_epochs = self.budget.horizon(time.perf_counter() - started, self.train_seconds,
                                                  epoch - self.train_seconds, val_every=1, epochs_done=2)
            self.lr_scheduler.max_steps = self.num_epochs  # the poly schedule spans the epochs that fit
            while self.current_epoch < self.num_epochs and not self.budget.spent(
                    time.perf_counter() - started, self.current_epoch):
                self.budget_epoch(first=False)
            self.budget_seconds_used = time.perf_counter() - started
            self.on_train_end()

        def budget_epoch(self, first: bool) -> None:
            """One nnU-Net epoch; the first stops early at a tenth of the budget and fixes the iterations."""
            self.on_epoch_start()
            self.on_train_epoch_start()
            outputs, started = [], time.perf_counter()
            for _ in range(self.num_iterations_per_epoch):
                outputs.append(self.train_step(next(self.dataloader_train)))
                self.steps += 1
                if first and time.perf_counter() - started > self.budget.seconds / MIN_EPOCHS:
                    break
            if first:
                self.num_iterations_per_epoch = len(outputs)
                self.num_val_iterations_per_epoch = val_iterations(len(outputs))
            self.on_train_epoch_end(outputs)
            self.train_seconds = time.perf_counter() - started
            with torch.no_grad():
                self.on_validation_epoch_start()
                val_outputs = [self.validation_step(next(self.dataloader_val))
                               for _ in range(self.num_val_iterations_per_epoch)]
                self.on_validation_epoch_end(val_outputs)
            self.on_epoch_end()

    assert BudgetTrainer.__name__ == BUDGET_TRAINER
    return BudgetTrainer


def fixed_trainer(epochs: int, iterations: int) -> type:
    """nnU-Net's default trainer, trained for ``epochs`` epochs of ``iterations`` iterations."""
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

    class FixedTrainer(nnUNetTrainer):
        """nnU-Net's trainer with its epochs and iterations set (its poly schedule spans ``num_epochs``)."""

        def initialize(self) -> None:  # nnU-Net reads its __init__'s signature: the lengths are set here
            self.num_epochs, self.num_iterations_per_epoch = epochs, iterations
            self.num_val_iterations_per_epoch = val_iterations(iterations)
            super().initialize()

        def run_training(self) -> None:
            started = time.perf_counter()
            super().run_training()
            self.steps = self.num_epochs * self.num_iterations_per_epoch
            self.budget_seconds_used = time.perf_counter() - started

    assert FixedTrainer.__name__ == FIXED_TRAINER
    return FixedTrainer


def parse_length(length: str) -> tuple[str, Callable[[], type]]:
    """``(trainer name, what builds its class)`` of a ``<length>`` argument: seconds, or ``<epochs>x<iterations>``.

    Raises:
        ValueError: neither form, or a length that is not positive.
    """
    epochs, x, iterations = length.partition("x")
    if x:
        if int(epochs) < 1 or int(iterations) < 1:
            raise ValueError(f"{length}: epochs and iterations must be positive")
        return FIXED_TRAINER, partial(fixed_trainer, int(epochs), int(iterations))
    if float(length) <= 0:
        raise ValueError(f"{length}: the budget must be positive seconds")
    return BUDGET_TRAINER, partial(budget_trainer, float(length))


def run(dataset_id: int, configuration: str, fold: int, length: str) -> dict[str, Any]:
    """Plan and preprocess (unless an earlier fold did), train and predict the fold's validation cases; the timings,
    steps and plan."""
    from batchgenerators.utilities.file_and_folder_operations import load_json
    from nnunetv2.experiment_planning.plan_and_preprocess_api import (
        extract_fingerprints,
        plan_experiments,
        preprocess,
    )
    from nnunetv2.paths import nnUNet_preprocessed
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    timings: dict[str, float] = {"planning": 0.0, "preprocessing": 0.0}
    name = maybe_convert_to_dataset_name(dataset_id)
    folder = Path(nnUNet_preprocessed) / name
    if not (folder / f"nnUNetPlans_{configuration}").is_dir():  # the folds of one dataset share one plan
        started = time.perf_counter()
        extract_fingerprints([dataset_id], check_dataset_integrity=True, show_progress_bar=False)
        plan_experiments([dataset_id])
        timings["planning"] = time.perf_counter() - started
        started = time.perf_counter()
        preprocess([dataset_id], configurations=[configuration], num_processes=[2], show_progress_bar=False)
        timings["preprocessing"] = time.perf_counter() - started
    plans, dataset_json = load_json(str(folder / "nnUNetPlans.json")), load_json(str(folder / "dataset.json"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plans["continue_training"] = False  # as nnU-Net's run_training sets it for a new run
    trainer = parse_length(length)[1]()(plans=plans, configuration=configuration, fold=fold,
                                      dataset_json=dataset_json, device=device)
    started = time.perf_counter()
    trainer.run_training()
    timings["training"] = time.perf_counter() - started
    started = time.perf_counter()
    trainer.perform_actual_validation(save_probabilities=False)
    timings["prediction"] = time.perf_counter() - started
    validation = Path(trainer.output_folder) / "validation"
    return {
        "timings": timings,
        "budget_seconds_used": trainer.budget_seconds_used,
        "epochs": trainer.current_epoch,
        "iterations_per_epoch": trainer.num_iterations_per_epoch,
        "steps": trainer.steps,
        "batch_size": trainer.batch_size,
        "plans": plans["configurations"][configuration],
        "predictions": str(validation),
        "nnunet_summary": load_json(str(validation / "summary.json")),
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
    }


def main(argv: list[str]) -> int:
    dataset_id, configuration, fold, length, result = argv
    report = run(int(dataset_id), configuration, int(fold), length)
    atomic_write_json(result, json.loads(json.dumps(report, default=str)))  # numpy values as text, as json writes
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
