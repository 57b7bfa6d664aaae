"""Evaluate a checkpoint on new volumes: predict, write label maps in the original geometry, score them.

Behind ``scripts/evaluate.py ckpt=RUN/checkpoints/best.pt input=PATH output=DIR``. The checkpoint alone
rebuilds the model, its preprocessing (target spacing, normalisation), the sliding window and the
class names. ``input`` is one of:

- a folder of images (``.nii.gz``, ``.nii``, ``.nrrd``, ``.mha``): predict only;
- a folder holding ``imagesTs/`` (or ``imagesTr/``) and, optionally, ``labelsTs/`` (``labelsTr/``),
  matched by case id; nnU-Net names (``CASE_0000.nii.gz`` ... one file per channel, label
  ``CASE.nii.gz``) are recognised;
- an MSD or nnU-Net ``dataset.json`` (the file or its folder) with ``split`` = ``test`` |
  ``training`` | ``validation``; test images get labels from ``labelsTs/`` when they are there.
  ``validation`` is the file's own validation list or, without one, the validation fold the checkpoint
  was trained with (its ``data.fold``, ``num_folds`` and ``split_seed``; the stored split when there is one).

Each case is preprocessed by :func:`medseg.data.transforms.eval_transforms`, predicted by
:func:`medseg.engine.inference.predict_volume` (gaussian sliding windows, optional mirroring TTA),
and its class probabilities are taken back to the original voxel grid with MONAI's ``Invertd``
(linear interpolation of the probabilities, then argmax). ``OUTPUT/<case>.nii.gz`` is written with
the original image's affine and header, so its shape and affine equal the input's exactly
(``save_probabilities``: ``<case>.npz`` with float16 ``probabilities`` ``(C, X, Y, Z)`` too).

With labels, every foreground class of every case is scored in the original geometry with the
label's own voxel spacing (:mod:`medseg.engine.metrics`): Dice, HD95 (mm), normalised surface Dice
at ``tolerance_mm`` and both volumes (mL), into ``metrics.csv``; means go to ``summary.json``.
Empty masks: both empty gives Dice 1, NSD 1, HD95 NaN (flag ``both_empty``); an empty reference
with a non-empty prediction gives Dice 0, NSD 0, HD95 inf (``ref_empty``); an empty prediction
with a non-empty reference the same (``pred_empty``). HD95 means skip NaN and inf and report how
many they skipped. Label values that are not classes of the checkpoint count as background.

A case that cannot be evaluated (unreadable file, wrong channel count, a label whose shape or
geometry differs from its image) is reported by name and recorded in ``summary.json``; the other
cases are still evaluated, and the exit code is 1. A missing or foreign checkpoint, or an input
without images, stops at once with a one-line error.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import Compose, Invertd
from omegaconf import DictConfig
from torch import nn
from tqdm import tqdm

from medseg.config import DataConfig, EvaluateConfig, TrainConfig, check_choices, to_typed
from medseg.data.datalist import NIFTI_ENDINGS, case_id, dataset_cache_dir, load_dataset, split_cases, splits_path
from medseg.data.planning import unset_keys
from medseg.data.transforms import IMAGE, Window, eval_transforms, window
from medseg.data.verify import NIBABEL_ENDINGS, affine_difference, read_volume
from medseg.engine.checkpoint import load_checkpoint, load_model_state
from medseg.engine.device import amp_dtype, resolve_device
from medseg.engine.inference import predict_volume
from medseg.engine.metrics import METRIC_NAMES, ClassMetrics, aggregate, case_metrics, voxel_spacing
from medseg.engine.report import text_table
from medseg.errors import CheckpointError, ConfigError, DatasetError
from medseg.io import atomic_write, atomic_write_json, atomic_write_text
from medseg.models import build_model

log = logging.getLogger("medseg")

SPLITS = ("test", "training", "validation")
"""The values of ``split``."""
PRED = "pred"
CHANNEL_FILE = re.compile(r"^(?P<case>.+)_(?P<channel>\d{4})$")
"""nnU-Net image names: ``CASE_0000`` for channel 0, ``CASE_0001`` for channel 1, ..."""
CSV_COLUMNS = ("case", "class_index", "class_name", *METRIC_NAMES, "flags")


class EvaluationError(ConfigError):
    """The evaluation cannot start (bad settings, no images); the message says why in one line."""


class CaseError(DatasetError):
    """One case cannot be evaluated; the message names the file. Other cases go on."""


@dataclass
class Case:
    """One case to evaluate: its id, image file(s) (one per channel) and optional label file."""

    case: str
    image: str | list[str]
    label: str | None = None

    @property
    def image_files(self) -> list[str]:
        return list(self.image) if isinstance(self.image, list) else [self.image]


@dataclass
class EvalModel:
    """A network rebuilt from a checkpoint, with everything its inference needs."""

    model: nn.Module
    data: DataConfig
    """The training run's resolved ``data`` config: preprocessing (spacing, normalisation) and its fold."""
    spatial_dims: int
    window: Window
    labels: dict[int, str]
    """Class index -> name, background (0) included."""
    channel_names: list[str]

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def in_channels(self) -> int:
        return len(self.channel_names)


@dataclass
class Geometry:
    """The voxel grid of an original image file: what a prediction must be written back into."""

    shape: tuple[int, int, int]
    affine: np.ndarray
    """``(4, 4)`` voxel-to-world (RAS mm) affine."""
    header: nib.Nifti1Header | None = None
    """The NIfTI header to copy (None for other formats)."""
    image_class: type = nib.Nifti1Image


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


# ------------------------------------------------------------------------------------------ settings


def parse_config(cfg: EvaluateConfig | Mapping[str, Any] | DictConfig) -> EvaluateConfig:
    """Check ``cfg`` against :class:`EvaluateConfig`; raises :class:`~medseg.errors.ConfigError` naming the key."""
    settings = to_typed(EvaluateConfig, cfg)
    check_choices(settings, {"split": SPLITS})
    if not 0.0 <= settings.overlap < 1.0:
        raise EvaluationError(f"overlap={settings.overlap}: expected a fraction in [0, 1)")
    if settings.sw_batch_size < 1:
        raise EvaluationError(f"sw_batch_size={settings.sw_batch_size}: expected at least 1")
    if not settings.tolerance_mm >= 0.0:
        raise EvaluationError(f"tolerance_mm={settings.tolerance_mm}: expected a distance >= 0")
    return settings


# ------------------------------------------------------------------------------------------- model


def load_model(path: str | Path, device: torch.device | str = "cpu") -> EvalModel:
    """Rebuild the network of a medseg checkpoint, in eval mode on ``device``.

    Raises:
        CheckpointError: the file is missing, foreign or unsafe, lacks the config and dataset
            description, or its weights do not fit the architecture it describes.
    """
    state = load_checkpoint(path, map_location="cpu")
    try:
        cfg = to_typed(TrainConfig, state["config"])
        labels = {int(k): str(v) for k, v in state["dataset"]["labels"].items()}
        channel_names = [str(c) for c in state["dataset"]["channel_names"]]
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"checkpoint {path} lacks the config or dataset description evaluation needs "
                              f"({type(err).__name__}: {err})") from None
    unset = unset_keys(cfg.data, cfg.model)
    if unset:
        raise CheckpointError(f"checkpoint {path} has no resolved {', '.join(unset)}")
    view = window(cfg.data, cfg.model.spatial_dims)
    try:
        model = build_model(cfg.model, len(channel_names), len(labels), view.net_patch)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path}: cannot rebuild its model ({type(err).__name__}: {err})") from None
    load_model_state(model, state["model"], path)
    return EvalModel(model.to(device).eval(), cfg.data, cfg.model.spatial_dims, view, labels, channel_names)


def mirror_axes(spatial_dims: int, slice_axis: int) -> tuple[int, ...]:
    """Spatial axes flipped by TTA: all three for 3D models, the two in-plane axes for 2D models."""
    return tuple(a for a in range(3) if spatial_dims == 3 or a != slice_axis)


# ------------------------------------------------------------------------------------------- cases


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.name.endswith(NIFTI_ENDINGS))


def group_channels(files: Sequence[Path], num_channels: int) -> list[Case]:
    """Cases of a folder of images: nnU-Net ``CASE_XXXX`` channel files grouped, else one file per case.

    Files count as nnU-Net channel files when every name ends in ``_XXXX``, every case has channel
    ``_0000`` and its channels are contiguous (and, for single-channel models, all ``_0000``).
    """
    groups: dict[str, dict[int, Path]] = {}
    for path in files:
        match = CHANNEL_FILE.match(case_id(path))
        if match is None:
            groups = {}
            break
        groups.setdefault(match["case"], {})[int(match["channel"])] = path
    nnunet = bool(groups) and all(sorted(g) == list(range(len(g))) for g in groups.values())
    if nnunet and num_channels == 1:
        nnunet = all(len(g) == 1 for g in groups.values())
    if not nnunet:
        return [Case(case_id(path), str(path)) for path in files]
    return [Case(cid, [str(g[c]) for c in sorted(g)] if len(g) > 1 else str(g[0])) for cid, g in sorted(groups.items())]


def attach_labels(cases: list[Case], label_dir: Path) -> list[Case]:
    """Give each case without a label the file of ``label_dir`` with the same case id, if there is one."""
    if not label_dir.is_dir():
        return cases
    labels = {case_id(p): str(p) for p in _image_files(label_dir)}
    for case in cases:
        if case.label is None:
            case.label = labels.get(case.case)
    return cases


def _dataset_cases(json_path: Path, split: str, trained_on: DataConfig | None) -> list[Case]:
    root = json_path.parent
    try:
        meta = json.loads(json_path.read_text())
        info = load_dataset(root, "nnunet" if "channel_names" in meta else "msd")
        if split == "validation" and not info.validation and trained_on is not None:
            stored = splits_path(dataset_cache_dir(info.root, trained_on.cache_dir), trained_on)
            _, entries = split_cases(info, trained_on.fold, trained_on.num_folds, trained_on.split_seed,
                                     splits_file=stored if stored.is_file() else None)
        else:
            entries = {"training": info.training, "test": info.test, "validation": info.validation or []}[split]
    except json.JSONDecodeError as err:
        raise EvaluationError(f"{json_path}: not valid JSON ({err})") from None
    except DatasetError as err:
        raise EvaluationError(str(err)) from None
    if not entries:
        raise EvaluationError(f"{json_path}: the {split!r} list is empty (choose split=test|training|validation)")
    cases = [Case(e["case"], e["image"], e.get("label")) for e in entries]
    if split == "test":  # test labels are not in dataset.json; take them from labelsTs/ when present
        attach_labels(cases, root / "labelsTs")
    return cases


def find_cases(input_path: str | Path, split: str, num_channels: int,
               trained_on: DataConfig | None = None) -> list[Case]:
    """The cases of ``input_path`` (see the module docstring for the accepted layouts).

    ``trained_on`` is the checkpoint's data config (:attr:`EvalModel.data`); with it, ``split=validation``
    on a dataset without a validation list means the validation fold of that training run.

    Raises:
        EvaluationError: the path does not exist, holds no images, or has duplicate case ids.
    """
    path = Path(input_path).expanduser()
    if not path.exists():
        raise EvaluationError(f"input={path}: not found")
    if path.is_file() and path.suffix == ".json":
        if path.name != "dataset.json":
            raise EvaluationError(f"input={path}: a dataset description must be named dataset.json")
        cases = _dataset_cases(path, split, trained_on)
    elif path.is_file():
        cases = [Case(case_id(path), str(path))]
    elif (path / "dataset.json").is_file():
        cases = _dataset_cases(path / "dataset.json", split, trained_on)
    else:
        image_dir = next((path / d for d in ("imagesTs", "imagesTr") if (path / d).is_dir()), path)
        cases = group_channels(_image_files(image_dir), num_channels)
        if image_dir != path:
            attach_labels(cases, path / image_dir.name.replace("images", "labels"))
    if not cases:
        raise EvaluationError(f"input={path}: no images found ({', '.join(NIFTI_ENDINGS)} files, imagesTs/ "
                              f"+ labelsTs/, or a dataset.json)")
    ids = [c.case for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise EvaluationError(f"input={path}: duplicate case ids {duplicates}")
    return cases


# ----------------------------------------------------------------------------------- reading/writing


def _root_message(err: BaseException) -> str:
    """The innermost cause of an exception (MONAI wraps reader errors in transform errors), one line."""
    while err.__cause__ is not None:
        err = err.__cause__
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def read_geometry(path: str | Path) -> Geometry:
    """Shape, affine and (for NIfTI) header of an image file, without loading NIfTI voxel data."""
    if str(path).endswith(NIBABEL_ENDINGS):
        image = nib.load(str(path))
        return Geometry(tuple(image.shape[:3]), np.asarray(image.affine), image.header.copy(), type(image))
    array, affine = read_volume(path)
    return Geometry(tuple(array.shape[:3]), affine)


def label_dtype(num_classes: int) -> type[np.integer]:
    return np.uint8 if num_classes <= 256 else np.uint16


def save_label_map(path: Path, labels: np.ndarray, geometry: Geometry) -> Path:
    """Write an integer label map ``(X, Y, Z)`` as NIfTI with ``geometry``'s affine and header, atomically."""
    if geometry.header is not None:
        header = geometry.header.copy()
        header.set_data_dtype(labels.dtype)
        header.set_slope_inter(1.0, 0.0)
        header["cal_min"], header["cal_max"] = 0, 0
        image = geometry.image_class(labels, geometry.affine, header=header)
    else:
        image = nib.Nifti1Image(labels, geometry.affine)
        image.set_qform(geometry.affine, code=1)
        image.set_sform(geometry.affine, code=1)
    data = image.to_bytes()
    return atomic_write(path, lambda handle: handle.write(gzip.compress(data, compresslevel=1)))


def save_probability_map(path: Path, probabilities: np.ndarray) -> Path:
    """Write ``probabilities`` ``(C, X, Y, Z)`` as float16 into an ``.npz`` (key ``probabilities``)."""
    half = probabilities.astype(np.float16)
    return atomic_write(path, lambda handle: np.savez_compressed(handle, probabilities=half))


def read_label(path: str, image: Geometry, image_file: str) -> tuple[np.ndarray, tuple[float, ...]]:
    """An integer label map ``(X, Y, Z)`` and its voxel spacing (mm), checked against its image's grid."""
    try:
        array, affine = read_volume(path)
    except Exception as err:  # any reader failure is this case's failure
        raise CaseError(f"{path}: cannot read the label ({_root_message(err)})") from None
    if array.ndim > 3 and all(s == 1 for s in array.shape[3:]):
        array = array.reshape(array.shape[:3])
    if array.shape != image.shape:
        raise CaseError(f"{path}: label shape {tuple(array.shape)} differs from the shape {image.shape} "
                        f"of its image {image_file}")
    difference = affine_difference(image.affine, affine)
    if difference is not None:
        raise CaseError(f"{path}: label geometry differs from its image {image_file}: {difference}")
    return np.rint(array).astype(np.int64), voxel_spacing(affine)


# ------------------------------------------------------------------------------------------ predict


class Predictor:
    """Whole-case prediction in the original geometry for one rebuilt model and one set of settings."""

    def __init__(self, net: EvalModel, settings: EvaluateConfig) -> None:
        self.net, self.settings = net, settings
        self.device = resolve_device(settings.device, "device")
        net.model.to(self.device)
        self.sw_device = resolve_device(settings.sw_device, "sw_device") if settings.sw_device else self.device
        self.amp_dtype = amp_dtype("auto", self.device)
        self.transform: Compose = eval_transforms(net.data, with_label=False)
        self.inverter = Invertd(keys=PRED, transform=self.transform, orig_keys=IMAGE, nearest_interp=False)
        self.mirror_axes = mirror_axes(net.spatial_dims, net.window.slice_axis) if settings.tta else ()

    def preprocess(self, case: Case) -> dict[str, Any]:
        """The case through the eval chain: ``image`` is a ``(C, X', Y', Z')`` MetaTensor on the target grid."""
        image_arg = case.image if isinstance(case.image, str) else list(case.image)
        try:
            data = self.transform({IMAGE: image_arg})
        except Exception as err:  # any reader failure is this case's failure
            raise CaseError(f"{', '.join(case.image_files)}: cannot be read ({_root_message(err)})") from None
        channels = int(data[IMAGE].shape[0])
        if channels != self.net.in_channels:
            raise CaseError(
                f"{', '.join(case.image_files)}: the image has {channels} channel(s) but the checkpoint was "
                f"trained on {self.net.in_channels} ({', '.join(self.net.channel_names)})")
        return data

    def probabilities(self, case: Case, progress: bool = False) -> torch.Tensor:
        """Class probabilities ``(C, X, Y, Z)`` (float32, CPU) on the case's original voxel grid."""
        data = self.preprocess(case)
        image = data[IMAGE].unsqueeze(0).to(self.device)
        probs = predict_volume(
            self.net.model, image, self.net.window.roi_size, self.net.spatial_dims, self.net.window.slice_axis,
            sw_batch_size=self.settings.sw_batch_size, overlap=self.settings.overlap, device=self.device,
            sw_device=self.sw_device, amp_dtype=self.amp_dtype, mirror_axes=self.mirror_axes, progress=progress,
        )
        # a MetaTensor, so that Invertd takes the image's applied operations (it skips plain tensors)
        data[PRED] = MetaTensor(probs[0].detach().cpu())
        inverted = self.inverter(data)[PRED]
        return (inverted.as_tensor() if isinstance(inverted, MetaTensor) else torch.as_tensor(inverted)).float()


# ----------------------------------------------------------------------------------------- evaluate


def _metric_rows(case: str, scores: Mapping[int, ClassMetrics], labels: Mapping[int, str]) -> list[dict[str, Any]]:
    rows = []
    for index, metrics in scores.items():
        values = metrics.as_dict()
        flags = values.pop("flag")
        rows.append({"case": case, "class_index": index, "class_name": labels[index], **values, "flags": flags})
    return rows


def evaluate_case(predictor: Predictor, case: Case, output: Path, tolerance_mm: float,
                  progress: bool = False) -> list[dict[str, Any]]:
    """Predict one case, write ``<case>.nii.gz`` (and ``.npz``), and score it when it has a label.

    Returns:
        One row per foreground class (empty without a label).

    Raises:
        CaseError: unreadable files, a wrong channel count, or a label that does not fit its image.
    """
    net = predictor.net
    image_file = case.image_files[0]
    try:
        geometry = read_geometry(image_file)
    except Exception as err:  # any reader failure is this case's failure
        raise CaseError(f"{image_file}: cannot be read ({_root_message(err)})") from None
    probs = predictor.probabilities(case, progress=progress)
    if tuple(probs.shape[1:]) != geometry.shape:  # Invertd must restore the input grid
        raise CaseError(f"{image_file}: inverted prediction has shape {tuple(probs.shape[1:])}, "
                        f"expected {geometry.shape}")
    labels = probs.argmax(0).numpy().astype(label_dtype(net.num_classes))
    save_label_map(output / f"{case.case}.nii.gz", labels, geometry)
    if predictor.settings.save_probabilities:
        save_probability_map(output / f"{case.case}.npz", probs.numpy())
    if case.label is None:
        return []
    reference, spacing = read_label(case.label, geometry, image_file)
    scores = case_metrics(labels, reference, range(1, net.num_classes), spacing, tolerance_mm)
    return _metric_rows(case.case, scores, net.labels)


def _check_output(cases: Sequence[Case], output: Path) -> None:
    """Refuse to write a prediction over an input file (e.g. ``output`` = the image folder)."""
    inputs = {Path(f).resolve() for c in cases for f in [*c.image_files, *([c.label] if c.label else [])]}
    clash = [c.case for c in cases if (output / f"{c.case}.nii.gz").resolve() in inputs]
    if clash:
        raise EvaluationError(f"output={output}: predictions would overwrite input files (cases {clash[:3]}); "
                              f"choose another output folder")


def write_metrics_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """One row per (case, class); floats at full precision, ``nan``/``inf`` spelled out."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_text(path, buffer.getvalue())


def _json_safe(value: Any) -> Any:
    """NaN and inf become null (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def summarize(rows: Sequence[Mapping[str, Any]], labels: Mapping[int, str]) -> dict[str, Any]:
    """Per-class and foreground means of metric rows (see :func:`medseg.engine.metrics.aggregate`)."""
    per_class: dict[str, list[ClassMetrics]] = {labels[i]: [] for i in sorted(labels) if i > 0}
    for row in rows:
        per_class[row["class_name"]].append(ClassMetrics(
            **{k: row[k] for k in METRIC_NAMES}, flag=row["flags"]))
    summary = aggregate(per_class)
    for index, name in labels.items():
        if name in summary["classes"]:
            summary["classes"][name] = {"index": index, **summary["classes"][name]}
    return summary


def summary_table(summary: Mapping[str, Any]) -> str:
    """Per-class means and the foreground mean as an aligned text table."""
    headers = ["class", "dice", "hd95_mm", "nsd", "pred_ml", "ref_ml", "hd95_excluded"]
    rows = [[name, m["dice"], m["hd95_mm"], m["nsd"], m["pred_ml"], m["ref_ml"], m["hd95_excluded"]]
            for name, m in summary["classes"].items()]
    mean = summary["foreground_mean"]
    rows.append(["foreground mean", mean["dice"], mean["hd95_mm"], mean["nsd"], "", "", ""])
    return text_table(headers, rows)


def evaluate(cfg: EvaluateConfig | Mapping[str, Any] | DictConfig) -> EvaluationResult:
    """Predict (and score, where labels exist) every case of ``cfg.input`` into ``cfg.output``.

    Writes ``<case>.nii.gz`` (+ ``<case>.npz``), ``metrics.csv`` (when any case has a label) and
    ``summary.json``. Per-case failures are recorded, not raised.

    Raises:
        EvaluationError: bad settings, no images, or outputs that would overwrite inputs.
        CheckpointError: a missing, foreign or incompatible checkpoint.
    """
    settings = parse_config(cfg)
    started = time.perf_counter()
    net = load_model(settings.ckpt)
    predictor = Predictor(net, settings)
    cases = find_cases(settings.input, settings.split, net.in_channels, net.data)
    output = Path(settings.output).expanduser()
    _check_output(cases, output)
    log.info("evaluating %d case(s) from %s with %s (%dD, spacing %s mm) on %s", len(cases), settings.input,
             settings.ckpt, net.spatial_dims, net.data.spacing, predictor.device)
    result = EvaluationResult(output)
    scored: list[str] = []
    for case in tqdm(cases, desc="evaluate", unit="case", disable=not settings.progress):
        try:
            rows = evaluate_case(predictor, case, output, settings.tolerance_mm, progress=settings.progress)
        except CaseError as err:
            result.failed.append({"case": case.case, "reason": str(err)})
            log.error("case %s failed: %s", case.case, err)
            continue
        except Exception as err:  # one broken case must not stop the others
            result.failed.append({"case": case.case, "reason": _root_message(err)})
            log.exception("case %s failed", case.case)
            continue
        result.rows.extend(rows)
        if case.label is not None:
            scored.append(case.case)
    if scored:
        write_metrics_csv(output / "metrics.csv", result.rows)
    result.summary = {
        "checkpoint": str(settings.ckpt),
        "input": str(settings.input),
        "num_cases": len(cases),
        "num_predicted": len(cases) - len(result.failed),
        "num_scored": len(scored),
        **(summarize(result.rows, net.labels) if scored else {}),
        "failed": result.failed,
        "settings": {k: v for k, v in asdict(settings).items() if k not in ("ckpt", "input", "progress")},
        "seconds": round(time.perf_counter() - started, 2),
    }
    atomic_write_json(output / "summary.json", _json_safe(result.summary))
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
