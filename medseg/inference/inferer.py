"""Whole-case prediction in the original geometry: preprocess, sliding windows (+ mirroring TTA), and back.

The case goes through :func:`medseg.data.transforms.eval_transforms` (read in RAS, resample, normalise), is
predicted by :func:`medseg.inference.sliding_window.infer_volume`, and its probabilities (softmax classes, or sigmoid
regions) are resampled back to the original voxel grid with MONAI's ``Invertd`` (linear interpolation), then
reordered from RAS to the image file's own axis order (:func:`medseg.data.reading.from_ras`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import Compose, Invertd
from torch import nn

from medseg.config import InferenceConfig
from medseg.data.labels import LabelSpec
from medseg.data.reading import from_ras, source_name
from medseg.data.transforms import IMAGE
from medseg.errors import DatasetError
from medseg.inference.backends import check_backend, window_network
from medseg.inference.cases import Case
from medseg.inference.model import EvalModel
from medseg.inference.sliding_window import infer_volume
from medseg.postprocessing.components import Postprocessing
from medseg.runtime.device import amp_dtype, resolve_device
from medseg.scoring.metrics import voxel_spacing

PRED = "pred"


def mirror_axes(spatial_dims: int, slice_axis: int) -> tuple[int, ...]:
    """Spatial axes flipped by TTA: all three for 3D models, the two in-plane axes for 2D models."""
    return tuple(a for a in range(3) if spatial_dims == 3 or a != slice_axis)


def window_options(inference: InferenceConfig, device: torch.device, spatial_dims: int,
                   slice_axis: int) -> dict[str, Any]:
    """The keyword arguments of :func:`~medseg.inference.sliding_window.infer_volume` that the ``inference`` node
    sets, for a network on ``device``: windows per pass, overlap, the stitching device, the mirrored axes and the
    constant windows. The one reading of the node's sliding window, for prediction and training's validation."""
    return {"sw_batch_size": inference.sw_batch_size, "overlap": inference.overlap, "device": device,
            "sw_device": resolve_device(inference.sw_device, "inference.sw_device") if inference.sw_device else device,
            "mirror_axes": mirror_axes(spatial_dims, slice_axis) if inference.tta else (),
            "skip_constant": inference.skip_constant}


@dataclass
class Prediction:
    """A case's prediction on its first image file's voxel grid."""

    probabilities: np.ndarray
    """(C, X, Y, Z) float32 class probabilities (softmax), or one sigmoid per region; spatial axes in the file's own
    order."""
    affine: np.ndarray
    """(4, 4) the image file's voxel-to-world (RAS mm) affine."""
    label_spec: LabelSpec
    """What the channels of ``probabilities`` are, and the label values to write."""

    def masks(self) -> np.ndarray:
        """(R, X, Y, Z) bool, one mask per output (:meth:`LabelSpec.prediction_masks`)."""
        return self.label_spec.prediction_masks(self.probabilities)

    def label_map(self) -> np.ndarray:
        """(X, Y, Z) the predicted label map in the dataset's label values (:meth:`LabelSpec.label_map`)."""
        return self.label_spec.label_map(self.masks())


class Inferer:
    """Whole-case prediction in the original geometry for one rebuilt model, configured by an ``inference`` node.

    ``transform``: the chain of another inferer with the same preprocessing (:attr:`EvalModel.preprocessing_key`),
    so that a case it preprocessed can be predicted here too (MONAI inverts only with the chain that applied it).
    ``network``: the module run on the windows ``(B, C, *window)`` instead of the checkpoint's network on
    ``inference.backend`` (:func:`~medseg.inference.backends.window_network`), e.g. that network wrapped to time it.
    """

    def __init__(self, net: EvalModel, inference: InferenceConfig, transform: Compose | None = None, *,
                 network: nn.Module | None = None) -> None:
        self.net, self.inference = net, inference
        self.device = resolve_device(inference.device, "inference.device")
        net.model.to(self.device)
        self.window = window_options(inference, self.device, net.spatial_dims, net.window.slice_axis)
        check_backend(inference.backend, inference.precision, self.device)
        self.network = network if network is not None else window_network(
            net.model, inference.backend, [net.in_channels, *net.window.net_patch], inference.precision)
        self.amp_dtype = amp_dtype(inference.precision, self.device) if inference.backend == "torch" else None
        self.transform: Compose = transform or net.preprocessing
        self.inverter = Invertd(keys=PRED, transform=self.transform, orig_keys=IMAGE, nearest_interp=False)

    def preprocess(self, case: Case) -> dict[str, Any]:
        """The case through the eval chain: ``image`` is a ``(C, X', Y', Z')`` MetaTensor on the target grid.

        Raises:
            DatasetError: an unreadable image file, or a channel count other than the checkpoint's.
        """
        try:
            data = self.transform({"case": case.case, IMAGE: case.image})
        except RuntimeError as err:  # MONAI's Compose wraps what a transform raises; a DatasetError names the file
            if isinstance(err.__cause__, DatasetError):
                raise err.__cause__ from None
            raise
        channels = int(data[IMAGE].shape[0])
        if channels != self.net.in_channels:
            raise DatasetError(
                f"{', '.join(map(source_name, case.image_files))}: the image has {channels} channel(s) but the "
                f"checkpoint was trained on {self.net.in_channels} ({', '.join(self.net.channel_names)})")
        return data

    def infer(self, case: Case, progress: bool = False) -> Prediction:
        """The case's class probabilities on its image file's voxel grid (see :class:`Prediction`)."""
        return self.infer_preprocessed(self.preprocess(case), progress)

    def infer_preprocessed(self, data: dict[str, Any], progress: bool = False) -> Prediction:
        """:meth:`infer` for a case :meth:`preprocess` has read (``data`` is not changed)."""
        probs = self.window_probabilities(data, progress)
        return Prediction(self.to_original(data, probs), original_affine(data), self.net.label_spec)

    def window_probabilities(self, data: dict[str, Any], progress: bool = False) -> torch.Tensor:
        """``(K, X', Y', Z')`` the probabilities of a preprocessed case (:meth:`preprocess`) on its preprocessed grid,
        from the sliding windows (and their mirrorings); windows holding one value per channel are answered from
        one run unless ``inference.skip_constant`` is false."""
        image = data[IMAGE].unsqueeze(0).to(self.device)
        return infer_volume(
            self.network, image, self.net.window.roi_size, self.net.spatial_dims, self.net.window.slice_axis,
            amp_dtype=self.amp_dtype, progress=progress, activation=self.net.label_spec.activation, **self.window,
        )[0]

    def to_original(self, data: dict[str, Any], maps: torch.Tensor) -> np.ndarray:
        """``(K, X', Y', Z')`` maps on the preprocessed grid of ``data`` (:meth:`preprocess`) -> float32
        ``(K, X, Y, Z)`` on the image file's voxel grid, in its own axis order: the preprocessing inverted with linear
        interpolation, as class probabilities are."""
        # a MetaTensor, so that Invertd takes the image's applied operations (it skips plain tensors)
        inverted = self.inverter({**data, PRED: MetaTensor(maps.detach().cpu())})[PRED]  # (K, X, Y, Z), RAS order
        ras = (inverted.as_tensor() if isinstance(inverted, MetaTensor) else torch.as_tensor(inverted)).float()
        return np.moveaxis(from_ras(np.moveaxis(ras.numpy(), 0, -1), original_affine(data)), -1, 0)


def original_affine(data: dict[str, Any]) -> np.ndarray:
    """``(4, 4)`` the image file's own voxel-to-world affine of a preprocessed case (:meth:`Inferer.preprocess`)."""
    return np.asarray(data[IMAGE].meta["original_affine"], dtype=np.float64)


def segment(prediction: Prediction, postprocessing: Postprocessing | None = None) -> np.ndarray:
    """The ``(R, X, Y, Z)`` bool output masks of ``prediction`` (a class's or a region's), postprocessed."""
    masks = prediction.masks()
    return masks if postprocessing is None else postprocessing.apply(masks, voxel_spacing(prediction.affine))
