"""Segmentation metrics on binary masks in physical units: Dice, HD95, normalised surface Dice, volumes.

Pure functions: numpy arrays (or tensors) in, Python floats out. Spacing is the voxel size in mm
along each array axis (for a NIfTI file: the column norms of its affine, :func:`voxel_spacing`).
Surfaces are MONAI's (``get_mask_edges``'s: the mask voxels removed by one binary erosion), distances from
a k-d tree of the other surface's voxels (scipy's ``cKDTree``: exact Euclidean distances between surface-voxel
centres, in mm, in memory that grows with the surfaces, not the scan), computed once for HD95 and NSD. HD95 takes
its percentile with numpy, which has no limit on the number of distances (``torch.quantile``, in MONAI's
``compute_hausdorff_distance``, refuses more than 2^24 of them: the surfaces of a large scan's noisy mask).

Empty masks (per case and class), one rule for every score and mean medseg reports (validation, ``evaluate``,
cross-validation, postprocessing, ``compare.py``): a class absent from both reference and prediction has no Dice nor
NSD (NaN, *undefined*, as Metrics Reloaded prescribes and as nnU-Net v2's evaluator scores it), and means leave such a
case out (:func:`defined_mean`, nnU-Net's ``nanmean``) rather than count it as perfect:

==============================  ======  ======  =====  ==============
reference / prediction          Dice    NSD     HD95   flag
==============================  ======  ======  =====  ==============
both empty                      NaN     NaN     NaN    ``both_empty``
reference empty, prediction not 0.0     0.0     inf    ``ref_empty``
prediction empty, reference not 0.0     0.0     inf    ``pred_empty``
==============================  ======  ======  =====  ==============

Means (:func:`aggregate`) average Dice and NSD over the cases where they are defined and count the cases left out
(``both_empty``); HD95 means skip NaN and inf and report how many values they skipped (``hd95_excluded``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy import ndimage
from scipy.spatial import cKDTree

BOTH_EMPTY, REF_EMPTY, PRED_EMPTY = "both_empty", "ref_empty", "pred_empty"
METRIC_NAMES = ("dice", "hd95_mm", "nsd", "pred_ml", "ref_ml")
UNDEFINED_WHEN_EMPTY = ("dice", "nsd")
"""The metrics that Metrics Reloaded leaves undefined where reference and prediction are both empty (HD95 is NaN there
already)."""


@dataclass(frozen=True)
class ClassMetrics:
    """The metrics of one foreground class in one case."""

    dice: float
    hd95_mm: float
    """95th-percentile symmetric Hausdorff distance in mm (NaN when both masks are empty, inf when one is)."""
    nsd: float
    """Normalised surface Dice at the tolerance, in [0, 1]."""
    pred_ml: float
    ref_ml: float
    flag: str = ""
    """``""``, ``both_empty``, ``ref_empty`` or ``pred_empty``."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def voxel_spacing(affine: np.ndarray) -> tuple[float, ...]:
    """Voxel size in mm along each array axis: the column norms of a ``(4, 4)`` voxel-to-world affine."""
    matrix = np.asarray(affine, dtype=np.float64)[:3, :3]
    return tuple(float(s) for s in np.linalg.norm(matrix, axis=0))


def _binary(mask: np.ndarray | torch.Tensor) -> np.ndarray:
    array = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    return array.astype(bool, copy=False)


def _check_pair(pred: np.ndarray, ref: np.ndarray, spacing: Sequence[float]) -> None:
    if pred.shape != ref.shape:
        raise ValueError(f"prediction shape {pred.shape} differs from reference shape {ref.shape}")
    if len(spacing) != pred.ndim:
        raise ValueError(f"spacing {tuple(spacing)} needs one entry per axis of shape {pred.shape}")


def empty_flag(pred: np.ndarray | torch.Tensor, ref: np.ndarray | torch.Tensor) -> str:
    """Which of the masks is empty: ``both_empty``, ``ref_empty``, ``pred_empty`` or ``""``."""
    has_pred, has_ref = bool(_binary(pred).any()), bool(_binary(ref).any())
    if not has_pred and not has_ref:
        return BOTH_EMPTY
    if not has_ref:
        return REF_EMPTY
    return "" if has_pred else PRED_EMPTY


def volume_ml(mask: np.ndarray | torch.Tensor, spacing: Sequence[float]) -> float:
    """Volume of a binary mask in mL: voxel count x voxel volume (mm³, product of ``spacing``) / 1000."""
    return float(_binary(mask).sum()) * float(np.prod(spacing)) / 1000.0


def dice(pred: np.ndarray | torch.Tensor, ref: np.ndarray | torch.Tensor) -> float:
    """Dice ``2|P∩R| / (|P| + |R|)`` of two binary masks of the same shape, the one Dice of medseg (validation and
    evaluation alike); NaN (undefined) when both are empty, 0.0 when only one is (the module's rule). Counted in
    place: MONAI's ``compute_dice`` makes float one-hot copies of both masks, 2 GB at 512 x 512 x 400."""
    pred, ref = _binary(pred), _binary(ref)
    if pred.shape != ref.shape:
        raise ValueError(f"prediction shape {pred.shape} differs from reference shape {ref.shape}")
    total = int(np.count_nonzero(pred)) + int(np.count_nonzero(ref))
    return math.nan if total == 0 else float(2 * np.count_nonzero(pred & ref) / total)


_QUERY_CHUNK = 1 << 20
"""Surface voxels asked of the k-d tree at once (:func:`_directed_distances`): 24 MB of positions."""


def _positions(indices: Sequence[np.ndarray], spacing: Sequence[float]) -> np.ndarray:
    """``(N, D)`` float64 positions in mm of N voxels given by their indices along each of the D axes (as
    ``np.nonzero`` returns them): voxel index x ``spacing``."""
    return np.stack([where * float(step) for where, step in zip(indices, spacing)], axis=1)


def _directed_distances(edges: np.ndarray, to: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
    """``(N,)`` mm from each of ``edges``' N voxels to the nearest voxel of ``to`` (both bool, the same shape, ``to``
    not empty).

    Exact nearest-neighbour distances between voxel centres from a k-d tree of ``to``'s voxels (scipy's
    ``cKDTree``), asked :data:`_QUERY_CHUNK` voxels at a time: the memory grows with the surfaces, not with the
    array. A feature transform of the array (``distance_transform_edt``) would hold 12 bytes a voxel of the masks'
    bounding box (1.5 GB on a long scan's), and twice that with its distances.
    """
    # sliding-midpoint splits, whole-extent nodes and 64-point leaves: 5-10x faster queries than scipy's defaults
    # on a noisy mask's surface against an organ's (whose points tie at equal distances)
    tree = cKDTree(_positions(np.nonzero(to), spacing), leafsize=64, balanced_tree=False, compact_nodes=False)
    points = np.nonzero(edges)
    distances = np.empty(len(points[0]), np.float64)
    for start in range(0, len(distances), _QUERY_CHUNK):
        chunk = _positions([where[start:start + _QUERY_CHUNK] for where in points], spacing)
        distances[start:start + _QUERY_CHUNK] = tree.query(chunk, k=1, workers=-1)[0]
    return distances


def _surface(mask: np.ndarray) -> np.ndarray:
    """The voxels of a bool mask that one binary erosion (scipy's, face connectivity, outside the array empty)
    removes: MONAI's ``get_mask_edges`` surface."""
    return mask & ~ndimage.binary_erosion(mask)


def _joint_box(pred: np.ndarray, ref: np.ndarray) -> tuple[slice, ...]:
    """The bounding box of the voxels in either mask (neither empty)."""
    either = pred | ref
    box = []
    for axis in range(either.ndim):
        present = np.flatnonzero(either.any(axis=tuple(a for a in range(either.ndim) if a != axis)))
        box.append(slice(int(present[0]), int(present[-1]) + 1))
    return tuple(box)


def surface_distances(pred: np.ndarray | torch.Tensor, ref: np.ndarray | torch.Tensor,
                      spacing: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The directed surface distances (mm) of two binary masks of the same shape, neither empty: ``(Np,)`` from each
    surface voxel of ``pred`` (:func:`_surface`) to the nearest of ``ref``'s, and ``(Nr,)`` back; on the masks' joint
    bounding box, whose outside is empty in both (so its border voxels are surface, as in the whole array)."""
    pred, ref = _binary(pred), _binary(ref)
    _check_pair(pred, ref, spacing)
    box = _joint_box(pred, ref)
    pred_edges, ref_edges = _surface(pred[box]), _surface(ref[box])
    spacing = [float(s) for s in spacing]
    return _directed_distances(pred_edges, ref_edges, spacing), _directed_distances(ref_edges, pred_edges, spacing)


def _hd95_of(distances: tuple[np.ndarray, np.ndarray]) -> float:
    """The larger directed 95th percentile (linear interpolation, as ``torch.quantile``), any number of distances."""
    return max(float(np.percentile(directed, 95)) for directed in distances)


def _nsd_of(distances: tuple[np.ndarray, np.ndarray], tolerance_mm: float) -> float:
    """The share of both surfaces' voxels within ``tolerance_mm`` of the other surface (MONAI's NSD without
    sub-voxel areas)."""
    within = sum(int((directed <= tolerance_mm).sum()) for directed in distances)
    return within / sum(len(directed) for directed in distances)


def hd95(pred: np.ndarray | torch.Tensor, ref: np.ndarray | torch.Tensor, spacing: Sequence[float]) -> float:
    """Symmetric 95th-percentile Hausdorff distance in mm between two binary masks.

    The larger of the two directed 95th percentiles of surface-to-surface distances (MONAI's
    definition), for any number of surface voxels. NaN when both masks are empty, inf when exactly one is.
    """
    pred, ref = _binary(pred), _binary(ref)
    _check_pair(pred, ref, spacing)
    flag = empty_flag(pred, ref)
    if flag:
        return math.nan if flag == BOTH_EMPTY else math.inf
    return _hd95_of(surface_distances(pred, ref, spacing))


def surface_dice(pred: np.ndarray | torch.Tensor, ref: np.ndarray | torch.Tensor, spacing: Sequence[float],
                 tolerance_mm: float) -> float:
    """Normalised surface Dice: the share of both surfaces lying within ``tolerance_mm`` of the other.

    NaN (undefined) when both masks are empty, 0.0 when exactly one is.
    """
    pred, ref = _binary(pred), _binary(ref)
    _check_pair(pred, ref, spacing)
    flag = empty_flag(pred, ref)
    if flag:
        return math.nan if flag == BOTH_EMPTY else 0.0
    return _nsd_of(surface_distances(pred, ref, spacing), tolerance_mm)


def class_metrics(pred: np.ndarray | torch.Tensor, ref: np.ndarray | torch.Tensor, spacing: Sequence[float],
                  tolerance_mm: float) -> ClassMetrics:
    """All metrics of one binary prediction against its binary reference (same shape, ``spacing`` in mm); HD95 and
    NSD from one computation of the surface distances."""
    pred, ref = _binary(pred), _binary(ref)
    _check_pair(pred, ref, spacing)
    flag = empty_flag(pred, ref)
    if flag:
        hd, nsd = (math.nan, math.nan) if flag == BOTH_EMPTY else (math.inf, 0.0)
    else:
        distances = surface_distances(pred, ref, spacing)
        hd, nsd = _hd95_of(distances), _nsd_of(distances, tolerance_mm)
    return ClassMetrics(dice=dice(pred, ref), hd95_mm=hd, nsd=nsd, pred_ml=volume_ml(pred, spacing),
                        ref_ml=volume_ml(ref, spacing), flag=flag)


def _finite_mean(values: Sequence[float]) -> tuple[float, int]:
    """Mean of the finite values (NaN if none) and how many values were not finite."""
    finite = [v for v in values if math.isfinite(v)]
    return (float(np.mean(finite)) if finite else math.nan), len(values) - len(finite)


def undefined_when_empty(values: Mapping[str, float], flag: str) -> dict[str, float]:
    """``values`` (metric name -> value) of one case and class, with each of :data:`UNDEFINED_WHEN_EMPTY` NaN when
    ``flag`` is ``both_empty``: the module's rule applied to a ``metrics.csv`` written before medseg scored such a
    case NaN (it wrote 1), so that older cross-validations read as new ones."""
    return {name: math.nan if flag == BOTH_EMPTY and name in UNDEFINED_WHEN_EMPTY else value
            for name, value in values.items()}


def defined_mean(values: Iterable[float]) -> float:
    """The mean of the values that are defined (not NaN); NaN when none is, inf when one is (an infinite HD95)."""
    defined = [value for value in values if not math.isnan(value)]
    return math.fsum(defined) / len(defined) if defined else math.nan


def aggregate(per_class: Mapping[str, Sequence[ClassMetrics]]) -> dict[str, Any]:
    """Means over cases per class, and over classes.

    Args:
        per_class: class name -> that class's metrics in every evaluated case.

    Returns:
        ``{"classes": {name: {"dice", "hd95_mm", "hd95_excluded", "nsd", "pred_ml", "ref_ml", "num_cases",
        "both_empty"}}, "foreground_mean": {"dice", "hd95_mm", "nsd"}}``. Class means of Dice and NSD use the cases
        where they are defined (``both_empty`` counts the cases without the class in reference and prediction, left
        out; NaN when every case is one), of the volumes every case; HD95 means skip non-finite values
        (``hd95_excluded`` counts them). The foreground mean is the mean of the class means that are defined.
    """
    classes: dict[str, dict[str, Any]] = {}
    for name, items in per_class.items():
        hd_mean, excluded = _finite_mean([m.hd95_mm for m in items])
        classes[name] = {
            "dice": defined_mean(m.dice for m in items),
            "hd95_mm": hd_mean,
            "hd95_excluded": excluded,
            "nsd": defined_mean(m.nsd for m in items),
            "pred_ml": float(np.mean([m.pred_ml for m in items])) if items else math.nan,
            "ref_ml": float(np.mean([m.ref_ml for m in items])) if items else math.nan,
            "num_cases": len(items),
            "both_empty": sum(m.flag == BOTH_EMPTY for m in items),
        }
    foreground = {
        key: _finite_mean([c[key] for c in classes.values()])[0] for key in ("dice", "hd95_mm", "nsd")
    }
    return {"classes": classes, "foreground_mean": foreground}
