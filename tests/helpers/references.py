"""Metric references written from the formulas, independent of MONAI and of medseg: surface = mask minus its
erosion, exact Euclidean distance transforms with anisotropic sampling. Masks are boolean arrays of one shape,
``spacing`` the voxel size in mm along their axes."""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage


def _surface(mask: np.ndarray) -> np.ndarray:
    return mask & ~ndimage.binary_erosion(mask)


def _directed_distances(pred: np.ndarray, ref: np.ndarray, spacing) -> tuple[np.ndarray, np.ndarray]:
    """Distances (mm) from each surface voxel of ``pred`` to ``ref``'s surface, and the other way round."""
    sp, sr = _surface(pred.astype(bool)), _surface(ref.astype(bool))
    to_ref = ndimage.distance_transform_edt(~sr, sampling=spacing)[sp]
    to_pred = ndimage.distance_transform_edt(~sp, sampling=spacing)[sr]
    return to_ref, to_pred


def reference_hd95(pred: np.ndarray, ref: np.ndarray, spacing) -> float:
    """The larger directed 95th percentile of surface distances; NaN both empty, inf one empty."""
    if not pred.any() or not ref.any():
        return math.nan if not pred.any() and not ref.any() else math.inf
    to_ref, to_pred = _directed_distances(pred, ref, spacing)
    return float(max(np.percentile(to_ref, 95), np.percentile(to_pred, 95)))


def reference_nsd(pred: np.ndarray, ref: np.ndarray, spacing, tolerance: float) -> float:
    """Share of both surfaces within ``tolerance`` mm of the other; 1 both empty, 0 one empty."""
    if not pred.any() or not ref.any():
        return 1.0 if not pred.any() and not ref.any() else 0.0
    to_ref, to_pred = _directed_distances(pred, ref, spacing)
    return float(((to_ref <= tolerance).sum() + (to_pred <= tolerance).sum()) / (to_ref.size + to_pred.size))


def reference_dice(pred: np.ndarray, ref: np.ndarray) -> float:
    total = pred.sum() + ref.sum()
    return 1.0 if total == 0 else float(2 * (pred & ref).sum() / total)
