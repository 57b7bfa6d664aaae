"""The settings of a cross-validated sweep, read for its verdict (:mod:`medseg.evaluation.compare`).

A *setting* is the runs that differ only in ``data.fold`` and ``trainer.seed``; the cross-validation
(:mod:`medseg.evaluation.crossval`) scored each seed of it on its out-of-fold cases, one
``crossval/<setting>/metrics.csv`` per seed. :func:`read_settings` reads them (per case, per output and metric, each
seed and their mean) and :func:`check_same_dataset` checks that every setting was scored against the same labels;
:func:`external_settings` adds another tool's out-of-fold predictions (:mod:`medseg.evaluation.external`) as settings
of the same kind.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from medseg.config import EvaluateConfig
from medseg.errors import ConfigError, DatasetError
from medseg.evaluation.external import (
    ExternalPredictions,
    ExternalSource,
    SweepDataset,
    check_names,
    checked_predictions,
    describe,
    score_external,
    scores_dir,
    sweep_dataset,
)
from medseg.runs.folders import (
    COMPUTE_KEYS,
    FLOPS_KEY,
    FOLD_KEY,
    Run,
    Sweep,
    cross_validations,
    setting_keys,
    setting_label,
    setting_of,
)
from medseg.runs.layout import CrossvalLayout, crossval_dir
from medseg.scoring.metrics import defined_mean, undefined_when_empty
from medseg.scoring.paired import check_same_cases, finite_cases, listed

log = logging.getLogger("medseg")

VOXEL_METRICS = {"dice": True, "hd95_mm": False, "nsd": True}
"""The compared voxel metrics of ``metrics.csv`` -> whether higher is better; each has a foreground mean."""
LESION_METRICS = {"lesion_sensitivity": True, "lesion_false_positives": False, "lesion_dice": True}
"""The compared lesion-wise columns of ``metrics.csv`` (:mod:`medseg.scoring.detection`), per output only; a
``metrics.csv`` without them (older, or rows written without detection) is compared without them."""
METRICS = {**VOXEL_METRICS, **LESION_METRICS}
"""The compared ``metrics.csv`` columns -> whether higher is better."""
FOREGROUND = "foreground mean"
"""The output name of the per-case mean over the outputs."""
NEEDS_FOLDS = "a verdict needs cross-validation (data.fold=0,1,2,3,4)"
"""Why a sweep without folds gets no verdict."""
Scores = dict[tuple[str, str], dict[str, float]]
"""``(output, metric) -> case -> value``: outputs in ``metrics.csv`` order, then the foreground mean."""


@dataclass
class Setting:
    """One setting of the sweep with its cross-validated per-case scores, seeds averaged."""

    label: str
    """``model.bottleneck=masa`` (:func:`setting_label`)."""
    runs: list[Run]
    """Every run of the setting (all seeds and folds)."""
    crossvals: list[Path]
    """The ``metrics.csv`` of each cross-validated seed, averaged into :attr:`scores`."""
    scores: Scores
    labels_sha256: dict[str, str] = field(default_factory=dict)
    """``case -> SHA-256`` of the label file each case was scored against (the ``summary.json`` beside each
    ``metrics.csv``); empty when the cross-validation predates that record."""
    data_root: str = ""
    """The ``data.root`` of the dataset it was scored on ("" when not recorded)."""
    recorded_compute: dict[str, float] | None = None
    """Another tool's compute as it recorded it; None for medseg's settings (the mean over :attr:`runs`)."""
    source: str = ""
    """For another tool's predictions: where they came from and what of their compute is blank, in words."""
    seed_scores: list[Scores] = field(default_factory=list)
    """The scores of each seed, averaged into :attr:`scores` (empty: :attr:`scores` is the one seed)."""
    volumes: dict[str, tuple[bool, bool]] = field(default_factory=dict)
    """``output -> (predicted in some case, in some case's label)`` over its seeds; empty when not recorded."""

    @property
    def seeds(self) -> list[Scores]:
        """The scores of each seed (one where :attr:`seed_scores` is empty)."""
        return self.seed_scores or [self.scores]

    def seed_values(self, key: tuple[str, str], cases: Sequence[str]) -> np.ndarray:
        """(S, N): the values of ``key`` (output, metric) of each seed on ``cases``."""
        return np.array([[scores[key][case] for case in cases] for scores in self.seeds], float)

    def seed_spread(self, key: tuple[str, str]) -> float | None:
        """The standard deviation over the seeds of their mean of ``key`` over the finite cases (None with one seed
        or no finite case)."""
        values = finite_cases([self.seed_values(key, sorted(self.scores[key]))])[0]
        return float(values.mean(axis=1).std(ddof=1)) if len(values) > 1 and values.shape[1] else None

    @property
    def starts(self) -> list[tuple[str, str]]:
        """``(fold, the weights its runs started from)`` of each fold whose runs started from trained weights
        (``trainer.init_from``), in fold order; empty for a setting trained from scratch."""
        pairs = {(run.overrides.get(FOLD_KEY, "?"), start) for run in self.runs if (start := run.started_from)}
        return sorted(pairs, key=lambda pair: (len(pair[0]), pair))

    @property
    def cases(self) -> int:
        return len(next(iter(self.scores.values())))

    @property
    def dice(self) -> float:
        """The mean over the cases of the foreground Dice (where defined)."""
        return defined_mean(self.scores[(FOREGROUND, "dice")].values())

    @property
    def compute(self) -> dict[str, float]:
        """The mean over the completed runs of each compute key of ``metrics.json`` that they report (another tool's:
        what it recorded)."""
        if self.recorded_compute is not None:
            return dict(self.recorded_compute)
        out = {}
        for key in COMPUTE_KEYS:
            values = [value for run in self.runs if not math.isnan(value := run.value(key))]
            if values:
                out[key] = math.fsum(values) / len(values)
        return out

    @property
    def efficiency(self) -> dict[str, float]:
        """Foreground Dice per GFLOP (with recorded FLOPs), per GPU-hour (where every completed run ran on CUDA)."""
        compute, out = self.compute, {}
        if compute.get(FLOPS_KEY):
            out["dice_per_gflop"] = self.dice / compute[FLOPS_KEY]
        done = [run for run in self.runs if run.status == "completed"]
        if done and all(run.device.startswith("cuda") for run in done) and compute.get("train_seconds"):
            out["dice_per_gpu_hour"] = self.dice / (compute["train_seconds"] / 3600)
        return out


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a cross-validation's ``metrics.csv``.

    Raises:
        DatasetError: the file cannot be read.
    """
    try:
        with path.open(newline="") as handle:
            return list(csv.DictReader(handle))
    except OSError as err:
        raise DatasetError(f"{path}: cannot read the per-case scores ({type(err).__name__}: {err}); rerun "
                           f"python scripts/crossval.py on the sweep") from None


def read_volumes(paths: Sequence[Path]) -> dict[str, tuple[bool, bool]]:
    """``output -> (predicted in some case, in the label of some case)`` over the ``metrics.csv`` of ``paths`` (one
    per seed), from their ``pred_ml`` and ``ref_ml``; empty when a file lacks them."""
    volumes: dict[str, tuple[bool, bool]] = {}
    try:
        for path in paths:
            for row in read_rows(path):
                predicted, present = volumes.get(row["class_name"], (False, False))
                volumes[row["class_name"]] = (predicted or float(row["pred_ml"]) > 0,
                                              present or float(row["ref_ml"]) > 0)
    except (KeyError, ValueError, DatasetError):
        return {}
    return volumes


def read_scores(path: Path) -> Scores:
    """The per-case values of a cross-validation's ``metrics.csv`` (a row per case and output), Dice and NSD undefined
    (NaN) where the output is in neither label nor prediction (:func:`~medseg.scoring.metrics.undefined_when_empty`),
    with the foreground mean of each case for :data:`VOXEL_METRICS` (the mean over its outputs where defined,
    :func:`~medseg.scoring.metrics.defined_mean`; infinite when an HD95 is). The :data:`LESION_METRICS` are read
    when the file records them.

    Raises:
        DatasetError: the file cannot be read, or lacks a column.
    """
    try:
        rows = read_rows(path)
        read = [*VOXEL_METRICS, *(metric for metric in LESION_METRICS if rows and rows[0].get(metric))]
        values = [(row["class_name"], row["case"],
                   undefined_when_empty({metric: float(row[metric]) for metric in read}, row["flags"]))
                  for row in rows]
    except (KeyError, ValueError) as err:
        raise DatasetError(f"{path}: cannot read the per-case scores ({type(err).__name__}: {err}); rerun "
                           f"python scripts/crossval.py on the sweep") from None
    if not values:
        raise DatasetError(f"{path}: no scored case; see why in the summary.md beside it")
    outputs = list(dict.fromkeys(output for output, _, _ in values))
    scores: Scores = {}
    for output, case, metrics in values:
        for metric, value in metrics.items():
            scores.setdefault((output, metric), {})[case] = value
    for metric in VOXEL_METRICS:
        per_case = [scores[(output, metric)] for output in outputs]
        scores[(FOREGROUND, metric)] = {case: defined_mean(o.get(case, math.nan) for o in per_case)
                                        for case in per_case[0]}
    return scores


def average_seeds(per_seed: Mapping[str, Scores]) -> Scores:
    """The case-by-case mean over the seeds (``crossval`` folder -> scores) of each output and metric.

    Raises:
        DatasetError: the seeds scored different outputs or cases.
    """
    (first_name, first), *others = per_seed.items()
    for name, scores in others:
        if set(scores) != set(first):
            raise DatasetError(f"{name} and {first_name} score different outputs; cross-validate the seeds of one "
                               f"setting with the same labels")
        for key in first:
            check_same_cases(scores[key], first[key], name, first_name)
    return {key: {case: math.fsum(scores[key][case] for scores in per_seed.values()) / len(per_seed)
                  for case in cases} for key, cases in first.items()}


def read_dataset_record(paths: Sequence[Path]) -> tuple[dict[str, str], str]:
    """The labels' SHA-256 by case and the ``data.root`` recorded in the ``summary.json`` beside each ``metrics.csv``
    of ``paths`` (one per seed); ``({}, "")`` when a seed's summary lacks them.

    Raises:
        DatasetError: two seeds were scored against different labels.
    """
    digests: dict[str, str] = {}
    roots = []
    for path in paths:
        try:
            summary = json.loads(CrossvalLayout(path.parent).summary.read_text())
        except (OSError, ValueError):
            return {}, ""
        if not summary.get("labels_sha256"):
            return {}, ""
        for case, digest in summary["labels_sha256"].items():
            if digests.setdefault(case, digest) != digest:
                raise DatasetError(f"{path}: case {case} was scored against another label than in {paths[0]}; the "
                                   f"seeds of one setting must be cross-validated on one dataset")
        roots.append(str(summary.get("data_root", "")))
    return digests, roots[0]


def check_same_dataset(settings: Sequence[Setting]) -> None:
    """Every setting was scored against the same label files (by their SHA-256) wherever their cases coincide; a
    setting whose cross-validation did not record them is named in a warning.

    Raises:
        DatasetError: two settings scored a case against different labels: both named, with their ``data.root``.
    """
    recorded = [setting for setting in settings if setting.labels_sha256]
    for setting in recorded[1:]:
        first = recorded[0]
        differ = sorted(case for case in first.labels_sha256.keys() & setting.labels_sha256.keys()
                        if first.labels_sha256[case] != setting.labels_sha256[case])
        if differ:
            raise DatasetError(f"{setting.label} (data.root={setting.data_root}) and {first.label} (data.root="
                               f"{first.data_root}) were scored against different labels of {len(differ)} case(s) "
                               f"({listed(differ)}): a paired verdict needs one dataset")
    unrecorded = [setting.label for setting in settings if not setting.labels_sha256]
    if unrecorded and recorded:
        log.warning("cannot check that %s were scored on the same dataset as the others: their cross-validation "
                    "predates the record of the labels (rerun python scripts/crossval.py on the sweep)",
                    "; ".join(unrecorded))


def keep_shared_metrics(settings: Sequence[Setting]) -> None:
    """Leave out of every setting's scores the :data:`LESION_METRICS` that some setting lacks (its cross-validation
    predates them), naming those settings in a warning."""
    recorded = {setting.label: {metric for _, metric in setting.scores} for setting in settings}
    lacking = [metric for metric in LESION_METRICS
               if any(metric in metrics for metrics in recorded.values())
               and not all(metric in metrics for metrics in recorded.values())]
    if not lacking:
        return
    log.warning("the lesion-wise measures are left out of the comparison: %s did not record them (rerun python "
                "scripts/crossval.py on the sweep)",
                "; ".join(label for label, metrics in recorded.items() if not set(lacking) <= metrics))
    for setting in settings:
        setting.scores = {key: values for key, values in setting.scores.items() if key[1] not in lacking}


def read_settings(sweep: Sweep) -> list[Setting]:
    """Every setting of ``sweep`` that has a cross-validation, in run order; a setting (or a seed of one) without
    ``crossval/.../metrics.csv`` is left out with a warning.

    Raises:
        ConfigError: ``data.fold`` is not swept. DatasetError: see :func:`read_scores`, :func:`average_seeds`.
    """
    if FOLD_KEY not in sweep.swept:
        raise ConfigError(f"{sweep.path}: its runs do not differ in {FOLD_KEY}; {NEEDS_FOLDS}: sweep the folds with "
                          f"the settings, python scripts/train.py -m ... data.fold=0,1,2,3,4")
    keys = setting_keys(sweep.swept)
    grouped: dict[tuple[str | None, ...], dict[str, list[Run]]] = {}
    for label, runs in cross_validations(sweep.runs).items():
        grouped.setdefault(setting_of(runs[0], keys), {})[label] = runs
    settings = []
    for values, seeds in grouped.items():
        label = setting_label(values, keys)
        paths = {CrossvalLayout(crossval_dir(sweep.path, seed)).scores: seed for seed in seeds}
        found = [path for path in paths if path.is_file()]
        for path in paths.keys() - set(found):
            log.warning("%s: no %s (python scripts/crossval.py %s); %s left out of the comparison", sweep.path,
                        path.relative_to(sweep.path), sweep.path, paths[path] or label)
        if found:
            per_seed = {str(path.parent.relative_to(sweep.path)): read_scores(path) for path in found}
            runs = [run for group in seeds.values() for run in group]
            settings.append(Setting(label, runs, found, average_seeds(per_seed), *read_dataset_record(found),
                                    seed_scores=list(per_seed.values()), volumes=read_volumes(found)))
    return settings


def external_settings(sweep: Sweep, settings: Sequence[Setting], sources: Sequence[ExternalSource],
                      progress: bool = True) -> list[Setting]:
    """Another tool's out-of-fold predictions of ``sources`` as settings, scored on the cases of the sweep's
    ``settings`` (:mod:`medseg.evaluation.external`): every source is checked before any is scored, and the sources
    given under one name are the seeds of one setting.

    Raises:
        ConfigError, PredictionError, DatasetError: see :func:`~medseg.evaluation.external.checked_predictions`.
    """
    if not sources:
        return []
    if not settings:
        raise ConfigError(f"{sweep.path}: no cross-validated setting to pair {sources[0].key} with (cross-validate "
                          f"with python scripts/crossval.py {sweep.path})")
    check_names(sources, [setting.label for setting in settings])
    dataset = sweep_dataset(sweep.runs, settings[0].scores[(FOREGROUND, "dice")])
    by_name: dict[str, list[ExternalPredictions]] = {}
    for source in sources:
        by_name.setdefault(source.name, []).append(checked_predictions(source, dataset))
    return [external_setting(sweep.path, seeds, dataset, progress) for seeds in by_name.values()]


def external_setting(sweep_dir: Path, seeds: Sequence[ExternalPredictions], dataset: SweepDataset,
                     progress: bool = True) -> Setting:
    """The setting of another tool's checked predictions, one :class:`ExternalPredictions` per seed, scored into
    ``DIR/external/<name>/`` (:func:`~medseg.evaluation.external.scores_dir`); its compute is the mean over the
    seeds of what each recorded."""
    paths = [score_external(predictions, dataset, EvaluateConfig.tolerance_mm,
                            scores_dir(sweep_dir, predictions.source, seed, len(seeds)), progress)
             for seed, predictions in enumerate(seeds)]
    per_seed = {str(path.parent.relative_to(sweep_dir)): read_scores(path) for path in paths}
    computes = [predictions.compute for predictions in seeds]
    compute = {key: math.fsum(c[key] for c in computes) / len(computes) for key in computes[0]
               if all(key in c for c in computes)}
    return Setting(seeds[0].source.name, [], paths, average_seeds(per_seed), *read_dataset_record(paths),
                   recorded_compute=compute, source="; ".join(describe(predictions, path, sweep_dir)
                                                              for predictions, path in zip(seeds, paths)),
                   seed_scores=list(per_seed.values()) if len(seeds) > 1 else [], volumes=read_volumes(paths))
