"""The verdict of a cross-validated sweep: does each setting differ from a reference setting, and at what compute?

Behind ``scripts/compare.py DIR [reference=model.bottleneck=none]``, and run by the multirun callback after the
cross-validation when ``data.fold`` is swept. A *setting* is the runs that differ only in ``data.fold`` and
``trainer.seed``; the cross-validation (:mod:`medseg.evaluation.crossval`) scored each seed of it on its out-of-fold
cases, one ``crossval/<setting>/metrics.csv`` per seed. For every setting:

1. the out-of-fold Dice, HD95 and NSD of each case, per output (class or region) and for the foreground mean (the
   mean over the outputs of the case where defined), and per output the lesion-wise detection sensitivity,
   false-positive components and Dice per found lesion (:mod:`medseg.scoring.detection`), for each seed (every seed
   scored the same cases). Following Metrics Reloaded, a case without the output in label and prediction has no
   Dice nor NSD (it is left out of their means, the foreground mean's included, never counted as 1), a case without
   a reference lesion no sensitivity, one without a found lesion no Dice per lesion;
2. each setting but the reference is paired with the reference on the same cases
   (:mod:`medseg.scoring.paired`): the mean difference (setting minus reference) with its 95 % confidence interval
   and p-value (one seed a side: the BCa bootstrap of the cases and Wilcoxon's signed-rank test; more: the bootstrap
   of cases and seeds, :mod:`medseg.scoring.bootstrap`), Holm's correction across the settings compared (for each
   output and metric), and a verdict in words: *better*, *worse* or *no evidence of a difference* at α = 0.05, or
   *not measurable* (with the reason) without a case finite on both sides; beside each verdict the seed-to-seed
   spread, whether every seed alone lies on its side, and beside *no evidence* the smallest difference the sweep
   would have detected with 80 % power (:mod:`medseg.scoring.power`), and with ``detect=`` the cases a difference
   of that size needs;
3. with three or more settings, each one's bootstrap rank distribution (:mod:`medseg.scoring.ranking`); when the
   sweep's settings differ in one numeric key only, the slope of the metric against its values, one test
   (:mod:`medseg.scoring.trend`), and the best value named only when it beats the runner-up;
4. its compute: the mean over its completed runs of the compute keys of ``metrics.json``
   (:data:`~medseg.runs.folders.COMPUTE_KEYS`, and the FLOPs of a training-patch forward when recorded), the
   foreground Dice per GFLOP and, where every run trained on a GPU, per GPU-hour of one run's training.

The work is split by job: :mod:`medseg.evaluation.compare_settings` reads the sweep's settings (and another tool's),
:mod:`medseg.evaluation.compare_stats` computes the statistics, and this module gives the verdict.
:func:`build_comparison` reads and compares: a sweep without folds, a reference that names no setting or several,
and settings scored on different cases stop with one line, before anything is written. :func:`report_name` names the
files of a report; :mod:`medseg.evaluation.compare_report` writes their text (and
:func:`~medseg.evaluation.compare_report.compare_sweep` the files), :mod:`medseg.evaluation.compare_plots` draws
their figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hydra.errors import OverrideParseException

from medseg.errors import ConfigError
from medseg.evaluation.compare_settings import (
    FOREGROUND,
    VOXEL_METRICS,
    Setting,
    check_same_dataset,
    external_settings,
    keep_shared_metrics,
    read_settings,
)
from medseg.evaluation.compare_stats import Curve, Ranking, Row, compare_settings, curves, rank_settings
from medseg.evaluation.external import ExternalSource
from medseg.runs.folders import Sweep, parse_overrides
from medseg.runs.layout import file_label
from medseg.scoring.paired import RESAMPLES

DEFAULT_REFERENCE = "model.bottleneck=none"
"""The setting every other is compared with, unless ``reference=`` names another."""
REPORTS = (".md", ".csv", ".json", ".png")
"""What :func:`~medseg.evaluation.compare_report.compare_sweep` always writes (:func:`report_name`); a swept numeric
key adds :data:`CURVE`."""
CURVE = ".curve.png"
"""The plot of a swept numeric key's differences against its values."""


def report_name(reference: str, suffix: str) -> str:
    """The file name of a report against ``reference`` (a setting's label): ``compare<suffix>`` against
    :data:`DEFAULT_REFERENCE`, else ``compare.<reference><suffix>`` (``compare.model.bottleneck=masa.md``)."""
    return f"compare{'' if reference == DEFAULT_REFERENCE else '.' + file_label(reference)}{suffix}"


FILES = tuple(report_name(DEFAULT_REFERENCE, suffix) for suffix in REPORTS)
"""What :func:`~medseg.evaluation.compare_report.compare_sweep` writes into the sweep directory against the default
reference."""


@dataclass
class Comparison:
    """Every setting of a sweep against its reference."""

    sweep_dir: Path
    reference: Setting
    settings: list[Setting]
    """Every cross-validated setting, the reference included, in run order."""
    rows: list[Row] = field(default_factory=list)
    rankings: list[Ranking] = field(default_factory=list)
    """With three or more settings: one per metric."""
    curves: list[Curve] = field(default_factory=list)
    """When the sweep's settings differ in one numeric key only: one per metric."""
    detect: float | None = None
    """The difference ``detect=`` named (in each metric's unit), or None."""

    def foreground(self, metric: str = "dice") -> dict[str, Row]:
        """The rows of the foreground mean of ``metric``, by setting."""
        return {row.setting: row for row in self.rows if row.output == FOREGROUND and row.metric == metric}

    @property
    def files(self) -> list[str]:
        """The names of the files :func:`~medseg.evaluation.compare_report.compare_sweep` writes for this comparison."""
        suffixes = [*REPORTS, *([CURVE] if self.curves else [])]
        return [report_name(self.reference.label, suffix) for suffix in suffixes]

    @property
    def unpredicted(self) -> list[str]:
        """The outputs in the labels that no setting predicted in any case (where every setting recorded it)."""
        outputs = dict.fromkeys(output for setting in self.settings for output in setting.volumes)
        recorded = {output: [s.volumes[output] for s in self.settings if output in s.volumes] for output in outputs}
        return [output for output, volumes in recorded.items() if len(volumes) == len(self.settings)
                and any(present for _, present in volumes) and not any(predicted for predicted, _ in volumes)]


def select_reference(settings: Sequence[Setting], spec: str) -> Setting:
    """The setting named ``spec`` (another tool's: ``nnunet``), else the one setting whose runs have every
    ``key=value`` of ``spec`` (space-separated) among their overrides.

    Raises:
        ConfigError: ``spec`` is no name nor ``key=value`` list, or it matches no setting or several.
    """
    named = [setting for setting in settings if setting.label == spec and not setting.runs]
    if named:
        return named[0]
    try:
        wanted = parse_overrides(spec.split())
    except OverrideParseException as err:
        raise ConfigError(f"reference={spec}: not key=value pairs nor the name of a setting ({err}); choose one "
                          f"of: {'; '.join(s.label for s in settings)}") from None
    matches = [s for s in settings
               if s.runs and all(s.runs[0].overrides.get(key) == value for key, value in wanted.items())]
    if len(matches) != 1:
        found = "no" if not matches else f"{len(matches)} ({'; '.join(s.label for s in matches)})"
        raise ConfigError(f"reference={spec} matches {found} cross-validated settings; choose one of: "
                          f"{'; '.join(s.label for s in settings)} (reference=KEY=VALUE ...)")
    return matches[0]


def build_comparison(sweep_dir: str | Path, reference: str = DEFAULT_REFERENCE, resamples: int = RESAMPLES,
                     external: Sequence[ExternalSource] = (), progress: bool = True,
                     detect: float | None = None) -> Comparison:
    """Read and compare a cross-validated sweep (see the module docstring), with another tool's out-of-fold
    predictions as settings (``external``, scored into ``DIR/external/``), and with the cases a difference of
    ``detect`` needs; writes nothing else.

    Raises:
        ConfigError: no sweep, no folds, fewer than two cross-validated settings, or a bad ``reference``.
        DatasetError: unreadable scores, or settings scored on different cases or labels.
    """
    sweep_dir = Path(sweep_dir).expanduser()
    try:
        sweep = Sweep.read(sweep_dir)
    except FileNotFoundError as err:
        raise ConfigError(f"{err}; give the folder of a multirun (python scripts/train.py -m ... "
                          f"data.fold=0,1,2,3,4)") from None
    settings = read_settings(sweep)
    check_same_dataset(settings)
    settings += external_settings(sweep, settings, external, progress)
    keep_shared_metrics(settings)
    if len(settings) < 2:
        raise ConfigError(f"{sweep_dir}: {len(settings)} cross-validated setting(s); a comparison needs two or more "
                          f"(cross-validate with python scripts/crossval.py {sweep_dir})")
    chosen = select_reference(settings, reference)
    rankings = ([ranking for metric in VOXEL_METRICS if (ranking := rank_settings(settings, metric, resamples))]
                if len(settings) >= 3 else [])
    return Comparison(sweep_dir, chosen, settings, compare_settings(settings, chosen, resamples, detect), rankings,
                      curves(sweep, settings, chosen, resamples), detect)
