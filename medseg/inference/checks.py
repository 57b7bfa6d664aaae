"""The checks of a prediction's config (:class:`~medseg.config.PredictConfig` and its ``inference`` node), made before
anything runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from medseg.config import InferenceConfig, PredictConfig
from medseg.data.dicom import missing_packages
from medseg.errors import PredictionError, check_choice
from medseg.inference.backends import BACKENDS, INT8
from medseg.runtime.device import PRECISIONS
from medseg.typed_config import check_choices, to_typed

SPLITS = ("test", "training", "validation")
"""The values of ``split``."""
OUTPUT_FORMATS = ("nifti", "dicom_seg")
"""The values of ``output_format``: NIfTI label maps, or DICOM-SEG objects (:mod:`medseg.inference.dicom_seg`)."""


def check_inference(inference: InferenceConfig, prefix: str = "inference.") -> None:
    """Check the choices of an ``inference`` node (precision, backend); raises :class:`~medseg.errors.ConfigError`
    naming the key (``prefix`` + its name). Whether the device exists and the backend runs on it is the
    :class:`~medseg.inference.inferer.Inferer`'s to say, where the device is resolved."""
    check_choice(f"{prefix}precision", inference.precision, (*PRECISIONS, INT8))
    check_choice(f"{prefix}backend", inference.backend, BACKENDS)


def check_postprocessing(value: str) -> None:
    """Refuse an empty ``postprocessing`` (its values are checked where the file is read)."""
    if not value:
        raise PredictionError("postprocessing is empty: expected auto, none, or a postprocessing.json file")


def check_ckpt(ckpt: Any) -> None:
    """Refuse a ``ckpt`` that is no checkpoint, folder or list of them."""
    ckpts = ckpt if isinstance(ckpt, list) else [ckpt]
    if not ckpts or not all(isinstance(c, str) and c for c in ckpts):
        raise PredictionError(f"ckpt={ckpt!r}: expected a checkpoint file, a run or multirun folder, or a list of "
                              f"them (ckpt=[a.pt,b.pt])")


def check_prediction(cfg: PredictConfig) -> None:
    """The checks of a typed :class:`PredictConfig` (or an ``EvaluateConfig`` that predicts): split, output format and
    its packages, postprocessing, the ``inference`` node, the checkpoints."""
    check_choices(cfg, {"split": SPLITS, "output_format": OUTPUT_FORMATS})
    check_inference(cfg.inference)
    missing = missing_packages("pydicom", "highdicom") if cfg.output_format == "dicom_seg" else None
    if missing:
        raise PredictionError(f"output_format=dicom_seg {missing}")
    check_ckpt(cfg.ckpt)
    check_postprocessing(cfg.postprocessing)


def check_config(cfg: PredictConfig | Mapping[str, Any] | DictConfig) -> PredictConfig:
    """``cfg`` typed as :class:`PredictConfig` (its types and ranges) and checked (:func:`check_prediction`); raises
    :class:`~medseg.errors.ConfigError` naming the key."""
    typed = to_typed(PredictConfig, cfg)
    check_prediction(typed)
    return typed
