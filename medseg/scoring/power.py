"""What a paired comparison could have seen: the smallest difference it detects with a given power, and the number of
cases a difference of a given size needs.

The normal approximation of a two-sided test of a mean difference at level ``alpha``: a true difference ``delta``
is detected with probability ``power`` when ``delta = (z_{1 - alpha/2} + z_{power}) * se``, ``se`` the standard error
of the mean difference (at α = 0.05 and 80 % power, ``delta = 2.80 se``, and ``n = 7.85 sigma² / delta²`` cases: Lehr's
rule, van Belle 2008, "Statistical Rules of Thumb", 2.3). It is the paired t-test's large-sample power; Wilcoxon's
signed-rank test needs ``1 / efficiency`` times the cases, ``efficiency`` its asymptotic relative efficiency to the
t-test, 3/π for normal differences (Lehmann 1975, "Nonparametrics", 2.4; at least 0.864 for any distribution). With
training seeds resampled, ``se² = case_variance / n + seed_variance``: the seed part does not shrink with the
cases, so a difference below ``(z_{1 - alpha/2} + z_{power}) * sqrt(seed_variance)`` needs more seeds, not cases.
"""

from __future__ import annotations

import math

from scipy import stats

from medseg.scoring.paired import PairedDifference

POWER = 0.8
"""The power of every detectable difference."""
WILCOXON_EFFICIENCY = 3 / math.pi
"""Wilcoxon's signed-rank test's asymptotic relative efficiency to the paired t-test, for normal differences."""


def z_sum(alpha: float, power: float = POWER) -> float:
    """``z_{1 - alpha/2} + z_{power}``: the standard errors between zero and a difference detected with ``power``."""
    return float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))


def detectable_difference(se: float, alpha: float, power: float = POWER, efficiency: float = 1.0) -> float:
    """The smallest true difference a two-sided test at ``alpha`` detects with ``power``, given the standard error
    ``se`` of the mean difference and the test's ``efficiency`` relative to the t-test (NaN when ``se`` is)."""
    return z_sum(alpha, power) * se / math.sqrt(efficiency)


def cases_needed(case_variance: float, difference: float, alpha: float, power: float = POWER,
                 efficiency: float = 1.0, seed_variance: float = 0.0) -> float:
    """The number of paired cases for a two-sided test at ``alpha`` to detect ``difference`` with ``power``: the
    smallest ``n`` with ``z_sum² (case_variance / n + seed_variance) / efficiency <= difference²``, ``inf`` when the
    seed part alone is too large (more seeds are needed), NaN when ``case_variance`` is.
    """
    if math.isnan(case_variance) or math.isnan(seed_variance):
        return math.nan
    room = efficiency * difference**2 / z_sum(alpha, power) ** 2 - seed_variance
    if room <= 0:
        return math.inf
    return float(max(2, math.ceil(case_variance / room)))


def sensitivity(difference: PairedDifference, alpha: float, detect: float | None = None) -> tuple[float, float]:
    """What a paired ``difference`` could have seen at ``alpha``: the smallest difference detected with
    :data:`POWER`, and the cases a difference of ``detect`` needs at its seeds (NaN without ``detect``). The test's
    efficiency is Wilcoxon's with one seed a side, the bootstrap's (1) with more; ``se²`` splits into the seed
    variance (:attr:`~medseg.scoring.paired.PairedDifference.seed_variance`, fixed) and the rest, which shrinks as
    1 / cases."""
    efficiency = 1.0 if difference.training_noise else WILCOXON_EFFICIENCY
    detectable = detectable_difference(difference.se, alpha, efficiency=efficiency)
    if detect is None or difference.cases < 2:
        return detectable, math.nan
    fixed = min(difference.seed_variance, difference.se**2)
    per_case = (difference.se**2 - fixed) * difference.cases
    return detectable, cases_needed(per_case, detect, alpha, efficiency=efficiency, seed_variance=fixed)
