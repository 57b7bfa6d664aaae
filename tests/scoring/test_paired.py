"""The paired statistics of a comparison: the false-positive rate under the null holds near α, Holm's correction is
the hand-computed one, the verdict follows the metric's direction, and pairing refuses different cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from medseg.errors import DatasetError
from medseg.scoring.paired import (
    ALPHA,
    BETTER,
    NO_EVIDENCE,
    WORSE,
    check_same_cases,
    holm,
    paired_cases,
    paired_difference,
    verdict,
)

REPETITIONS = 200
CASES = 30


def test_same_distribution_gives_no_evidence_near_alpha() -> None:
    """Two settings whose per-case Dice come from one distribution (a case difficulty shared by both, independent
    noise each): a verdict in at most 8 % of 200 seeded repetitions."""
    rng = np.random.default_rng(2024)
    verdicts = []
    for _ in range(REPETITIONS):
        difficulty = rng.beta(8, 2, CASES)
        setting, reference = (np.clip(difficulty + rng.normal(0, 0.03, CASES), 0, 1) for _ in range(2))
        difference = paired_difference(setting, reference, resamples=999)
        verdicts.append(verdict(difference, difference.p))
    false_positives = sum(v != NO_EVIDENCE for v in verdicts)
    assert false_positives <= 0.08 * REPETITIONS
    assert false_positives > 0, "a test that never rejects under the null would pass this trivially"


def test_holm_against_a_hand_computation() -> None:
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> the running max 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = holm([math.nan, 0.02, 0.5])  # NaN is no test: m = 2
    assert math.isnan(adjusted[0]) and adjusted[1:] == pytest.approx([0.04, 0.5])
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # capped at 1
    assert holm([0.01]) == [0.01]


def test_difference_interval_and_p_of_a_known_shift() -> None:
    rng = np.random.default_rng(0)
    reference = rng.uniform(0.5, 0.9, 40)
    setting = reference - 0.02 + rng.normal(0, 0.01, 40)
    difference = paired_difference(setting, reference)
    assert difference.mean == pytest.approx(np.mean(setting - reference))
    assert difference.setting_mean == pytest.approx(setting.mean())
    assert difference.low < difference.mean < difference.high < 0 and difference.cases == 40
    assert difference.p < 1e-6
    assert verdict(difference, difference.p) == WORSE
    assert verdict(difference, difference.p, higher_is_better=False) == BETTER  # an HD95 that shrank
    assert verdict(difference, ALPHA) == NO_EVIDENCE  # not below α after the correction
    assert paired_difference(setting, reference) == difference, "seeded: the same interval every time"


def test_equal_values_and_non_finite_cases() -> None:
    values = np.array([0.5, 0.7, 0.9])
    same = paired_difference(values, values.copy())
    assert (same.mean, same.low, same.high, same.p, same.cases) == (0.0, 0.0, 0.0, 1.0, 3)
    assert verdict(same, same.p) == NO_EVIDENCE
    hd95 = paired_difference(np.array([1.0, math.inf, 2.0, math.nan]), np.array([2.0, 3.0, 3.0, 1.0]))
    assert hd95.cases == 2 and hd95.mean == -1.0  # only the cases finite on both sides
    empty = paired_difference(np.array([math.inf]), np.array([1.0]))
    assert empty.cases == 0 and math.isnan(empty.mean) and math.isnan(empty.p)
    assert verdict(empty, holm([empty.p])[0]) == NO_EVIDENCE


def test_pairing_refuses_different_cases_and_names_them() -> None:
    setting = {"case_1": 0.9, "case_2": 0.8, "case_4": 0.7}
    reference = {"case_1": 0.8, "case_2": 0.7, "case_3": 0.6}
    with pytest.raises(DatasetError, match=r"masa lacks 1 case\(s\): case_3; none lacks 1 case\(s\): case_4"):
        paired_cases(setting, reference, "masa", "none")
    values, ref = paired_cases({"b": 1.0, "a": 2.0}, {"a": 0.5, "b": 0.25}, "x", "y")
    assert values.tolist() == [2.0, 1.0] and ref.tolist() == [0.5, 0.25]  # case by case
    check_same_cases(["a", "b"], ["b", "a"], "x", "y")
