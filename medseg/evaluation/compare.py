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

:func:`build_comparison` reads and compares: a sweep without folds, a reference that names no setting or several,
and settings scored on different cases stop with one line, before anything is written. :func:`report_name` names the
files of a report; :mod:`medseg.evaluation.compare_report` writes their text (and
:func:`~medseg.evaluation.compare_report.compare_sweep` the files), :mod:`medseg.evaluation.compare_plots` draws
their figures.
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
from hydra.errors import OverrideParseException

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
    parse_overrides,
    setting_keys,
    setting_label,
    setting_of,
)
from medseg.runs.layout import CrossvalLayout, crossval_dir, file_label
from medseg.scoring.bootstrap import resampled_means
from medseg.scoring.metrics import defined_mean, undefined_when_empty
from medseg.scoring.paired import (
    ALPHA,
    BETTER,
    NO_EVIDENCE,
    NOT_MEASURABLE,
    RESAMPLES,
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
from medseg.scoring.power import sensitivity
from medseg.scoring.ranking import rank_distribution
from medseg.scoring.trend import slope

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
"""What :func:`~medseg.evaluation.compare_report.compare_sweep` always writes (:func:`report_name`); a swept numeric
key adds :data:`CURVE`."""
CURVE = ".curve.png"
"""The plot of a swept numeric key's differences against its values."""


def report_name(reference: str, suffix: str) -> str:
    """The file name of a report against ``reference`` (a setting's label): ``compare<suffix>`` against
    :data:`DEFAULT_REFERENCE`, else ``compare.<reference><suffix>`` (``compare.model.bottleneck=masa.md``)."""
    return f"compare{'' if reference == DEFAULT_REFERENCE else '.' + file_label(reference)}{suffix}"


FILES = tuple(report_name(DEFAULT_REFERENCE, suffix) for suffix in REPORTS)
"""What :func:`~medseg.evaluation.compare_report.compare_sweep` writes into the sweep directory against the default
reference."""
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
        """The names of the files :func:`~medseg.evaluation.compare_report.compare_sweep` writes for this comparison."""
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
               f"{format_interval(difference)}, p {format_p(difference.p)}")
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


def format_interval(difference: PairedDifference | Contrast) -> str:
    """``[low, high]`` of a difference's (or a slope's) interval, signed to four decimals; "" without one."""
    return "" if math.isnan(difference.low) else f"[{difference.low:+.4f}, {difference.high:+.4f}]"


def format_p(value: float) -> str:
    """A p-value to three decimals (two significant digits below 0.001); "" for NaN."""
    return "" if math.isnan(value) else f"{value:.2g}" if value < 0.001 else f"{value:.3f}"
