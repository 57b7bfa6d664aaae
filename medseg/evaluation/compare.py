"""The verdict of a cross-validated sweep: does each setting differ from a reference setting, and at what compute?

Behind ``scripts/compare.py DIR [reference=model.bottleneck=none]``, and run by the multirun callback after the
cross-validation when ``data.fold`` is swept. A *setting* is the runs that differ only in ``data.fold`` and
``trainer.seed``; the cross-validation (:mod:`medseg.evaluation.crossval`) scored each seed of it on its out-of-fold
cases, one ``crossval/<setting>/metrics.csv`` per seed. For every setting:

1. the out-of-fold Dice, HD95 and NSD of each case, per output (class or region) and for the foreground mean (the
   mean over the outputs of the case where defined), and per output the lesion-wise detection sensitivity,
   false-positive components and Dice per found lesion (:mod:`medseg.scoring.detection`), averaged over the seeds
   case by case (every seed scored the same cases). Following Metrics Reloaded, a case without the output in label
   and prediction has no Dice nor NSD (it is left out of their means, the foreground mean's included, never counted
   as 1), a case without a reference lesion no sensitivity, one without a found lesion no Dice per lesion;
2. each setting but the reference is paired with the reference on the same cases
   (:mod:`medseg.scoring.paired`): the mean difference (setting minus reference) with its bootstrap 95 % confidence
   interval, the Wilcoxon signed-rank p-value, Holm's correction across the settings compared (for each output and
   metric), and a verdict in words: *better*, *worse* or *no evidence of a difference* at α = 0.05;
3. its compute: the mean over its completed runs of the compute keys of ``metrics.json``
   (:data:`~medseg.runs.folders.COMPUTE_KEYS`, and the FLOPs of a training-patch forward when recorded), the
   foreground Dice per GFLOP and, where every run trained on a GPU, per GPU-hour of one run's training.

:func:`compare_sweep` writes ``compare.md``, ``compare.csv``, ``compare.json`` and ``compare.png`` (a forest plot)
atomically into the sweep directory. A sweep without folds, a reference that names no setting or several, and
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
from medseg.runs.layout import CrossvalLayout, crossval_dir
from medseg.scoring.metrics import UNDEFINED_WHEN_EMPTY, defined_mean, undefined_when_empty
from medseg.scoring.paired import (
    ALPHA,
    BETTER,
    CONFIDENCE,
    RESAMPLES,
    WORSE,
    PairedDifference,
    check_same_cases,
    holm,
    listed,
    paired_cases,
    paired_difference,
    verdict,
)
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
FILES = ("compare.md", "compare.csv", "compare.json", "compare.png")
"""What :func:`compare_sweep` writes into the sweep directory."""
NEEDS_FOLDS = "a verdict needs cross-validation (data.fold=0,1,2,3,4)"
"""Why a sweep without folds gets no verdict."""
EFFICIENCY = ("dice_per_gflop", "dice_per_gpu_hour")
"""The efficiency columns: foreground Dice per GFLOP of a training-patch forward, per GPU-hour of one run."""
METHOD = (f"Paired on the same out-of-fold cases (seeds averaged per case): the mean difference setting − reference "
          f"with a {CONFIDENCE:.0%} bootstrap confidence interval (BCa, {RESAMPLES} resamples of the cases), the "
          f"two-sided Wilcoxon signed-rank p-value, Holm's correction across the settings compared (per output and "
          f"metric); *better* or *worse* when the Holm p < {ALPHA} and the interval excludes zero, else *no evidence "
          f"of a difference*.")

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


@dataclass
class Comparison:
    """Every setting of a sweep against its reference."""

    sweep_dir: Path
    reference: Setting
    settings: list[Setting]
    """Every cross-validated setting, the reference included, in run order."""
    rows: list[Row] = field(default_factory=list)

    def foreground(self, metric: str = "dice") -> dict[str, Row]:
        """The rows of the foreground mean of ``metric``, by setting."""
        return {row.setting: row for row in self.rows if row.output == FOREGROUND and row.metric == metric}


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
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        read = [*VOXEL_METRICS, *(metric for metric in LESION_METRICS if rows and rows[0].get(metric))]
        values = [(row["class_name"], row["case"],
                   undefined_when_empty({metric: float(row[metric]) for metric in read}, row["flags"]))
                  for row in rows]
    except (OSError, KeyError, ValueError) as err:
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
            settings.append(Setting(label, runs, found, average_seeds(per_seed), *read_dataset_record(found)))
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
    """``setting`` minus ``reference`` on their common cases for one ``(output, metric)``.

    Raises:
        DatasetError: they were not scored on the same outputs or cases.
    """
    if set(setting.scores) != set(reference.scores):
        outputs = [sorted({output for output, _ in s.scores}) for s in (setting, reference)]
        raise DatasetError(f"{setting.label} scores the outputs {outputs[0]}, {reference.label} {outputs[1]}: a paired "
                           f"comparison needs the same labels")
    return paired_difference(*paired_cases(setting.scores[key], reference.scores[key], setting.label,
                                           reference.label), resamples=resamples)


def compare_settings(settings: Sequence[Setting], reference: Setting, resamples: int = RESAMPLES) -> list[Row]:
    """Every setting but ``reference`` against it, for every output and metric; Holm's correction across the
    settings, for each output and metric. Rows by setting, then output, then metric."""
    others = [setting for setting in settings if setting is not reference]
    by_setting: dict[str, list[Row]] = {setting.label: [] for setting in others}
    for key in reference.scores:
        differences = [paired(setting, reference, key, resamples) for setting in others]
        adjusted = holm([difference.p for difference in differences])
        for setting, difference, p in zip(others, differences, adjusted):
            by_setting[setting.label].append(Row(setting.label, *key, difference, p,
                                                 verdict(difference, p, METRICS[key[1]])))
    return [row for rows in by_setting.values() for row in rows]


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
                           recorded_compute=predictions.compute, source=describe(predictions, path, sweep.path)))
    return out


def build_comparison(sweep_dir: str | Path, reference: str = DEFAULT_REFERENCE, resamples: int = RESAMPLES,
                     external: Sequence[ExternalSource] = (), progress: bool = True) -> Comparison:
    """Read and compare a cross-validated sweep (see the module docstring), with another tool's out-of-fold
    predictions as settings (``external``, scored into ``DIR/external/``); writes nothing else.

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
    return Comparison(sweep_dir, chosen, settings, compare_settings(settings, chosen, resamples))


def _interval(difference: PairedDifference) -> str:
    return "" if math.isnan(difference.low) else f"[{difference.low:+.4f}, {difference.high:+.4f}]"


def _p(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def setting_table(comparison: Comparison, render: Any = text_table) -> str:
    """One row per setting (the reference first): seeds, cases, foreground Dice, its difference, interval, p-values and
    verdict, then each compute column that some setting has and the efficiency."""
    rows_by_setting = comparison.foreground()
    ordered = [comparison.reference, *(s for s in comparison.settings if s is not comparison.reference)]
    compute = [key for key in COMPUTE_KEYS if any(key in s.compute for s in ordered)]
    efficiency = [key for key in EFFICIENCY if any(key in s.efficiency for s in ordered)]
    headers = ["setting", "seeds", "cases", "dice", "Δ dice", "95% CI", "p", "Holm p", "verdict",
               *compute, *efficiency]
    rows = []
    for setting in ordered:
        row = rows_by_setting.get(setting.label)
        tested = ([f"{row.difference.mean:+.4f}", _interval(row.difference), _p(row.difference.p), _p(row.p_holm),
                   row.verdict] if row else ["", "", "", "", "reference"])
        rows.append([setting.label, len(setting.crossvals), setting.cases, setting.dice, *tested,
                     *(setting.compute.get(key) for key in compute), *(setting.efficiency.get(k) for k in efficiency)])
    formats = {"params": ",.0f", FLOPS_KEY: ".4g", "train_seconds": ".1f", "peak_memory_mb": ".0f",
               "seconds_per_step": ".3g", "wall_seconds": ".1f"}
    return render(headers, rows, formats=formats)


def detail_table(comparison: Comparison, render: Any = markdown_table) -> str:
    """One row per setting, output and metric: cases, both means, the difference, interval, p-values, verdict."""
    headers = ["setting", "output", "metric", "cases", "mean", "reference", "Δ", "95% CI", "p", "Holm p", "verdict"]
    rows = [[row.setting, row.output, row.metric, row.difference.cases, row.difference.setting_mean,
             row.difference.reference_mean, f"{row.difference.mean:+.4f}", _interval(row.difference),
             _p(row.difference.p), _p(row.p_holm), row.verdict] for row in comparison.rows]
    return render(headers, rows)


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


def render_markdown(comparison: Comparison) -> str:
    """The text of ``compare.md``."""
    compared = len(comparison.settings) - 1
    return "\n\n".join([
        f"# Comparison: `{comparison.sweep_dir}`",
        f"Reference: `{comparison.reference.label}`; {compared} setting(s) compared on "
        f"{comparison.reference.cases} out-of-fold cases of the cross-validation (`crossval/`). {METHOD}",
        "## Foreground mean Dice, and compute",
        setting_table(comparison, markdown_table),
        *external_notes(comparison),
        *undefined_notes(comparison),
        "![forest plot](compare.png)",
        "## Every output and metric (HD95: lower is better; cases with an infinite HD95 left out)",
        detail_table(comparison),
    ]) + "\n"


def row_record(row: Row) -> dict[str, Any]:
    """A row of ``compare.csv`` and of ``compare.json``'s comparisons."""
    d = row.difference
    return {"setting": row.setting, "output": row.output, "metric": row.metric,
            "higher_is_better": METRICS[row.metric], "cases": d.cases, "mean": d.setting_mean,
            "reference_mean": d.reference_mean, "difference": d.mean, "ci_low": d.low, "ci_high": d.high, "p": d.p,
            "p_holm": row.p_holm, "verdict": row.verdict}


def setting_record(setting: Setting, sweep_dir: Path) -> dict[str, Any]:
    """A setting of ``compare.json``: its cross-validations, cases, foreground Dice, compute and efficiency."""
    return {"setting": setting.label, "crossval": [str(path.relative_to(sweep_dir)) for path in setting.crossvals],
            "cases": setting.cases, "dice": setting.dice, "compute": setting.compute,
            "devices": sorted({run.device for run in setting.runs if run.status == "completed"}),
            **({"source": setting.source} if setting.source else {}), **setting.efficiency}


def render_json(comparison: Comparison) -> dict[str, Any]:
    """The content of ``compare.json``."""
    return json_safe({
        "sweep_dir": str(comparison.sweep_dir), "reference": comparison.reference.label, "alpha": ALPHA,
        "confidence": CONFIDENCE, "method": METHOD,
        "settings": [setting_record(setting, comparison.sweep_dir) for setting in comparison.settings],
        "comparisons": [row_record(row) for row in comparison.rows],
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
"""Forest-plot colours; *no evidence* is grey."""


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


def render_plot(comparison: Comparison) -> Any:
    """The forest plot (a matplotlib Figure, Agg canvas): a panel per metric of the foreground mean, one row per
    setting with its mean difference and confidence interval, and a line at zero; below them, a panel per lesion-wise
    measure, one row per setting and output."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = plot_panels(comparison)
    heights = [1.0 + 0.45 * len(figure_row[0][1]) for figure_row in panels]
    columns = max(len(figure_row) for figure_row in panels)
    fig = Figure(figsize=(4.2 * columns, 0.4 + sum(heights)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(len(panels), columns, height_ratios=heights)
    for line, figure_row in enumerate(panels):
        for index, (metric, rows) in enumerate(figure_row):
            ax = fig.add_subplot(grid[line, index])
            for y, (_, row) in enumerate(rows):
                d = row.difference
                if not math.isnan(d.mean):
                    ax.errorbar(d.mean, y, xerr=[[d.mean - d.low], [d.high - d.mean]], fmt="o", capsize=3,
                                color=VERDICT_COLOURS.get(row.verdict, "tab:gray"))
            ax.axvline(0.0, color="black", linewidth=0.8)
            ax.set_yticks(range(len(rows)), [label for label, _ in rows] if index == 0 else [""] * len(rows),
                          fontsize="small")
            ax.set_ylim(len(rows) - 0.5, -0.5)
            ax.set_xlabel(f"Δ {metric} ({'higher' if METRICS[metric] else 'lower'} is better)")
            ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"setting − {comparison.reference.label}: foreground mean{', lesions per output' * (len(panels) > 1)}"
                 f", {CONFIDENCE:.0%} CI (green better, red worse, grey no evidence)", fontsize="medium")
    return fig


def compare_sweep(sweep_dir: str | Path, reference: str = DEFAULT_REFERENCE, resamples: int = RESAMPLES,
                  external: Sequence[ExternalSource] = (), progress: bool = True) -> Comparison:
    """Compare a cross-validated sweep (:func:`build_comparison`) and write :data:`FILES` into it atomically."""
    comparison = build_comparison(sweep_dir, reference, resamples, external, progress)
    folder = comparison.sweep_dir
    atomic_write_text(folder / "compare.csv", render_csv(comparison))
    atomic_write_json(folder / "compare.json", render_json(comparison))
    atomic_write_text(folder / "compare.md", render_markdown(comparison))
    fig = render_plot(comparison)
    atomic_write(folder / "compare.png", lambda handle: fig.savefig(handle, format="png", dpi=110))
    return comparison
