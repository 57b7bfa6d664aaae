"""The verdict of a cross-validated sweep: does each setting differ from a reference setting, and at what compute?

Behind ``scripts/compare.py DIR [reference=model.bottleneck=none]``, and run by the multirun callback after the
cross-validation when ``data.fold`` is swept. A *setting* is the runs that differ only in ``data.fold`` and
``trainer.seed``; the cross-validation (:mod:`medseg.evaluation.crossval`) scored each seed of it on its out-of-fold
cases, one ``crossval/<setting>/metrics.csv`` per seed. For every setting:

1. the out-of-fold Dice, HD95 and NSD of each case, per output (class or region) and for the foreground mean (the
   mean over the outputs of the case where defined), and per output the lesion-wise detection sensitivity,
   false-positive components and Dice per found lesion (:mod:`medseg.scoring.detection`), for each seed (every seed
   scored the same cases). Following Metrics Reloaded, a case without the output in label and prediction has no
   Dice nor NSD (it is left out of their means, the foreground mean's included, never counted as 1), a case without
   a reference lesion no sensitivity, one without a found lesion no Dice per lesion;
2. each setting but the reference is paired with the reference on the same cases
   (:mod:`medseg.scoring.paired`): the mean difference (setting minus reference) with its 95 % confidence interval
   and p-value (one seed a side: the BCa bootstrap of the cases and Wilcoxon's signed-rank test; more: the bootstrap
   of cases and seeds, :mod:`medseg.scoring.bootstrap`), Holm's correction across the settings compared (for each
   output and metric), and a verdict in words: *better*, *worse* or *no evidence of a difference* at α = 0.05, or
   *not measurable* (with the reason) without a case finite on both sides; beside each verdict the seed-to-seed
   spread, whether every seed alone lies on its side, and beside *no evidence* the smallest difference the sweep
   would have detected with 80 % power (:mod:`medseg.scoring.power`), and with ``detect=`` the cases a difference
   of that size needs;
3. with three or more settings, each one's bootstrap rank distribution (:mod:`medseg.scoring.ranking`); when the
   sweep's settings differ in one numeric key only, the slope of the metric against its values, one test
   (:mod:`medseg.scoring.trend`), and the best value named only when it beats the runner-up;
4. its compute: the mean over its completed runs of the compute keys of ``metrics.json``
   (:data:`~medseg.runs.folders.COMPUTE_KEYS`, and the FLOPs of a training-patch forward when recorded), the
   foreground Dice per GFLOP and, where every run trained on a GPU, per GPU-hour of one run's training.

:func:`compare_sweep` writes ``compare.md``, ``compare.csv``, ``compare.json`` and ``compare.png`` (a forest plot, with
the rank blobs), and ``compare.curve.png`` for a swept numeric key, atomically into the sweep directory; against a
reference other than :data:`DEFAULT_REFERENCE` the names carry it (``compare.model.bottleneck=masa.md``), so each
reference keeps its report. A sweep without folds, a reference that names no setting or several, and
settings scored on different cases stop with one line, before anything is written.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hydra.errors import OverrideParseException

from medseg.config import EvaluateConfig
from medseg.errors import ConfigError, DatasetError
from medseg.evaluation.external import (
    ExternalSource,
    check_names,
    checked_predictions,
    describe,
    score_external,
    sweep_dataset,
)
from medseg.io import atomic_write, atomic_write_json, atomic_write_text, json_safe
from medseg.runs.folders import (
    COMPUTE_KEYS,
    FLOPS_KEY,
    FOLD_KEY,
    Run,
    Sweep,
    cross_validations,
    parse_overrides,
    setting_keys,
    setting_label,
    setting_of,
)
from medseg.runs.layout import CrossvalLayout, crossval_dir, file_label
from medseg.scoring.bootstrap import resampled_means
from medseg.scoring.metrics import UNDEFINED_WHEN_EMPTY, defined_mean, undefined_when_empty
from medseg.scoring.paired import (
    ALPHA,
    BETTER,
    CONFIDENCE,
    NO_EVIDENCE,
    NOT_MEASURABLE,
    RESAMPLES,
    WORSE,
    Contrast,
    PairedDifference,
    check_same_cases,
    finite_cases,
    holm,
    listed,
    paired_cases,
    paired_difference,
    verdict,
)
from medseg.scoring.power import POWER, sensitivity
from medseg.scoring.ranking import rank_distribution
from medseg.scoring.trend import slope
from medseg.tables import markdown_table, text_table

log = logging.getLogger("medseg")

DEFAULT_REFERENCE = "model.bottleneck=none"
"""The setting every other is compared with, unless ``reference=`` names another."""
VOXEL_METRICS = {"dice": True, "hd95_mm": False, "nsd": True}
"""The compared voxel metrics of ``metrics.csv`` -> whether higher is better; each has a foreground mean."""
LESION_METRICS = {"lesion_sensitivity": True, "lesion_false_positives": False, "lesion_dice": True}
"""The compared lesion-wise columns of ``metrics.csv`` (:mod:`medseg.scoring.detection`), per output only; a
``metrics.csv`` without them (older, or rows written without detection) is compared without them."""
METRICS = {**VOXEL_METRICS, **LESION_METRICS}
"""The compared ``metrics.csv`` columns -> whether higher is better."""
FOREGROUND = "foreground mean"
"""The output name of the per-case mean over the outputs."""
REPORTS = (".md", ".csv", ".json", ".png")
"""What :func:`compare_sweep` always writes (:func:`report_name`); a swept numeric key adds :data:`CURVE`."""
CURVE = ".curve.png"
"""The plot of a swept numeric key's differences against its values."""


def report_name(reference: str, suffix: str) -> str:
    """The file name of a report against ``reference`` (a setting's label): ``compare<suffix>`` against
    :data:`DEFAULT_REFERENCE`, else ``compare.<reference><suffix>`` (``compare.model.bottleneck=masa.md``)."""
    return f"compare{'' if reference == DEFAULT_REFERENCE else '.' + file_label(reference)}{suffix}"


FILES = tuple(report_name(DEFAULT_REFERENCE, suffix) for suffix in REPORTS)
"""What :func:`compare_sweep` writes into the sweep directory against the default reference."""
NEEDS_FOLDS = "a verdict needs cross-validation (data.fold=0,1,2,3,4)"
"""Why a sweep without folds gets no verdict."""
EFFICIENCY = ("dice_per_gflop", "dice_per_gpu_hour")
"""The efficiency columns: foreground Dice per GFLOP of a training-patch forward, per GPU-hour of one run."""
METHOD = (f"Paired on the same out-of-fold cases: the mean difference setting − reference with a {CONFIDENCE:.0%} "
          f"confidence interval and a two-sided p-value; with one seed a side the BCa bootstrap of the cases "
          f"({RESAMPLES} resamples) and the Wilcoxon signed-rank test, with more the bootstrap of cases and seeds "
          f"(each setting's seeds resampled, so training noise is in the interval) and its test; Holm's correction "
          f"across the settings compared (per output and metric); *better* or *worse* when the Holm p < {ALPHA} and "
          f"the interval excludes zero, else *no evidence of a difference*, with the smallest difference the sweep "
          f"would have detected with {POWER:.0%} power at α = {ALPHA}/(settings compared), Holm's first step; *not "
          f"measurable* without a case finite on both sides.")
ONE_SEED = "1: CI omits its training noise"
"""The seeds cell of a setting with one seed: its interval resamples the cases only."""

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
        """The scores of each seed (one for another tool's predictions)."""
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


@dataclass(frozen=True)
class Row:
    """One setting against the reference, for one output and metric."""

    setting: str
    output: str
    metric: str
    difference: PairedDifference
    p_holm: float
    verdict: str
    detectable: float = math.nan
    """Beside *no evidence*: the smallest difference detected with 80 % power at α / (settings compared)."""
    cases_needed: float = math.nan
    """With ``detect=``: the cases a difference of that size needs at this spread and these seeds (inf: more seeds)."""


@dataclass(frozen=True)
class Ranking:
    """The bootstrap rank distribution of every setting on the foreground mean of one metric."""

    metric: str
    settings: list[str]
    """The settings, in :attr:`Comparison.settings` order."""
    means: list[float]
    """Each setting's mean over the cases finite in every setting."""
    distribution: np.ndarray
    """(K, K): ``[k, r]`` the share of the resamples in which setting k ranks ``r + 1``."""

    @property
    def first(self) -> int:
        """The index of the setting with the best observed mean."""
        return int(np.argmax(self.means) if METRICS[self.metric] else np.argmin(self.means))

    @property
    def first_is_first(self) -> float:
        """The share of the resamples in which the observed first ranks first."""
        return float(self.distribution[self.first, 0])


@dataclass(frozen=True)
class Curve:
    """The settings that differ in one numeric key, against its values, for the foreground mean of one metric."""

    key: str
    metric: str
    values: list[float]
    """The key's values, ascending."""
    settings: list[str]
    """The setting of each value."""
    slope: Contrast
    """The least-squares slope of the means against the values (metric per unit of the key), tested once."""
    best: str
    """Which value is best, or that the data cannot tell, in words."""


@dataclass
class Comparison:
    """Every setting of a sweep against its reference."""

    sweep_dir: Path
    reference: Setting
    settings: list[Setting]
    """Every cross-validated setting, the reference included, in run order."""
    rows: list[Row] = field(default_factory=list)
    rankings: list[Ranking] = field(default_factory=list)
    """With three or more settings: one per metric."""
    curves: list[Curve] = field(default_factory=list)
    """When the sweep's settings differ in one numeric key only: one per metric."""
    detect: float | None = None
    """The difference ``detect=`` named (in each metric's unit), or None."""

    def foreground(self, metric: str = "dice") -> dict[str, Row]:
        """The rows of the foreground mean of ``metric``, by setting."""
        return {row.setting: row for row in self.rows if row.output == FOREGROUND and row.metric == metric}

    @property
    def files(self) -> list[str]:
        """The names of the files :func:`compare_sweep` writes for this comparison."""
        suffixes = [*REPORTS, *([CURVE] if self.curves else [])]
        return [report_name(self.reference.label, suffix) for suffix in suffixes]

    @property
    def unpredicted(self) -> list[str]:
        """The outputs in the labels that no setting predicted in any case (where every setting recorded it)."""
        outputs = dict.fromkeys(output for setting in self.settings for output in setting.volumes)
        recorded = {output: [s.volumes[output] for s in self.settings if output in s.volumes] for output in outputs}
        return [output for output, volumes in recorded.items() if len(volumes) == len(self.settings)
                and any(present for _, present in volumes) and not any(predicted for predicted, _ in volumes)]


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


def select_reference(settings: Sequence[Setting], spec: str) -> Setting:
    """The setting named ``spec`` (another tool's: ``nnunet``), else the one setting whose runs have every
    ``key=value`` of ``spec`` (space-separated) among their overrides.

    Raises:
        ConfigError: ``spec`` is no name nor ``key=value`` list, or it matches no setting or several.
    """
    named = [setting for setting in settings if setting.label == spec and not setting.runs]
    if named:
        return named[0]
    try:
        wanted = parse_overrides(spec.split())
    except OverrideParseException as err:
        raise ConfigError(f"reference={spec}: not key=value pairs nor the name of a setting ({err}); choose one "
                          f"of: {'; '.join(s.label for s in settings)}") from None
    matches = [s for s in settings
               if s.runs and all(s.runs[0].overrides.get(key) == value for key, value in wanted.items())]
    if len(matches) != 1:
        found = "no" if not matches else f"{len(matches)} ({'; '.join(s.label for s in matches)})"
        raise ConfigError(f"reference={spec} matches {found} cross-validated settings; choose one of: "
                          f"{'; '.join(s.label for s in settings)} (reference=KEY=VALUE ...)")
    return matches[0]


def paired(setting: Setting, reference: Setting, key: tuple[str, str], resamples: int = RESAMPLES) -> PairedDifference:
    """``setting`` minus ``reference`` on their common cases for one ``(output, metric)``, every seed of each
    (:func:`~medseg.scoring.paired.paired_difference`).

    Raises:
        DatasetError: they were not scored on the same outputs or cases.
    """
    if set(setting.scores) != set(reference.scores):
        outputs = [sorted({output for output, _ in s.scores}) for s in (setting, reference)]
        raise DatasetError(f"{setting.label} scores the outputs {outputs[0]}, {reference.label} {outputs[1]}: a paired "
                           f"comparison needs the same labels")
    paired_cases(setting.scores[key], reference.scores[key], setting.label, reference.label)
    cases = sorted(reference.scores[key])
    return paired_difference(setting.seed_values(key, cases), reference.seed_values(key, cases), resamples=resamples)


def neither_predicted(setting: Setting, reference: Setting, output: str) -> bool:
    """Whether neither ``setting`` nor ``reference`` predicted ``output`` in any case (from the recorded volumes): then
    every metric of it compares two empty predictions, which says nothing of how either segments it."""
    volumes = [s.volumes.get(output) for s in (setting, reference)]
    return all(volume is not None and not volume[0] for volume in volumes)


def unmeasurable(setting: Setting, reference: Setting, output: str, metric: str) -> str:
    """Why ``metric`` of ``output`` cannot be compared: no case finite on both sides, or neither side predicted
    ``output`` anywhere (:func:`neither_predicted`), in words (from the recorded volumes)."""
    volumes = [s.volumes.get(output) for s in (setting, reference)]
    if volumes[0] is not None and volumes[1] is not None:
        if not (volumes[0][1] or volumes[1][1]):
            return f"no {output} in the labels"
        missing = [s.label for s, (predicted, _) in zip((setting, reference), volumes) if not predicted]
        if len(missing) == 2:
            return f"no {output} predicted"
        if missing:
            return f"{missing[0]} predicted no {output}"
    return f"no case with a finite {metric} on both sides"


def compare_settings(settings: Sequence[Setting], reference: Setting, resamples: int = RESAMPLES,
                     detect: float | None = None) -> list[Row]:
    """Every setting but ``reference`` against it, for every output and metric; Holm's correction across the
    settings, for each output and metric; *not measurable* (with the reason) without a finite pair; what each could
    have seen (:func:`~medseg.scoring.power.sensitivity`) at Holm's first level, α / (settings tested). Rows by
    setting, then output, then metric."""
    others = [setting for setting in settings if setting is not reference]
    by_setting: dict[str, list[Row]] = {setting.label: [] for setting in others}
    for key in reference.scores:
        differences = [paired(setting, reference, key, resamples) for setting in others]
        measurable = [bool(difference.cases) and not neither_predicted(setting, reference, key[0])
                      for setting, difference in zip(others, differences)]
        adjusted = holm([difference.p if tested else math.nan for difference, tested in zip(differences, measurable)])
        level = ALPHA / max(1, sum(tested and not math.isnan(d.p) for d, tested in zip(differences, measurable)))
        for setting, difference, p, tested in zip(others, differences, adjusted, measurable):
            if not tested:
                said = f"{NOT_MEASURABLE}: {unmeasurable(setting, reference, *key)}"
                by_setting[setting.label].append(Row(setting.label, *key, difference, p, said))
                continue
            said = verdict(difference, p, METRICS[key[1]])
            detectable, needed = sensitivity(difference, level, detect)
            by_setting[setting.label].append(Row(setting.label, *key, difference, p, said,
                                                 detectable if said == NO_EVIDENCE else math.nan, needed))
    return [row for rows in by_setting.values() for row in rows]


def rank_settings(settings: Sequence[Setting], metric: str, resamples: int = RESAMPLES) -> Ranking | None:
    """The bootstrap rank distribution of ``settings`` on the foreground mean of ``metric``, on the cases finite in
    every seed of every setting (:func:`~medseg.scoring.bootstrap.resampled_means`); None without such a case."""
    key = (FOREGROUND, metric)
    cases = sorted(settings[0].scores[key])
    groups = finite_cases([setting.seed_values(key, cases) for setting in settings])
    if not groups[0].shape[1]:
        return None
    resampled = resampled_means(groups, resamples)
    return Ranking(metric, [s.label for s in settings], [float(g.mean()) for g in groups],
                   rank_distribution(resampled, METRICS[metric]))


def swept_values(sweep: Sweep, settings: Sequence[Setting],
                 reference: Setting) -> tuple[str, list[tuple[float, Setting]]] | None:
    """The one key in which the sweep's own settings differ (or, failing that, those but the reference: a gamma
    sweep of one block against ``none``), with each one's numeric value (ascending), when it is numeric and takes
    three or more values; else None."""
    own = [setting for setting in settings if setting.runs]
    for group in (own, [setting for setting in own if setting is not reference]):
        varying = [key for key in setting_keys(sweep.swept) if len({s.runs[0].overrides.get(key) for s in group}) > 1]
        if len(varying) == 1 and len(group) >= 3:
            try:
                values = [(float(s.runs[0].overrides[varying[0]]), s) for s in group]
            except (KeyError, TypeError, ValueError):
                return None
            return varying[0], sorted(values, key=lambda pair: pair[0])
    return None


def best_value(key: str, metric: str, values: Sequence[tuple[float, Setting]], means: Sequence[float],
               resamples: int = RESAMPLES) -> str:
    """Which value of ``key`` is best on the foreground mean of ``metric`` (``means``: each value's), when it beats
    the runner-up (paired, at α), else that the data cannot tell."""
    order = sorted(range(len(values)), key=lambda index: means[index], reverse=METRICS[metric])
    (best, first), (second, runner_up) = values[order[0]], values[order[1]]
    difference = paired(first, runner_up, (FOREGROUND, metric), resamples)
    said = verdict(difference, difference.p, METRICS[metric])
    against = (f"{key}={best:g} against the runner-up {key}={second:g}: {difference.mean:+.4f} "
               f"{_interval(difference)}, p {_p(difference.p)}")
    if said == BETTER:
        edge = best in (values[0][0], values[-1][0])
        return f"{key}={best:g} is best ({against}){'; it is the end of the range tested' if edge else ''}"
    return f"the data cannot tell which value of {key} is best ({against}: {said})"


def curves(sweep: Sweep, settings: Sequence[Setting], reference: Setting, resamples: int = RESAMPLES) -> list[Curve]:
    """For a sweep whose settings differ in one numeric key (:func:`swept_values`): per metric, the slope of the
    foreground mean against the values (one test, :func:`~medseg.scoring.trend.slope`) and the best value."""
    swept = swept_values(sweep, settings, reference)
    if swept is None:
        return []
    key, values = swept
    out = []
    for metric in VOXEL_METRICS:  # the foreground means: the lesion measures have none
        cases = sorted(values[0][1].scores[(FOREGROUND, metric)])
        groups = finite_cases([setting.seed_values((FOREGROUND, metric), cases) for _, setting in values])
        trend = slope(groups, [value for value, _ in values], resamples=resamples)
        if trend is not None:
            out.append(Curve(key, metric, [value for value, _ in values], [s.label for _, s in values], trend,
                             best_value(key, metric, values, [float(g.mean()) for g in groups], resamples)))
    return out


def external_settings(sweep: Sweep, settings: Sequence[Setting], sources: Sequence[ExternalSource],
                      progress: bool = True) -> list[Setting]:
    """Another tool's out-of-fold predictions of each of ``sources`` as a setting, scored on the cases of the sweep's
    ``settings`` (:mod:`medseg.evaluation.external`): every source is checked before any is scored.

    Raises:
        ConfigError, PredictionError, DatasetError: see :func:`~medseg.evaluation.external.checked_predictions`.
    """
    if not sources:
        return []
    if not settings:
        raise ConfigError(f"{sweep.path}: no cross-validated setting to pair {sources[0].key} with (cross-validate "
                          f"with python scripts/crossval.py {sweep.path})")
    check_names(sources, {setting.label: setting for setting in settings})
    dataset = sweep_dataset(sweep.runs, settings[0].scores[(FOREGROUND, "dice")])
    checked = [checked_predictions(source, dataset) for source in sources]
    out = []
    for predictions in checked:
        path = score_external(predictions, dataset, EvaluateConfig.tolerance_mm, sweep.path, progress)
        out.append(Setting(predictions.source.name, [], [path], read_scores(path), *read_dataset_record([path]),
                           recorded_compute=predictions.compute, source=describe(predictions, path, sweep.path),
                           volumes=read_volumes([path])))
    return out


def build_comparison(sweep_dir: str | Path, reference: str = DEFAULT_REFERENCE, resamples: int = RESAMPLES,
                     external: Sequence[ExternalSource] = (), progress: bool = True,
                     detect: float | None = None) -> Comparison:
    """Read and compare a cross-validated sweep (see the module docstring), with another tool's out-of-fold
    predictions as settings (``external``, scored into ``DIR/external/``), and with the cases a difference of
    ``detect`` needs; writes nothing else.

    Raises:
        ConfigError: no sweep, no folds, fewer than two cross-validated settings, or a bad ``reference``.
        DatasetError: unreadable scores, or settings scored on different cases or labels.
    """
    sweep_dir = Path(sweep_dir).expanduser()
    try:
        sweep = Sweep.read(sweep_dir)
    except FileNotFoundError as err:
        raise ConfigError(f"{err}; give the folder of a multirun (python scripts/train.py -m ... "
                          f"data.fold=0,1,2,3,4)") from None
    settings = read_settings(sweep)
    check_same_dataset(settings)
    settings += external_settings(sweep, settings, external, progress)
    keep_shared_metrics(settings)
    if len(settings) < 2:
        raise ConfigError(f"{sweep_dir}: {len(settings)} cross-validated setting(s); a comparison needs two or more "
                          f"(cross-validate with python scripts/crossval.py {sweep_dir})")
    chosen = select_reference(settings, reference)
    rankings = ([ranking for metric in VOXEL_METRICS if (ranking := rank_settings(settings, metric, resamples))]
                if len(settings) >= 3 else [])
    return Comparison(sweep_dir, chosen, settings, compare_settings(settings, chosen, resamples, detect), rankings,
                      curves(sweep, settings, chosen, resamples), detect)


def _interval(difference: PairedDifference | Contrast) -> str:
    return "" if math.isnan(difference.low) else f"[{difference.low:+.4f}, {difference.high:+.4f}]"


def _p(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def _needed(value: float) -> str:
    return "" if math.isnan(value) else "more seeds" if math.isinf(value) else f"{value:,.0f}"


def _seeds(setting: Setting) -> int | str:
    return len(setting.seeds) if len(setting.seeds) > 1 else ONE_SEED


def _on_its_side(difference: PairedDifference) -> str:
    """``k/S``: how many of the setting's S seeds alone differ from the reference on the side of the mean."""
    if len(difference.seed_differences) < 2 or not math.isfinite(difference.mean):
        return ""
    side = math.copysign(1.0, difference.mean)
    return f"{sum(d * side > 0 for d in difference.seed_differences)}/{len(difference.seed_differences)}"


def _tested(row: Row, detect: float | None) -> list[Any]:
    """The cells of a row's test: Δ, interval, p, Holm p, verdict, seeds on its side, detectable Δ and, with
    ``detect``, the cases needed."""
    d = row.difference
    cells = [f"{d.mean:+.4f}" if d.cases else "", _interval(d), _p(d.p), _p(row.p_holm), row.verdict,
             _on_its_side(d), "" if math.isnan(row.detectable) else f"{row.detectable:.4f}"]
    return [*cells, _needed(row.cases_needed)] if detect is not None else cells


def _tested_headers(detect: float | None) -> list[str]:
    return ["Δ", "95% CI", "p", "Holm p", "verdict", "seeds on its side", f"detectable Δ ({POWER:.0%})",
            *([f"cases for Δ={detect:g}"] if detect is not None else [])]


def setting_table(comparison: Comparison, render: Any = text_table) -> str:
    """One row per setting (the reference first): seeds (one: the interval omits its training noise), cases,
    foreground Dice and its seed-to-seed spread, its difference, interval, p-values, verdict, the seeds on its side,
    the detectable difference (and the cases ``detect=`` needs), then each compute column that some setting has and
    the efficiency."""
    rows_by_setting = comparison.foreground()
    ordered = [comparison.reference, *(s for s in comparison.settings if s is not comparison.reference)]
    compute = [key for key in COMPUTE_KEYS if any(key in s.compute for s in ordered)]
    efficiency = [key for key in EFFICIENCY if any(key in s.efficiency for s in ordered)]
    tested = _tested_headers(comparison.detect)
    headers = ["setting", "seeds", "cases", "dice", "seed sd", *(f"{h} dice" if h == "Δ" else h for h in tested),
               *compute, *efficiency]
    rows = []
    for setting in ordered:
        row = rows_by_setting.get(setting.label)
        cells = _tested(row, comparison.detect) if row else ["", "", "", "", "reference", *[""] * (len(tested) - 5)]
        rows.append([setting.label, _seeds(setting), setting.cases, setting.dice,
                     setting.seed_spread((FOREGROUND, "dice")), *cells,
                     *(setting.compute.get(key) for key in compute), *(setting.efficiency.get(k) for k in efficiency)])
    formats = {"params": ",.0f", FLOPS_KEY: ".4g", "train_seconds": ".1f", "peak_memory_mb": ".0f",
               "seconds_per_step": ".3g", "wall_seconds": ".1f", "seed sd": ".4f"}
    return render(headers, rows, formats=formats, missing="")


def detail_table(comparison: Comparison, render: Any = markdown_table) -> str:
    """One row per setting, output and metric: cases, both means, the setting's seed-to-seed spread, then the test's
    cells (:func:`setting_table`)."""
    by_label = {setting.label: setting for setting in comparison.settings}
    headers = ["setting", "output", "metric", "cases", "mean", "reference", "seed sd",
               *_tested_headers(comparison.detect)]
    rows = [[row.setting, row.output, row.metric, row.difference.cases, row.difference.setting_mean,
             row.difference.reference_mean, by_label[row.setting].seed_spread((row.output, row.metric)),
             *_tested(row, comparison.detect)] for row in comparison.rows]
    return render(headers, rows, formats={"seed sd": ".4f", "mean": ".4f", "reference": ".4f"})


def external_notes(comparison: Comparison) -> list[str]:
    """The paragraph on other tools' settings of ``compare.md`` (none without them)."""
    sources = [setting.source for setting in comparison.settings if setting.source]
    return [f"Other tools' out-of-fold predictions, scored by medseg against the same labels: "
            f"{'; '.join(sources)}."] if sources else []


def undefined_notes(comparison: Comparison) -> list[str]:
    """The paragraph of ``compare.md`` on the cases left out as undefined: per output, how many cases of each setting
    hold it in neither label nor prediction (Dice and NSD undefined), and the lesion-wise measures' rule."""
    counts = {output: {setting.label: sum(math.isnan(value) for value in values.values())
                       for setting in comparison.settings if (values := setting.scores.get((output, "dice")))}
              for output, metric in comparison.reference.scores if metric == "dice" and output != FOREGROUND}
    empty = [f"{output}: " + ", ".join(f"{count} of {comparison.reference.cases} in {label}"
                                       for label, count in by_setting.items())
             for output, by_setting in counts.items() if any(by_setting.values())]
    lesion = any(metric in LESION_METRICS for _, metric in comparison.reference.scores)
    return ([f"Undefined, not perfect (Metrics Reloaded): a case that holds an output in neither its label nor the "
             f"prediction (of a seed) has no {' nor '.join(UNDEFINED_WHEN_EMPTY)} and is left out of them and of the "
             f"foreground mean: {'; '.join(empty) if empty else 'no such case'}."] +
            ([f"Lesion-wise ({', '.join(LESION_METRICS)}): a lesion is a connected component of the output's label "
              f"(full connectivity), found when a predicted voxel lies in it; a predicted component touching no "
              f"lesion is a false positive, counted in every case; sensitivity is undefined in a case without a "
              f"lesion, the Dice per found lesion in a case where none is found."] if lesion else []))


def unpredicted_notes(comparison: Comparison) -> list[str]:
    """The warning above the table of ``compare.md`` on outputs that no setting predicted in any case."""
    if not comparison.unpredicted:
        return []
    outputs = ", ".join(f"`{output}`" for output in comparison.unpredicted)
    return [f"**No setting predicted {outputs} in any case**: its rows compare empty predictions, not segmentations "
            f"of it."]


def noise_notes(comparison: Comparison) -> list[str]:
    """How the seeds entered the interval, in words."""
    one = [setting.label for setting in comparison.settings if len(setting.seeds) == 1]
    if not one:
        return ["Every setting has several seeds: the intervals and tests resample them as well as the cases."]
    if len(one) == len(comparison.settings):
        return ["One seed per setting: **the intervals omit training noise** (a second seed of the same setting can "
                "differ by more than they say); train with `trainer.seed=0,1,2` for intervals that hold it."]
    return [f"One seed for {'; '.join(f'`{label}`' for label in one)}: the intervals omit that training noise."]


def ranking_table(comparison: Comparison, render: Any = markdown_table) -> str:
    """One row per setting: for each ranked metric, its mean rank and the share of resamples it ranks first."""
    rankings = comparison.rankings
    headers = ["setting", *(f"{r.metric}: mean rank" for r in rankings), *(f"{r.metric}: P(first)" for r in rankings)]
    rows = [[label, *(float(r.distribution[index] @ np.arange(1, len(r.settings) + 1)) for r in rankings),
             *(f"{r.distribution[index, 0]:.0%}" for r in rankings)]
            for index, label in enumerate(rankings[0].settings)]
    return render(headers, rows, formats={h: ".2f" for h in headers if h.endswith("mean rank")})


def ranking_notes(comparison: Comparison) -> list[str]:
    """The section of ``compare.md`` on the ranking's uncertainty (none with fewer than three settings)."""
    if not comparison.rankings:
        return []
    firsts = "; ".join(f"{r.metric}: `{r.settings[r.first]}` ranks first in {r.first_is_first:.0%} of the resamples"
                       for r in comparison.rankings)
    return ["## The ranking's uncertainty",
            f"Each setting's rank over the bootstrap resamples of the cases (and seeds) of the foreground mean (blobs "
            f"in the plot's lower row: area the share of resamples at that rank). {firsts}.",
            ranking_table(comparison)]


def _trend_words(trend: Contrast) -> str:
    excludes_zero = trend.low > 0 or trend.high < 0
    return "a trend" if trend.p < ALPHA and excludes_zero else "no evidence of a trend"


def curve_notes(comparison: Comparison) -> list[str]:
    """The section of ``compare.md`` on a swept numeric key (none without one)."""
    if not comparison.curves:
        return []
    key = comparison.curves[0].key
    lines = [f"- {c.metric}: slope {c.slope.estimate:+.4g} per unit of {key} {_interval(c.slope)}, p {_p(c.slope.p)} "
             f"({_trend_words(c.slope)}); {c.best}" for c in comparison.curves]
    name = report_name(comparison.reference.label, CURVE)
    values = ", ".join(f"{value:g}" for value in comparison.curves[0].values)
    return [f"## {key} as a curve",
            f"The settings of the curve differ in `{key}` only ({values}): the "
            f"least-squares slope of each foreground metric against the values, one test for the whole curve (the "
            f"per-case slopes, paired like a difference), and the best value named only when it beats the runner-up.",
            "\n".join(lines), f"![{key} against the reference]({name})"]


def render_markdown(comparison: Comparison) -> str:
    """The text of ``compare.md``."""
    compared = len(comparison.settings) - 1
    return "\n\n".join([
        f"# Comparison: `{comparison.sweep_dir}`",
        f"Reference: `{comparison.reference.label}`; {compared} setting(s) compared on "
        f"{comparison.reference.cases} out-of-fold cases of the cross-validation (`crossval/`). {METHOD}",
        *noise_notes(comparison),
        "## Foreground mean Dice, and compute",
        *unpredicted_notes(comparison),
        setting_table(comparison, markdown_table),
        *external_notes(comparison),
        *undefined_notes(comparison),
        f"![forest plot]({report_name(comparison.reference.label, '.png')})",
        *ranking_notes(comparison),
        *curve_notes(comparison),
        "## Every output and metric (HD95: lower is better; cases with an infinite HD95 left out)",
        detail_table(comparison),
    ]) + "\n"


def row_record(row: Row) -> dict[str, Any]:
    """A row of ``compare.csv`` and of ``compare.json``'s comparisons."""
    d = row.difference
    return {"setting": row.setting, "output": row.output, "metric": row.metric,
            "higher_is_better": METRICS[row.metric], "cases": d.cases, "mean": d.setting_mean,
            "reference_mean": d.reference_mean, "difference": d.mean, "ci_low": d.low, "ci_high": d.high, "p": d.p,
            "p_holm": row.p_holm, "verdict": row.verdict, "training_noise": d.training_noise, "se": d.se,
            "seeds_on_its_side": _on_its_side(d), "holds_in_every_seed": d.holds_in_every_seed,
            "detectable_difference": row.detectable,
            "cases_needed": row.cases_needed}


def setting_record(setting: Setting, sweep_dir: Path) -> dict[str, Any]:
    """A setting of ``compare.json``: its cross-validations, seeds, cases, foreground Dice and its seed-to-seed
    spread, compute and efficiency."""
    return {"setting": setting.label, "crossval": [str(path.relative_to(sweep_dir)) for path in setting.crossvals],
            "seeds": len(setting.seeds), "cases": setting.cases, "dice": setting.dice,
            "dice_seed_sd": setting.seed_spread((FOREGROUND, "dice")), "compute": setting.compute,
            "devices": sorted({run.device for run in setting.runs if run.status == "completed"}),
            **({"source": setting.source} if setting.source else {}), **setting.efficiency}


def render_json(comparison: Comparison) -> dict[str, Any]:
    """The content of ``compare.json``."""
    return json_safe({
        "sweep_dir": str(comparison.sweep_dir), "reference": comparison.reference.label, "alpha": ALPHA,
        "confidence": CONFIDENCE, "power": POWER, "detect": comparison.detect, "method": METHOD,
        "unpredicted": comparison.unpredicted,
        "settings": [setting_record(setting, comparison.sweep_dir) for setting in comparison.settings],
        "comparisons": [row_record(row) for row in comparison.rows],
        "rankings": [{"metric": r.metric, "first": r.settings[r.first], "first_is_first": r.first_is_first,
                      "ranks": {label: r.distribution[index].tolist() for index, label in enumerate(r.settings)}}
                     for r in comparison.rankings],
        "curves": [{"key": c.key, "metric": c.metric, "values": c.values, "settings": c.settings,
                    "slope": c.slope.estimate, "ci_low": c.slope.low, "ci_high": c.slope.high, "p": c.slope.p,
                    "training_noise": c.slope.training_noise, "best": c.best} for c in comparison.curves],
    })


def render_csv(comparison: Comparison) -> str:
    """The text of ``compare.csv``: a row per setting, output and metric, with the setting's compute."""
    by_label = {setting.label: setting for setting in comparison.settings}
    records = [{**row_record(row), **by_label[row.setting].compute, **by_label[row.setting].efficiency}
               for row in comparison.rows]
    headers = list(dict.fromkeys(key for record in records for key in record))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=headers, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


VERDICT_COLOURS = {BETTER: "tab:green", WORSE: "tab:red"}
"""Forest-plot colours; *no evidence* is grey; a *not measurable* row is left empty."""


def plot_panels(comparison: Comparison) -> list[list[tuple[str, list[tuple[str, Row]]]]]:
    """The forest plot's panels by row of the figure, each ``(metric, [(label, row)])``: the foreground mean of each
    of :data:`VOXEL_METRICS` by setting, then (when recorded) each of :data:`LESION_METRICS` by setting and output."""
    labels = [s.label for s in comparison.settings if s is not comparison.reference]
    voxel = [(metric, [(label, comparison.foreground(metric)[label]) for label in labels]) for metric in VOXEL_METRICS]
    by_key = {(row.setting, row.output, row.metric): row for row in comparison.rows}
    outputs = list(dict.fromkeys(output for output, metric in comparison.reference.scores if metric in LESION_METRICS))
    lesion = [(metric, [(f"{label}: {output}", by_key[(label, output, metric)]) for label in labels
                        for output in outputs]) for metric in LESION_METRICS
              if any((output, metric) in comparison.reference.scores for output in outputs)]
    return [voxel, lesion] if lesion else [voxel]


def _figure(width: float, height: float) -> Any:
    """A matplotlib Figure on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _blobs(ax: Any, ranking: Ranking, labelled: bool) -> None:
    """A blob plot of ``ranking`` on ``ax``: a row per setting, a column per rank, the area the share."""
    ranks = np.arange(1, len(ranking.settings) + 1)
    for y, shares in enumerate(ranking.distribution):
        ax.scatter(ranks, np.full(len(ranks), y), s=400 * shares, color="tab:blue", alpha=0.7)
    ax.set_xticks(ranks)
    ax.set_yticks(range(len(ranking.settings)), ranking.settings if labelled else [""] * len(ranking.settings),
                  fontsize="small")
    ax.set_ylim(len(ranking.settings) - 0.5, -0.5)
    ax.set_xlabel(f"bootstrap rank, {ranking.metric} (first: P = {ranking.first_is_first:.0%})")


def render_plot(comparison: Comparison) -> Any:
    """The forest plot (a matplotlib Figure, Agg canvas): a panel per metric of the foreground mean, one row per
    setting with its mean difference and confidence interval, and a line at zero; below them, a panel per lesion-wise
    measure, one row per setting and output; with three or more settings, a lower row of blob plots of each
    foreground metric's bootstrap rank distribution."""
    panels = plot_panels(comparison)
    heights = [1.0 + 0.45 * len(figure_row[0][1]) for figure_row in panels]
    if comparison.rankings:
        heights.append(1.0 + 0.45 * len(comparison.rankings[0].settings))
    columns = max(len(figure_row) for figure_row in panels)
    fig = _figure(4.2 * columns, 0.4 + sum(heights))
    grid = fig.add_gridspec(len(heights), columns, height_ratios=heights)
    for line, figure_row in enumerate(panels):
        for index, (metric, rows) in enumerate(figure_row):
            ax = fig.add_subplot(grid[line, index])
            for y, (_, row) in enumerate(rows):
                d = row.difference
                if not math.isnan(d.mean) and not row.verdict.startswith(NOT_MEASURABLE):
                    ax.errorbar(d.mean, y, xerr=[[d.mean - d.low], [d.high - d.mean]], fmt="o", capsize=3,
                                color=VERDICT_COLOURS.get(row.verdict, "tab:gray"))
            ax.axvline(0.0, color="black", linewidth=0.8)
            ax.set_yticks(range(len(rows)), [label for label, _ in rows] if index == 0 else [""] * len(rows),
                          fontsize="small")
            ax.set_ylim(len(rows) - 0.5, -0.5)
            ax.set_xlabel(f"Δ {metric} ({'higher' if METRICS[metric] else 'lower'} is better)")
            ax.grid(axis="x", alpha=0.3)
    for index, ranking in enumerate(comparison.rankings):
        _blobs(fig.add_subplot(grid[len(panels), list(VOXEL_METRICS).index(ranking.metric)]), ranking, index == 0)
    fig.suptitle(f"setting − {comparison.reference.label}: foreground mean{', lesions per output' * (len(panels) > 1)}"
                 f", {CONFIDENCE:.0%} CI (green better, red worse, grey no evidence)", fontsize="medium")
    return fig


def render_curve(comparison: Comparison) -> Any:
    """The curve of a swept numeric key (a matplotlib Figure): a panel per metric, the difference of each value's
    setting to the reference against the value, with its interval (the reference's own value at zero)."""
    fig = _figure(4.2 * len(comparison.curves), 3.2)
    for index, curve in enumerate(comparison.curves):
        ax = fig.add_subplot(1, len(comparison.curves), index + 1)
        rows = comparison.foreground(curve.metric)
        points = [(value, rows[label].difference if label in rows else None)
                  for value, label in zip(curve.values, curve.settings)]
        xs = [value for value, _ in points]
        means = [0.0 if d is None else d.mean for _, d in points]
        lows = [0.0 if d is None or math.isnan(d.low) else d.mean - d.low for _, d in points]
        highs = [0.0 if d is None or math.isnan(d.high) else d.high - d.mean for _, d in points]
        ax.errorbar(xs, means, yerr=[lows, highs], fmt="o-", capsize=3, color="tab:blue")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xlabel(curve.key)
        ax.set_ylabel(f"Δ {curve.metric} ({'higher' if METRICS[curve.metric] else 'lower'} is better)")
        ax.set_title(f"slope {curve.slope.estimate:+.3g}, p {_p(curve.slope.p)}", fontsize="small")
        ax.grid(alpha=0.3)
    fig.suptitle(f"setting − {comparison.reference.label}: foreground mean, {CONFIDENCE:.0%} CI", fontsize="medium")
    return fig


def compare_sweep(sweep_dir: str | Path, reference: str = DEFAULT_REFERENCE, resamples: int = RESAMPLES,
                  external: Sequence[ExternalSource] = (), progress: bool = True,
                  detect: float | None = None) -> Comparison:
    """Compare a cross-validated sweep (:func:`build_comparison`) and write :attr:`Comparison.files` into it
    atomically (named for its reference, :func:`report_name`)."""
    comparison = build_comparison(sweep_dir, reference, resamples, external, progress, detect)
    folder, label = comparison.sweep_dir, comparison.reference.label
    atomic_write_text(folder / report_name(label, ".csv"), render_csv(comparison))
    atomic_write_json(folder / report_name(label, ".json"), render_json(comparison))
    atomic_write_text(folder / report_name(label, ".md"), render_markdown(comparison))
    plots = [(".png", render_plot(comparison)), *([(CURVE, render_curve(comparison))] if comparison.curves else [])]
    for suffix, fig in plots:
        atomic_write(folder / report_name(label, suffix), lambda handle, fig=fig: fig.savefig(handle, format="png",
                                                                                             dpi=110))
    return comparison
