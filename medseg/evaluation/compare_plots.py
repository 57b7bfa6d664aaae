"""The figures of a comparison (:mod:`medseg.evaluation.compare`), matplotlib Figures on an Agg canvas: the forest
plot of ``compare.png`` with the rank blobs (:func:`render_plot`), the curve of a swept numeric key of
``compare.curve.png`` (:func:`render_curve`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from medseg.evaluation.compare import Comparison
from medseg.evaluation.compare_settings import LESION_METRICS, METRICS, VOXEL_METRICS
from medseg.evaluation.compare_stats import Ranking, Row, format_p
from medseg.scoring.paired import BETTER, CONFIDENCE, NOT_MEASURABLE, WORSE

VERDICT_COLOURS = {BETTER: "tab:green", WORSE: "tab:red"}
"""Forest-plot colours; *no evidence* is grey; a *not measurable* row is left empty."""


def plot_panels(comparison: Comparison) -> list[list[tuple[str, list[tuple[str, Row]]]]]:
    """The forest plot's panels by row of the figure, each ``(metric, [(label, row)])``: the foreground mean of each
    of :data:`VOXEL_METRICS` by setting, then (when recorded) each of :data:`LESION_METRICS` by setting and output."""
    labels = [s.label for s in comparison.settings if s is not comparison.reference]
    voxel = [(metric, [(label, comparison.foreground(metric)[label]) for label in labels]) for metric in VOXEL_METRICS]
    by_key = {(row.setting, row.output, row.metric): row for row in comparison.rows}
    outputs = list(dict.fromkeys(output for output, metric in comparison.reference.scores if metric in LESION_METRICS))
    lesion = [(metric, [(f"{label}: {output}", by_key[(label, output, metric)]) for label in labels
                        for output in outputs]) for metric in LESION_METRICS
              if any((output, metric) in comparison.reference.scores for output in outputs)]
    return [voxel, lesion] if lesion else [voxel]


def _figure(width: float, height: float) -> Any:
    """A matplotlib Figure on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _blobs(ax: Any, ranking: Ranking, labelled: bool) -> None:
    """A blob plot of ``ranking`` on ``ax``: a row per setting, a column per rank, the area the share."""
    ranks = np.arange(1, len(ranking.settings) + 1)
    for y, shares in enumerate(ranking.distribution):
        ax.scatter(ranks, np.full(len(ranks), y), s=400 * shares, color="tab:blue", alpha=0.7)
    ax.set_xticks(ranks)
    ax.set_yticks(range(len(ranking.settings)), ranking.settings if labelled else [""] * len(ranking.settings),
                  fontsize="small")
    ax.set_ylim(len(ranking.settings) - 0.5, -0.5)
    ax.set_xlabel(f"bootstrap rank, {ranking.metric} (first: P = {ranking.first_is_first:.0%})")


def render_plot(comparison: Comparison) -> Any:
    """The forest plot (a matplotlib Figure, Agg canvas): a panel per metric of the foreground mean, one row per
    setting with its mean difference and confidence interval, and a line at zero; below them, a panel per lesion-wise
    measure, one row per setting and output; with three or more settings, a lower row of blob plots of each
    foreground metric's bootstrap rank distribution."""
    panels = plot_panels(comparison)
    heights = [1.0 + 0.45 * len(figure_row[0][1]) for figure_row in panels]
    if comparison.rankings:
        heights.append(1.0 + 0.45 * len(comparison.rankings[0].settings))
    columns = max(len(figure_row) for figure_row in panels)
    fig = _figure(4.2 * columns, 0.4 + sum(heights))
    grid = fig.add_gridspec(len(heights), columns, height_ratios=heights)
    for line, figure_row in enumerate(panels):
        for index, (metric, rows) in enumerate(figure_row):
            ax = fig.add_subplot(grid[line, index])
            for y, (_, row) in enumerate(rows):
                d = row.difference
                if not math.isnan(d.mean) and not row.verdict.startswith(NOT_MEASURABLE):
                    ax.errorbar(d.mean, y, xerr=[[d.mean - d.low], [d.high - d.mean]], fmt="o", capsize=3,
                                color=VERDICT_COLOURS.get(row.verdict, "tab:gray"))
            ax.axvline(0.0, color="black", linewidth=0.8)
            ax.set_yticks(range(len(rows)), [label for label, _ in rows] if index == 0 else [""] * len(rows),
                          fontsize="small")
            ax.set_ylim(len(rows) - 0.5, -0.5)
            ax.set_xlabel(f"Δ {metric} ({'higher' if METRICS[metric] else 'lower'} is better)")
            ax.grid(axis="x", alpha=0.3)
    for index, ranking in enumerate(comparison.rankings):
        _blobs(fig.add_subplot(grid[len(panels), list(VOXEL_METRICS).index(ranking.metric)]), ranking, index == 0)
    fig.suptitle(f"setting − {comparison.reference.label}: foreground mean{', lesions per output' * (len(panels) > 1)}"
                 f", {CONFIDENCE:.0%} CI (green better, red worse, grey no evidence)", fontsize="medium")
    return fig


def render_curve(comparison: Comparison) -> Any:
    """The curve of a swept numeric key (a matplotlib Figure): a panel per metric, the difference of each value's
    setting to the reference against the value, with its interval (the reference's own value at zero)."""
    fig = _figure(4.2 * len(comparison.curves), 3.2)
    for index, curve in enumerate(comparison.curves):
        ax = fig.add_subplot(1, len(comparison.curves), index + 1)
        rows = comparison.foreground(curve.metric)
        points = [(value, rows[label].difference if label in rows else None)
                  for value, label in zip(curve.values, curve.settings)]
        xs = [value for value, _ in points]
        means = [0.0 if d is None else d.mean for _, d in points]
        lows = [0.0 if d is None or math.isnan(d.low) else d.mean - d.low for _, d in points]
        highs = [0.0 if d is None or math.isnan(d.high) else d.high - d.mean for _, d in points]
        ax.errorbar(xs, means, yerr=[lows, highs], fmt="o-", capsize=3, color="tab:blue")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xlabel(curve.key)
        ax.set_ylabel(f"Δ {curve.metric} ({'higher' if METRICS[curve.metric] else 'lower'} is better)")
        ax.set_title(f"slope {curve.slope.estimate:+.3g}, p {format_p(curve.slope.p)}", fontsize="small")
        ax.grid(alpha=0.3)
    fig.suptitle(f"setting − {comparison.reference.label}: foreground mean, {CONFIDENCE:.0%} CI", fontsize="medium")
    return fig
