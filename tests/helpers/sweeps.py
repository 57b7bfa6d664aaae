"""Multirun folders of folds as ``train.py -m data.fold=...`` leaves them, and cross-validated ones, built without
training."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from medseg.data.datalist import load_dataset, split_cases
from medseg.runs.layout import crossval_dir
from medseg.scoring.per_case import write_metrics_csv
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


def make_crossvalidated_sweep(sweep: Path, rows: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
                              folds: int = NUM_FOLDS, metrics: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    """A cross-validated multirun without checkpoints: for each setting (overrides, ``model.bottleneck=masa``) and
    seed, ``folds`` job folders (``.hydra/overrides.yaml``, ``metrics.json``: the setting's ``metrics`` over a completed
    status) and the ``crossval/<setting> trainer.seed=<seed>/metrics.csv`` of ``rows[setting][seed]`` (its rows).

    With one seed per setting, ``trainer.seed`` is not swept (``crossval/<setting>/``)."""
    seeds = {len(per_seed) for per_seed in rows.values()}
    number = 0
    for setting, per_seed in rows.items():
        for seed, seed_rows in enumerate(per_seed):
            repeat = [f"trainer.seed={seed}"] if seeds != {1} else []
            for fold in range(folds):
                job = sweep / str(number)
                (job / ".hydra").mkdir(parents=True)
                (job / ".hydra" / "overrides.yaml").write_text(
                    yaml.safe_dump([*setting.split(), *repeat, f"data.fold={fold}"]))
                recorded = (metrics or {}).get(setting, {})
                (job / "metrics.json").write_text(json.dumps({"status": "completed", **recorded}))
                number += 1
            label = " ".join([setting, *repeat])
            write_metrics_csv(crossval_dir(sweep, label) / "metrics.csv", seed_rows)
    return sweep


def metric_rows(dice: Mapping[str, float], class_name: str = "tumour", class_index: int = 1,
                **others: Mapping[str, float]) -> list[dict[str, Any]]:
    """``metrics.csv`` rows of one class: ``case -> Dice`` and, by name (``hd95_mm``, ``nsd``), the other metrics
    (their Dice when not given)."""
    return [{"case": case, "class_index": class_index, "class_name": class_name, "dice": value,
             "hd95_mm": others.get("hd95_mm", dice)[case], "nsd": others.get("nsd", dice)[case], "pred_ml": 1.0,
             "ref_ml": 1.0, "flags": ""} for case, value in dice.items()]
