"""``preprocessing.json``: what evaluation does around an exported network, written beside it and read back."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from monai.inferers import sliding_window_inference

from medseg.config import InferenceConfig
from medseg.errors import ConfigError
from medseg.export.formats import EXPORT_FORMATS, INPUT, OUTPUT
from medseg.inference.model import EvalModel
from medseg.version import __version__

PREPROCESSING_FILE = "preprocessing.json"
EXPORT_FORMAT, EXPORT_VERSION = "medseg-export", 1
"""The ``format`` tag and version of ``preprocessing.json``."""
STEPS = [
    "read the image (channels first) and reorder its voxels to RAS: axis 0 left to right, 1 posterior to anterior, "
    "2 inferior to superior",
    "resample to spacing (mm per RAS axis) by resampling: linear; or nnunet, a third-order spline, and for a case more "
    "than 3 times thicker along one axis the spline across it and nearest neighbour along it",
    "normalise: zscore = per channel (x - mean) / std over the whole image; ct = clip to [clip] then "
    "(x - mean) / std; none = as is",
    "gaussian-weighted sliding windows of roi_size (a 2D network: 1 voxel thick along slice_axis, which it does not "
    "see), zero padding where the volume is smaller",
    "softmax over the classes (axis 1 of logits)",
    "resample the probabilities back to the input's voxel grid (linear), argmax: the class indices",
    "postprocessing: per class, as the postprocessing.json named here says (null: none)",
]
"""What evaluation does, in words, for readers of ``preprocessing.json``."""


def export_description(net: EvalModel, name: str, checkpoint: str, postprocessing: str | None) -> dict[str, Any]:
    """The contents of ``preprocessing.json`` for ``net`` exported in format ``name`` from ``checkpoint``;
    ``postprocessing``: the file name of the copied decision, or None."""
    patch = net.window.net_patch
    sigma_scale = inspect.signature(sliding_window_inference).parameters["sigma_scale"].default
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "medseg_version": __version__,
        "checkpoint": checkpoint,
        "network": {"file": EXPORT_FORMATS[name].file, "format": name, "spatial_dims": net.spatial_dims,
                    "input": INPUT, "input_shape": ["batch", net.in_channels, *patch],
                    "output": OUTPUT, "output_shape": ["batch", net.num_classes, *patch]},
        "steps": STEPS,
        "orientation": "RAS",
        "spacing": net.data.spacing,
        "resampling": net.data.resampling,
        "normalization": net.data.normalization,
        "patch_size": net.data.patch_size,
        "sliding_window": {"roi_size": net.window.roi_size,
                           "slice_axis": net.window.slice_axis if net.spatial_dims == 2 else None,
                           "overlap": InferenceConfig.overlap, "mode": "gaussian", "sigma_scale": sigma_scale},
        "classes": {str(index): label for index, label in net.labels.items()},
        "channel_names": net.channel_names,
        "postprocessing": postprocessing,
    }


def read_description(folder: str | Path) -> dict[str, Any]:
    """The ``preprocessing.json`` of an export folder.

    Raises:
        ConfigError: there is none, or it is not a medseg export of this version.
    """
    path = Path(folder).expanduser() / PREPROCESSING_FILE
    try:
        description = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a medseg export ({type(err).__name__}: {err}); export one with "
                          f"scripts/export.py") from None
    if not isinstance(description, dict) or description.get("format") != EXPORT_FORMAT:
        raise ConfigError(f"{path}: not a medseg export (no '{EXPORT_FORMAT}' tag)")
    if description.get("version") != EXPORT_VERSION:
        raise ConfigError(f"{path}: export version {description.get('version')}; this medseg reads {EXPORT_VERSION}")
    return description
