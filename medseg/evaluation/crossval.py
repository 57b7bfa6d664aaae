"""Cross-validation of a multirun of folds: the out-of-fold predictions scored together, the postprocessing decided.

Behind ``scripts/crossval.py DIR``, and run by the multirun callback when ``data.fold`` is swept. For each setting
of the sweep (the runs that differ only in ``data.fold``; the whole sweep when it is one cross-validation):

1. every finished fold (``metrics.json`` completed, ``checkpoints/best.pt`` there) predicts its own validation
   cases, the ids its ``splits.json`` lists, found in the dataset of its config (``data.root``, ``data.format``),
   in their original geometry with the predict stage (:meth:`medseg.inference.predict.Predictor.predict_case`), into
   ``predictions/<case>.nii.gz`` (and the output masks, ``<case>.masks.npz``);
2. all out-of-fold predictions are scored together with evaluate's scoring: ``metrics.csv`` (a row per case and
   output: class or region), ``summary.json`` (with the SHA-256 of each case's label file, by which
   ``scripts/compare.py`` tells datasets apart) and ``summary.md`` (per output, mean ± std over every case of Dice,
   HD95 and NSD);
3. the postprocessing is decided per output on their masks (:func:`medseg.postprocessing.components.decide`) into
   ``postprocessing.json``,
   which ``scripts/evaluate.py ckpt=DIR`` applies (``postprocessing=auto``).

The results go to ``DIR/crossval/`` (``DIR/crossval/<setting>/`` for each setting of a wider sweep), written in a
temporary folder that replaces the old one only when everything is written. A sweep without a finished fold, a
fold without validation cases (or trained with ``data.fold=all``), a case in two folds or a dataset that is not
there stops everything before anything is written, with one line.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from medseg.config import CrossvalConfig, EvaluateConfig, PredictConfig
from medseg.data.datalist import dataset_from_config
from medseg.data.labels import LabelSpec, member_masks
from medseg.data.reading import read_file
from medseg.errors import ConfigError, DatasetError, MedsegError, NoSpaceError
from medseg.evaluation.evaluate import Scorer
from medseg.inference.cases import Case
from medseg.inference.ensemble import Ensemble, check_compatible
from medseg.inference.model import EvalModel, load_model
from medseg.inference.output import label_map_path, read_masks
from medseg.inference.predict import Predictor
from medseg.io import atomic_write_json, atomic_write_text, check_writable, json_safe, replaced_folder
from medseg.postprocessing.components import POSTPROCESSING_FILE, STEPS, OutOfFoldCase, decide
from medseg.runs.folders import Run, Sweep, cross_validations
from medseg.runs.layout import CrossvalLayout, crossval_dir
from medseg.scoring.per_case import read_reference, reference_digest, summarize, write_metrics_csv
from medseg.tables import markdown_table, mean_std, text_table
from medseg.typed_config import to_typed

log = logging.getLogger("medseg")

SCORES = (("dice", "dice"), ("hd95_mm", "hd95 (mm)"), ("nsd", "nsd"))
"""The metrics of the tables: ``metrics.csv`` column -> table header."""


@dataclass
class Fold:
    """One finished fold of a cross-validation: its run, its model and its validation cases."""

    run: Run
    fold: int
    net: EvalModel
    cases: list[Case]


@dataclass
class CrossvalResult:
    """What one cross-validation wrote into ``output``."""

    label: str
    """The setting (``""`` when the sweep is one cross-validation)."""
    output: Path
    summary: dict[str, Any] = field(default_factory=dict)
    decision: dict[str, Any] | None = None
    """The content of ``postprocessing.json``, if it was decided."""

    @property
    def failed(self) -> list[dict[str, str]]:
        return self.summary.get("failed", [])


def run_splits(run: Run) -> dict[str, Any]:
    """A run's ``splits.json``: ``{"fold": k or "all", "train": [ids], "val": [ids]}``.

    Raises:
        DatasetError: no ``splits.json``, or one that is not JSON.
    """
    path = run.splits_file
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DatasetError(f"{path}: cannot read the fold's validation cases ({type(err).__name__}: {err})") from None


def _fold_cases(run: Run, net: EvalModel) -> tuple[int, list[Case]]:
    """The fold number and validation cases of a finished run (its ``splits.json`` in its model's dataset).

    Raises:
        DatasetError: no ``splits.json``, a run trained on ``data.fold=all``, no validation cases, or ids that
            its dataset lacks.
    """
    path = run.splits_file
    splits = run_splits(run)
    if splits.get("fold") == "all":
        raise DatasetError(f"{run.path} trained with data.fold=all: it has no held-out cases; cross-validate "
                           f"folds 0..{net.data.num_folds - 1} (python scripts/train.py -m data.fold=0,1,2,3,4)")
    ids = splits.get("val") or []
    if not ids:
        raise DatasetError(f"{path}: fold {splits.get('fold')} has no validation cases; train with "
                           f"data.num_folds at most the number of cases")
    root = Path(net.data.root).expanduser()
    if not root.is_dir():
        raise DatasetError(f"{run.path}: its dataset data.root={net.data.root} is not found from {Path.cwd()}; run "
                           f"from the folder it was trained in")
    entries = {entry["case"]: entry for entry in dataset_from_config(net.data).training}
    unknown = [case for case in ids if case not in entries]
    if unknown:
        raise DatasetError(f"{path}: validation cases {unknown[:3]} are not in {root}; was the dataset changed?")
    return int(splits["fold"]), [Case(i, entries[i]["image"], entries[i]["label"]) for i in ids]


def missing_folds(folds: Sequence[Fold]) -> list[int]:
    """The folds of the split (``data.num_folds``) that are not among ``folds``."""
    return sorted(set(range(folds[0].net.data.num_folds)) - {fold.fold for fold in folds})


def read_folds(runs: Sequence[Run], where: str) -> list[Fold]:
    """The finished folds of one cross-validation, checked (``where`` names it in messages).

    Raises:
        ConfigError: no finished fold. DatasetError: see :func:`_fold_cases`, or a case in two folds.
        CheckpointError: an unreadable checkpoint.
    """
    finished = [run for run in runs if run.finished]
    if not finished:
        raise ConfigError(f"{where}: no finished fold (no run with a completed metrics.json and checkpoints/best.pt); "
                          f"wait for the training to end, or see why the runs failed in their metrics.json")
    folds = []
    for run in finished:
        net = load_model(run.best_checkpoint)
        number, cases = _fold_cases(run, net)
        folds.append(Fold(run, number, net, cases))
    check_compatible([fold.net for fold in folds])
    seen: dict[str, Fold] = {}
    for fold in folds:
        for case in fold.cases:
            if case.case in seen:
                raise DatasetError(f"{where}: case {case.case} is a validation case of both {seen[case.case].run.path} "
                                   f"and {fold.run.path}; a cross-validation needs disjoint folds")
            seen[case.case] = fold
    missing = missing_folds(folds)
    if missing:
        log.warning("%s: fold(s) %s are not finished; cross-validating the others", where, missing)
    return sorted(folds, key=lambda fold: fold.fold)


def class_statistics(rows: Sequence[Mapping[str, Any]], labels: Mapping[int, str]) -> dict[str, Any]:
    """Evaluate's means per class (:func:`summarize`) with the sample std over cases of Dice, HD95 and NSD.

    HD95's std, like its mean, is over the cases with a finite HD95.
    """
    summary = summarize(rows, labels)
    for name, stats in summary["classes"].items():
        for metric, _ in SCORES:
            values = [float(row[metric]) for row in rows if row["class_name"] == name]
            stats[f"{metric}_std"] = mean_std([v for v in values if math.isfinite(v)])[1]
    return summary


class OutOfFold:
    """The scored out-of-fold cases, read from disk on each iteration (for :func:`decide`): the output masks
    evaluation wrote, and the references of the outputs of ``labels``."""

    def __init__(self, cases: Sequence[Case], folder: Path, rows: Sequence[Mapping[str, Any]],
                 labels: LabelSpec) -> None:
        self.cases, self.folder, self.labels = cases, folder, labels
        self.scores: dict[str, dict[int, tuple[float, float]]] = {}
        for row in rows:
            self.scores.setdefault(row["case"], {})[row["class_index"]] = (row["dice"], row["hd95_mm"])

    def __iter__(self) -> Iterator[OutOfFoldCase]:
        ignore = self.labels.ignore_value
        for case in self.cases:
            prediction, affine = read_file(label_map_path(self.folder, case.case))
            reference, spacing = read_reference(case.label, prediction.shape, affine, case.image_files[0], self.labels)
            yield OutOfFoldCase(case.case, read_masks(self.folder, case.case),
                                member_masks(reference, self.labels.output_values), spacing, self.scores[case.case],
                                None if ignore is None else reference != ignore)


def _cell(stats: Mapping[str, Any], metric: str) -> str:
    """``"0.9512 ± 0.0213"`` (the mean alone where there is no std, as for the foreground mean)."""
    mean, std = stats[metric], stats.get(f"{metric}_std")
    if math.isnan(mean):
        return "nan"
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def score_table(summary: Mapping[str, Any], render: Any = text_table) -> str:
    """Per class: mean ± std over the out-of-fold cases of Dice, HD95 and NSD; then the foreground mean."""
    headers = ["class", *(header for _, header in SCORES), "cases", "hd95_excluded"]
    rows = [[name, *(_cell(stats, metric) for metric, _ in SCORES), stats["num_cases"], stats["hd95_excluded"]]
            for name, stats in summary["classes"].items()]
    mean = summary["foreground_mean"]
    rows.append(["foreground mean", *(_cell(mean, metric) for metric, _ in SCORES), "", ""])
    return render(headers, rows)


def decision_table(decision: Mapping[str, Any], render: Any = text_table) -> str:
    """Per class: mean Dice and HD95 of each postprocessing step on the out-of-fold cases, and the step taken."""
    steps = [step for step in STEPS if any(step in entry["candidates"] for entry in decision["classes"].values())]
    headers = ["class", *(f"dice {s}" for s in steps), *(f"hd95 {s}" for s in steps), "chosen"]
    rows = []
    for name, entry in decision["classes"].items():
        candidates = entry["candidates"]
        chosen = entry["step"] + (f" (< {entry['min_volume_mm3']:.4g} mm³)" if entry["min_volume_mm3"] else "")
        rows.append([name, *(candidates.get(s, {}).get("dice") for s in steps),
                     *(candidates.get(s, {}).get("hd95_mm") for s in steps), chosen])
    return render(headers, rows)


def render_markdown(result: CrossvalResult) -> str:
    """The text of ``summary.md``."""
    summary = result.summary
    folds = ", ".join(str(f["fold"]) for f in summary["folds"])
    parts = [f"# Cross-validation: `{summary['sweep_dir']}`" + (f" ({result.label})" if result.label else ""),
             f"{len(summary['folds'])} fold(s) ({folds}), {summary['num_scored']} out-of-fold cases scored together "
             f"in their original geometry: mean ± std over the cases (HD95 over those with a finite HD95).",
             score_table(summary, markdown_table)]
    if summary["missing_folds"]:
        parts.append(f"Not finished, left out: fold(s) {summary['missing_folds']}.")
    if result.decision is not None:
        parts += [f"## Postprocessing (`{POSTPROCESSING_FILE}`)", f"Rule: {result.decision['rule']}.",
                  decision_table(result.decision, markdown_table)]
    if result.failed:
        parts += ["## Failed cases", *(f"- {f['case']}: {f['reason']}" for f in result.failed)]
    return "\n\n".join(parts) + "\n"


def run_folds(folds: Sequence[Fold], sweep: Path, label: str, cfg: CrossvalConfig) -> CrossvalResult:
    """Predict, score and decide one cross-validation into its folder (see the module docstring)."""
    started = time.perf_counter()
    target = crossval_dir(sweep, label)
    spec = folds[0].net.label_spec
    labels = spec.outputs
    result = CrossvalResult(label, target)
    with replaced_folder(target) as folder:
        files = CrossvalLayout(folder)
        predictions = files.predictions
        inference = replace(cfg.inference, progress=False)  # the bar is over the cases
        prediction = PredictConfig(ckpt=str(sweep), input=str(sweep), output=str(predictions), inference=inference)
        scorer = Scorer(spec, EvaluateConfig.tolerance_mm)
        rows: list[dict[str, Any]] = []
        scored: list[Case] = []
        failed: list[dict[str, str]] = []
        total = sum(len(fold.cases) for fold in folds)
        bar = tqdm(total=total, desc=f"crossval {label}".strip(), unit="case", disable=not cfg.inference.progress)
        with bar:
            for fold in folds:
                predictor = Predictor(prediction, Ensemble([fold.net], inference), predictions)
                for case in fold.cases:
                    try:
                        rows += predictor.predict_case(case, on_case=scorer, save_masks=True)
                        scored.append(case)
                    except NoSpaceError:  # no case can be written: stop
                        raise
                    except MedsegError as err:  # a case that cannot be read is reported; the others go on
                        failed.append({"case": case.case, "reason": str(err)})
                        log.error("case %s failed: %s", case.case, err)
                    bar.update()
        write_metrics_csv(files.scores, rows)
        result.summary = {
            "sweep_dir": str(sweep),
            "setting": label or "(all runs)",
            "folds": [{"fold": f.fold, "run": f.run.name, "checkpoint": str(f.run.best_checkpoint.relative_to(sweep)),
                       "cases": [c.case for c in f.cases]} for f in folds],
            "missing_folds": missing_folds(folds),
            "num_cases": total,
            "num_scored": len(scored),
            "data_root": str(folds[0].net.data.root),
            "labels_sha256": {case.case: reference_digest(case.label) for case in scored},
            **class_statistics(rows, labels),
            "failed": failed,
            "config": asdict(cfg),
        }
        if cfg.postprocessing and scored:
            result.decision = decide(OutOfFold(scored, predictions, rows, spec), labels)
            checkpoints = [str(f.run.best_checkpoint.relative_to(sweep)) for f in folds]
            atomic_write_json(folder / POSTPROCESSING_FILE, json_safe({**result.decision, "checkpoints": checkpoints}))
            result.summary["postprocessing"] = {name: c["step"] for name, c in result.decision["classes"].items()}
        result.summary["seconds"] = round(time.perf_counter() - started, 2)
        atomic_write_json(files.summary, json_safe(result.summary))
        atomic_write_text(files.report, render_markdown(result))
    return result


def cross_validate(cfg: CrossvalConfig | Mapping[str, Any] | DictConfig) -> list[CrossvalResult]:
    """Cross-validate every setting of the multirun ``cfg.dir`` (see the module docstring).

    Raises:
        ConfigError: ``dir`` is not a multirun or cannot be written into, or no setting has a finished fold.
        DatasetError, CheckpointError: a fold that cannot be cross-validated; nothing is written then.
    """
    cfg = to_typed(CrossvalConfig, cfg)
    sweep = Path(cfg.dir).expanduser()
    check_writable(sweep, "dir")
    try:
        runs = Sweep.read(sweep).runs
    except FileNotFoundError as err:
        raise ConfigError(f"dir={sweep}: {err}; give the folder of a multirun "
                          f"(python scripts/train.py -m data.fold=0,1,2,3,4)") from None
    groups = cross_validations(runs)
    runnable = {label: group for label, group in groups.items() if any(run.finished for run in group)}
    if not runnable:
        read_folds(runs, f"dir={sweep}")  # raises: no finished fold
    for label in sorted(set(groups) - set(runnable)):
        log.warning("dir=%s: setting %s has no finished fold; left out", sweep, label)
    plans = {label: read_folds(group, f"dir={sweep}" + (f" ({label})" if label else ""))
             for label, group in runnable.items()}
    return [run_folds(folds, sweep, label, cfg) for label, folds in plans.items()]


def crossval_cli(cfg: DictConfig | Mapping[str, Any]) -> int:
    """``scripts/crossval.py``'s task: cross-validate, print the tables; 1 when a case failed."""
    results = cross_validate(cfg)
    for result in results:
        title = f" ({result.label})" if result.label else ""
        print(f"\ncross-validation{title}: {result.summary['num_scored']} out-of-fold cases from "
              f"{len(result.summary['folds'])} fold(s), mean ± std over the cases; written to {result.output}")
        print(score_table(result.summary))
        if result.decision is not None:
            print(f"\npostprocessing ({POSTPROCESSING_FILE}):")
            print(decision_table(result.decision))
        for failure in result.failed:
            print(f"  {failure['case']} failed: {failure['reason']}", file=sys.stderr)
    return 1 if any(result.failed for result in results) else 0
