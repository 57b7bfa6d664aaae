"""The detectable difference and the cases needed against the normal-approximation formula (Lehr's 7.85 sigma² /
delta² at α = 0.05 and 80 % power), and against a simulation of Wilcoxon's test at that number of cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from medseg.scoring.power import WILCOXON_EFFICIENCY, cases_needed, detectable_difference, z_sum


def test_against_the_normal_approximation() -> None:
    assert z_sum(0.05) == pytest.approx(1.959964 + 0.841621, abs=1e-5)
    assert detectable_difference(0.01, 0.05) == pytest.approx(0.028016, abs=1e-5)
    assert cases_needed(1.0, 1.0, 0.05) == 8  # 7.85 cases, rounded up
    assert cases_needed(1.0, 0.5, 0.05) == 32  # 7.85 x 4 = 31.4
    assert cases_needed(1.0, 1.0, 0.05, efficiency=WILCOXON_EFFICIENCY) == 9  # 7.85 x pi / 3 = 8.22
    assert cases_needed(0.04, 0.01, 0.025) == math.ceil(0.04 * z_sum(0.025) ** 2 / 0.01**2)  # Holm's first step
    wilcoxon = detectable_difference(0.01, 0.05, efficiency=WILCOXON_EFFICIENCY)
    assert wilcoxon == pytest.approx(0.028016 / math.sqrt(3 / math.pi), abs=1e-5)


def test_training_noise_sets_a_floor_that_cases_cannot_lower() -> None:
    floor = z_sum(0.05) ** 2 * 1e-4  # the detectable difference² with infinitely many cases, seed variance 1e-4
    assert cases_needed(0.01, math.sqrt(floor) * 0.99, 0.05, seed_variance=1e-4) == math.inf
    room = 0.05**2 / z_sum(0.05) ** 2 - 1e-4
    assert cases_needed(0.01, 0.05, 0.05, seed_variance=1e-4) == math.ceil(0.01 / room)
    assert math.isnan(cases_needed(math.nan, 0.02, 0.05))


def test_wilcoxon_reaches_the_power_at_the_cases_needed() -> None:
    n = int(cases_needed(1.0, 0.5, 0.05, efficiency=WILCOXON_EFFICIENCY))
    rng = np.random.default_rng(5)
    detected = np.mean([stats.wilcoxon(rng.normal(0.5, 1.0, n)).pvalue < 0.05 for _ in range(400)])
    assert 0.74 <= detected <= 0.88
