"""The calibration windows of ``inference.precision=int8``: windows of the network's input size drawn from the
checkpoint's training cases, preprocessed as prediction preprocesses, around their body rather than in air.

The training cases are those of the checkpoint's fold (:func:`~medseg.inference.cases.fold_split` of its ``data``
config) in its dataset folder, ``data.root``, or ``inference.calibration_root`` where the folder has moved. A case
gives at most :data:`WINDOWS_PER_CASE` windows, each centred on a voxel of its body: a voxel whose first channel is
above the case's mean (tissue, not the air or background around it), drawn with :data:`SEED`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from medseg.data.datalist import load_dataset
from medseg.data.transforms import IMAGE
from medseg.errors import ConfigError
from medseg.inference.cases import Case, fold_split
from medseg.inference.model import EvalModel

SEED = 0
"""The seed of the cases chosen and of the windows' positions: the same windows on every run."""
WINDOWS_PER_CASE = 4
"""The most windows a training case gives, so that the calibration sees several cases' intensities."""


def training_cases(net: EvalModel, root: str | None = None) -> list[Case]:
    """The training cases of ``net``'s fold (not its validation cases), in the dataset folder ``root``
    (``inference.calibration_root``) or, for None, the checkpoint's ``data.root``.

    Raises:
        ConfigError: the folder holds no ``dataset.json``, naming the key and the path.
        DatasetError: the dataset does not fit the checkpoint's splits.
    """
    key, folder = ("inference.calibration_root", root) if root else ("data.root", net.data.root)
    path = Path(str(folder)).expanduser()
    if not (path / "dataset.json").is_file():
        where = f" (of checkpoint {net.checkpoint})" if key == "data.root" else ""
        raise ConfigError(f"inference.precision=int8 calibrates on the checkpoint's training cases, but {key}={path}"
                          f"{where} holds no dataset.json: set inference.calibration_root to the dataset folder the "
                          f"model was trained on")
    info = load_dataset(path, "msd" if net.data.format == "demo" else net.data.format)
    train, _ = fold_split(info, net.data)
    return [Case(entry["case"], entry["image"]) for entry in train]


def body_windows(image: np.ndarray, roi: list[int], count: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """``count`` float32 ``(C, *roi)`` windows of a preprocessed ``(C, X, Y, Z)`` ``image``, each centred on a
    random voxel of its body (first channel above its mean; anywhere in a constant image), shifted to lie inside it;
    an image smaller than ``roi`` is padded with zeros, as the sliding window pads it."""
    shape = np.asarray(image.shape[1:])
    size = np.asarray(roi)
    body = np.flatnonzero(image[0] > image[0].mean())
    candidates = body if len(body) else np.arange(int(np.prod(shape)))
    for flat in rng.choice(candidates, size=count):
        centre = np.asarray(np.unravel_index(flat, tuple(shape)))
        start = np.clip(centre - size // 2, 0, np.maximum(shape - size, 0))
        crop = image[(slice(None), *(slice(s, s + r) for s, r in zip(start, size)))]
        yield np.pad(crop, [(0, 0), *((0, r - c) for r, c in zip(size, crop.shape[1:]))]).astype(np.float32)


def calibration_windows(net: EvalModel, count: int, root: str | None = None) -> list[np.ndarray]:
    """``count`` float32 ``(C, *window)`` input windows of ``net`` (2D models: without the slice axis) from its
    training cases (:func:`training_cases`): ``ceil(count / WINDOWS_PER_CASE)`` cases chosen at random (all of them
    where there are fewer), each preprocessed by :attr:`EvalModel.preprocessing` and giving its share of the windows
    (:func:`body_windows`)."""
    cases = training_cases(net, root)
    rng = np.random.default_rng(SEED)
    chosen = [cases[i] for i in rng.permutation(len(cases))[:math.ceil(count / WINDOWS_PER_CASE)]]
    windows = []
    for index, case in enumerate(chosen):
        share = count // len(chosen) + (index < count % len(chosen))
        image = np.asarray(net.preprocessing({"case": case.case, IMAGE: case.image})[IMAGE])
        windows += body_windows(image, net.window.roi_size, share, rng)
    if net.spatial_dims == 2:  # the slice axis, one voxel thick, is not the network's
        windows = [np.squeeze(w, 1 + net.window.slice_axis) for w in windows]
    return windows
