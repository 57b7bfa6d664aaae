"""The settings of an evaluation (:class:`~medseg.config.EvaluateConfig`), checked before anything runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from medseg.config import EvaluateConfig
from medseg.data.dicom import missing_packages
from medseg.errors import ConfigError
from medseg.inference.runtimes import RUNTIMES
from medseg.typed_config import check_choices, to_typed

SPLITS = ("test", "training", "validation")
"""The values of ``split``."""
PRECISIONS = ("auto", "fp32", "bf16")
"""The values of ``precision``."""
OUTPUT_FORMATS = ("nifti", "dicom_seg")
"""The values of ``output_format``: NIfTI label maps, or DICOM-SEG objects (:mod:`medseg.inference.dicom_seg`)."""


class EvaluationError(ConfigError):
    """The evaluation cannot start (bad settings, no images); the message says why in one line."""


def check_config(cfg: EvaluateConfig | Mapping[str, Any] | DictConfig) -> EvaluateConfig:
    """Check ``cfg`` against :class:`EvaluateConfig` (its types and ranges, the split, the checkpoints); raises
    :class:`~medseg.errors.ConfigError` naming the key."""
    settings = to_typed(EvaluateConfig, cfg)
    check_choices(settings, {"split": SPLITS, "output_format": OUTPUT_FORMATS, "precision": PRECISIONS,
                             "runtime": RUNTIMES})
    missing = missing_packages("pydicom", "highdicom") if settings.output_format == "dicom_seg" else None
    if missing:
        raise EvaluationError(f"output_format=dicom_seg {missing}")
    ckpts = settings.ckpt if isinstance(settings.ckpt, list) else [settings.ckpt]
    if not ckpts or not all(isinstance(c, str) and c for c in ckpts):
        raise EvaluationError(f"ckpt={settings.ckpt!r}: expected a checkpoint file, a run or multirun folder, or a "
                              f"list of them (ckpt=[a.pt,b.pt])")
    if not settings.postprocessing:
        raise EvaluationError("postprocessing is empty: expected auto, none, or a postprocessing.json file")
    return settings
