"""Evaluate segmentations against their labels: what a checkpoint or an ensemble predicts, or a folder of predictions
made by any tool.

Behind ``scripts/evaluate.py``, in one of two ways:

- ``ckpt=RUN/checkpoints/best.pt input=PATH output=DIR``: predict every case of ``input`` as ``scripts/predict.py``
  does (:mod:`medseg.inference.predict`, with its inputs, outputs and failure handling) and score each case that has a
  label, from the masks in memory (a region-based model's regions as predicted, before they are written into one
  label map);
- ``pred=DIR input=LABELS``: score the label maps ``DIR/<case>.nii.gz`` (any tool's: nnU-Net's ``predict`` output,
  another framework's) against the references of ``input`` (:mod:`.folder`), nnU-Net's ``evaluate_folder``.

Every output (foreground class, or region) of every case is scored in the original geometry with the label's own
voxel spacing (:mod:`medseg.scoring.metrics`), the ignore label's voxels left out of prediction and reference (a
region's reference is the union of its labels): Dice, HD95 (mm), normalised surface Dice at ``tolerance_mm`` and both
volumes (mL), into ``metrics.csv``; means go to ``summary.json``. Empty masks follow medseg's one rule
(:mod:`medseg.scoring.metrics`): both empty gives Dice, NSD and HD95 NaN (flag ``both_empty``), left out of the means
and counted; an empty reference with a non-empty prediction gives Dice 0, NSD 0, HD95 inf (``ref_empty``); an empty
prediction with a non-empty reference the same (``pred_empty``). HD95 means skip NaN and inf and report how many they
skipped.

A label that cannot be scored (its shape or geometry differs from its image, or it holds values that are not whole
numbers or not labels of the checkpoint) fails its case, reported by name and recorded in ``summary.json``; the other
cases are still evaluated, and the exit code is 1.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from medseg.config import EvaluateConfig
from medseg.data.labels import LabelSpec
from medseg.errors import PredictionError
from medseg.evaluation.folder import score_folder
from medseg.inference.cases import Case
from medseg.inference.checks import check_ckpt, check_prediction
from medseg.inference.inferer import Prediction
from medseg.inference.predict import Predictor, report_failures
from medseg.io import atomic_write_json, json_safe
from medseg.scoring.per_case import read_reference, score_masks, summarize, summary_table, write_metrics_csv
from medseg.typed_config import to_typed

log = logging.getLogger("medseg")


@dataclass
class EvaluationResult:
    """What :func:`evaluate` wrote into ``output``: one row per (case, output), the summary, the failures."""

    output: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> list[dict[str, str]]:
        return self.summary.get("failed", [])

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


class Scorer:
    """Scores predicted cases that have a label (:data:`~medseg.inference.predict.CaseHook`)."""

    def __init__(self, labels: LabelSpec, tolerance_mm: float) -> None:
        self.labels, self.tolerance_mm = labels, tolerance_mm
        self.scored: list[str] = []

    def __call__(self, case: Case, prediction: Prediction) -> list[dict[str, Any]]:
        """One metric row per output for a case with a label; none without. The outputs are scored one at a time
        (:meth:`Prediction.each_mask`, :func:`score_masks`): one output's masks are held, not every output's.

        Raises:
            DatasetError: a label that does not fit its image or holds values the model does not predict.
        """
        if case.label is None:
            return []
        reference, spacing = read_reference(case.label, prediction.shape, prediction.affine, case.image_files[0],
                                            self.labels)
        self.scored.append(case.case)
        return score_masks(case.case, prediction.each_mask(), reference, spacing, self.labels, self.tolerance_mm)


def check_config(cfg: EvaluateConfig | Mapping[str, Any] | DictConfig) -> EvaluateConfig:
    """``cfg`` typed as :class:`EvaluateConfig` and checked: as a prediction's (:func:`check_prediction`) when it
    predicts, its ``ckpt`` (if any) when it scores ``pred``; raises :class:`~medseg.errors.ConfigError` naming the
    key."""
    typed = to_typed(EvaluateConfig, cfg)
    if typed.pred is None and typed.ckpt is None:
        raise PredictionError("ckpt or pred is required: ckpt=<checkpoint> predicts input and scores it, "
                              "pred=<folder> scores a folder of predictions made by any tool")
    if typed.pred is None:
        check_prediction(typed)
    elif typed.ckpt is not None:
        check_ckpt(typed.ckpt)
    return typed


def output_folder(cfg: EvaluateConfig) -> Path:
    """Where ``metrics.csv`` and ``summary.json`` go: ``output``, else the ``pred`` folder, else ``predictions``."""
    return Path(cfg.output or cfg.pred or "predictions").expanduser()


def evaluate(cfg: EvaluateConfig | Mapping[str, Any] | DictConfig) -> EvaluationResult:
    """Score the predictions of ``cfg.ckpt`` (predicted here, into ``output``), or the folder ``cfg.pred``, against
    the labels of ``cfg.input``; writes ``metrics.csv`` (when any case was scored) and ``summary.json``. Per-case
    failures are recorded in the summary, not raised.

    Raises:
        PredictionError: bad settings, no images or references, predictions missing or on another grid (``pred``),
            outputs that would overwrite inputs.
        ConfigError: an output folder that cannot be written into (before any work).
        CheckpointError: a missing, foreign or incompatible checkpoint.
        NoSpaceError: the disk is full (the files written before are intact).
    """
    checked = check_config(cfg)
    output = output_folder(checked)
    if checked.pred is not None:
        scored = score_folder(checked, output)
        rows, labels, summary = scored.rows, scored.labels, scored.summary
    else:
        predictor = Predictor.load(checked, output)
        labels = predictor.ensemble.label_spec
        scorer = Scorer(labels, checked.tolerance_mm)
        result = predictor.run(predictor.find_cases(), on_case=scorer)
        rows, summary = result.rows, predictor.summary(result)
        summary["num_scored"] = len(scorer.scored)
    if summary["num_scored"]:
        write_metrics_csv(output / "metrics.csv", rows)
        summary.update(summarize(rows, labels.outputs))
    atomic_write_json(output / "summary.json", json_safe(summary))
    return EvaluationResult(output, rows, summary)


def evaluate_cli(cfg: DictConfig | Mapping[str, Any]) -> int:
    """``scripts/evaluate.py``'s task: run :func:`evaluate`, print the table and failures; the exit code.

    Any failed case makes the exit code 1; setup errors raise (:class:`~medseg.errors.MedsegError`).
    """
    result = evaluate(cfg)
    summary, output = result.summary, result.output
    if "num_predicted" in summary:
        print(f"\n{summary['num_predicted']}/{summary['num_cases']} case(s) predicted into {output}"
              + (f"; {summary['num_scored']} scored (metrics.csv, summary.json)" if summary["num_scored"] else ""))
    else:
        print(f"\n{summary['num_scored']}/{summary['num_cases']} case(s) of {summary['pred']} scored into {output} "
              f"(metrics.csv, summary.json)")
    if summary["num_scored"]:
        print(summary_table(summary))
    report_failures(result.failed)
    return result.exit_code
