"""The statistics of a verdict (:mod:`medseg.evaluation.compare`): each setting paired with the reference on the
same cases, per output and metric (:func:`compare_settings`: the mean difference, its interval and p-value, Holm's
correction, the verdict in words and the detectable difference), the settings' rank distributions
(:func:`rank_settings`), and the trend over a swept numeric key (:func:`curves`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from medseg.errors import DatasetError
from medseg.evaluation.compare_settings import FOREGROUND, METRICS, VOXEL_METRICS, Setting
from medseg.runs.folders import Sweep, setting_keys
from medseg.scoring.bootstrap import resampled_means
from medseg.scoring.paired import (
    ALPHA,
    BETTER,
    NO_EVIDENCE,
    NOT_MEASURABLE,
    RESAMPLES,
    Contrast,
    PairedDifference,
    finite_cases,
    holm,
    paired_cases,
    paired_difference,
    verdict,
)
from medseg.scoring.power import sensitivity
from medseg.scoring.ranking import rank_distribution
from medseg.scoring.trend import slope


@dataclass(frozen=True)
class Row:
    """One setting against the reference, for one output and metric."""

    setting: str
    output: str
    metric: str
    difference: PairedDifference
    p_holm: float
    verdict: str
    detectable: float = math.nan
    """Beside *no evidence*: the smallest difference detected with 80 % power at α / (settings compared)."""
    cases_needed: float = math.nan
    """With ``detect=``: the cases a difference of that size needs at this spread and these seeds (inf: more seeds)."""


@dataclass(frozen=True)
class Ranking:
    """The bootstrap rank distribution of every setting on the foreground mean of one metric."""

    metric: str
    settings: list[str]
    """The settings, in :attr:`~medseg.evaluation.compare.Comparison.settings` order."""
    means: list[float]
    """Each setting's mean over the cases finite in every setting."""
    distribution: np.ndarray
    """(K, K): ``[k, r]`` the share of the resamples in which setting k ranks ``r + 1``."""

    @property
    def first(self) -> int:
        """The index of the setting with the best observed mean."""
        return int(np.argmax(self.means) if METRICS[self.metric] else np.argmin(self.means))

    @property
    def first_is_first(self) -> float:
        """The share of the resamples in which the observed first ranks first."""
        return float(self.distribution[self.first, 0])


@dataclass(frozen=True)
class Curve:
    """The settings that differ in one numeric key, against its values, for the foreground mean of one metric."""

    key: str
    metric: str
    values: list[float]
    """The key's values, ascending."""
    settings: list[str]
    """The setting of each value."""
    slope: Contrast
    """The least-squares slope of the means against the values (metric per unit of the key), tested once."""
    best: str
    """Which value is best, or that the data cannot tell, in words."""


def paired(setting: Setting, reference: Setting, key: tuple[str, str], resamples: int = RESAMPLES) -> PairedDifference:
    """``setting`` minus ``reference`` on their common cases for one ``(output, metric)``, every seed of each
    (:func:`~medseg.scoring.paired.paired_difference`).

    Raises:
        DatasetError: they were not scored on the same outputs or cases.
    """
    if set(setting.scores) != set(reference.scores):
        outputs = [sorted({output for output, _ in s.scores}) for s in (setting, reference)]
        raise DatasetError(f"{setting.label} scores the outputs {outputs[0]}, {reference.label} {outputs[1]}: a paired "
                           f"comparison needs the same labels")
    paired_cases(setting.scores[key], reference.scores[key], setting.label, reference.label)
    cases = sorted(reference.scores[key])
    return paired_difference(setting.seed_values(key, cases), reference.seed_values(key, cases), resamples=resamples)


def neither_predicted(setting: Setting, reference: Setting, output: str) -> bool:
    """Whether neither ``setting`` nor ``reference`` predicted ``output`` in any case (from the recorded volumes): then
    every metric of it compares two empty predictions, which says nothing of how either segments it."""
    volumes = [s.volumes.get(output) for s in (setting, reference)]
    return all(volume is not None and not volume[0] for volume in volumes)


def unmeasurable(setting: Setting, reference: Setting, output: str, metric: str) -> str:
    """Why ``metric`` of ``output`` cannot be compared: no case finite on both sides, or neither side predicted
    ``output`` anywhere (:func:`neither_predicted`), in words (from the recorded volumes)."""
    volumes = [s.volumes.get(output) for s in (setting, reference)]
    if volumes[0] is not None and volumes[1] is not None:
        if not (volumes[0][1] or volumes[1][1]):
            return f"no {output} in the labels"
        missing = [s.label for s, (predicted, _) in zip((setting, reference), volumes) if not predicted]
        if len(missing) == 2:
            return f"no {output} predicted"
        if missing:
            return f"{missing[0]} predicted no {output}"
    return f"no case with a finite {metric} on both sides"


def compare_settings(settings: Sequence[Setting], reference: Setting, resamples: int = RESAMPLES,
                     detect: float | None = None) -> list[Row]:
    """Every setting but ``reference`` against it, for every output and metric; Holm's correction across the
    settings, for each output and metric; *not measurable* (with the reason) without a finite pair; what each could
    have seen (:func:`~medseg.scoring.power.sensitivity`) at Holm's first level, α / (settings tested). Rows by
    setting, then output, then metric."""
    others = [setting for setting in settings if setting is not reference]
    by_setting: dict[str, list[Row]] = {setting.label: [] for setting in others}
    for key in reference.scores:
        differences = [paired(setting, reference, key, resamples) for setting in others]
        measurable = [bool(difference.cases) and not neither_predicted(setting, reference, key[0])
                      for setting, difference in zip(others, differences)]
        adjusted = holm([difference.p if tested else math.nan for difference, tested in zip(differences, measurable)])
        level = ALPHA / max(1, sum(tested and not math.isnan(d.p) for d, tested in zip(differences, measurable)))
        for setting, difference, p, tested in zip(others, differences, adjusted, measurable):
            if not tested:
                said = f"{NOT_MEASURABLE}: {unmeasurable(setting, reference, *key)}"
                by_setting[setting.label].append(Row(setting.label, *key, difference, p, said))
                continue
            said = verdict(difference, p, METRICS[key[1]])
            detectable, needed = sensitivity(difference, level, detect)
            by_setting[setting.label].append(Row(setting.label, *key, difference, p, said,
                                                 detectable if said == NO_EVIDENCE else math.nan, needed))
    return [row for rows in by_setting.values() for row in rows]


def rank_settings(settings: Sequence[Setting], metric: str, resamples: int = RESAMPLES) -> Ranking | None:
    """The bootstrap rank distribution of ``settings`` on the foreground mean of ``metric``, on the cases finite in
    every seed of every setting (:func:`~medseg.scoring.bootstrap.resampled_means`); None without such a case."""
    key = (FOREGROUND, metric)
    cases = sorted(settings[0].scores[key])
    groups = finite_cases([setting.seed_values(key, cases) for setting in settings])
    if not groups[0].shape[1]:
        return None
    resampled = resampled_means(groups, resamples)
    return Ranking(metric, [s.label for s in settings], [float(g.mean()) for g in groups],
                   rank_distribution(resampled, METRICS[metric]))


def swept_values(sweep: Sweep, settings: Sequence[Setting],
                 reference: Setting) -> tuple[str, list[tuple[float, Setting]]] | None:
    """The one key in which the sweep's own settings differ (or, failing that, those but the reference: a gamma
    sweep of one block against ``none``), with each one's numeric value (ascending), when it is numeric and takes
    three or more values; else None."""
    own = [setting for setting in settings if setting.runs]
    for group in (own, [setting for setting in own if setting is not reference]):
        varying = [key for key in setting_keys(sweep.swept) if len({s.runs[0].overrides.get(key) for s in group}) > 1]
        if len(varying) == 1 and len(group) >= 3:
            try:
                values = [(float(s.runs[0].overrides[varying[0]]), s) for s in group]
            except (KeyError, TypeError, ValueError):
                return None
            return varying[0], sorted(values, key=lambda pair: pair[0])
    return None


def best_value(key: str, metric: str, values: Sequence[tuple[float, Setting]], means: Sequence[float],
               resamples: int = RESAMPLES) -> str:
    """Which value of ``key`` is best on the foreground mean of ``metric`` (``means``: each value's), when it beats
    the runner-up (paired, at α), else that the data cannot tell."""
    order = sorted(range(len(values)), key=lambda index: means[index], reverse=METRICS[metric])
    (best, first), (second, runner_up) = values[order[0]], values[order[1]]
    difference = paired(first, runner_up, (FOREGROUND, metric), resamples)
    said = verdict(difference, difference.p, METRICS[metric])
    against = (f"{key}={best:g} against the runner-up {key}={second:g}: {difference.mean:+.4f} "
               f"{format_interval(difference)}, p {format_p(difference.p)}")
    if said == BETTER:
        edge = best in (values[0][0], values[-1][0])
        return f"{key}={best:g} is best ({against}){'; it is the end of the range tested' if edge else ''}"
    return f"the data cannot tell which value of {key} is best ({against}: {said})"


def curves(sweep: Sweep, settings: Sequence[Setting], reference: Setting, resamples: int = RESAMPLES) -> list[Curve]:
    """For a sweep whose settings differ in one numeric key (:func:`swept_values`): per metric, the slope of the
    foreground mean against the values (one test, :func:`~medseg.scoring.trend.slope`) and the best value."""
    swept = swept_values(sweep, settings, reference)
    if swept is None:
        return []
    key, values = swept
    out = []
    for metric in VOXEL_METRICS:  # the foreground means: the lesion measures have none
        cases = sorted(values[0][1].scores[(FOREGROUND, metric)])
        groups = finite_cases([setting.seed_values((FOREGROUND, metric), cases) for _, setting in values])
        trend = slope(groups, [value for value, _ in values], resamples=resamples)
        if trend is not None:
            out.append(Curve(key, metric, [value for value, _ in values], [s.label for _, s in values], trend,
                             best_value(key, metric, values, [float(g.mean()) for g in groups], resamples)))
    return out


def format_interval(difference: PairedDifference | Contrast) -> str:
    """``[low, high]`` of a difference's (or a slope's) interval, signed to four decimals; "" without one."""
    return "" if math.isnan(difference.low) else f"[{difference.low:+.4f}, {difference.high:+.4f}]"


def format_p(value: float) -> str:
    """A p-value to three decimals (two significant digits below 0.001); "" for NaN."""
    return "" if math.isnan(value) else f"{value:.2g}" if value < 0.001 else f"{value:.3f}"
