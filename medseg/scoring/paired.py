"""Paired comparison of two settings on the same cases: the mean difference with a bootstrap interval, the Wilcoxon
signed-rank test, Holm's correction across the settings compared, and a verdict in words.

Pure functions of per-case values (``case -> value``, or arrays of shape (N,) in case order, or (S, N) for S training
seeds of the same cases). With one seed on each side, the interval is the BCa bootstrap of the cases and the test is
Wilcoxon's; with several on either side, both resample the seeds as well as the cases (:mod:`medseg.scoring.bootstrap`:
the percentile interval and the bootstrap test), so they hold training noise too. The difference is always
*setting minus reference*; whether a positive difference is better depends on the metric (Dice and NSD: higher is
better; HD95: lower). The verdict is *better* or *worse* only when the Holm-adjusted p-value is below ``alpha`` and the
whole confidence interval lies on the same side of zero; otherwise *no evidence of a difference*.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy import stats

from medseg.errors import DatasetError
from medseg.scoring.bootstrap import RESAMPLES, SEED, bootstrap_p, percentile_interval, resampled_means

ALPHA = 0.05
"""The significance level of every verdict, after Holm's correction."""
CONFIDENCE = 0.95
"""The level of the bootstrap confidence interval of the mean difference."""
BETTER, WORSE, NO_EVIDENCE = "better", "worse", "no evidence of a difference"
"""The verdicts."""
NOT_MEASURABLE = "not measurable"
"""The cell of a metric without a finite pair (followed by the reason): never a verdict."""


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
    se: float = math.nan
    """The standard error of :attr:`mean`: the bootstrap's with several seeds, ``sd / sqrt(cases)`` with one."""
    seed_variance: float = 0.0
    """The part of ``se²`` that more cases would not shrink: each side's seed variance over its seeds
    (:func:`seed_variance`), summed; 0 with one seed a side."""
    seed_differences: tuple[float, ...] = ()
    """Each of the setting's seeds alone: its mean over the cases minus the reference's (seeds averaged)."""
    training_noise: bool = False
    """Whether the interval and the test resampled seeds (several seeds on either side)."""

    @property
    def holds_in_every_seed(self) -> bool:
        """Whether every seed of the setting alone differs from the reference on the side of :attr:`mean`."""
        side = np.sign(self.mean)
        return bool(math.isfinite(self.mean) and side) and all(np.sign(d) == side for d in self.seed_differences)


class Contrast(NamedTuple):
    """A weighted sum of the groups' means over the cases, with its interval and test."""

    estimate: float
    low: float
    high: float
    p: float
    se: float
    """Its standard error: the bootstrap's with several seeds, ``sd / sqrt(cases)`` of the per-case contrasts with
    one."""
    training_noise: bool
    """Whether the seeds were resampled."""


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


def seed_variance(values: np.ndarray) -> float:
    """The variance of a training seed's shift of every case, divided by the S seeds of ``values`` (S, N): the part
    of the variance of their mean that does not shrink with the cases. For ``v_si = mu_i + a_s + e_si``, the seed means
    vary by ``var(a) + var(e) / N`` and each case over the seeds by ``var(a) + var(e)``, so
    ``var(a) = (N * var(seed means) - mean over cases of var over seeds) / (N - 1)`` (method of moments, clipped at 0;
    0 with one seed or one case)."""
    seeds, cases = values.shape
    if seeds < 2 or cases < 2:
        return 0.0
    between = cases * values.mean(axis=1).var(ddof=1) - values.var(axis=0, ddof=1).mean()
    return max(0.0, float(between) / (cases - 1)) / seeds


def finite_cases(groups: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``groups`` ((S_k, N) or (N,) each) as (S_k, N') arrays of the N' cases finite in every seed of every group
    (HD95 of an empty mask is not)."""
    groups = [np.atleast_2d(np.asarray(group, float)) for group in groups]
    finite = np.logical_and.reduce([np.isfinite(group).all(axis=0) for group in groups])
    return [group[:, finite] for group in groups]


def contrast(groups: Sequence[np.ndarray], weights: Sequence[float], confidence: float = CONFIDENCE,
             resamples: int = RESAMPLES, seed: int = SEED) -> Contrast:
    """``sum_k weights[k] * mean(groups[k])`` over the same cases (each group (S_k, N), finite, N >= 1), with its
    interval and two-sided p-value against zero. With one seed in every group: the BCa interval of the cases and
    Wilcoxon's test of the per-case contrasts; with more: the percentile interval and the bootstrap test of
    :func:`~medseg.scoring.bootstrap.resampled_means` (cases and seeds resampled)."""
    per_case = sum(weight * group.mean(axis=0) for weight, group in zip(weights, groups))
    estimate, cases = float(per_case.mean()), len(per_case)
    case_variance = float(per_case.var(ddof=1)) if cases > 1 else math.nan
    if all(group.shape[0] == 1 for group in groups):
        low, high = mean_interval(per_case, confidence, resamples, seed)
        return Contrast(estimate, low, high, wilcoxon_p(per_case), math.sqrt(case_variance / cases), False)
    resampled = resampled_means(groups, resamples, seed) @ np.asarray(weights, float)
    return Contrast(estimate, *percentile_interval(resampled, confidence), bootstrap_p(resampled, estimate),
                    float(resampled.std(ddof=1)), True)


def paired_difference(values: np.ndarray, reference: np.ndarray, resamples: int = RESAMPLES,
                      seed: int = SEED) -> PairedDifference:
    """Mean of ``values - reference`` (each (N,), or (S, N) for S seeds, case by case), its interval and p-value
    (:func:`contrast`); the cases where a value of either side is not finite (HD95 of an empty mask) are left out."""
    values, reference = finite_cases([values, reference])
    cases = values.shape[1]
    if not cases:
        return PairedDifference(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 0)
    result = contrast([values, reference], (1.0, -1.0), resamples=resamples, seed=seed)
    return PairedDifference(result.estimate, float(values.mean()), float(reference.mean()), result.low, result.high,
                            result.p, cases, result.se, seed_variance(values) + seed_variance(reference),
                            tuple(float(d) for d in values.mean(axis=1) - reference.mean()), result.training_noise)


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
