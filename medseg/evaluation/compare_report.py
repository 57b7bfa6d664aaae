"""The report of a comparison (:mod:`medseg.evaluation.compare`): its tables and notes, the text of ``compare.md``,
``compare.csv`` and ``compare.json``, and :func:`compare_sweep`, which compares a sweep and writes them.

:func:`compare_sweep` writes ``compare.md``, ``compare.csv``, ``compare.json`` and ``compare.png`` (a forest plot, with
the rank blobs, :mod:`medseg.evaluation.compare_plots`), and ``compare.curve.png`` for a swept numeric key, atomically
into the sweep directory; against a reference other than :data:`~medseg.evaluation.compare.DEFAULT_REFERENCE` the
names carry it (``compare.model.bottleneck=masa.md``, :func:`~medseg.evaluation.compare.report_name`), so each
reference keeps its report.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medseg.evaluation.compare import CURVE, DEFAULT_REFERENCE, Comparison, build_comparison, report_name
from medseg.evaluation.compare_plots import render_curve, render_plot
from medseg.evaluation.compare_settings import FOREGROUND, LESION_METRICS, METRICS, Setting
from medseg.evaluation.compare_stats import Row, format_interval, format_p
from medseg.evaluation.external import ExternalSource
from medseg.io import atomic_write, atomic_write_json, atomic_write_text, json_safe
from medseg.runs.folders import COMPUTE_KEYS, FLOPS_KEY
from medseg.scoring.metrics import UNDEFINED_WHEN_EMPTY
from medseg.scoring.paired import ALPHA, CONFIDENCE, RESAMPLES, Contrast, PairedDifference
from medseg.scoring.power import POWER
from medseg.tables import markdown_table, text_table

EFFICIENCY = ("dice_per_gflop", "dice_per_gpu_hour")
"""The efficiency columns: foreground Dice per GFLOP of a training-patch forward, per GPU-hour of one run."""
METHOD = (f"Paired on the same out-of-fold cases: the mean difference setting − reference with a {CONFIDENCE:.0%} "
          f"confidence interval and a two-sided p-value; with one seed a side the BCa bootstrap of the cases "
          f"({RESAMPLES} resamples) and the Wilcoxon signed-rank test, with more the bootstrap of cases and seeds "
          f"(each setting's seeds resampled, so training noise is in the interval) and its test; Holm's correction "
          f"across the settings compared (per output and metric); *better* or *worse* when the Holm p < {ALPHA} and "
          f"the interval excludes zero, else *no evidence of a difference*, with the smallest difference the sweep "
          f"would have detected with {POWER:.0%} power at α = {ALPHA}/(settings compared), Holm's first step; *not "
          f"measurable* without a case finite on both sides.")
ONE_SEED = "1: CI omits its training noise"
"""The seeds cell of a setting with one seed: its interval resamples the cases only."""


def _needed(value: float) -> str:
    return "" if math.isnan(value) else "more seeds" if math.isinf(value) else f"{value:,.0f}"


def _seeds(setting: Setting) -> int | str:
    return len(setting.seeds) if len(setting.seeds) > 1 else ONE_SEED


def _on_its_side(difference: PairedDifference) -> str:
    """``k/S``: how many of the setting's S seeds alone differ from the reference on the side of the mean."""
    if len(difference.seed_differences) < 2 or not math.isfinite(difference.mean):
        return ""
    side = math.copysign(1.0, difference.mean)
    return f"{sum(d * side > 0 for d in difference.seed_differences)}/{len(difference.seed_differences)}"


def _tested(row: Row, detect: float | None) -> list[Any]:
    """The cells of a row's test: Δ, interval, p, Holm p, verdict, seeds on its side, detectable Δ and, with
    ``detect``, the cases needed."""
    d = row.difference
    cells = [f"{d.mean:+.4f}" if d.cases else "", format_interval(d), format_p(d.p), format_p(row.p_holm), row.verdict,
             _on_its_side(d), "" if math.isnan(row.detectable) else f"{row.detectable:.4f}"]
    return [*cells, _needed(row.cases_needed)] if detect is not None else cells


def _tested_headers(detect: float | None) -> list[str]:
    return ["Δ", "95% CI", "p", "Holm p", "verdict", "seeds on its side", f"detectable Δ ({POWER:.0%})",
            *([f"cases for Δ={detect:g}"] if detect is not None else [])]


def setting_table(comparison: Comparison, render: Any = text_table) -> str:
    """One row per setting (the reference first): seeds (one: the interval omits its training noise), cases,
    foreground Dice and its seed-to-seed spread, its difference, interval, p-values, verdict, the seeds on its side,
    the detectable difference (and the cases ``detect=`` needs), then each compute column that some setting has and
    the efficiency."""
    rows_by_setting = comparison.foreground()
    ordered = [comparison.reference, *(s for s in comparison.settings if s is not comparison.reference)]
    compute = [key for key in COMPUTE_KEYS if any(key in s.compute for s in ordered)]
    efficiency = [key for key in EFFICIENCY if any(key in s.efficiency for s in ordered)]
    tested = _tested_headers(comparison.detect)
    headers = ["setting", "seeds", "cases", "dice", "seed sd", *(f"{h} dice" if h == "Δ" else h for h in tested),
               *compute, *efficiency]
    rows = []
    for setting in ordered:
        row = rows_by_setting.get(setting.label)
        cells = _tested(row, comparison.detect) if row else ["", "", "", "", "reference", *[""] * (len(tested) - 5)]
        rows.append([setting.label, _seeds(setting), setting.cases, setting.dice,
                     setting.seed_spread((FOREGROUND, "dice")), *cells,
                     *(setting.compute.get(key) for key in compute), *(setting.efficiency.get(k) for k in efficiency)])
    formats = {"params": ",.0f", FLOPS_KEY: ".4g", "train_seconds": ".1f", "peak_memory_mb": ".0f",
               "seconds_per_step": ".3g", "wall_seconds": ".1f", "seed sd": ".4f"}
    return render(headers, rows, formats=formats, missing="")


def detail_table(comparison: Comparison, render: Any = markdown_table) -> str:
    """One row per setting, output and metric: cases, both means, the setting's seed-to-seed spread, then the test's
    cells (:func:`setting_table`)."""
    by_label = {setting.label: setting for setting in comparison.settings}
    headers = ["setting", "output", "metric", "cases", "mean", "reference", "seed sd",
               *_tested_headers(comparison.detect)]
    rows = [[row.setting, row.output, row.metric, row.difference.cases, row.difference.setting_mean,
             row.difference.reference_mean, by_label[row.setting].seed_spread((row.output, row.metric)),
             *_tested(row, comparison.detect)] for row in comparison.rows]
    return render(headers, rows, formats={"seed sd": ".4f", "mean": ".4f", "reference": ".4f"})


def external_notes(comparison: Comparison) -> list[str]:
    """The paragraph on other tools' settings of ``compare.md`` (none without them)."""
    sources = [setting.source for setting in comparison.settings if setting.source]
    return [f"Other tools' out-of-fold predictions, scored by medseg against the same labels: "
            f"{'; '.join(sources)}."] if sources else []


def start_notes(comparison: Comparison) -> list[str]:
    """The paragraph of ``compare.md`` on the trained weights each setting's runs started from
    (``trainer.init_from``), fold by fold; none when every run started from scratch."""
    lines = [f"- `{setting.label}`:\n" + "\n".join(f"  - fold {fold}: {source}" for fold, source in setting.starts)
             for setting in comparison.settings if setting.starts]
    return ["Started from trained weights (`trainer.init_from`):\n" + "\n".join(lines)] if lines else []


def undefined_notes(comparison: Comparison) -> list[str]:
    """The paragraph of ``compare.md`` on the cases left out as undefined: per output, how many cases of each setting
    hold it in neither label nor prediction (Dice and NSD undefined), and the lesion-wise measures' rule."""
    counts = {output: {setting.label: sum(math.isnan(value) for value in values.values())
                       for setting in comparison.settings if (values := setting.scores.get((output, "dice")))}
              for output, metric in comparison.reference.scores if metric == "dice" and output != FOREGROUND}
    empty = [f"{output}: " + ", ".join(f"{count} of {comparison.reference.cases} in {label}"
                                       for label, count in by_setting.items())
             for output, by_setting in counts.items() if any(by_setting.values())]
    lesion = any(metric in LESION_METRICS for _, metric in comparison.reference.scores)
    return ([f"Undefined, not perfect (Metrics Reloaded): a case that holds an output in neither its label nor the "
             f"prediction (of a seed) has no {' nor '.join(UNDEFINED_WHEN_EMPTY)} and is left out of them and of the "
             f"foreground mean: {'; '.join(empty) if empty else 'no such case'}."] +
            ([f"Lesion-wise ({', '.join(LESION_METRICS)}): a lesion is a connected component of the output's label "
              f"(full connectivity), found when a predicted voxel lies in it; a predicted component touching no "
              f"lesion is a false positive, counted in every case; sensitivity is undefined in a case without a "
              f"lesion, the Dice per found lesion in a case where none is found."] if lesion else []))


def unpredicted_notes(comparison: Comparison) -> list[str]:
    """The warning above the table of ``compare.md`` on outputs that no setting predicted in any case."""
    if not comparison.unpredicted:
        return []
    outputs = ", ".join(f"`{output}`" for output in comparison.unpredicted)
    return [f"**No setting predicted {outputs} in any case**: its rows compare empty predictions, not segmentations "
            f"of it."]


def noise_notes(comparison: Comparison) -> list[str]:
    """How the seeds entered the interval, in words."""
    one = [setting.label for setting in comparison.settings if len(setting.seeds) == 1]
    if not one:
        return ["Every setting has several seeds: the intervals and tests resample them as well as the cases."]
    if len(one) == len(comparison.settings):
        return ["One seed per setting: **the intervals omit training noise** (a second seed of the same setting can "
                "differ by more than they say); train with `trainer.seed=0,1,2` for intervals that hold it."]
    return [f"One seed for {'; '.join(f'`{label}`' for label in one)}: the intervals omit that training noise."]


def ranking_table(comparison: Comparison, render: Any = markdown_table) -> str:
    """One row per setting: for each ranked metric, its mean rank and the share of resamples it ranks first."""
    rankings = comparison.rankings
    headers = ["setting", *(f"{r.metric}: mean rank" for r in rankings), *(f"{r.metric}: P(first)" for r in rankings)]
    rows = [[label, *(float(r.distribution[index] @ np.arange(1, len(r.settings) + 1)) for r in rankings),
             *(f"{r.distribution[index, 0]:.0%}" for r in rankings)]
            for index, label in enumerate(rankings[0].settings)]
    return render(headers, rows, formats={h: ".2f" for h in headers if h.endswith("mean rank")})


def ranking_notes(comparison: Comparison) -> list[str]:
    """The section of ``compare.md`` on the ranking's uncertainty (none with fewer than three settings)."""
    if not comparison.rankings:
        return []
    firsts = "; ".join(f"{r.metric}: `{r.settings[r.first]}` ranks first in {r.first_is_first:.0%} of the resamples"
                       for r in comparison.rankings)
    return ["## The ranking's uncertainty",
            f"Each setting's rank over the bootstrap resamples of the cases (and seeds) of the foreground mean (blobs "
            f"in the plot's lower row: area the share of resamples at that rank). {firsts}.",
            ranking_table(comparison)]


def _trend_words(trend: Contrast) -> str:
    excludes_zero = trend.low > 0 or trend.high < 0
    return "a trend" if trend.p < ALPHA and excludes_zero else "no evidence of a trend"


def curve_notes(comparison: Comparison) -> list[str]:
    """The section of ``compare.md`` on a swept numeric key (none without one)."""
    if not comparison.curves:
        return []
    key = comparison.curves[0].key
    lines = [f"- {c.metric}: slope {c.slope.estimate:+.4g} per unit of {key} {format_interval(c.slope)}, "
             f"p {format_p(c.slope.p)} ({_trend_words(c.slope)}); {c.best}" for c in comparison.curves]
    name = report_name(comparison.reference.label, CURVE)
    values = ", ".join(f"{value:g}" for value in comparison.curves[0].values)
    return [f"## {key} as a curve",
            f"The settings of the curve differ in `{key}` only ({values}): the "
            f"least-squares slope of each foreground metric against the values, one test for the whole curve (the "
            f"per-case slopes, paired like a difference), and the best value named only when it beats the runner-up.",
            "\n".join(lines), f"![{key} against the reference]({name})"]


def render_markdown(comparison: Comparison) -> str:
    """The text of ``compare.md``."""
    compared = len(comparison.settings) - 1
    return "\n\n".join([
        f"# Comparison: `{comparison.sweep_dir}`",
        f"Reference: `{comparison.reference.label}`; {compared} setting(s) compared on "
        f"{comparison.reference.cases} out-of-fold cases of the cross-validation (`crossval/`). {METHOD}",
        *noise_notes(comparison),
        "## Foreground mean Dice, and compute",
        *unpredicted_notes(comparison),
        setting_table(comparison, markdown_table),
        *external_notes(comparison),
        *start_notes(comparison),
        *undefined_notes(comparison),
        f"![forest plot]({report_name(comparison.reference.label, '.png')})",
        *ranking_notes(comparison),
        *curve_notes(comparison),
        "## Every output and metric (HD95: lower is better; cases with an infinite HD95 left out)",
        detail_table(comparison),
    ]) + "\n"


def row_record(row: Row) -> dict[str, Any]:
    """A row of ``compare.csv`` and of ``compare.json``'s comparisons."""
    d = row.difference
    return {"setting": row.setting, "output": row.output, "metric": row.metric,
            "higher_is_better": METRICS[row.metric], "cases": d.cases, "mean": d.setting_mean,
            "reference_mean": d.reference_mean, "difference": d.mean, "ci_low": d.low, "ci_high": d.high, "p": d.p,
            "p_holm": row.p_holm, "verdict": row.verdict, "training_noise": d.training_noise, "se": d.se,
            "seeds_on_its_side": _on_its_side(d), "holds_in_every_seed": d.holds_in_every_seed,
            "detectable_difference": row.detectable,
            "cases_needed": row.cases_needed}


def setting_record(setting: Setting, sweep_dir: Path) -> dict[str, Any]:
    """A setting of ``compare.json``: its cross-validations, seeds, cases, foreground Dice and its seed-to-seed
    spread, compute, the weights each fold started from (if any) and efficiency."""
    return {"setting": setting.label, "crossval": [str(path.relative_to(sweep_dir)) for path in setting.crossvals],
            "seeds": len(setting.seeds), "cases": setting.cases, "dice": setting.dice,
            "dice_seed_sd": setting.seed_spread((FOREGROUND, "dice")), "compute": setting.compute,
            "devices": sorted({run.device for run in setting.runs if run.status == "completed"}),
            **({"source": setting.source} if setting.source else {}),
            **({"started_from": dict(setting.starts)} if setting.starts else {}), **setting.efficiency}


def render_json(comparison: Comparison) -> dict[str, Any]:
    """The content of ``compare.json``."""
    return json_safe({
        "sweep_dir": str(comparison.sweep_dir), "reference": comparison.reference.label, "alpha": ALPHA,
        "confidence": CONFIDENCE, "power": POWER, "detect": comparison.detect, "method": METHOD,
        "unpredicted": comparison.unpredicted,
        "settings": [setting_record(setting, comparison.sweep_dir) for setting in comparison.settings],
        "comparisons": [row_record(row) for row in comparison.rows],
        "rankings": [{"metric": r.metric, "first": r.settings[r.first], "first_is_first": r.first_is_first,
                      "ranks": {label: r.distribution[index].tolist() for index, label in enumerate(r.settings)}}
                     for r in comparison.rankings],
        "curves": [{"key": c.key, "metric": c.metric, "values": c.values, "settings": c.settings,
                    "slope": c.slope.estimate, "ci_low": c.slope.low, "ci_high": c.slope.high, "p": c.slope.p,
                    "training_noise": c.slope.training_noise, "best": c.best} for c in comparison.curves],
    })


def render_csv(comparison: Comparison) -> str:
    """The text of ``compare.csv``: a row per setting, output and metric, with the setting's compute."""
    by_label = {setting.label: setting for setting in comparison.settings}
    records = [{**row_record(row), **by_label[row.setting].compute, **by_label[row.setting].efficiency}
               for row in comparison.rows]
    headers = list(dict.fromkeys(key for record in records for key in record))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=headers, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def compare_sweep(sweep_dir: str | Path, reference: str = DEFAULT_REFERENCE, resamples: int = RESAMPLES,
                  external: Sequence[ExternalSource] = (), progress: bool = True,
                  detect: float | None = None) -> Comparison:
    """Compare a cross-validated sweep (:func:`build_comparison`) and write :attr:`Comparison.files` into it
    atomically (named for its reference, :func:`report_name`)."""
    comparison = build_comparison(sweep_dir, reference, resamples, external, progress, detect)
    folder, label = comparison.sweep_dir, comparison.reference.label
    atomic_write_text(folder / report_name(label, ".csv"), render_csv(comparison))
    atomic_write_json(folder / report_name(label, ".json"), render_json(comparison))
    atomic_write_text(folder / report_name(label, ".md"), render_markdown(comparison))
    plots = [(".png", render_plot(comparison)), *([(CURVE, render_curve(comparison))] if comparison.curves else [])]
    for suffix, fig in plots:
        atomic_write(folder / report_name(label, suffix), lambda handle, fig=fig: fig.savefig(handle, format="png",
                                                                                             dpi=110))
    return comparison
