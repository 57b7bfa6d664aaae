"""Evaluate a checkpoint or an ensemble on new volumes: predict, write label maps in the original geometry, score.

Behind ``scripts/evaluate.py ckpt=RUN/checkpoints/best.pt input=PATH output=DIR``. The checkpoint alone
rebuilds the model, its preprocessing (target spacing, normalisation), the sliding window and the
class names. ``ckpt`` may also name several models (a list, or a multirun folder: :mod:`.ensemble`), whose
probabilities are averaged on each case's own grid. ``input`` is one of:

- a folder of images (``.nii.gz``, ``.nii``, ``.nrrd``, ``.mha``) or DICOM series (a sub-folder per series, or the
  folder itself; each series, told apart by ``SeriesInstanceUID``, is a case: :mod:`medseg.data.dicom`): predict only;
- a folder holding ``imagesTs/`` (or ``imagesTr/``) and, optionally, ``labelsTs/`` (``labelsTr/``),
  matched by case id; nnU-Net names (``CASE_0000.nii.gz`` ... one file per channel, label
  ``CASE.nii.gz``) are recognised;
- an MSD or nnU-Net ``dataset.json`` (the file or its folder) with ``split`` = ``test`` |
  ``training`` | ``validation``; test images (the file's ``test`` list, else ``imagesTs/``; no training cases are
  needed) get labels from ``labelsTs/`` when they are there.
  ``validation`` is the file's own validation list or, without one, the validation fold the checkpoint
  was trained with (its ``data.fold``, ``num_folds`` and ``split_seed``; the stored split when there is one).

Each case is preprocessed by :func:`medseg.data.transforms.eval_transforms`, predicted by
:func:`medseg.inference.sliding_window.infer_volume` (gaussian sliding windows, optional mirroring TTA),
and its probabilities (softmax classes, or a sigmoid per region for region-based checkpoints:
:mod:`medseg.data.labels`) are taken back to the original voxel grid with MONAI's ``Invertd`` (linear
interpolation of the probabilities) and to the file's own axis order, averaged over the models, then turned into
one mask per output (argmax; a region's sigmoid above 0.5), then postprocessed per output (``postprocessing``:
:mod:`medseg.postprocessing.components`; ``auto`` finds the decision ``scripts/crossval.py`` made for exactly these
checkpoints). ``OUTPUT/<case>.nii.gz`` holds the dataset's own label values (regions written in their
``regions_class_order``) with the original image's affine and header, so its shape and affine equal the input's
exactly (``save_probabilities``: ``<case>.npz`` with float16 ``probabilities`` ``(C, X, Y, Z)`` too, before
postprocessing). With ``output_format=dicom_seg`` each case, a DICOM series, gets ``OUTPUT/<case>.seg.dcm`` instead:
one segment per output on the series' own slices (:mod:`medseg.inference.dicom_seg`).

With labels, every output (foreground class, or region) of every case is scored in the original geometry with the
label's own voxel spacing (:mod:`medseg.scoring.metrics`), the ignore label's voxels left out of prediction and
reference (a region's reference is the union of its labels): Dice, HD95 (mm), normalised surface Dice
at ``tolerance_mm`` and both volumes (mL), into ``metrics.csv``; means go to ``summary.json``.
Empty masks: both empty gives Dice 1, NSD 1, HD95 NaN (flag ``both_empty``); an empty reference
with a non-empty prediction gives Dice 0, NSD 0, HD95 inf (``ref_empty``); an empty prediction
with a non-empty reference the same (``pred_empty``). HD95 means skip NaN and inf and report how
many they skipped.

A case that cannot be evaluated (unreadable or corrupt file, NaN or Inf voxels, wrong channel count, a label whose
shape or geometry differs from its image, or that holds values that are not whole numbers or not labels of the
checkpoint) is reported by name and recorded in ``summary.json``; the other cases are still evaluated, and the exit
code is 1. A missing or foreign checkpoint, an input without images, an ``output`` that cannot be written into or a
full disk stops at once with a one-line error. The half-written files a killed evaluation left in ``output`` are
removed by the next one there.

Modules: :mod:`.settings` (the checked settings), :mod:`.cases` (finding the cases of ``input``),
:mod:`.model` (the network of a checkpoint), :mod:`.predict` (prediction in the original geometry),
:mod:`.ensemble` (the models of ``ckpt``, averaged), :mod:`.output` (label maps and probabilities), :mod:`.scoring`
(metrics, ``metrics.csv``, means, the table); this one runs them over every case.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from medseg.config import EvaluateConfig
from medseg.errors import DatasetError, NoSpaceError, one_line
from medseg.inference.cases import Case, find_cases
from medseg.inference.dicom_seg import check_seg_inputs, write_dicom_seg
from medseg.inference.ensemble import Ensemble
from medseg.inference.inferer import segment
from medseg.inference.output import check_output, write_label_map, write_masks, write_probabilities
from medseg.inference.settings import check_config
from medseg.io import atomic_write_json, check_writable, json_safe, remove_temporaries
from medseg.postprocessing.components import Postprocessing, from_setting
from medseg.runtime.host_memory import release_freed_memory
from medseg.scoring.per_case import (
    read_reference,
    score_masks,
    summarize,
    summary_table,
    write_metrics_csv,
)

log = logging.getLogger("medseg")


@dataclass
class EvaluationResult:
    """What :func:`evaluate` wrote: one row per (case, foreground class), the summary, the failures."""

    output: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    failed: list[dict[str, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def _root_message(err: BaseException) -> str:
    """The innermost cause of an exception (MONAI wraps errors in transform errors), one line."""
    while err.__cause__ is not None:
        err = err.__cause__
    return one_line(err)


def evaluate_case(ensemble: Ensemble, case: Case, output: Path, postprocessing: Postprocessing | None = None,
                  on_model: Callable[[], object] = lambda: None, save_masks: bool = False) -> list[dict[str, Any]]:
    """Predict one case, postprocess it, write ``<case>.nii.gz`` (``<case>.seg.dcm`` with ``output_format=dicom_seg``;
    and ``.npz``), and score it when it has a label.

    ``save_masks``: also write the output masks, ``<case>.masks.npz`` (:func:`~.output.write_masks`).

    Returns:
        One row per output: foreground class or region (empty without a label).

    Raises:
        DatasetError: unreadable files, a wrong channel count, or a label that does not fit its image; the
            message names the file.
    """
    settings = ensemble.settings
    prediction = ensemble.infer(case, on_model)
    masks = segment(prediction, postprocessing)
    reference = None if case.label is None else read_reference(  # a label that cannot be scored: nothing written
        case.label, masks.shape[1:], prediction.affine, case.image_files[0], ensemble.label_spec)
    if settings.output_format == "dicom_seg":
        model = ", ".join(path.name for path in ensemble.checkpoints) or "medseg"
        write_dicom_seg(output, case, masks, ensemble.label_spec, model)
    else:
        write_label_map(output, case, ensemble.label_spec.label_map(masks), prediction.affine)
    if settings.save_probabilities:
        write_probabilities(output, case, prediction)
    if save_masks:
        write_masks(output, case, masks)
    if reference is None:
        return []
    return score_masks(case.case, masks, *reference, ensemble.label_spec, settings.tolerance_mm)


def evaluate(cfg: EvaluateConfig | Mapping[str, Any] | DictConfig) -> EvaluationResult:
    """Predict (and score, where labels exist) every case of ``cfg.input`` into ``cfg.output``.

    Writes ``<case>.nii.gz`` (+ ``<case>.npz``), ``metrics.csv`` (when any case has a label) and
    ``summary.json``. Per-case failures are recorded, not raised.

    Raises:
        EvaluationError: bad settings, no images, outputs that would overwrite inputs, or a DICOM-SEG asked for inputs
            that are not DICOM series of a one-channel model.
        ConfigError: an ``output`` that cannot be written into (before any prediction).
        CheckpointError: a missing, foreign or incompatible checkpoint.
        NoSpaceError: the disk is full (the files written before are intact).
    """
    settings = check_config(cfg)
    started = time.perf_counter()
    output = Path(settings.output).expanduser()
    check_writable(output, "output")
    ensemble = Ensemble.load(settings.ckpt, settings)
    postprocessing = from_setting(settings.postprocessing, ensemble.checkpoints, ensemble.label_spec.outputs)
    cases = find_cases(settings.input, settings.split, ensemble.in_channels, ensemble.trained_on)
    if settings.output_format == "dicom_seg":
        check_seg_inputs(cases, ensemble.nets[0].channel_names)
    check_output(cases, output, settings.output_format)
    for path in remove_temporaries(output):
        log.warning("removed %s, half-written by an evaluation that was killed", path)
    for net, inferer in zip(ensemble.nets, ensemble.inferers):
        log.info("model %s: %dD, spacing %s mm, on %s", net.checkpoint, net.spatial_dims, net.data.spacing,
                 inferer.device)
    log.info("evaluating %d case(s) from %s with %d model(s); postprocessing: %s", len(cases), settings.input,
             len(ensemble), postprocessing.describe() + f" ({postprocessing.source})" if postprocessing else "none")
    result = EvaluationResult(output)
    scored: list[str] = []
    with tqdm(total=len(cases) * len(ensemble), desc="evaluate", unit="model", disable=not settings.progress) as bar:
        for case in cases:
            done = bar.n + len(ensemble)
            try:
                rows = evaluate_case(ensemble, case, output, postprocessing, on_model=lambda: bar.update())
            except NoSpaceError:  # no case can be written: stop
                raise
            except DatasetError as err:
                result.failed.append({"case": case.case, "reason": str(err)})
                log.error("case %s failed: %s", case.case, err)
                continue
            except Exception as err:  # one broken case must not stop the others
                result.failed.append({"case": case.case, "reason": _root_message(err)})
                log.exception("case %s failed", case.case)
                continue
            finally:
                bar.update(done - bar.n)  # a failed case counts its models as done
                release_freed_memory()  # this case's volumes, before the next one's
            result.rows.extend(rows)
            if case.label is not None:
                scored.append(case.case)
    if scored:
        write_metrics_csv(output / "metrics.csv", result.rows)
    result.summary = {
        "checkpoints": [str(path) for path in ensemble.checkpoints],
        "postprocessing": postprocessing.describe() if postprocessing else "none",
        "input": str(settings.input),
        "num_cases": len(cases),
        "num_predicted": len(cases) - len(result.failed),
        "num_scored": len(scored),
        **(summarize(result.rows, ensemble.label_spec.outputs) if scored else {}),
        "failed": result.failed,
        "settings": {k: v for k, v in asdict(settings).items() if k not in ("ckpt", "input", "progress")},
        "seconds": round(time.perf_counter() - started, 2),
    }
    atomic_write_json(output / "summary.json", json_safe(result.summary))
    return result


def evaluate_cli(cfg: DictConfig | Mapping[str, Any]) -> int:
    """``scripts/evaluate.py``'s task: run :func:`evaluate`, print the table and failures; the exit code.

    Any failed case makes the exit code 1; setup errors raise (:class:`~medseg.errors.MedsegError`).
    """
    result = evaluate(cfg)
    summary = result.summary
    print(f"\n{summary['num_predicted']}/{summary['num_cases']} case(s) predicted into {result.output}"
          + (f"; {summary['num_scored']} scored (metrics.csv, summary.json)" if summary["num_scored"] else ""))
    if summary["num_scored"]:
        print(summary_table(summary))
    if result.failed:
        print(f"\n{len(result.failed)} case(s) failed:", file=sys.stderr)
        for failure in result.failed:
            print(f"  {failure['case']}: {failure['reason']}", file=sys.stderr)
    return result.exit_code
