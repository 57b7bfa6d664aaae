"""Attention maps as NIfTI volumes on the input file's own grid, to open over the scan in 3D Slicer or ITK-SNAP.

A map's token values are interpolated onto the network window's voxels (:func:`~.window.to_voxels`), placed into the
preprocessed volume (zeros outside the window), and taken back through the inverted preprocessing exactly as
evaluation takes class probabilities back (:meth:`medseg.evaluation.evaluate.Inferer.to_original`: resampling inverted
with linear interpolation, then the file's own axis order). The file has the input's shape, affine and header, with
one volume per head along the fourth axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medseg.data.reading import IMAGE, nifti_header
from medseg.inference.inferer import Inferer, original_affine
from medseg.io import write_nifti
from medseg.visualize.window import QueryWindow, to_voxels, token_stride

if TYPE_CHECKING:
    from medseg.models.inspect import AttentionMap


def original_volumes(attention: AttentionMap, window: QueryWindow, data: dict[str, Any],
                     inferer: Inferer) -> dict[str, np.ndarray]:
    """The map's ``weights`` (and, for MaSA, ``decay``) as float32 ``(X, Y, Z, heads)`` on the image file's grid.

    Args:
        attention: the map, computed on ``window`` of the case.
        window: where the network window lies in the preprocessed volume.
        data: the case as :meth:`Inferer.preprocess` gave it.
        inferer: the inferer that preprocessed it (its inversion undoes that preprocessing).
    """
    stride = token_stride(attention)
    size = [window.size[axis] for axis in window.net_axes]
    shape = data[IMAGE].shape[1:]
    volumes = {}
    for name, values in (("weights", attention.weights), ("decay", attention.decay)):
        if values is not None:
            placed = window.paste(to_voxels(values.detach().cpu(), stride, size), shape)
            volumes[name] = np.moveaxis(inferer.to_original(data, placed), 0, -1).astype(np.float32)
    return volumes


def write_volume(path: Path, volume: np.ndarray, data: dict[str, Any], image: str | Path) -> Path:
    """Atomically write ``volume`` ``(X, Y, Z, heads)`` with the affine (and, for a NIfTI input, the header) of
    ``image``, the file ``data`` was preprocessed from."""
    return write_nifti(path, volume, original_affine(data), nifti_header(image))
