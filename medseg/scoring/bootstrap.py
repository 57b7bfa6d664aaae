"""The bootstrap of out-of-fold scores over cases and training seeds: a crossed design, resampled at both levels.

Every seed of a setting is a training run that scored the same N cases, so a setting's scores form a seeds × cases array
(S, N), and the cases are shared by every setting. The seeds are crossed with the cases, not nested in them (a seed's
network scores every case), so a resample draws the cases once, shared by every setting (the pairing), and each
setting's seeds independently (its own training noise): the pigeonhole bootstrap of a crossed random-effects design
(Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat.; McCullagh 2000 shows that no bootstrap of a crossed design is
exactly unbiased). Drawing S seeds from S shrinks their variance by (S - 1) / S, so each setting's resampled seed mean
is moved away from its observed mean by sqrt(S / (S - 1)) (the rescaled bootstrap of Davison and Hinkley 1997,
"Bootstrap Methods and their Application", 3.8, for the upper stage of a two-stage design). A mixed model (case and seed
random effects) would give the same interval with normal errors, but Dice and HD95 differences are skewed and bounded,
and with two to five seeds its seed-variance estimate sits on the boundary; the bootstrap needs no such model.

Pure functions of arrays; the same ``seed`` gives the same resamples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 9999
"""Bootstrap resamples (scipy's default)."""
SEED = 0
"""The bootstrap's seed: the same values give the same interval."""


def resampled_means(groups: Sequence[np.ndarray], resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """The mean over the cases of each group's seed mean, for ``resamples`` bootstrap resamples: the cases drawn with
    replacement once per resample (shared by the groups), each group's seeds drawn with replacement independently,
    their mean's deviation from the group's rescaled by ``sqrt(S / (S - 1))``.

    Args:
        groups: K arrays of shape (S_k, N): group k's value of every case (columns, the same cases in the same order
            for every group) under each of its S_k seeds (rows).

    Returns:
        (resamples, K): the resampled means of each group.
    """
    rng = np.random.default_rng(seed)
    cases = groups[0].shape[1]
    case_weights = rng.multinomial(cases, np.full(cases, 1 / cases), size=resamples) / cases  # (B, N)
    out = np.empty((resamples, len(groups)))
    for index, values in enumerate(groups):
        seeds = values.shape[0]
        seed_weights = rng.multinomial(seeds, np.full(seeds, 1 / seeds), size=resamples) / seeds  # (B, S_k)
        observed = values.mean(axis=0)
        scale = np.sqrt(seeds / (seeds - 1)) if seeds > 1 else 1.0
        out[:, index] = np.einsum("bn,bn->b", observed + scale * (seed_weights @ values - observed), case_weights)
    return out


def percentile_interval(resampled: np.ndarray, confidence: float) -> tuple[float, float]:
    """The percentile interval of ``resampled`` (B,) at ``confidence``."""
    low, high = np.quantile(resampled, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def bootstrap_p(resampled: np.ndarray, observed: float) -> float:
    """The two-sided bootstrap p-value of ``observed`` against zero: the share of the resamples (B,), centred on
    ``observed``, at least as far from zero as ``observed`` (Hall and Wilson 1991), counted as
    ``(1 + hits) / (1 + B)`` so it is never 0."""
    hits = np.count_nonzero(np.abs(resampled - observed) >= abs(observed))
    return float(min(1.0, (1 + hits) / (1 + len(resampled))))
