"""Out-of-fold predictions made by another tool, scored as a setting of the paired verdict.

``scripts/compare.py DIR nnunet=RESULTS`` adds nnU-Net v2's cross-validation: ``RESULTS`` is its trained-model folder
(``nnUNet_results/DatasetXXX_Name/nnUNetTrainer__nnUNetPlans__3d_fullres``), whose ``fold_<k>/validation/`` holds
the out-of-fold predictions of fold ``k`` in the cases' original geometry. ``extra=NAME=DIR`` adds any folder of
out-of-fold label maps (``DIR/<case>.nii.gz``, or ``DIR/fold_<k>/validation/`` laid out as nnU-Net's), made by any
tool. A source given again under the same name (``nnunet=R0 nnunet=R1``) is another seed of the same setting: its
runs trained again, on the same folds.

Each is scored with medseg's own scoring (:func:`medseg.evaluation.folder.score_pair`: the same Dice, HD95 and NSD,
per class or region, with the tolerance of the cross-validation) against the labels of the sweep's dataset, so that it
pairs with medseg's settings case by case. Before anything is scored, the predictions must cover exactly the sweep's
out-of-fold cases, each on its label's voxel grid, and nnU-Net's results must hold every fold the sweep trained:
otherwise one line says what differs. Its compute is what nnU-Net recorded: training time and wall time from each
fold's ``training_log_*.txt``, parameters from rebuilding its network from ``plans.json`` where ``nnunetv2`` is
installed (blank, and said so, elsewhere).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

from medseg.data.datalist import dataset_from_config
from medseg.data.labels import LabelSpec, renumbering
from medseg.errors import ConfigError, DatasetError, MedsegError
from medseg.evaluation.crossval import class_statistics, run_splits
from medseg.evaluation.folder import check_predictions, score_pair
from medseg.inference.cases import files_by_case, read_dataset
from medseg.inference.model import load_model
from medseg.io import atomic_write_json, json_safe
from medseg.runs.folders import FOLD_KEY, Run
from medseg.runs.layout import CrossvalLayout, external_dir
from medseg.scoring.paired import listed
from medseg.scoring.per_case import reference_digest, write_metrics_csv

log = logging.getLogger("medseg")

NNUNET = "nnunet"
"""The setting name of ``nnunet=RESULTS`` (``reference=nnunet`` makes it the reference)."""
FOLD_FOLDER = re.compile(r"fold_(\d+)$")
EPOCH_TIME = re.compile(r"Epoch time: ([0-9.]+) s")
LOG_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d+): ")
SETTING_NAME = re.compile(r"^[A-Za-z][\w.+-]*$")


@dataclass(frozen=True)
class ExternalSource:
    """A folder of another tool's out-of-fold predictions, as ``compare.py`` was given it."""

    name: str
    """The setting's name in the report (``nnunet``, or ``NAME`` of ``extra=NAME=DIR``)."""
    path: Path
    nnunet: bool = False
    """Whether ``path`` is an nnU-Net trained-model folder (``nnunet=``), whose compute is read too."""

    @property
    def key(self) -> str:
        return f"{NNUNET}={self.path}" if self.nnunet else f"extra={self.name}={self.path}"


@dataclass
class ExternalPredictions:
    """The predictions of an :class:`ExternalSource` for the sweep's cases, and what its tool recorded."""

    source: ExternalSource
    files: dict[str, str]
    """``case -> label map``."""
    folds: list[int] = field(default_factory=list)
    """The folds read (``fold_<k>/validation``); empty for a flat folder."""
    fold_cases: dict[int, list[str]] = field(default_factory=dict)
    """``fold -> the cases its validation/ folder predicts``; empty for a flat folder."""
    renumber: dict[int, int] | None = None
    """The predictions' label values -> the sweep's, where the tool's ``dataset.json`` numbers the classes otherwise
    (:func:`~medseg.data.labels.renumbering`); None: the same numbering."""
    compute: dict[str, float] = field(default_factory=dict)
    """:data:`~medseg.runs.folders.COMPUTE_KEYS` the tool recorded: ``train_seconds``, ``wall_seconds`` (means over
    the folds), ``params``."""
    notes: list[str] = field(default_factory=list)
    """Why a compute value is blank, for the report."""


def parse_source(option: str) -> ExternalSource:
    """``nnunet=RESULTS`` or ``extra=NAME=DIR`` as :class:`ExternalSource`.

    Raises:
        ConfigError: another key, or a ``NAME`` that is not a word (letters, digits, ``_.+-``, a letter first).
    """
    key, _, value = option.partition("=")
    if key == NNUNET and value:
        return ExternalSource(NNUNET, Path(value).expanduser(), nnunet=True)
    name, _, folder = value.partition("=")
    if key != "extra" or not folder:
        raise ConfigError(f"{option}: expected nnunet=RESULTS_FOLDER or extra=NAME=FOLDER")
    if not SETTING_NAME.match(name) or name == NNUNET:
        raise ConfigError(f"{option}: the name {name!r} must be a word (letters, digits, _.+-, a letter first) other "
                          f"than {NNUNET!r}")
    return ExternalSource(name, Path(folder).expanduser())


def fold_folders(path: Path) -> dict[int, Path]:
    """``fold -> fold_<k>/validation`` of a folder laid out as nnU-Net's trained-model folders."""
    return {int(match.group(1)): child / "validation" for child in sorted(path.iterdir())
            if child.is_dir() and (match := FOLD_FOLDER.match(child.name))}


def gather_predictions(source: ExternalSource, folds: Collection[int]) -> ExternalPredictions:
    """The label maps of ``source`` for the sweep's ``folds``: those of each ``fold_<k>/validation`` (nnU-Net's
    layout), else the folder's own files.

    Raises:
        ConfigError: no such folder, a fold of the sweep without its ``validation/`` folder, a case predicted by two
            folds, or a case held by two files of one folder (:func:`~medseg.inference.cases.files_by_case`).
    """
    where = source.key
    if not source.path.is_dir():
        raise ConfigError(f"{where}: not a folder" + (" (give nnU-Net's trained-model folder, nnUNet_results/"
                                                      "DatasetXXX_Name/nnUNetTrainer__nnUNetPlans__3d_fullres)"
                                                      if source.nnunet else ""))
    by_fold = fold_folders(source.path)
    if not by_fold and not source.nnunet:
        return ExternalPredictions(source, files_by_case(source.path, where))
    missing = [f"fold_{fold}/validation" for fold in sorted(folds) if fold not in by_fold or not by_fold[fold].is_dir()]
    if missing:
        raise ConfigError(f"{where}: no {', '.join(missing)}: the sweep cross-validated folds {sorted(folds)} (nnU-Net"
                          f" writes fold_<k>/validation when a fold's training ends, or with nnUNetv2_train ... --val)")
    files: dict[str, str] = {}
    fold_cases: dict[int, list[str]] = {}
    for fold in sorted(folds):
        fold_files = files_by_case(by_fold[fold], where)
        for case, path in fold_files.items():
            if case in files:
                raise ConfigError(f"{where}: case {case} is predicted by two folds ({files[case]}, {path}); "
                                  f"out-of-fold predictions need disjoint folds")
            files[case] = path
        fold_cases[fold] = sorted(fold_files)
    return ExternalPredictions(source, files, sorted(folds), fold_cases)


def check_cases(predictions: ExternalPredictions, cases: Collection[str],
                fold_cases: Mapping[int, Collection[str]]) -> None:
    """The predictions cover exactly the sweep's out-of-fold ``cases``, and each fold of theirs (nnU-Net's layout)
    exactly the validation cases of the sweep's fold of the same number (``fold_cases``), so that fold k is paired
    with fold k.

    Raises:
        ConfigError: cases without a prediction, or predictions of cases the sweep did not hold out, named; or a fold
            whose cases differ from the sweep's fold of that number, with the cases that differ.
    """
    missing, extra = sorted(set(cases) - set(predictions.files)), sorted(set(predictions.files) - set(cases))
    advice = "train the sweep on the same folds (data.splits=<its splits_final.json>)"
    if missing or extra:
        parts = ([f"no prediction of {len(missing)} of the sweep's {len(cases)} out-of-fold case(s): {listed(missing)}"]
                 if missing else []) + ([f"{len(extra)} case(s) the sweep did not hold out: {listed(extra)}"]
                                        if extra else [])
        raise ConfigError(f"{predictions.source.key}: {'; '.join(parts)}; {advice}")
    for fold, theirs in predictions.fold_cases.items():
        ours = set(fold_cases.get(fold, ()))
        if set(theirs) != ours:
            only_theirs, only_ours = sorted(set(theirs) - ours), sorted(ours - set(theirs))
            parts = ([f"only its fold_{fold} holds {listed(only_theirs)}"] if only_theirs else []) + (
                [f"only the sweep's fold {fold} holds {listed(only_ours)}"] if only_ours else [])
            raise ConfigError(f"{predictions.source.key}: fold_{fold}/validation predicts other cases than the "
                              f"sweep's fold {fold} validated: {'; '.join(parts)}; {advice}")


def log_times(path: Path) -> tuple[float, float]:
    """The sum of the ``Epoch time: ... s`` lines of an nnU-Net training log, and the seconds between its first and
    last time stamps (nan where the log has none)."""
    epochs, stamps = 0.0, []
    for line in path.read_text(errors="replace").splitlines():
        if (match := EPOCH_TIME.search(line)) is not None:
            epochs += float(match.group(1))
        if (stamp := LOG_TIME.match(line)) is not None:
            stamps.append(datetime.fromisoformat(stamp.group(1)))
    wall = (stamps[-1] - stamps[0]).total_seconds() if len(stamps) > 1 else math.nan
    return (epochs if epochs else math.nan), wall


def nnunet_times(results: Path, folds: Sequence[int]) -> tuple[dict[str, float], list[str]]:
    """``train_seconds`` and ``wall_seconds``, means over ``folds`` of their latest training log, and notes."""
    per_fold = []
    for fold in folds:
        logs = sorted((results / f"fold_{fold}").glob("training_log_*.txt"))
        if logs:
            per_fold.append(log_times(logs[-1]))  # the name holds the start time: the latest run of the fold
    compute, notes = {}, []
    for index, key in enumerate(("train_seconds", "wall_seconds")):
        values = [times[index] for times in per_fold if not math.isnan(times[index])]
        if len(values) == len(folds):
            compute[key] = math.fsum(values) / len(values)
    if len(compute) < 2:
        notes.append(f"training time blank: {len(per_fold)} of {len(folds)} fold(s) have a training_log_*.txt with "
                     f"epoch times")
    return compute, notes


def nnunet_parameters(results: Path) -> tuple[int | None, str]:
    """The parameter count of the network nnU-Net builds from ``results/plans.json`` (its configuration: the folder
    name's last part), or None and why."""
    configuration = results.name.split("__")[-1]
    try:
        from batchgenerators.utilities.file_and_folder_operations import load_json
        from nnunetv2.utilities.get_network_from_plans import get_network_from_plans
        from nnunetv2.utilities.label_handling.label_handling import determine_num_input_channels
        from nnunetv2.utilities.plans_handling.plans_handler import PlansManager
    except ImportError:
        return None, "parameters blank: nnunetv2 is not installed (pip install nnunetv2) to rebuild its network"
    try:
        plans = PlansManager(str(results / "plans.json"))
        config = plans.get_configuration(configuration)
        dataset = load_json(str(results / "dataset.json"))
        network = get_network_from_plans(
            config.network_arch_class_name, config.network_arch_init_kwargs,
            config.network_arch_init_kwargs_req_import, determine_num_input_channels(plans, config, dataset),
            plans.get_label_manager(dataset).num_segmentation_heads, allow_init=True, deep_supervision=False)
    except Exception as err:  # nnU-Net's own errors, of any type: the column stays blank with the reason
        return None, f"parameters blank: nnU-Net could not rebuild {configuration} from {results}/plans.json " \
                     f"({type(err).__name__}: {err})"
    return sum(p.numel() for p in network.parameters()), ""


def nnunet_compute(predictions: ExternalPredictions) -> None:
    """Fill ``predictions.compute`` and ``notes`` from what nnU-Net recorded in its results folder."""
    results = predictions.source.path
    compute, notes = nnunet_times(results, predictions.folds)
    params, why = nnunet_parameters(results)
    if params is not None:
        compute["params"] = float(params)
    predictions.compute.update(compute)
    predictions.notes += [*notes, *([why] if why else [])]


@dataclass(frozen=True)
class SweepDataset:
    """What an external setting is scored against: the sweep's out-of-fold cases, their labels, classes and folds."""

    references: dict[str, str]
    """``case -> label file``, the out-of-fold cases of the sweep."""
    labels: LabelSpec
    folds: list[int]
    root: str
    """The dataset's ``data.root``."""
    fold_cases: dict[int, list[str]] = field(default_factory=dict)
    """``fold -> its validation cases`` (the ``splits.json`` of the fold's first run that has one)."""


def sweep_dataset(runs: Sequence[Run], cases: Collection[str]) -> SweepDataset:
    """The dataset of a sweep's finished runs (its first checkpoint's data and classes) for the out-of-fold ``cases``.

    Raises:
        ConfigError: no finished run with a checkpoint. DatasetError: the dataset is gone, or lacks a case.
    """
    finished = [run for run in runs if run.finished]
    if not finished:
        raise ConfigError("no finished run with checkpoints/best.pt in the sweep: its checkpoint names the dataset "
                          "and the classes another tool's predictions are scored against")
    model = load_model(finished[0].best_checkpoint)
    entries = {entry["case"]: entry for entry in dataset_from_config(model.data).training}
    unknown = sorted(set(cases) - set(entries))
    if unknown:
        raise DatasetError(f"data.root={model.data.root}: no case {listed(unknown)} of the sweep's cross-validation; "
                           f"was the dataset changed?")
    folds = sorted({int(run.overrides[FOLD_KEY]) for run in runs if run.overrides.get(FOLD_KEY, "").isdigit()})
    return SweepDataset({case: str(entries[case]["label"]) for case in sorted(cases)}, model.label_spec, folds,
                        str(model.data.root), validation_cases(runs))


def validation_cases(runs: Sequence[Run]) -> dict[int, list[str]]:
    """``fold -> its validation cases`` of a sweep's runs: the ``splits.json`` of each fold's first run that has one
    (a run trained on ``data.fold=all`` holds out none).

    Raises:
        DatasetError: a ``splits.json`` that is not JSON (:func:`~medseg.evaluation.crossval.run_splits`).
    """
    cases: dict[int, list[str]] = {}
    for run in runs:
        splits = run_splits(run) if run.splits_file.is_file() else {}
        if isinstance(splits.get("fold"), int):
            cases.setdefault(splits["fold"], sorted(splits.get("val") or []))
    return cases


def checked_predictions(source: ExternalSource, dataset: SweepDataset) -> ExternalPredictions:
    """The predictions of ``source`` for the sweep's out-of-fold cases, checked (see the module docstring), with the
    compute nnU-Net recorded; nothing is scored or written.

    Raises:
        ConfigError: see :func:`gather_predictions`, :func:`check_cases`, :func:`nnunet_renumbering`.
        PredictionError: predictions on another grid.
    """
    predictions = gather_predictions(source, dataset.folds)
    check_cases(predictions, dataset.references, dataset.fold_cases)
    check_predictions(predictions.files, dataset.references, source.key)
    if source.nnunet:
        predictions.renumber = nnunet_renumbering(source, dataset.labels)
        nnunet_compute(predictions)
    return predictions


def nnunet_renumbering(source: ExternalSource, labels: LabelSpec) -> dict[int, int] | None:
    """How nnU-Net's label maps (numbered by the ``dataset.json`` of its results folder) read in the sweep's numbering
    ``labels``, classes matched by name (:func:`~medseg.data.labels.renumbering`); None when both number them alike,
    or when the folder has no ``dataset.json`` (logged: its numbering is taken to be the sweep's).

    Raises:
        ConfigError: classes that cannot be matched by name; a ``dataset.json`` that is no dataset description.
    """
    path = source.path / "dataset.json"
    if not path.is_file():
        log.warning("%s: no dataset.json: its label maps are taken to number the classes as the sweep's dataset does",
                    source.key)
        return None
    return renumbering(read_dataset(path).label_spec, labels, f"{source.key} ({path})")


def scores_dir(sweep_dir: Path, source: ExternalSource, seed: int, seeds: int) -> Path:
    """Where ``source``'s scores go: ``DIR/external/<name>/``, or ``.../seed_<k>/`` for its seed ``k`` when its name
    was given ``seeds`` > 1 times."""
    folder = external_dir(sweep_dir, source.name)
    return folder / f"seed_{seed}" if seeds > 1 else folder


def score_external(predictions: ExternalPredictions, dataset: SweepDataset, tolerance_mm: float, folder: Path,
                   progress: bool = True) -> Path:
    """Score checked ``predictions`` (:func:`checked_predictions`) on the sweep's out-of-fold cases into ``folder``
    (:func:`scores_dir`: ``metrics.csv``, ``summary.json``); returns the ``metrics.csv`` path.

    Raises:
        DatasetError: a prediction or label that cannot be scored (nothing is written then).
    """
    source = predictions.source
    rows: list[dict[str, Any]] = []
    failed = []
    for case, reference in tqdm(dataset.references.items(), desc=f"score {source.name}", unit="case",
                                disable=not progress):
        try:
            rows += score_pair(case, predictions.files[case], reference, dataset.labels, tolerance_mm,
                               predictions.renumber)
        except MedsegError as err:
            failed.append(f"{case}: {err}")
    if failed:
        raise DatasetError(f"{source.key}: {len(failed)} case(s) cannot be scored, so it cannot be paired: "
                           + "; ".join(failed[:3]))
    files = CrossvalLayout(folder)
    write_metrics_csv(files.scores, rows)
    atomic_write_json(files.summary, json_safe({
        "setting": source.name, "source": str(source.path), "folds": predictions.folds,
        "num_cases": len(dataset.references), "data_root": dataset.root, "tolerance_mm": tolerance_mm,
        "compute": predictions.compute, "notes": predictions.notes,
        "labels_sha256": {case: reference_digest(path) for case, path in dataset.references.items()},
        **class_statistics(rows, dataset.labels.outputs),
    }))
    log.info("%s: %d out-of-fold case(s) scored into %s", source.key, len(dataset.references), files.folder)
    return files.scores


def describe(predictions: ExternalPredictions, scores: Path, sweep_dir: Path) -> str:
    """One line for the report: where the setting's predictions came from, and what of its compute is blank."""
    folds = f" (folds {', '.join(map(str, predictions.folds))})" if predictions.folds else ""
    notes = "".join(f"; {note}" for note in predictions.notes)
    return f"`{predictions.source.name}`: {predictions.source.path}{folds}, scored by medseg into " \
           f"`{scores.relative_to(sweep_dir)}`{notes}"


def check_names(sources: Sequence[ExternalSource], labels: Collection[str]) -> None:
    """Each external setting's name is new (not one of the sweep's setting ``labels``); a name given again is another
    seed of that setting, on another folder.

    Raises:
        ConfigError: a name of the sweep's, or a folder given twice.
    """
    for source in sources:
        if source.name in labels:
            raise ConfigError(f"{source.key}: the setting name {source.name!r} is taken; give another NAME")
    paths = [source.path.resolve() for source in sources]
    twice = sorted({str(path) for path in paths if paths.count(path) > 1})
    if twice:
        raise ConfigError(f"{twice[0]} is given twice; each seed of a setting is a folder of its own")
