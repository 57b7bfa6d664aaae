"""``benchmark.py nnunet_crossval``: nnU-Net v2 cross-validated on a medseg dataset, for a budget per fold, in nnU-Net's
own folder layout, so that medseg can train on its folds and plan and ``compare.py`` can pair it with medseg's
settings.

``python scripts/benchmark.py nnunet_crossval data.root=<MSD or nnU-Net v2 folder> [data.format=nnunet]
folds=0,1,2,3,4 budget_minutes=N [configuration=3d_fullres] --out OUT``, or with ``epochs=E iterations=I`` in place of
``budget_minutes=``: E epochs of I iterations a fold (the parity run's fixed length, which medseg's
``trainer.max_epochs=E trainer.iterations_per_epoch=I`` matches).

Under ``OUT``: ``nnUNet_raw/`` (links to the dataset's files), ``nnUNet_preprocessed/<dataset>/`` with nnU-Net's
``nnUNetPlans.json`` and the ``splits_final.json`` it draws on its first fold (its default: 5 folds), and
``nnUNet_results/<dataset>/<trainer>__nnUNetPlans__<configuration>/fold_<k>/`` (``BudgetTrainer`` or ``FixedTrainer``)
with each fold's training log and its out-of-fold predictions (``validation/``). Each fold is
:mod:`benchmarks.nnunet_peer` (nnU-Net's defaults, the length of training set by the budget or the epochs); the plan
and the preprocessing are made once, by the first fold. The paths to give medseg are printed at the end and written to
``OUT/nnunet_crossval.json``.

nnU-Net is the optional ``peers`` extra,
installed with the README's command, which keeps the torch installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
from pathlib import Path

from benchmarks.common import compose_train_config
from benchmarks.nnunet_peer import parse_length
from benchmarks.peers import INSTALL_HINT, NNUNET_DATASET_ID, Command, parse_overrides, write_nnunet_raw
from medseg.io import atomic_write_json

log = logging.getLogger("medseg")

FOLDERS = ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")
OWN_KEYS = ("folds", "budget_minutes", "epochs", "iterations", "configuration")


def run(args: argparse.Namespace) -> int:
    """Train nnU-Net on each fold of ``folds=`` for ``budget_minutes`` or ``epochs`` x ``iterations`` (see the module
    docstring)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    own, data_overrides = parse_overrides(args.overrides, OWN_KEYS)
    if importlib.util.find_spec("nnunetv2") is None:
        raise SystemExit(f"error: {INSTALL_HINT}")
    if not any(o.startswith("data.root=") for o in data_overrides):
        raise SystemExit("error: data.root=<MSD or nnU-Net v2 folder> is required")
    folds = [int(fold) for fold in own.get("folds", "0,1,2,3,4").split(",")]
    length = training_length(own)
    configuration = own.get("configuration", "3d_fullres")

    from medseg.data.datalist import dataset_from_config
    from medseg.training.checks import check_config

    data_format = next((o.split("=", 1)[1] for o in data_overrides if o.startswith("data.format=")), "msd")
    data_overrides = [f"data={data_format}", *(o for o in data_overrides if not o.startswith("data.format="))]
    data = check_config(compose_train_config([*data_overrides, f"output_dir={args.out}"])).data
    out = args.out.resolve()
    folders = {name: out / name for name in FOLDERS}
    raw = write_nnunet_raw(dataset_from_config(data), folders["nnUNet_raw"])
    env = {name: str(path) for name, path in folders.items()}
    for fold in folds:
        log.info("nnunet_crossval: fold %d, training for %s", fold, length)
        Command([sys.executable, "-m", "benchmarks.nnunet_peer", str(NNUNET_DATASET_ID), configuration, str(fold),
                 length, str(out / f"fold_{fold}.json")], out / f"fold_{fold}.log", env).run()
    preprocessed = folders["nnUNet_preprocessed"] / raw.name
    paths = {"splits": str(preprocessed / "splits_final.json"), "plans": str(preprocessed / "nnUNetPlans.json"),
             "results": str(folders["nnUNet_results"] / raw.name
                            / f"{parse_length(length)[0]}__nnUNetPlans__{configuration}"),
             "configuration": configuration, "folds": folds, "length": length,
             "reports": {fold: json.loads((out / f"fold_{fold}.json").read_text()) for fold in folds}}
    atomic_write_json(out / "nnunet_crossval.json", paths)
    print(f"data.splits={paths['splits']}\nplan.file={paths['plans']}\nnnunet={paths['results']}")
    return 0


def training_length(own: dict[str, str]) -> str:
    """:func:`~benchmarks.nnunet_peer.parse_length`'s argument: ``<epochs>x<iterations>`` when ``epochs=`` and
    ``iterations=`` are given, else the seconds of ``budget_minutes=`` (10 by default)."""
    fixed = [key for key in ("epochs", "iterations") if key in own]
    if len(fixed) == 1 or (fixed and "budget_minutes" in own):
        raise SystemExit("error: give budget_minutes=N, or epochs=E and iterations=I, not both")
    length = f"{own['epochs']}x{own['iterations']}" if fixed else str(60.0 * float(own.get("budget_minutes", "10")))
    try:
        parse_length(length)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    return length


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py nnunet_crossval``'s arguments."""
    parser.add_argument("overrides", nargs="*", help="data.root=..., data.format=msd|nnunet, folds=0,1,2,3,4, "
                                                     "budget_minutes=10 (or epochs=E iterations=I), "
                                                     "configuration=3d_fullres")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmark/nnunet_crossval"),
                        help="nnU-Net's three folders and nnunet_crossval.json go here")
