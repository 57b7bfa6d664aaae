"""Sweep reports: one table, one CSV and one plot for a Hydra multirun directory.

A sweep directory (``multirun/<date>/<time>/``) holds one folder per run, each with the overrides Hydra
applied (``.hydra/overrides.yaml``) and, once the run ends, medseg's ``metrics.json``. The parameters whose
values differ between runs are the *swept* parameters; they become the leading columns of the report.
Runs that differ only in ``trainer.seed`` or ``data.fold`` are one *setting*, summarised as mean ± std over its
seeds and folds (over folds, that mean is the setting's cross-validation mean); settings are ranked by that mean,
never by a single seed or fold, and the first is named the best setting only when it is significantly better than
the runner-up in the paired test of :mod:`medseg.evaluation.compare` on the cross-validation's out-of-fold cases
(a sweep without folds, or without ``crossval/``, is ranked by mean and untested).

:func:`summarize_sweep` writes ``summary.md``, ``summary.csv`` and ``summary.png`` into the sweep directory
(atomically) and returns a :class:`SweepSummary`; ``scripts/summarize.py`` and the Hydra callback in
:mod:`medseg.sweeps.callbacks` are thin wrappers around it.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medseg.errors import MedsegError
from medseg.evaluation.compare import DEFAULT_REFERENCE, report_name
from medseg.evaluation.compare_settings import FOREGROUND, NEEDS_FOLDS, read_settings
from medseg.evaluation.compare_stats import paired
from medseg.io import atomic_write, atomic_write_text
from medseg.runs.folders import (
    COMPUTE_KEYS,
    FOLD_KEY,
    REPEAT_KEYS,
    Run,
    Sweep,
    as_number,
    dice_column,
    display_value,
    group_by_setting,
    group_runs,
    setting_keys,
    setting_label,
)
from medseg.runs.layout import CROSSVAL_FOLDER, crossval_dir
from medseg.scoring.paired import BETTER, CONFIDENCE, PairedDifference, verdict
from medseg.tables import CellFormat, format_mean_std, markdown_table, mean_std, text_table

RESULT_COLUMNS = ("best_val_dice", "best_epoch", *COMPUTE_KEYS)
"""Columns copied from ``metrics.json`` into every row, after the per-class Dice."""

MAX_PLOT_COLUMNS = 3
"""Panels per row of ``summary.png``."""

MAX_LINE_POINTS = 12
"""A numeric parameter with at most this many distinct values is plotted as lines, else as points."""

DISPLAY_DIGITS = {"train_seconds": 1, "params": 0, "peak_memory_mb": 0, "gflops_per_patch_forward": 3,
                  "seconds_per_step": 3, "wall_seconds": 1}
"""Decimals shown in the markdown and terminal tables (4 for every other float; the CSV keeps full precision)."""



@dataclass
class SweepSummary:
    """The tables of a sweep report, and its best setting."""

    sweep_dir: Path
    metric: str
    higher_is_better: bool
    runs: list[Run]
    swept: list[str]
    headers: list[str]
    rows: list[list[Any]]
    group_headers: list[str] = field(default_factory=list)
    group_rows: list[list[Any]] = field(default_factory=list)
    best: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    def text(self) -> str:
        """The report for a terminal: the run table, the table over seeds and folds if any, and the best setting."""
        parts = [render_table(text_table, self.headers, self.rows, self.swept)]
        if self.group_rows:
            parts.append(render_table(text_table, self.group_headers, self.group_rows, self.swept))
        parts.append(self.best)
        return "\n\n".join(parts)



def numeric_keys(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
    """The swept keys (but seeds and folds) whose values are all numbers: the x axes of the plot."""
    return [key for key in setting_keys(keys) if all(as_number(run.overrides.get(key)) is not None for run in runs)]



def class_columns(runs: Sequence[Run]) -> list[str]:
    """The per-class Dice columns, in the order the classes first appear."""
    return list(dict.fromkeys(column for run in runs for column in run.dice_per_class()))



def attention_columns(runs: Sequence[Run]) -> list[str]:
    """The per-slot attention-distance columns, in the order the slots first appear (none without attention maps)."""
    return list(dict.fromkeys(column for run in runs for column in run.attention_distances()))



def run_rows(runs: Sequence[Run], swept: Sequence[str], metric: str) -> tuple[list[str], list[list[Any]]]:
    """The per-run table: swept parameters, Dice per class and mean, results, status and failure reason."""
    classes, attention = class_columns(runs), attention_columns(runs)
    known = metric in RESULT_COLUMNS or metric in classes or metric in attention
    results = list(RESULT_COLUMNS) if known else [RESULT_COLUMNS[0], metric, *RESULT_COLUMNS[1:]]
    results += attention
    headers = ["run", *swept, *classes, *results, "status", "reason"]
    rows = []
    for run in runs:
        completed = run.status == "completed"
        values = [_result(run, column) if completed else None for column in (*classes, *results)]
        rows.append([run.name, *(run.overrides.get(key) for key in swept), *values, run.status, run.reason])
    return headers, rows



def _result(run: Run, column: str) -> Any:
    """A result cell: ints stay ints (params, epochs), the rest are floats."""
    raw = (run.metrics or {}).get(column)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    value = run.value(column)
    return None if math.isnan(value) else value



def repeats(swept: Sequence[str]) -> list[str]:
    """The swept seed and fold keys, in :data:`REPEAT_KEYS` order."""
    return [key for key in REPEAT_KEYS if key in swept]



def group_rows(runs: Sequence[Run], swept: Sequence[str], metric: str) -> tuple[list[str], list[list[Any]]]:
    """The per-setting table over seeds and folds (empty when neither ``trainer.seed`` nor ``data.fold`` is swept)."""
    repeated = repeats(swept)
    if not repeated:
        return [], []
    keys = setting_keys(swept)
    columns = list(dict.fromkeys([*class_columns(runs), RESULT_COLUMNS[0], metric, *COMPUTE_KEYS,
                                  *attention_columns(runs)]))
    headers = [*keys, *(REPEAT_KEYS[key] for key in repeated), "completed", *columns]
    rows = []
    for setting, group in group_by_setting(runs, keys).items():
        done = [run for run in group if run.status == "completed"]
        values = [",".join(dict.fromkeys(str(run.overrides.get(key)) for run in group)) for key in repeated]
        stats = [format_mean_std([run.value(c) for run in done], DISPLAY_DIGITS.get(c, 4)) for c in columns]
        rows.append([*setting, *values, f"{len(done)}/{len(group)}", *stats])
    return headers, rows



def per_case_key(metric: str, outputs: Sequence[str]) -> tuple[str, str] | None:
    """The cross-validation's per-case values behind ``metric``: the foreground Dice for ``best_val_dice``, a class's
    Dice for its ``dice_<class>``; None for any other metric."""
    if metric == RESULT_COLUMNS[0]:
        return FOREGROUND, "dice"
    return next(((output, "dice") for output in outputs if dice_column(output) == metric), None)


def runner_up_test(sweep: Sweep, best: str, runner_up: str, metric: str,
                   higher_is_better: bool) -> tuple[PairedDifference, str] | str:
    """The paired test of the settings labelled ``best`` and ``runner_up`` (best minus runner-up) on the
    cross-validation's per-case values of ``metric``, with its verdict; else why they cannot be tested."""
    if FOLD_KEY not in sweep.swept:
        return NEEDS_FOLDS
    if not crossval_dir(sweep.path).is_dir():
        return f"no cross-validation in {CROSSVAL_FOLDER}/ (python scripts/crossval.py {sweep.path})"
    try:
        settings = {setting.label: setting for setting in read_settings(sweep)}
        if best not in settings or runner_up not in settings:
            return f"not both are cross-validated in {CROSSVAL_FOLDER}/ (python scripts/crossval.py {sweep.path})"
        key = per_case_key(metric, [output for output, _ in settings[best].scores])
        if key is None:
            return f"the cross-validation has no per-case {metric} to test"
        difference = paired(settings[best], settings[runner_up], key)
    except MedsegError as err:
        return str(err)
    return difference, verdict(difference, difference.p, higher_is_better)


def best_setting(sweep: Sweep, metric: str, higher_is_better: bool = True) -> str:
    """One line on the best setting: ranked by the mean over its seeds and folds when they are swept (over folds, its
    cross-validation mean), never by one seed or fold; named the best only when it is significantly better than the
    runner-up on the cross-validation's paired cases (:func:`runner_up_test`), else said to be untested or not
    significantly better."""
    keys = setting_keys(sweep.swept)
    scored = []
    for setting, group in group_by_setting(sweep.runs, keys).items():
        mean, std = mean_std([run.value(metric) for run in group])
        if not math.isnan(mean):
            scored.append((mean, std, setting_label(setting, keys), group))
    if not scored:
        return f"best setting: none (no completed run reports {metric})"
    (mean, std, label, group), *others = sorted(scored, key=lambda item: item[0], reverse=higher_is_better)
    done = [run.name for run in group if run.status == "completed"]
    repeated = " × ".join(REPEAT_KEYS[key] for key in repeats(sweep.swept))
    spread = f" ± {std:.4f} over {len(done)} {repeated}" if repeated else ""
    described = f"{label} -> {metric} {mean:.4f}{spread} (run{'s' if len(done) > 1 else ''} {', '.join(done)})"
    if not others:
        return f"best setting: {described}"
    runner_up = others[0][2]
    tested = runner_up_test(sweep, label, runner_up, metric, higher_is_better)
    if isinstance(tested, str):
        return f"highest mean: {described}; the ranking is by mean and untested against {runner_up}: {tested}"
    difference, outcome = tested
    versus = (f"the runner-up {runner_up} on {difference.cases} out-of-fold cases (Dice difference "
              f"{difference.mean:+.4f}, {CONFIDENCE:.0%} CI [{difference.low:+.4f}, {difference.high:+.4f}], "
              f"Wilcoxon p={difference.p:.3g})")
    if outcome == BETTER:
        return f"best setting: {described}; significantly better than {versus}"
    return f"no best setting: {described} has the highest mean but is not significantly better than {versus}"


def build_summary(sweep_dir: str | Path, metric: str = "best_val_dice", higher_is_better: bool = True) -> SweepSummary:
    """Read a sweep directory into a :class:`SweepSummary` (writes nothing)."""
    sweep = Sweep.read(sweep_dir)
    runs, swept = sweep.runs, sweep.swept
    headers, rows = run_rows(runs, swept, metric)
    g_headers, g_rows = group_rows(runs, swept, metric)
    counts = {status: sum(run.status == status for run in runs) for status in ("completed", "failed", "missing")}
    return SweepSummary(
        sweep_dir=Path(sweep_dir),
        metric=metric,
        higher_is_better=higher_is_better,
        runs=runs,
        swept=swept,
        headers=headers,
        rows=rows,
        group_headers=g_headers,
        group_rows=g_rows,
        best=best_setting(sweep, metric, higher_is_better),
        counts=counts,
    )



def _blank_none(rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """CSV cells: None (a result a failed run does not have) becomes an empty cell."""
    return [["" if value is None else value for value in row] for row in rows]



def display_formats(swept: Sequence[str]) -> dict[str, CellFormat]:
    """How the tables show cells: swept values via :func:`display_value`, 1,234 parameters, the decimals of
    :data:`DISPLAY_DIGITS` (Dice and other floats to 4 decimals, the renderer's default)."""
    digits = {column: f".{places}f" for column, places in DISPLAY_DIGITS.items()}
    return {**dict.fromkeys(swept, display_value), **digits, "params": ","}



def render_table(render: Callable[..., str], headers: Sequence[str], rows: Sequence[Sequence[Any]],
                 swept: Sequence[str]) -> str:
    """``rows`` for people, by ``render`` (:func:`text_table` or :func:`markdown_table`); the reason column only
    when some run has a reason."""
    keep = [i for i, header in enumerate(headers) if header != "reason" or any(row[i] for row in rows)]
    return render([headers[i] for i in keep], [[row[i] for i in keep] for row in rows],
                  formats=display_formats(swept))



def render_markdown(summary: SweepSummary) -> str:
    """The text of ``summary.md``."""
    counts = ", ".join(f"{n} {status}" for status, n in summary.counts.items() if n)
    direction = "higher" if summary.higher_is_better else "lower"
    swept = ", ".join(f"`{key}`" for key in summary.swept) or "nothing"
    parts = [
        f"# Sweep summary: `{summary.sweep_dir}`",
        f"{len(summary.rows)} runs ({counts}). Swept: {swept}. Metric: `{summary.metric}` ({direction} is better).",
        "## Runs",
        render_table(markdown_table, summary.headers, summary.rows, summary.swept),
    ]
    repeated = repeats(summary.swept)
    if summary.group_rows:
        over = " and ".join(f"{REPEAT_KEYS[key]} (`{key}`)" for key in repeated)
        note = " (over folds: the cross-validation mean)" if FOLD_KEY in repeated else ""
        parts += [
            f"## Over {over}: mean ± std{note}",
            render_table(markdown_table, summary.group_headers, summary.group_rows, summary.swept),
        ]
    parts += [f"**{summary.best}**", "![summary](summary.png)"]
    compared = sorted(path.name for path in summary.sweep_dir.glob(f"{report_name(DEFAULT_REFERENCE, '')}*.md"))
    if compared:
        parts.append(f"Every setting against the reference, paired on the out-of-fold cases: "
                     f"{', '.join(f'`{name}`' for name in compared)} (`scripts/compare.py`, one report per reference).")
    if crossval_dir(summary.sweep_dir).is_dir():
        parts.append(f"Scores of the out-of-fold predictions in the original geometry: `{CROSSVAL_FOLDER}/`"
                     f" (`scripts/crossval.py`).")
    return "\n\n".join(parts) + "\n"



def render_csv(summary: SweepSummary) -> str:
    """The text of ``summary.csv``: the run table at full precision, empty cells for missing results."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(summary.headers)
    writer.writerows(_blank_none(summary.rows))
    return buffer.getvalue()



def _short(key: str) -> str:
    """``model.attention.gamma`` -> ``gamma``, for plot labels."""
    return key.rsplit(".", 1)[-1]



def _plot_lines(ax: Any, runs: Sequence[Run], key: str, metric: str) -> None:
    """``metric`` against the numeric parameter ``key``: one line per block, mean ± std where values repeat.

    A grid sweep (few distinct values) is drawn as lines; a random or Optuna search as points only.
    """
    values = [as_number(run.overrides.get(key)) for run in runs]
    linestyle = "-" if len(set(values)) <= MAX_LINE_POINTS else "none"
    for block, group in group_runs(runs, lambda run: run.block).items():
        by_x: dict[float, list[float]] = {}
        for run in group:
            by_x.setdefault(as_number(run.overrides.get(key)), []).append(run.value(metric))  # type: ignore[arg-type]
        points = [(x, *mean_std(ys)) for x, ys in sorted(by_x.items())]
        points = [point for point in points if not math.isnan(point[1])]
        if points:
            xs, means, stds = zip(*points)
            ax.errorbar(
                xs, means, yerr=stds if any(stds) else None, marker="o", linestyle=linestyle, capsize=3, label=block
            )
    positive = [x for x in values if x is not None and x > 0]
    if len(positive) == len(values) and max(positive) / min(positive) >= 10:
        ax.set_xscale("log")
    ax.set_xlabel(key)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="block", fontsize="small")



def _plot_bars(ax: Any, runs: Sequence[Run], swept: Sequence[str], metric: str) -> None:
    """One bar per setting (mean ± std over seeds and folds); settings without a result are marked "failed"."""
    keys = setting_keys(swept)
    groups = group_by_setting(runs, keys)
    if len(keys) == 1:  # the values alone, the key as the axis label
        labels = [display_value(setting[0]) for setting in groups]
        ax.set_xlabel(keys[0])
    else:
        labels = [setting_label(setting, keys, _short) for setting in groups]
    stats = [mean_std([run.value(metric) for run in group]) for group in groups.values()]
    heights = [0.0 if math.isnan(mean) else mean for mean, _ in stats]
    errors = [0.0 if math.isnan(std) else std for _, std in stats]
    bars = ax.bar(range(len(heights)), heights, yerr=errors if any(errors) else None, capsize=3, color="tab:blue")
    for bar, (mean, _) in zip(bars, stats):
        text = "failed" if math.isnan(mean) else f"{mean:.3f}"
        ax.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize="small",
            xytext=(0, 2),
            textcoords="offset points",
        )
    long_labels = max(map(len, labels)) * len(labels) > 60
    ax.set_xticks(
        range(len(labels)),
        labels,
        fontsize="small",
        rotation=30 if long_labels else 0,
        ha="right" if long_labels else "center",
    )
    ax.margins(y=0.12)  # room for the value labels
    ax.set_ylabel(metric)
    ax.grid(axis="y", alpha=0.3)



def render_plot(runs: Sequence[Run], swept: Sequence[str], metric: str) -> Any:
    """A matplotlib Figure (Agg canvas, no pyplot state): a panel per numeric swept parameter, else bars; for
    ``metric`` and, below it, each slot's mean attention distance when the runs recorded one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = list(dict.fromkeys([metric, *attention_columns(runs)]))
    axes_keys = numeric_keys(runs, swept)
    if not axes_keys:
        fig = Figure(figsize=(max(5.5, 1.2 * len(runs)), 4.2 * len(metrics)), layout="constrained")
        FigureCanvasAgg(fig)
        for index, shown in enumerate(metrics):
            _plot_bars(fig.add_subplot(len(metrics), 1, index + 1), runs, swept, shown)
    else:
        panels = [(key, shown) for shown in metrics for key in axes_keys]
        cols = min(len(axes_keys), MAX_PLOT_COLUMNS)
        rows = math.ceil(len(panels) / cols)
        fig = Figure(figsize=(5.0 * cols, 3.8 * rows), layout="constrained")
        FigureCanvasAgg(fig)
        for index, (key, shown) in enumerate(panels):
            _plot_lines(fig.add_subplot(rows, cols, index + 1), runs, key, shown)
    fig.suptitle(f"{' and '.join(metrics)} over {len(runs)} runs", fontsize="medium")
    return fig



def summarize_sweep(
    sweep_dir: str | Path, metric: str = "best_val_dice", higher_is_better: bool = True, plot: bool = True
) -> SweepSummary:
    """Write ``summary.md``, ``summary.csv`` and (if ``plot``) ``summary.png`` into ``sweep_dir``; return the summary.

    Raises:
        FileNotFoundError: ``sweep_dir`` does not exist or holds no Hydra job folder.
    """
    sweep_dir = Path(sweep_dir)
    summary = build_summary(sweep_dir, metric, higher_is_better)
    atomic_write_text(sweep_dir / "summary.csv", render_csv(summary))
    atomic_write_text(sweep_dir / "summary.md", render_markdown(summary))
    if plot:
        fig = render_plot(summary.runs, summary.swept, metric)
        atomic_write(sweep_dir / "summary.png", lambda handle: fig.savefig(handle, format="png", dpi=110))
    return summary
