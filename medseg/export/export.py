"""Export a checkpoint's network for use outside medseg: ONNX or TorchScript, with a ``preprocessing.json`` beside it.

Behind ``scripts/export.py ckpt=RUN/checkpoints/best.pt format=onnx|torchscript output=DIR``, which writes into
``DIR`` (all files appear together, or none):

- ``model.onnx`` (onnxruntime) or ``model.pt`` (``torch.jit.load``, in Python or C++): the network on one fixed
  window, the training patch, for any batch size: ``image`` ``(B, C, *patch)`` float32 -> ``logits``
  ``(B, K, *patch)``; a 2D network takes slices ``(B, C, *in-plane patch)`` (:mod:`.formats`);
- ``preprocessing.json``: everything evaluation does around the network (:mod:`.description`);
- ``postprocessing.json``: a copy of the ``postprocessing=<file>`` given (scripts/crossval.py's decision), if any.

Every export is checked before it appears: the written file, run in its own runtime, must give the probabilities of
the torch network within :data:`~.formats.TOLERANCE` on random windows (at a batch size other than the traced one).

:func:`load_exported` reads an export back as an :class:`~medseg.inference.model.EvalModel` from its files alone;
:func:`medseg.predict_exported` predicts a volume with it as ``scripts/predict.py`` does (preprocessing, sliding
window, inversion, postprocessing), so an export can be checked against its checkpoint.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from medseg.config import DataConfig, ExportConfig
from medseg.data.transforms import window
from medseg.errors import ConfigError
from medseg.export.description import PREPROCESSING_FILE, export_description, read_description
from medseg.export.formats import (
    EXPORT_FORMATS,
    INPUT,
    OUTPUT,
    TOLERANCE,
    ExportError,
    check_export,
    require_runtime,
    write_network,
)
from medseg.inference.model import EvalModel, load_model
from medseg.io import atomic_write_json, check_writable, replaced_folder
from medseg.postprocessing.components import POSTPROCESSING_FILE
from medseg.postprocessing.components import load as load_postprocessing
from medseg.typed_config import check_choices, to_typed

__all__ = ["EXPORT_FORMATS", "INPUT", "OUTPUT", "PREPROCESSING_FILE", "TOLERANCE", "ExportError", "ExportResult",
           "check_export", "export", "export_cli", "load_exported", "read_description",
           "write_network"]


def check_output(output: Path) -> None:
    """Refuse an ``output`` that exists and is neither empty nor an earlier export (it would be replaced)."""
    if output.exists() and not (output.is_dir() and (not any(output.iterdir())
                                                     or (output / PREPROCESSING_FILE).is_file())):
        raise ConfigError(f"output={output} exists and is not an earlier export (no {PREPROCESSING_FILE}); choose a "
                          f"new or empty folder")


@dataclass
class ExportResult:
    """What :func:`export` wrote."""

    folder: Path
    files: list[str]
    difference: float
    """Largest probability difference to the torch network on random windows."""


def export(cfg: ExportConfig | Mapping[str, Any] | DictConfig) -> ExportResult:
    """Write the network of ``cfg.ckpt`` in ``cfg.format`` and its ``preprocessing.json`` into ``cfg.output``.

    Raises:
        ConfigError: a bad setting, a format whose exporter or runtime is not installed, an ``output`` that holds
            other files or cannot be written, a postprocessing file for other classes, or a checkpoint of regions or
            gapped label values.
        CheckpointError: a missing or foreign checkpoint.
        ExportError: the network cannot be exported, or its export computes something else.
    """
    settings = to_typed(ExportConfig, cfg)
    check_choices(settings, {"format": list(EXPORT_FORMATS)})
    require_runtime(settings.format)
    output = Path(settings.output).expanduser()
    check_output(output)
    check_writable(output.parent, "output")  # replaced_folder writes beside it
    net = load_model(settings.ckpt)
    labels = net.label_spec
    if labels.region_based or labels.label_values != list(range(labels.num_classes)):
        kind = "regions" if labels.region_based else "label values with gaps"
        raise ConfigError(f"ckpt={settings.ckpt} predicts {kind}; preprocessing.json describes softmax classes 0..K-1 "
                          f"only, so export a checkpoint of such classes, or predict with scripts/evaluate.py")
    if settings.postprocessing:
        load_postprocessing(settings.postprocessing, net.labels)  # refuses a file for other classes
    kind = EXPORT_FORMATS[settings.format]
    example = torch.randn(2, net.in_channels, *net.window.net_patch, generator=torch.Generator().manual_seed(0))
    with replaced_folder(output) as folder:
        write_network(net.model, example, settings.format, folder / kind.file)
        difference = check_export(net.model, kind.load(folder / kind.file, "cpu"), example)
        if settings.postprocessing:
            shutil.copyfile(Path(settings.postprocessing).expanduser(), folder / POSTPROCESSING_FILE)
        atomic_write_json(folder / PREPROCESSING_FILE, export_description(
            net, settings.format, settings.ckpt, POSTPROCESSING_FILE if settings.postprocessing else None))
        files = sorted(p.name for p in folder.iterdir())
    return ExportResult(output, files, difference)


def export_cli(cfg: DictConfig | Mapping[str, Any]) -> None:
    """``scripts/export.py``'s task: export and print what was written."""
    result = export(cfg)
    sizes = ", ".join(f"{name} ({(result.folder / name).stat().st_size / 2**20:.2f} MB)" for name in result.files)
    print(f"exported into {result.folder}: {sizes}; probabilities within {result.difference:.2g} of torch's on random "
          f"windows")


def load_exported(folder: str | Path, device: torch.device | str = "cpu") -> EvalModel:
    """An exported network with the preprocessing of its ``preprocessing.json`` alone, as evaluation takes it.

    Raises:
        ConfigError: not an export, or its runtime is not installed.
    """
    folder = Path(folder).expanduser()
    description = read_description(folder)
    network = description["network"]
    require_runtime(network["format"])
    data = DataConfig(spacing=description["spacing"], patch_size=description["patch_size"],
                      normalization=description["normalization"])
    model = EXPORT_FORMATS[network["format"]].load(folder / network["file"], device)
    return EvalModel(model=model, data=data, spatial_dims=network["spatial_dims"],
                     window=window(data, network["spatial_dims"]),
                     labels={int(index): label for index, label in description["classes"].items()},
                     channel_names=description["channel_names"], checkpoint=folder / network["file"])
