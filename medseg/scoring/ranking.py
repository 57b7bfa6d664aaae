"""The uncertainty of a ranking: how often each setting takes each rank over bootstrap resamples of its means.

The resampled means come from :func:`medseg.scoring.bootstrap.resampled_means` (cases shared, each setting's seeds
its own), so a ranking that the noise can reorder shows as spread-out ranks (Wiesenfarth et al. 2021, "Methods and
open-source toolkit for analyzing and visualizing challenge results", Sci. Rep.: the blob plot of challengeR).
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def rank_distribution(resampled: np.ndarray, higher_is_better: bool = True) -> np.ndarray:
    """How often each of K settings takes each rank over the resamples.

    Args:
        resampled: (B, K) the resampled means of the settings.

    Returns:
        (K, K): ``[k, r]`` the share of the resamples in which setting k ranks ``r + 1`` (1: best; ties share the
        better rank, so each row sums to 1).
    """
    ranks = stats.rankdata(-resampled if higher_is_better else resampled, method="min", axis=1).astype(int) - 1
    counts = np.stack([np.bincount(ranks[:, k], minlength=resampled.shape[1]) for k in range(resampled.shape[1])])
    return counts / len(resampled)
