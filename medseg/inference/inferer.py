"""Whole-case prediction in the original geometry: preprocess, sliding windows (+ mirroring TTA), and back, slab by
slab.

The case goes through :func:`medseg.data.transforms.eval_transforms` (read in RAS, resample, normalise), is
predicted by :func:`medseg.inference.sliding_window.infer_slabs`, and its probabilities (softmax classes, or sigmoid
regions) are resampled back to the original voxel grid (linear interpolation, as MONAI's ``Invertd`` would) and
reordered from RAS to the image file's own axis order (:mod:`medseg.inference.resample_back`), ``inference.slab_slices``
slices of the file at a time: the probabilities held are those of a slab (and a window's depth), whatever the scan's
length. A :class:`Prediction` keeps what the probabilities decide (the winning class, or the regions' masks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from monai.transforms import Compose
from torch import nn

from medseg.config import InferenceConfig
from medseg.data.labels import LabelSpec
from medseg.data.reading import source_name
from medseg.data.transforms import IMAGE, Window
from medseg.errors import DatasetError
from medseg.inference.backends import INT8, check_backend, window_network
from medseg.inference.cases import Case
from medseg.inference.int8 import int8_network
from medseg.inference.model import EvalModel
from medseg.inference.resample_back import Grids, back_to_file
from medseg.inference.sliding_window import SlidingWindow, infer_slabs
from medseg.postprocessing.components import Postprocessing
from medseg.runtime.device import amp_dtype, resolve_device
from medseg.scoring.metrics import voxel_spacing

FileSlabs = Iterator[tuple[int, int, np.ndarray]]
"""``(first, stop, maps)``: float32 ``(K, X, Y, stop - first)`` maps on slices ``[first, stop)`` of a case's image
file, in the file's axis order (:func:`~medseg.inference.resample_back.back_to_file`)."""


def mirror_axes(spatial_dims: int, slice_axis: int) -> tuple[int, ...]:
    """Spatial axes flipped by TTA: all three for 3D models, the two in-plane axes for 2D models."""
    return tuple(a for a in range(3) if spatial_dims == 3 or a != slice_axis)


def sliding_window(inference: InferenceConfig, device: torch.device, view: Window, spatial_dims: int,
                   precision_dtype: torch.dtype | None, activation: str) -> SlidingWindow:
    """The sliding window the ``inference`` node sets for a network on ``device`` seeing volumes through ``view``:
    windows per pass, overlap, the stitching device, the mirrored axes and the constant windows; ``precision_dtype``:
    the autocast dtype, ``activation``: the outputs'. The one reading of the node's sliding window, for prediction
    and training's validation."""
    return SlidingWindow(
        tuple(view.roi_size), spatial_dims, view.slice_axis, inference.sw_batch_size, inference.overlap, device,
        resolve_device(inference.sw_device, "inference.sw_device") if inference.sw_device else device, precision_dtype,
        mirror_axes(spatial_dims, view.slice_axis) if inference.tta else (), activation, inference.skip_constant)


def inference_network(net: EvalModel, inference: InferenceConfig) -> nn.Module:
    """The module that runs ``net``'s windows ``(B, C, *window)`` on ``inference.backend`` in
    ``inference.precision`` (:func:`~medseg.inference.backends.window_network`); with ``inference.precision=int8``
    quantised on its checkpoint's training cases (:func:`~medseg.inference.int8.int8_network`)."""
    window = [net.in_channels, *net.window.net_patch]
    if inference.backend == "openvino" and inference.precision == INT8:
        return int8_network(net, inference, window)
    return window_network(net.model, inference.backend, window, inference.precision)


@dataclass
class Prediction:
    """A case's prediction on its first image file's voxel grid, spatial axes in the file's own order."""

    outputs: np.ndarray
    """What the probabilities decide (:meth:`LabelSpec.prediction_outputs`): ``(X, Y, Z)`` the winning class index
    (softmax), or ``(R, X, Y, Z)`` bool, each region's sigmoid above 0.5."""
    affine: np.ndarray
    """(4, 4) the image file's voxel-to-world (RAS mm) affine."""
    label_spec: LabelSpec
    """What the outputs are, and the label values to write."""
    probabilities: np.ndarray | None = None
    """(C, X, Y, Z) float32 class probabilities (softmax), or one sigmoid per region, where they were kept."""

    @property
    def shape(self) -> tuple[int, ...]:
        """(X, Y, Z) the file's spatial shape."""
        return tuple(self.outputs.shape[1:] if self.label_spec.region_based else self.outputs.shape)

    def masks(self) -> np.ndarray:
        """(R, X, Y, Z) bool, one mask per output (:meth:`LabelSpec.output_masks`)."""
        return self.label_spec.output_masks(self.outputs)

    def each_mask(self) -> Iterator[np.ndarray]:
        """(X, Y, Z) bool, the mask of each output in turn, one at a time (:meth:`LabelSpec.each_output_mask`)."""
        return self.label_spec.each_output_mask(self.outputs)

    def label_map(self) -> np.ndarray:
        """(X, Y, Z) the predicted label map in the dataset's label values (:meth:`LabelSpec.outputs_label_map`)."""
        return self.label_spec.outputs_label_map(self.outputs)


class Inferer:
    """Whole-case prediction in the original geometry for one rebuilt model, configured by an ``inference`` node.

    ``transform``: the chain of another inferer with the same preprocessing (:attr:`EvalModel.preprocessing_key`),
    so that a case it preprocessed can be predicted here too (MONAI inverts only with the chain that applied it).
    ``network``: the module run on the windows ``(B, C, *window)`` instead of the checkpoint's network on
    ``inference.backend`` (:func:`inference_network`), e.g. that network wrapped to time it.
    """

    def __init__(self, net: EvalModel, inference: InferenceConfig, transform: Compose | None = None, *,
                 network: nn.Module | None = None) -> None:
        self.net, self.inference = net, inference
        self.device = resolve_device(inference.device, "inference.device")
        net.model.to(self.device)
        mirrored = net.tta if inference.tta is None else inference.tta
        check_backend(inference.backend, inference.precision, self.device)
        self.window = sliding_window(replace(inference, tta=mirrored), self.device, net.window, net.spatial_dims,
                                     amp_dtype(inference.precision, self.device) if inference.backend == "torch"
                                     else None, net.label_spec.activation)
        self.network = network if network is not None else inference_network(net, inference)
        self.transform: Compose = transform or net.preprocessing

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
        """The case's prediction on its image file's voxel grid, its probabilities kept (see :class:`Prediction`)."""
        return self.infer_preprocessed(self.preprocess(case), progress)

    def infer_preprocessed(self, data: dict[str, Any], progress: bool = False) -> Prediction:
        """:meth:`infer` for a case :meth:`preprocess` has read (``data`` is not changed)."""
        return collect(self.file_slabs(data, progress), Grids.of(data[IMAGE]).file_shape, original_affine(data),
                       self.net.label_spec, keep_probabilities=True)

    def file_slabs(self, data: dict[str, Any], progress: bool = False) -> FileSlabs:
        """The probabilities of a preprocessed case (:meth:`preprocess`; ``data`` is not changed) on its image file's
        grid, ``inference.slab_slices`` slices at a time (:data:`FileSlabs`): from the sliding windows (and their
        mirrorings), windows holding one value per channel answered from one run unless ``inference.skip_constant``
        is false."""
        image = data[IMAGE].unsqueeze(0).to(self.device)
        grids = Grids.of(data[IMAGE])
        slabs = infer_slabs(self.network, image, self.window, axis=grids.axis, slab=self.inference.slab_slices,
                            progress=progress)
        return back_to_file(grids, ((start, probs[0]) for start, probs in slabs), self.inference.slab_slices)

    def to_original(self, data: dict[str, Any], maps: torch.Tensor) -> np.ndarray:
        """``(K, X', Y', Z')`` maps on the preprocessed grid of ``data`` (:meth:`preprocess`) -> float32
        ``(K, X, Y, Z)`` on the image file's voxel grid, in its own axis order: the resampling undone with linear
        interpolation, as class probabilities are (:func:`~medseg.inference.resample_back.back_to_file`)."""
        ((_, _, back),) = back_to_file(Grids.of(data[IMAGE]), iter([(0, maps.detach().cpu())]), None)
        return back


def collect(slabs: FileSlabs, shape: tuple[int, ...], affine: np.ndarray, label_spec: LabelSpec,
            keep_probabilities: bool = False, on_slab: Callable[[int, int, np.ndarray], object] | None = None
            ) -> Prediction:
    """The :class:`Prediction` of the probability ``slabs`` of a file of spatial ``shape``: each slab's outputs
    (:meth:`LabelSpec.prediction_outputs`) placed as it comes, then the slab dropped, or kept too
    (``keep_probabilities``); ``on_slab(first, stop, maps)`` sees each slab first (e.g. to write it)."""
    outputs = probabilities = None
    for first, stop, maps in slabs:
        if on_slab is not None:
            on_slab(first, stop, maps)
        decided = label_spec.prediction_outputs(maps)
        if outputs is None:
            outputs = np.zeros((*decided.shape[:-1], shape[-1]), decided.dtype)
            probabilities = np.zeros((len(maps), *shape), np.float32) if keep_probabilities else None
        outputs[..., first:stop] = decided
        if probabilities is not None:
            probabilities[..., first:stop] = maps
    assert outputs is not None, "no slabs"
    return Prediction(outputs, affine, label_spec, probabilities)


def original_affine(data: dict[str, Any]) -> np.ndarray:
    """``(4, 4)`` the image file's own voxel-to-world affine of a preprocessed case (:meth:`Inferer.preprocess`)."""
    return np.asarray(data[IMAGE].meta["original_affine"], dtype=np.float64)


def segment(prediction: Prediction, postprocessing: Postprocessing | None = None) -> Prediction:
    """``prediction`` with its outputs postprocessed (each class's or region's mask on its own), without its
    probabilities."""
    if postprocessing is None:
        return Prediction(prediction.outputs, prediction.affine, prediction.label_spec)
    spacing = voxel_spacing(prediction.affine)
    apply = postprocessing.apply if prediction.label_spec.region_based else postprocessing.apply_to_classes
    return Prediction(apply(prediction.outputs, spacing), prediction.affine, prediction.label_spec)
