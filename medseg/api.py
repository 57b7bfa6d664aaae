"""The Python API: predict a volume with a medseg checkpoint (or an ensemble) from a script or a notebook.

``from medseg import predict, load_model``. ``predict`` is ``scripts/predict.py`` for one volume in memory: the
same preprocessing, sliding windows, inversion to the input's grid, ensemble averaging and postprocessing, so both
give the same labels for the same file. ``image`` is a file path (``.nii.gz``, ``.nii``, ``.nrrd``, ``.mha``), a
DICOM series folder (:mod:`medseg.data.dicom`: its voxels are columns, rows and slices in position order), a
nibabel image, or a numpy array ``(X, Y, Z)`` (``(X, Y, Z, C)`` for several channels, as a NIfTI file holds them)
with its ``(4, 4)`` voxel-to-world affine in RAS mm (nibabel's convention: an LPS affine from DICOM or ITK has its
first two rows negated). Arrays are read in memory, never written to a file. The labels come back in the input's
geometry and voxel order: the array's own axes, or a file's as nibabel's ``dataobj`` holds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.spatialimages import SpatialImage

from medseg.config import InferenceConfig, PredictConfig
from medseg.data.reading import ImageSource, check_voxels
from medseg.errors import ConfigError
from medseg.export import load_exported, read_description
from medseg.inference.cases import Case
from medseg.inference.checks import check_ckpt, check_inference, check_postprocessing
from medseg.inference.ensemble import Ensemble
from medseg.inference.inferer import segment
from medseg.inference.model import EvalModel, load_model
from medseg.postprocessing.components import from_setting
from medseg.typed_config import to_typed

__all__ = ["load_model", "predict", "predict_exported"]

Checkpoints = str | Path | EvalModel | Sequence[str | Path | EvalModel]
"""A checkpoint file, a training run or multirun folder, a model from :func:`load_model`, or a list of them."""


def _source(image: str | Path | SpatialImage | np.ndarray, affine: np.ndarray | None) -> ImageSource:
    """What the reader takes: a path, or a nibabel image (an array becomes one in memory, with ``affine``)."""
    if isinstance(image, np.ndarray):
        if affine is None:
            raise ConfigError("predict(array): give the array's affine= ((4, 4) voxel-to-world in RAS mm)")
        matrix = np.asarray(affine, dtype=np.float64)
        if matrix.shape != (4, 4) or image.ndim not in (3, 4):
            raise ConfigError(f"predict(array): expected an (X, Y, Z) or (X, Y, Z, C) array and a (4, 4) affine, "
                              f"got shapes {image.shape} and {matrix.shape}")
        check_voxels(image, matrix, "predict(array)")  # before nibabel, which refuses some dtypes with a traceback
        return nib.Nifti1Image(image, matrix)
    if affine is not None:
        raise ConfigError("predict(): affine= is for arrays only; files and nibabel images carry their own")
    if isinstance(image, SpatialImage):
        return image
    if isinstance(image, str | Path):
        return str(Path(image).expanduser())
    raise ConfigError(f"predict(): image must be a path, a nibabel image or a numpy array, not {type(image).__name__}")


def predict(image: str | Path | SpatialImage | np.ndarray, ckpt: Checkpoints, affine: np.ndarray | None = None,
            device: str = InferenceConfig.device, *, return_probabilities: bool = False,
            tta: bool | None = InferenceConfig.tta, postprocessing: str = PredictConfig.postprocessing,
            overlap: float = InferenceConfig.overlap, sw_batch_size: int = InferenceConfig.sw_batch_size,
            precision: str = InferenceConfig.precision,
            backend: str = InferenceConfig.backend) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The label map of one volume, in the input's geometry.

    Args:
        image: a file path, a DICOM series folder, a nibabel image, or a numpy array ``(X, Y, Z)`` / ``(X, Y, Z, C)``
            with ``affine``.
        ckpt: a checkpoint, a training run or multirun folder, a model from :func:`load_model` (load once, predict
            many), or a list of them: an ensemble, whose probabilities are averaged.
        affine: the array's ``(4, 4)`` voxel-to-world matrix in RAS mm; only for arrays.
        device: ``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``.
        return_probabilities: also return the class probabilities.
        tta: mirroring test-time augmentation; None: as the checkpoint's training validated.
        postprocessing: ``auto``, ``none`` or a ``postprocessing.json``, as ``scripts/predict.py``'s.
        overlap, sw_batch_size, precision, backend: the ``inference`` node's (``inference.overlap``, ...): the
            sliding window, the network's arithmetic (``auto``, ``fp32``, ``bf16``; ``int8`` with ``openvino``,
            its quantisation cached beside the checkpoint) and backend (``torch``, or ``openvino`` on the CPU,
            compiled anew on each call).

    Every default is :class:`~medseg.config.InferenceConfig`'s (and :class:`~medseg.config.PredictConfig`'s), the
    one of ``scripts/predict.py``.

    Returns:
        ``(X, Y, Z)`` labels on the input's voxels in the dataset's label values (uint8; uint16 above 255): class
        values, or for a region-based model each region's ``regions_class_order`` value, later regions overwriting
        earlier ones; with ``return_probabilities``, also float32 ``(C, X, Y, Z)`` probabilities (before
        postprocessing): softmax over the classes, or a sigmoid per region.

    Raises:
        ConfigError: a bad argument. DatasetError: an unreadable image, one without voxels, with voxels that are
            not finite numbers or with a singular or non-finite affine, or another channel count than the model's.
        CheckpointError: a missing or foreign checkpoint, or models that cannot be ensembled.
    """
    items = list(ckpt) if isinstance(ckpt, Sequence) and not isinstance(ckpt, str) else [ckpt]
    loaded = [item for item in items if isinstance(item, EvalModel)]
    names = [str(item.checkpoint if isinstance(item, EvalModel) else item) for item in items]
    inference = to_typed(InferenceConfig, InferenceConfig(device=device, tta=tta, overlap=overlap,
                                                          sw_batch_size=sw_batch_size, precision=precision,
                                                          backend=backend, progress=False))
    check_inference(inference, prefix="")  # the arguments are named as the node's keys
    check_ckpt(names)
    check_postprocessing(postprocessing)
    source = _source(image, affine)
    if loaded and len(loaded) != len(items):
        raise ConfigError("predict(): ckpt= mixes loaded models and paths; give one kind")
    ensemble = Ensemble(loaded, inference) if loaded else Ensemble.load(names, inference)
    steps = from_setting(postprocessing, ensemble.checkpoints, ensemble.label_spec.outputs)
    prediction = ensemble.infer(Case("image", source), keep_probabilities=return_probabilities)
    labels = segment(prediction, steps).label_map()
    return (labels, prediction.probabilities) if return_probabilities else labels


def predict_exported(image: str | Path | SpatialImage | np.ndarray, folder: str | Path,
                     affine: np.ndarray | None = None, device: str = "cpu") -> np.ndarray:
    """The label map ``(X, Y, Z)`` of one volume in its own geometry, predicted by the export in ``folder`` as
    ``scripts/predict.py`` predicts (its preprocessing, sliding window and overlap, inversion, the export's
    postprocessing). ``image`` and ``affine`` as :func:`medseg.predict` takes them."""
    folder = Path(folder).expanduser()
    description = read_description(folder)
    post = description["postprocessing"]
    return predict(image, load_exported(folder, device), affine, device,
                   overlap=description["sliding_window"]["overlap"],
                   postprocessing=str(folder / post) if post else "none")
