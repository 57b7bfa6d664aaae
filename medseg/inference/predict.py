"""The predict stage: read, preprocess, infer, postprocess and write every case of an input with a checkpoint or an
ensemble; no labels needed.

Behind ``scripts/predict.py ckpt=RUN/checkpoints/best.pt input=PATH output=DIR`` (and ``scripts/evaluate.py``, which
scores what it predicts). The checkpoint alone rebuilds the model, its preprocessing (target spacing, normalisation),
the sliding window and the class names. ``ckpt`` may also name several models (a list, or a multirun folder:
:mod:`.ensemble`), whose probabilities are averaged on each case's own grid. ``input`` is one of:

- a folder of images (``.nii.gz``, ``.nii``, ``.nrrd``, ``.mha``) or DICOM series (series folders at any depth, or
  the folder itself; each series, told apart by ``SeriesInstanceUID``, is a case: :mod:`medseg.data.dicom`);
- a folder holding ``imagesTs/`` (or ``imagesTr/``), matched by case id; nnU-Net names (``CASE_0000.nii.gz`` ... one
  file per channel) are recognised;
- an MSD or nnU-Net ``dataset.json`` (the file or its folder) with ``split`` = ``test`` | ``training`` |
  ``validation``; ``validation`` is the file's own validation list or, without one, the validation fold the
  checkpoint was trained with (its ``data.fold``, ``num_folds`` and ``split_seed``; the stored split when there is
  one).

Each case is predicted by the checkpoint's :class:`medseg.inference.inferer.Inferer` (preprocessing, gaussian
sliding windows with optional mirroring: the ``inference`` node; the probabilities, softmax classes or a sigmoid per
region, taken back to the original voxel grid and the file's own axis order slab by slab), averaged over the models
(:class:`medseg.inference.ensemble.Ensemble`), turned into one mask per output (argmax; a region's sigmoid above
0.5) and postprocessed per output (:func:`medseg.inference.inferer.segment`; ``postprocessing``:
:mod:`medseg.postprocessing.components`; ``auto`` finds the decision ``scripts/crossval.py`` made for exactly these
checkpoints). ``OUTPUT/<case>.nii.gz`` holds the dataset's own label values with the original image's affine and
header (``save_probabilities``: ``<case>.npz`` with float16 ``probabilities`` ``(C, X, Y, Z)`` too, before
postprocessing); with ``output_format=dicom_seg`` each case, a DICOM series, gets ``OUTPUT/<case>.seg.dcm`` instead
(:mod:`medseg.inference.dicom_seg`). ``OUTPUT/summary.json`` lists the cases, the failures and the config.

A case that cannot be predicted (unreadable or corrupt file, NaN or Inf voxels, wrong channel count) is reported by
name and recorded in ``summary.json``; the other cases are still predicted, and the exit code is 1. A missing or
foreign checkpoint, an input without images, an ``output`` that cannot be written into or a full disk stops at once
with a one-line error. The half-written files a killed prediction left in ``output`` are removed by the next one.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from medseg.config import PredictConfig
from medseg.errors import DatasetError, NoSpaceError, one_line
from medseg.inference.cases import Case, find_cases
from medseg.inference.checks import check_config
from medseg.inference.dicom_seg import check_seg_inputs, write_dicom_seg
from medseg.inference.ensemble import Ensemble
from medseg.inference.inferer import Prediction, segment
from medseg.inference.output import ProbabilityWriter, check_output, write_label_map, write_masks
from medseg.io import atomic_write_json, check_writable, json_safe, remove_temporaries
from medseg.postprocessing.components import Postprocessing, from_setting
from medseg.runtime.host_memory import release_freed_memory

log = logging.getLogger("medseg")

CaseHook = Callable[[Case, Prediction], list[dict[str, Any]]]
"""Called with each predicted case and its postprocessed prediction (without its probabilities; its masks made one
output at a time by :meth:`Prediction.each_mask`) before its label map is written (evaluation scores it there);
returns that case's rows. An error it raises fails the case."""


@dataclass
class PredictionResult:
    """What :meth:`Predictor.run` did: the cases predicted, the rows of the case hook, the failures."""

    output: Path
    cases: list[Case] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def num_predicted(self) -> int:
        return len(self.cases) - len(self.failed)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def root_message(err: BaseException) -> str:
    """The innermost cause of an exception (MONAI wraps errors in transform errors), one line."""
    while err.__cause__ is not None:
        err = err.__cause__
    return one_line(err)


class Predictor:
    """The predict stage for one config: an ensemble (or one model), its postprocessing and the output folder.

    ``cfg`` is a checked :class:`~medseg.config.PredictConfig` (or an ``EvaluateConfig``, which extends it); only its
    ``output_format`` and ``save_probabilities`` are read here, besides what :meth:`load` reads.
    """

    def __init__(self, cfg: PredictConfig, ensemble: Ensemble, output: Path,
                 postprocessing: Postprocessing | None = None) -> None:
        self.cfg, self.ensemble, self.output, self.postprocessing = cfg, ensemble, output, postprocessing

    @classmethod
    def load(cls, cfg: PredictConfig, output: Path) -> Predictor:
        """The models of ``cfg.ckpt`` and the postprocessing ``cfg.postprocessing`` names, writing into ``output``.

        Raises:
            ConfigError: an ``output`` that cannot be written into (before any model is loaded).
            CheckpointError: a missing, foreign or incompatible checkpoint.
        """
        check_writable(output, "output")
        ensemble = Ensemble.load(cfg.ckpt, cfg.inference)
        postprocessing = from_setting(cfg.postprocessing, ensemble.checkpoints, ensemble.label_spec.outputs)
        return cls(cfg, ensemble, output, postprocessing)

    def find_cases(self) -> list[Case]:
        """The cases of ``cfg.input`` (:func:`~medseg.inference.cases.find_cases`), checked against the output format
        and the output folder, whose half-written files of a killed run are removed.

        Raises:
            PredictionError: no images, outputs that would overwrite inputs, or a DICOM-SEG asked for inputs that are
                not DICOM series of a one-channel model.
        """
        ensemble = self.ensemble
        cases = find_cases(self.cfg.input, self.cfg.split, ensemble.in_channels, ensemble.trained_on)
        if self.cfg.output_format == "dicom_seg":
            check_seg_inputs(cases, ensemble.nets[0].channel_names)
        check_output(cases, self.output, self.cfg.output_format)
        for path in remove_temporaries(self.output):
            log.warning("removed %s, half-written by a prediction that was killed", path)
        return cases

    def predict_case(self, case: Case, on_model: Callable[[], object] = lambda: None,
                     on_case: CaseHook | None = None, save_masks: bool = False) -> list[dict[str, Any]]:
        """Predict one case, postprocess it, pass it to ``on_case``, then write ``<case>.nii.gz`` (``<case>.seg.dcm``
        with ``output_format=dicom_seg``; and ``.npz``); ``save_masks``: also the output masks, ``<case>.masks.npz``
        (:func:`~.output.write_masks`).

        Returns:
            The rows ``on_case`` returned (none without it).

        Raises:
            DatasetError: unreadable files or a wrong channel count (or what ``on_case`` raises); the message names
                the file. Nothing of the case is written then.
        """
        ensemble = self.ensemble
        with ProbabilityWriter(self.output, case.case) if self.cfg.save_probabilities else nullcontext() as writer:
            prediction = ensemble.infer(case, on_model, on_slab=writer.write if writer else None)
            segmented = segment(prediction, self.postprocessing)
            rows = on_case(case, segmented) if on_case is not None else []
            if self.cfg.output_format == "dicom_seg":
                model = ", ".join(path.name for path in ensemble.checkpoints) or "medseg"
                write_dicom_seg(self.output, case, segmented.outputs, ensemble.label_spec, model)
            else:
                write_label_map(self.output, case, segmented.label_map(), prediction.affine)
            if writer:
                writer.save((ensemble.label_spec.num_outputs, *prediction.outputs.shape[-3:]))
        if save_masks:
            write_masks(self.output, case, segmented.masks())
        return rows

    def run(self, cases: Sequence[Case], on_case: CaseHook | None = None) -> PredictionResult:
        """Predict every case (:meth:`predict_case`) with a progress bar over cases x models; a case that fails is
        recorded with its reason and the others go on.

        Raises:
            NoSpaceError: the disk is full (the files written before are intact).
        """
        started = time.perf_counter()
        ensemble = self.ensemble
        for net, inferer in zip(ensemble.nets, ensemble.inferers):
            log.info("model %s: %dD, spacing %s mm, on %s", net.checkpoint, net.spatial_dims, net.data.spacing,
                     inferer.device)
        post = self.postprocessing
        log.info("predicting %d case(s) from %s with %d model(s); postprocessing: %s", len(cases), self.cfg.input,
                 len(ensemble), post.describe() + f" ({post.source})" if post else "none")
        result = PredictionResult(self.output, list(cases))
        progress = self.cfg.inference.progress
        with tqdm(total=len(cases) * len(ensemble), desc="predict", unit="model", disable=not progress) as bar:
            for case in cases:
                done = bar.n + len(ensemble)
                try:
                    result.rows += self.predict_case(case, on_model=lambda: bar.update(), on_case=on_case)
                except NoSpaceError:  # no case can be written: stop
                    raise
                except DatasetError as err:
                    result.failed.append({"case": case.case, "reason": str(err)})
                    log.error("case %s failed: %s", case.case, err)
                except Exception as err:  # one broken case must not stop the others
                    result.failed.append({"case": case.case, "reason": root_message(err)})
                    log.exception("case %s failed", case.case)
                finally:
                    bar.update(done - bar.n)  # a failed case counts its models as done
                    release_freed_memory()  # this case's volumes, before the next one's
        result.seconds = round(time.perf_counter() - started, 2)
        return result

    def summary(self, result: PredictionResult) -> dict[str, Any]:
        """What ``summary.json`` says of a prediction: the models, the postprocessing, the cases, the failures and the
        config (``ckpt`` and ``input`` stated once)."""
        return {
            "checkpoints": [str(path) for path in self.ensemble.checkpoints],
            "postprocessing": self.postprocessing.describe() if self.postprocessing else "none",
            "input": str(self.cfg.input),
            "num_cases": len(result.cases),
            "num_predicted": result.num_predicted,
            "failed": result.failed,
            "config": {k: v for k, v in asdict(self.cfg).items() if k not in ("ckpt", "input")},
            "seconds": result.seconds,
        }


def predict(cfg: PredictConfig | Mapping[str, Any] | DictConfig) -> PredictionResult:
    """Predict every case of ``cfg.input`` into ``cfg.output`` (see the module docstring); writes the label maps (and
    probabilities) and ``summary.json``. Per-case failures are recorded, not raised.

    Raises:
        PredictionError: bad settings, no images, outputs that would overwrite inputs, or a DICOM-SEG asked for inputs
            that are not DICOM series of a one-channel model.
        ConfigError: an ``output`` that cannot be written into (before any prediction).
        CheckpointError: a missing, foreign or incompatible checkpoint.
        NoSpaceError: the disk is full (the files written before are intact).
    """
    checked = check_config(cfg)
    output = Path(checked.output).expanduser()
    predictor = Predictor.load(checked, output)
    result = predictor.run(predictor.find_cases())
    atomic_write_json(output / "summary.json", json_safe(predictor.summary(result)))
    return result


def report_failures(failed: Sequence[Mapping[str, str]]) -> None:
    """The failed cases on stderr, one line each."""
    if failed:
        print(f"\n{len(failed)} case(s) failed:", file=sys.stderr)
        for failure in failed:
            print(f"  {failure['case']}: {failure['reason']}", file=sys.stderr)


def predict_cli(cfg: DictConfig | Mapping[str, Any]) -> int:
    """``scripts/predict.py``'s task: run :func:`predict`, print what was written and the failures; the exit code
    (1 when a case failed; setup errors raise a :class:`~medseg.errors.MedsegError`)."""
    result = predict(cfg)
    print(f"\n{result.num_predicted}/{len(result.cases)} case(s) predicted into {result.output} (summary.json)")
    report_failures(result.failed)
    return result.exit_code
