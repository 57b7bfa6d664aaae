"""Multirun folders of folds as ``train.py -m data.fold=...`` leaves them, built without training."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import yaml

from medseg.data.datalist import load_dataset, split_cases
from tests.helpers.checkpoints import save_test_checkpoint

NUM_FOLDS = 2


def make_fold_sweep(sweep: Path, root: Path, folds: Sequence[int] = range(NUM_FOLDS), overrides: Sequence[str] = (),
                    status: str = "completed", first_job: int = 0) -> Path:
    """A multirun folder of ``folds`` of the MSD dataset ``root`` as ``train.py -m data.fold=...`` leaves it."""
    info = load_dataset(root, "msd")
    for number, fold in enumerate(folds, start=first_job):
        job = sweep / str(number)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"data.fold={fold}", *overrides]))
        train, val = split_cases(info, fold, NUM_FOLDS, 12345)
        (job / "splits.json").write_text(json.dumps({"fold": fold, "train": [c["case"] for c in train],
                                                     "val": [c["case"] for c in val]}))
        save_test_checkpoint(job / "checkpoints" / "best.pt", seed=fold,
                             data={"root": str(root), "format": "msd", "fold": fold, "num_folds": NUM_FOLDS})
        (job / "metrics.json").write_text(json.dumps({"status": status, "best_val_dice": 0.5, "reason": "boom"}))
    return sweep
