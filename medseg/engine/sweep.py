"""Sweep reports: one table, one CSV and one plot for a Hydra multirun directory.

A sweep directory (``multirun/<date>/<time>/``) holds one folder per job, each with the overrides Hydra
applied (``.hydra/overrides.yaml``) and, once the job ends, medseg's ``metrics.json``. The parameters whose
values differ between jobs are the *swept* parameters; they become the leading columns of the report.
Jobs that differ only in ``trainer.seed`` or ``data.fold`` are one *setting*, summarised as mean ± std over its
seeds and folds (over folds, that mean is the setting's cross-validation mean); the best setting is ranked by
that mean, never by a single seed or fold.

:func:`summarize_sweep` writes ``summary.md``, ``summary.csv`` and ``summary.png`` into the sweep directory
(atomically) and returns a :class:`SweepSummary`; ``scripts/summarize.py`` and the Hydra callback in
:mod:`medseg.engine.callbacks` are thin wrappers around it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from medseg.engine.report import CellFormat, markdown_table, text_table
from medseg.io import atomic_write, atomic_write_text

SEED_KEY = "trainer.seed"
FOLD_KEY = "data.fold"
REPEAT_KEYS = {SEED_KEY: "seeds", FOLD_KEY: "folds"}
"""Keys whose jobs repeat one setting (-> what the report calls them): never a setting or a plot axis of their own."""
CROSSVAL_FOLDER = "crossval"
"""The folder of a sweep that ``scripts/crossval.py`` writes its results into."""
BLOCK_KEY = "model.bottleneck"
RESULT_COLUMNS = ("best_val_dice", "best_epoch", "train_seconds", "params", "peak_memory_mb")
"""Columns copied from ``metrics.json`` into every row, after the per-class Dice."""
ATTENTION_KEY = "attention_distance_mm"
"""The epoch-record key (``trainer.attention_maps=true``) of each slot's mean attention distance in mm; a run's is
its best epoch's, one column per slot after the results (:func:`attention_column`)."""
MAX_PLOT_COLUMNS = 3
"""Panels per row of ``summary.png``."""
MAX_LINE_POINTS = 12
"""A numeric parameter with at most this many distinct values is plotted as lines, else as points."""
DISPLAY_DIGITS = {"train_seconds": 1, "peak_memory_mb": 0}
"""Decimals shown in the markdown and terminal tables (4 for every other float; the CSV keeps full precision)."""


@dataclass
class Job:
    """One job folder of a sweep: its overrides, and its metrics if it has finished."""

    name: str
    """The folder relative to the sweep directory (Hydra's job number by default)."""
    overrides: dict[str, str]
    """``key -> value`` of each override, read by Hydra's parser (:func:`parse_overrides`)."""
    metrics: dict[str, Any] | None
    """The parsed ``metrics.json``; None while the job is running, or if it was killed."""
    block: str = "default"
    """The bottleneck block (``model.bottleneck``) the job trained, or "default" when unknown."""
    read_error: str | None = None
    """Why ``metrics.json`` could not be read, if it exists but is unreadable."""
    path: Path = Path()
    """The job folder."""

    @property
    def checkpoint(self) -> Path:
        """The job's best checkpoint, ``checkpoints/best.pt``."""
        return self.path / "checkpoints" / "best.pt"

    @property
    def finished(self) -> bool:
        """The job has completed (its ``metrics.json`` says so) and left its best checkpoint."""
        return self.status == "completed" and self.checkpoint.is_file()

    @property
    def status(self) -> str:
        """``completed`` or ``failed`` (from ``metrics.json``), else ``missing`` (running or killed)."""
        if self.metrics is None:
            return "missing"
        return str(self.metrics.get("status", "completed"))

    @property
    def reason(self) -> str:
        """Why the job did not complete; empty for completed jobs."""
        if self.metrics is None:
            return self.read_error or "no metrics.json: still running, or killed"
        return str(self.metrics.get("reason", "")) if self.status != "completed" else ""

    def value(self, metric: str) -> float:
        """A numeric result of the job (``metrics.json`` key or ``dice_<class>``); NaN when absent."""
        if self.status != "completed":
            return math.nan
        value = self.metrics.get(metric) if self.metrics else None
        if value is None and metric.startswith("dice_"):
            value = self.dice_per_class().get(metric)
        if value is None and metric.startswith(ATTENTION_KEY):
            value = self.attention_distances().get(metric)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan

    def dice_per_class(self) -> dict[str, float]:
        """Best-epoch validation Dice per class, keyed ``dice_<class name with underscores>``."""
        per_class = (self.metrics or {}).get("val_dice_per_class") or {}
        return {dice_column(name): float(value) for name, value in per_class.items()}

    def attention_distances(self) -> dict[str, float]:
        """Each slot's mean attention distance (mm) at the best epoch (else the last epoch that recorded one), keyed
        by :func:`attention_column`; empty for a run without ``trainer.attention_maps``."""
        metrics = self.metrics or {}
        records = [r for r in metrics.get("history") or [] if isinstance(r, dict) and r.get(ATTENTION_KEY)]
        best = [r for r in records if r.get("epoch") == metrics.get("best_epoch")]
        chosen = (best or records or [{}])[-1].get(ATTENTION_KEY) or {}
        return {attention_column(slot): float(value) for slot, value in chosen.items()}


@dataclass
class SweepSummary:
    """The tables of a sweep report, and its best setting."""

    sweep_dir: Path
    metric: str
    higher_is_better: bool
    jobs: list[Job]
    swept: list[str]
    headers: list[str]
    rows: list[list[Any]]
    group_headers: list[str] = field(default_factory=list)
    group_rows: list[list[Any]] = field(default_factory=list)
    best: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    def text(self) -> str:
        """The report for a terminal: the job table, the table over seeds and folds if any, and the best setting."""
        parts = [render_table(text_table, self.headers, self.rows, self.swept)]
        if self.group_rows:
            parts.append(render_table(text_table, self.group_headers, self.group_rows, self.swept))
        parts.append(self.best)
        return "\n\n".join(parts)


def dice_column(class_name: str) -> str:
    """The report column of one class's Dice (``dim sphere`` -> ``dice_dim_sphere``, as in TensorBoard)."""
    return "dice_" + re.sub(r"\s+", "_", class_name.strip())


def attention_column(slot: str) -> str:
    """The report column of a slot's mean attention distance: ``bottleneck`` -> ``attention_distance_mm_bottleneck``."""
    return f"{ATTENTION_KEY}_" + re.sub(r"\s+", "_", slot.strip())


def parse_overrides(lines: Sequence[str]) -> dict[str, str]:
    """``["model.bottleneck=masa", "+x=1e-4", "~y"]`` -> ``{"model.bottleneck": "masa", "x": "0.0001", "y": "~"}``.

    Parsed by Hydra's own override parser: a string value as it reads (quotes and escapes removed), any other
    value in Hydra's notation (``[8,16]``, ``null``, ``True``), a deleted key as ``~``.

    Raises:
        hydra.errors.OverrideParseException: a line that is not a Hydra override.
    """
    out: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides([str(line) for line in lines]):
        value = override.value()
        text = value if isinstance(value, str) else override.get_value_element_as_str()
        out[override.key_or_group] = "~" if override.is_delete() else text
    return out


def _natural_key(name: str) -> list[Any]:
    """Sort ``2`` before ``10`` (Hydra numbers jobs without padding)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _job_block(overrides: dict[str, str], job_dir: Path) -> str:
    """The bottleneck block: the override, else the job's composed config, else "default"."""
    if BLOCK_KEY in overrides:
        return overrides[BLOCK_KEY]
    try:
        config = _read_yaml(job_dir / ".hydra" / "config.yaml") or {}
    except yaml.YAMLError:
        return "default"
    block = (config.get("model") or {}).get("bottleneck") if isinstance(config, dict) else None
    return str(block) if isinstance(block, str) else "default"


def read_job(job_dir: Path, sweep_dir: Path) -> Job:
    """Read one job folder (one that holds ``.hydra/overrides.yaml``)."""
    overrides = parse_overrides(_read_yaml(job_dir / ".hydra" / "overrides.yaml") or [])
    metrics, error = None, None
    metrics_path = job_dir / "metrics.json"
    if metrics_path.is_file():
        try:
            metrics = json.loads(metrics_path.read_text())
        except (OSError, ValueError) as err:
            error = f"metrics.json unreadable: {err}"
    name = job_dir.relative_to(sweep_dir).as_posix()
    return Job(name=name, overrides=overrides, metrics=metrics, block=_job_block(overrides, job_dir), read_error=error,
               path=job_dir)


def collect_jobs(sweep_dir: str | Path) -> list[Job]:
    """Every job of a sweep directory, in job order; raises FileNotFoundError when there is none."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep directory {sweep_dir} does not exist")
    job_dirs = {path.parent.parent for path in sweep_dir.glob("**/.hydra/overrides.yaml")} - {sweep_dir}
    if not job_dirs:
        raise FileNotFoundError(f"{sweep_dir} holds no Hydra job folders (no */.hydra/overrides.yaml)")
    ordered = sorted(job_dirs, key=lambda path: _natural_key(path.relative_to(sweep_dir).as_posix()))
    return [read_job(path, sweep_dir) for path in ordered]


def swept_keys(jobs: Sequence[Job]) -> list[str]:
    """The override keys whose value differs between jobs (absent counts as a value), in first-seen order."""
    keys = list(dict.fromkeys(key for job in jobs for key in job.overrides))
    return [key for key in keys if len({job.overrides.get(key) for job in jobs}) > 1]


def as_number(text: str | None) -> float | None:
    """The override value as a number, or None for anything else (names, lists, booleans, null)."""
    if text is None or text.strip().lower() in ("true", "false", "nan", "inf", "-inf"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def numeric_keys(jobs: Sequence[Job], keys: Sequence[str]) -> list[str]:
    """The swept keys (but seeds and folds) whose values are all numbers: the x axes of the plot."""
    return [key for key in setting_keys(keys) if all(as_number(job.overrides.get(key)) is not None for job in jobs)]


def setting_keys(swept: Sequence[str]) -> list[str]:
    """The swept keys that make a setting: all but the seeds and folds (:data:`REPEAT_KEYS`)."""
    return [key for key in swept if key not in REPEAT_KEYS]


def class_columns(jobs: Sequence[Job]) -> list[str]:
    """The per-class Dice columns, in the order the classes first appear."""
    return list(dict.fromkeys(column for job in jobs for column in job.dice_per_class()))


def attention_columns(jobs: Sequence[Job]) -> list[str]:
    """The per-slot attention-distance columns, in the order the slots first appear (none without attention maps)."""
    return list(dict.fromkeys(column for job in jobs for column in job.attention_distances()))


def job_rows(jobs: Sequence[Job], swept: Sequence[str], metric: str) -> tuple[list[str], list[list[Any]]]:
    """The per-job table: swept parameters, Dice per class and mean, results, status and failure reason."""
    classes, attention = class_columns(jobs), attention_columns(jobs)
    known = metric in RESULT_COLUMNS or metric in classes or metric in attention
    results = list(RESULT_COLUMNS) if known else [RESULT_COLUMNS[0], metric, *RESULT_COLUMNS[1:]]
    results += attention
    headers = ["job", *swept, *classes, *results, "status", "reason"]
    rows = []
    for job in jobs:
        completed = job.status == "completed"
        values = [_result(job, column) if completed else None for column in (*classes, *results)]
        rows.append([job.name, *(job.overrides.get(key) for key in swept), *values, job.status, job.reason])
    return headers, rows


def _result(job: Job, column: str) -> Any:
    """A result cell: ints stay ints (params, epochs), the rest are floats."""
    raw = (job.metrics or {}).get(column)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    value = job.value(column)
    return None if math.isnan(value) else value


def setting_of(job: Job, keys: Sequence[str]) -> tuple[str | None, ...]:
    """The job's values of ``keys``: jobs with equal settings differ only in the other swept keys."""
    return tuple(job.overrides.get(key) for key in keys)


def group_jobs(jobs: Sequence[Job], key: Callable[[Job], Hashable]) -> dict[Any, list[Job]]:
    """Jobs grouped by ``key(job)``, groups and jobs in first-seen order."""
    groups: dict[Any, list[Job]] = {}
    for job in jobs:
        groups.setdefault(key(job), []).append(job)
    return groups


def group_by_setting(jobs: Sequence[Job], keys: Sequence[str]) -> dict[tuple[str | None, ...], list[Job]]:
    """Jobs grouped by their values of ``keys``."""
    return group_jobs(jobs, lambda job: setting_of(job, keys))


def cross_validations(jobs: Sequence[Job]) -> dict[str, list[Job]]:
    """The jobs of each cross-validation in a sweep, those that differ only in ``data.fold``, by the label of their
    setting (:func:`setting_label`; ``""`` when the sweep is one cross-validation)."""
    keys = [key for key in swept_keys(jobs) if key != FOLD_KEY]
    groups = group_by_setting(jobs, keys)
    if len(groups) == 1:
        return {"": list(jobs)}
    return {setting_label(setting, keys): group for setting, group in groups.items()}


def crossval_dir(sweep_dir: str | Path, label: str = "") -> Path:
    """Where ``scripts/crossval.py`` writes a cross-validation: ``DIR/crossval``, or ``DIR/crossval/<setting>`` for
    one setting (``label``) of a sweep of several."""
    folder = Path(sweep_dir) / CROSSVAL_FOLDER
    return folder / re.sub(r"[^\w.,=+-]+", "_", label) if label else folder


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation of the finite values (std 0 for one value, NaN for none)."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan, math.nan
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def format_mean_std(values: Sequence[float], digits: int = 4) -> str:
    """``"0.8123 ± 0.0101"``, or ``"nan"`` when no value is finite."""
    mean, std = mean_std(values)
    return "nan" if math.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def repeats(swept: Sequence[str]) -> list[str]:
    """The swept seed and fold keys, in :data:`REPEAT_KEYS` order."""
    return [key for key in REPEAT_KEYS if key in swept]


def group_rows(jobs: Sequence[Job], swept: Sequence[str], metric: str) -> tuple[list[str], list[list[Any]]]:
    """The per-setting table over seeds and folds (empty when neither ``trainer.seed`` nor ``data.fold`` is swept)."""
    repeated = repeats(swept)
    if not repeated:
        return [], []
    keys = setting_keys(swept)
    columns = list(dict.fromkeys([*class_columns(jobs), RESULT_COLUMNS[0], metric, "train_seconds",
                                  *attention_columns(jobs)]))
    headers = [*keys, *(REPEAT_KEYS[key] for key in repeated), "completed", *columns]
    rows = []
    for setting, group in group_by_setting(jobs, keys).items():
        done = [job for job in group if job.status == "completed"]
        values = [",".join(dict.fromkeys(str(job.overrides.get(key)) for job in group)) for key in repeated]
        stats = [format_mean_std([job.value(c) for job in done], DISPLAY_DIGITS.get(c, 4)) for c in columns]
        rows.append([*setting, *values, f"{len(done)}/{len(group)}", *stats])
    return headers, rows


def setting_label(setting: Sequence[str | None], keys: Sequence[str]) -> str:
    """``"model.bottleneck=masa model.attention.gamma=0.8"``; ``"(all jobs)"`` when nothing is swept."""
    return " ".join(f"{key}={display_value(value)}" for key, value in zip(keys, setting)) or "(all jobs)"


def best_setting(jobs: Sequence[Job], swept: Sequence[str], metric: str, higher_is_better: bool = True) -> str:
    """One line naming the best setting: by the mean over its seeds and folds when they are swept (over folds, its
    cross-validation mean), never by one seed or fold."""
    keys = setting_keys(swept)
    scored = []
    for setting, group in group_by_setting(jobs, keys).items():
        mean, std = mean_std([job.value(metric) for job in group])
        if not math.isnan(mean):
            scored.append((mean, std, setting, group))
    if not scored:
        return f"best setting: none (no completed job reports {metric})"
    mean, std, setting, group = (max if higher_is_better else min)(scored, key=lambda item: item[0])
    done = [job.name for job in group if job.status == "completed"]
    repeated = " × ".join(REPEAT_KEYS[key] for key in repeats(swept))
    spread = f" ± {std:.4f} over {len(done)} {repeated}" if repeated else ""
    return (
        f"best setting: {setting_label(setting, keys)} -> {metric} {mean:.4f}{spread} "
        f"(job{'s' if len(done) > 1 else ''} {', '.join(done)})"
    )


def build_summary(sweep_dir: str | Path, metric: str = "best_val_dice", higher_is_better: bool = True) -> SweepSummary:
    """Read a sweep directory into a :class:`SweepSummary` (writes nothing)."""
    jobs = collect_jobs(sweep_dir)
    swept = swept_keys(jobs)
    headers, rows = job_rows(jobs, swept, metric)
    g_headers, g_rows = group_rows(jobs, swept, metric)
    counts = {status: sum(job.status == status for job in jobs) for status in ("completed", "failed", "missing")}
    return SweepSummary(
        sweep_dir=Path(sweep_dir),
        metric=metric,
        higher_is_better=higher_is_better,
        jobs=jobs,
        swept=swept,
        headers=headers,
        rows=rows,
        group_headers=g_headers,
        group_rows=g_rows,
        best=best_setting(jobs, swept, metric, higher_is_better),
        counts=counts,
    )


def _blank_none(rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """CSV cells: None (a result a failed job does not have) becomes an empty cell."""
    return [["" if value is None else value for value in row] for row in rows]


def display_formats(swept: Sequence[str]) -> dict[str, CellFormat]:
    """How the tables show cells: swept values via :func:`display_value`, 1,234 parameters, seconds to 0.1,
    whole MB (Dice and other floats to 4 decimals, the renderer's default)."""
    digits = {column: f".{places}f" for column, places in DISPLAY_DIGITS.items()}
    return {**dict.fromkeys(swept, display_value), "params": ",", **digits}


def render_table(render: Callable[..., str], headers: Sequence[str], rows: Sequence[Sequence[Any]],
                 swept: Sequence[str]) -> str:
    """``rows`` for people, by ``render`` (:func:`text_table` or :func:`markdown_table`); the reason column only
    when some job has a reason."""
    keep = [i for i, header in enumerate(headers) if header != "reason" or any(row[i] for row in rows)]
    return render([headers[i] for i in keep], [[row[i] for i in keep] for row in rows],
                  formats=display_formats(swept))


def display_value(text: str | None) -> str:
    """An override value for people: long numbers (Optuna's samples) to 4 significant digits."""
    number = as_number(text)
    return f"{number:.4g}" if number is not None and len(str(text)) > 8 else str(text)


def render_markdown(summary: SweepSummary) -> str:
    """The text of ``summary.md``."""
    counts = ", ".join(f"{n} {status}" for status, n in summary.counts.items() if n)
    direction = "higher" if summary.higher_is_better else "lower"
    swept = ", ".join(f"`{key}`" for key in summary.swept) or "nothing"
    parts = [
        f"# Sweep summary: `{summary.sweep_dir}`",
        f"{len(summary.rows)} jobs ({counts}). Swept: {swept}. Metric: `{summary.metric}` ({direction} is better).",
        "## Jobs",
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
    if (summary.sweep_dir / CROSSVAL_FOLDER).is_dir():
        parts.append(f"Scores of the out-of-fold predictions in the original geometry: `{CROSSVAL_FOLDER}/`"
                     f" (`scripts/crossval.py`).")
    return "\n\n".join(parts) + "\n"


def render_csv(summary: SweepSummary) -> str:
    """The text of ``summary.csv``: the job table at full precision, empty cells for missing results."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(summary.headers)
    writer.writerows(_blank_none(summary.rows))
    return buffer.getvalue()


def _short(key: str) -> str:
    """``model.attention.gamma`` -> ``gamma``, for plot labels."""
    return key.rsplit(".", 1)[-1]


def _plot_lines(ax: Any, jobs: Sequence[Job], key: str, metric: str) -> None:
    """``metric`` against the numeric parameter ``key``: one line per block, mean ± std where values repeat.

    A grid sweep (few distinct values) is drawn as lines; a random or Optuna search as points only.
    """
    values = [as_number(job.overrides.get(key)) for job in jobs]
    linestyle = "-" if len(set(values)) <= MAX_LINE_POINTS else "none"
    for block, group in group_jobs(jobs, lambda job: job.block).items():
        by_x: dict[float, list[float]] = {}
        for job in group:
            by_x.setdefault(as_number(job.overrides.get(key)), []).append(job.value(metric))  # type: ignore[arg-type]
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


def _plot_bars(ax: Any, jobs: Sequence[Job], swept: Sequence[str], metric: str) -> None:
    """One bar per setting (mean ± std over seeds and folds); settings without a result are marked "failed"."""
    keys = setting_keys(swept)
    groups = group_by_setting(jobs, keys)
    if len(keys) == 1:  # the values alone, the key as the axis label
        labels = [display_value(setting[0]) for setting in groups]
        ax.set_xlabel(keys[0])
    else:
        labels = [
            " ".join(f"{_short(k)}={display_value(v)}" for k, v in zip(keys, setting)) or "(all jobs)"
            for setting in groups
        ]
    stats = [mean_std([job.value(metric) for job in group]) for group in groups.values()]
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


def render_plot(jobs: Sequence[Job], swept: Sequence[str], metric: str) -> Any:
    """A matplotlib Figure (Agg canvas, no pyplot state): a panel per numeric swept parameter, else bars; for
    ``metric`` and, below it, each slot's mean attention distance when the runs recorded one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = list(dict.fromkeys([metric, *attention_columns(jobs)]))
    axes_keys = numeric_keys(jobs, swept)
    if not axes_keys:
        fig = Figure(figsize=(max(5.5, 1.2 * len(jobs)), 4.2 * len(metrics)), layout="constrained")
        FigureCanvasAgg(fig)
        for index, shown in enumerate(metrics):
            _plot_bars(fig.add_subplot(len(metrics), 1, index + 1), jobs, swept, shown)
    else:
        panels = [(key, shown) for shown in metrics for key in axes_keys]
        cols = min(len(axes_keys), MAX_PLOT_COLUMNS)
        rows = math.ceil(len(panels) / cols)
        fig = Figure(figsize=(5.0 * cols, 3.8 * rows), layout="constrained")
        FigureCanvasAgg(fig)
        for index, (key, shown) in enumerate(panels):
            _plot_lines(fig.add_subplot(rows, cols, index + 1), jobs, key, shown)
    fig.suptitle(f"{' and '.join(metrics)} over {len(jobs)} jobs", fontsize="medium")
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
        fig = render_plot(summary.jobs, summary.swept, metric)
        atomic_write(sweep_dir / "summary.png", lambda handle: fig.savefig(handle, format="png", dpi=110))
    return summary
