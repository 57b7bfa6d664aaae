"""The rank distribution against a hand count, and the slope of a trend against per-case least squares."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from medseg.scoring.ranking import rank_distribution
from medseg.scoring.trend import slope, slope_weights


def test_rank_distribution_by_hand() -> None:
    resampled = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [1.0, 1.0, 0.0]])  # the last: a tie for first
    expected = np.array([[2, 0, 1], [1, 2, 0], [1, 0, 2]]) / 3
    assert rank_distribution(resampled) == pytest.approx(expected)
    assert rank_distribution(resampled, higher_is_better=False)[2] == pytest.approx([2 / 3, 0, 1 / 3])


def test_slope_is_the_least_squares_slope_of_the_means() -> None:
    assert slope_weights([0.8, 0.85, 0.9]) == pytest.approx([-10, 0, 10])
    rng = np.random.default_rng(4)
    x = [0.8, 0.85, 0.9, 1.0]
    per_case = rng.uniform(0.5, 0.9, 20) + 0.3 * np.array(x)[:, None] + rng.normal(0, 0.02, (4, 20))  # (K, N)
    result = slope([row[None] for row in per_case], x, resamples=999)
    by_case = np.array([stats.linregress(x, per_case[:, i]).slope for i in range(20)])
    assert result.estimate == pytest.approx(by_case.mean()) and not result.training_noise
    assert result.p == pytest.approx(stats.wilcoxon(by_case).pvalue)
    assert result.low < 0.3 < result.high
    seeded = slope([np.stack([row, row + 0.01]) for row in per_case], x, resamples=999)
    assert seeded.training_noise and seeded.estimate == pytest.approx(by_case.mean())
    assert slope([np.full((1, 3), np.inf)] * 2, [0, 1]) is None
