"""Paired comparison of two settings on the same cases: the mean difference with a bootstrap interval, the Wilcoxon
signed-rank test, Holm's correction across the settings compared, and a verdict in words.

Pure functions of per-case values (``case -> value``, or arrays of shape (N,) in case order). The difference is always
*setting minus reference*; whether a positive difference is better depends on the metric (Dice and NSD: higher is
better; HD95: lower). The verdict is *better* or *worse* only when the Holm-adjusted p-value is below ``alpha`` and the
whole confidence interval lies on the same side of zero; otherwise *no evidence of a difference*.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from medseg.errors import DatasetError

ALPHA = 0.05
"""The significance level of every verdict, after Holm's correction."""
CONFIDENCE = 0.95
"""The level of the bootstrap confidence interval of the mean difference."""
RESAMPLES = 9999
"""Bootstrap resamples of the cases (scipy's default)."""
SEED = 0
"""The bootstrap's seed: the same values give the same interval."""
BETTER, WORSE, NO_EVIDENCE = "better", "worse", "no evidence of a difference"
"""The verdicts."""


@dataclass(frozen=True)
class PairedDifference:
    """Setting minus reference over the paired cases."""

    mean: float
    """The mean difference (NaN without cases)."""
    setting_mean: float
    """The mean of the setting's values over the paired cases."""
    reference_mean: float
    """The mean of the reference's values over the same cases."""
    low: float
    """The bootstrap confidence interval of the mean difference: ``[low, high]``."""
    high: float
    p: float
    """The two-sided Wilcoxon signed-rank p-value (1 when every difference is zero, NaN without cases)."""
    cases: int
    """The number of paired cases with finite values on both sides."""


def listed(cases: Sequence[str], shown: int = 5) -> str:
    """``"case_1, case_2, ..."``: the first ``shown`` of ``cases``."""
    return ", ".join(cases[:shown]) + (", ..." if len(cases) > shown else "")


def check_same_cases(cases: Collection[str], reference: Collection[str], name: str, reference_name: str) -> None:
    """Raise unless ``name`` was evaluated on the cases of ``reference_name``.

    Raises:
        DatasetError: the two case sets differ; the message names the cases each one lacks.
    """
    lacking = {name: sorted(set(reference) - set(cases)), reference_name: sorted(set(cases) - set(reference))}
    detail = "; ".join(f"{who} lacks {len(missing)} case(s): {listed(missing)}"
                       for who, missing in lacking.items() if missing)
    if detail:
        raise DatasetError(f"{name} and {reference_name} were not evaluated on the same cases ({detail}); a paired "
                           f"comparison needs the same out-of-fold cases (cross-validate both on the same folds)")


def paired_cases(values: Mapping[str, float], reference: Mapping[str, float], name: str,
                 reference_name: str) -> tuple[np.ndarray, np.ndarray]:
    """The values of both (``case -> value``) as arrays of shape (N,), cases in sorted order.

    Raises:
        DatasetError: the two were not evaluated on the same cases (:func:`check_same_cases`).
    """
    check_same_cases(values, reference, name, reference_name)
    cases = sorted(values)
    return np.array([values[c] for c in cases], float), np.array([reference[c] for c in cases], float)


def wilcoxon_p(differences: np.ndarray) -> float:
    """The two-sided Wilcoxon signed-rank p-value of ``differences`` (N,): zeros dropped, 1 when all are zero."""
    if len(differences) == 0:
        return math.nan
    if not np.any(differences):
        return 1.0
    return float(stats.wilcoxon(differences).pvalue)


def mean_interval(differences: np.ndarray, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                  seed: int = SEED) -> tuple[float, float]:
    """The bootstrap (BCa) confidence interval of the mean of ``differences`` (N,), resampling the cases with
    ``seed``: paired resampling, since each case carries both of its values. A point when every difference is equal
    (or N is 1), NaN without cases."""
    if len(differences) == 0:
        return math.nan, math.nan
    if np.ptp(differences) == 0:
        return float(differences[0]), float(differences[0])
    result = stats.bootstrap((differences,), np.mean, n_resamples=resamples, confidence_level=confidence,
                             vectorized=True, rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def paired_difference(values: np.ndarray, reference: np.ndarray, resamples: int = RESAMPLES,
                      seed: int = SEED) -> PairedDifference:
    """Mean of ``values - reference`` (both (N,), case by case), its bootstrap interval and the Wilcoxon p-value; the
    cases where either value is not finite (HD95 of an empty mask) are left out."""
    finite = np.isfinite(values) & np.isfinite(reference)
    values, reference = values[finite], reference[finite]
    differences = values - reference
    means = [float(array.mean()) if len(array) else math.nan for array in (differences, values, reference)]
    low, high = mean_interval(differences, resamples=resamples, seed=seed)
    return PairedDifference(*means, low, high, wilcoxon_p(differences), len(differences))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (one per setting compared), in their order; NaN stays NaN and
    does not count as a test. The i-th smallest of m p-values becomes ``max over j <= i of min(1, (m - j + 1) p_j)``.
    """
    tested = sorted((p, index) for index, p in enumerate(p_values) if not math.isnan(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[index] = running
    return adjusted


def verdict(difference: PairedDifference, adjusted_p: float, higher_is_better: bool = True,
            alpha: float = ALPHA) -> str:
    """*better*, *worse* or *no evidence of a difference*: better or worse only when ``adjusted_p < alpha`` and the
    confidence interval excludes zero on that side."""
    if math.isnan(adjusted_p) or adjusted_p >= alpha:
        return NO_EVIDENCE
    if difference.low > 0:
        return BETTER if higher_is_better else WORSE
    if difference.high < 0:
        return WORSE if higher_is_better else BETTER
    return NO_EVIDENCE
