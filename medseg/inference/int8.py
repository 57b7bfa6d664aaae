"""``inference.precision=int8``: a checkpoint's network quantised to int8 after training by OpenVINO's NNCF, for
CPUs without native bf16.

The network is exported as for fp32 (:func:`~medseg.inference.backends.export_openvino`) and quantised by
``nncf.quantize`` (its default preset) on ``inference.calibration_windows`` windows of the checkpoint's training
cases (:mod:`medseg.inference.calibration`), then compiled for the CPU with its remaining layers in fp32. Calibrating
takes a while, so the quantised network is saved (OpenVINO IR) in ``<checkpoint folder>/openvino_int8/<key>/``, the
key hashing the checkpoint file and the calibration settings, and read back on the next run; a checkpoint folder
that cannot be written gets no cache (the log says so).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from medseg.config import InferenceConfig
from medseg.errors import ConfigError
from medseg.inference.backends import INT8, OpenVinoNetwork, export_openvino
from medseg.inference.calibration import SEED, WINDOWS_PER_CASE, calibration_windows
from medseg.inference.model import EvalModel
from medseg.io import check_writable, replaced_folder

if TYPE_CHECKING:
    import openvino

log = logging.getLogger("medseg")

CACHE_FOLDER = "openvino_int8"
"""The folder beside a checkpoint that holds its quantised networks, one sub-folder per :func:`cache_key`."""
MODEL_FILE = "model.xml"
"""The quantised network's IR in its cache folder (with ``model.bin``, its weights)."""


def file_digest(path: Path) -> str:
    """The SHA-1 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha1()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_key(checkpoint: Path, inference: InferenceConfig, window: Sequence[int]) -> str:
    """What the quantised network depends on, hashed: the checkpoint file, the calibration's windows (number, size,
    root, seed, windows per case) and the versions of OpenVINO and NNCF."""
    import nncf
    import openvino

    root = inference.calibration_root and str(Path(inference.calibration_root).expanduser().resolve())
    settings = [file_digest(checkpoint), inference.calibration_windows, list(window), root, SEED, WINDOWS_PER_CASE,
                openvino.__version__, nncf.__version__]
    return hashlib.sha1(json.dumps(settings).encode()).hexdigest()[:16]


def cache_folder(net: EvalModel, inference: InferenceConfig, window: Sequence[int]) -> Path | None:
    """The folder that holds (or will hold) ``net``'s network quantised for ``inference``; None for a model without
    a checkpoint file."""
    if net.checkpoint is None:
        return None
    return net.checkpoint.parent / CACHE_FOLDER / cache_key(net.checkpoint, inference, window)


def quantise(net: EvalModel, inference: InferenceConfig, window: Sequence[int]) -> openvino.Model:
    """``net``'s network for ``(C, *window)`` windows, quantised to int8 by ``nncf.quantize`` on its calibration
    windows (:func:`~medseg.inference.calibration.calibration_windows`)."""
    import nncf

    windows = calibration_windows(net, inference.calibration_windows, inference.calibration_root)
    log.info("inference.precision=int8: calibrating %s on %d windows of its training cases", net.checkpoint,
             len(windows))
    return nncf.quantize(export_openvino(net.model, window), nncf.Dataset([w[None] for w in windows]),
                         subset_size=len(windows))


def save(network: openvino.Model, folder: Path) -> None:
    """Write ``network`` to ``folder`` (:data:`MODEL_FILE`) atomically (a temporary folder, then renamed); where the
    checkpoint's folder cannot be written, say so and write nothing."""
    import openvino

    try:
        check_writable(folder.parent, "inference.precision=int8's cache")
    except ConfigError as err:
        log.info("%s: the quantised network is not cached", err)
        return
    with replaced_folder(folder) as temp:
        openvino.save_model(network, temp / MODEL_FILE, compress_to_fp16=False)  # the weights as quantised
    log.info("inference.precision=int8: the quantised network is cached in %s", folder)


def int8_network(net: EvalModel, inference: InferenceConfig, window: Sequence[int]) -> OpenVinoNetwork:
    """``net``'s network for ``(C, *window)`` windows quantised to int8 and compiled for the CPU: read from its cache
    folder (:func:`cache_folder`) when it is there, else quantised (:func:`quantise`) and cached (:func:`save`).

    Raises:
        ConfigError: the checkpoint's training cases are not found
            (:func:`~medseg.inference.calibration.training_cases`).
    """
    import openvino

    folder = cache_folder(net, inference, window)
    if folder is not None and (folder / MODEL_FILE).is_file():
        log.info("inference.precision=int8: reusing the quantised network of %s", folder)
        return OpenVinoNetwork(openvino.Core().read_model(folder / MODEL_FILE), INT8)
    network = quantise(net, inference, window)
    if folder is None:
        log.info("inference.precision=int8: a model without a checkpoint file; the quantised network is not cached")
    else:
        save(network, folder)
    return OpenVinoNetwork(network, INT8)
