"""One test of a trend across the values of a swept numeric key: the least-squares slope of the settings' means
against the values.

The slope is a linear contrast of the settings' means, ``sum_k w_k mean_k`` with ``w_k = (x_k - x̄) / sum_j (x_j -
x̄)²``, so it is tested like a paired difference (:func:`medseg.scoring.paired.contrast`): per case, the slope of that
case's values, tested by Wilcoxon's signed-rank test over the cases with one seed per setting, by the bootstrap of
cases and seeds with more. One test for the whole curve, not one per value, and in the metric's units per unit of the
key. Page's trend test would rank the settings within each case instead; it ignores how far apart the values lie and
has no interval, nor a way to resample the seeds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from medseg.scoring.bootstrap import RESAMPLES, SEED
from medseg.scoring.paired import CONFIDENCE, Contrast, contrast, finite_cases


def slope_weights(values: Sequence[float]) -> np.ndarray:
    """The weights (K,) that turn K means at ``values`` (at least two distinct) into their least-squares slope."""
    x = np.asarray(values, float)
    centred = x - x.mean()
    return centred / np.sum(centred**2)


def slope(groups: Sequence[np.ndarray], values: Sequence[float], confidence: float = CONFIDENCE,
          resamples: int = RESAMPLES, seed: int = SEED) -> Contrast | None:
    """The slope of the groups' means (each (S_k, N), the same cases) against ``values`` with its interval and
    p-value, on the cases finite in every group; None without such a case."""
    groups = finite_cases(groups)
    if not groups[0].shape[1]:
        return None
    return contrast(groups, slope_weights(values), confidence, resamples, seed)
