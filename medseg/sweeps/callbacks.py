"""Hydra callbacks: refuse an output folder that cannot be written before Hydra makes it; cross-validate and
summarise a sweep when a multirun ends; report failed jobs to Optuna.

:class:`CheckOutputFolder` and :class:`SummarizeSweep` are registered in ``configs/train.yaml`` under
``hydra.callbacks``;
:class:`FailedJobsFailTrials` only in the Optuna presets (``configs/hparams_search/``). Hydra instantiates
callbacks for every run, single or multirun, so this module imports nothing heavy; the cross-validation and summary
code loads only at the end of a sweep.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from medseg.errors import ConfigError, exit_with
from medseg.runs.layout import RunLayout
from medseg.runtime.launch import env_rank

log = logging.getLogger("medseg")


class CheckOutputFolder(Callback):
    """Before Hydra makes the run folder (``hydra.run.dir``) or the sweep folder (``hydra.sweep.dir``) and writes its
    ``.hydra/`` files and log there, check that it can be written (:func:`medseg.io.check_writable`: a file is made
    and removed in it, or in its nearest existing parent): a read-only mount, permissions, or a path through a file
    is one line, ``error: hydra.run.dir: ...``, and exit status 1, instead of Hydra's traceback.

    torchrun's ranks > 0 write no folder of their own (:func:`medseg.runtime.launch.hydra_rank_overrides`) and are
    not checked. A folder Hydra's interpolations cannot resolve yet is left to Hydra.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``hydra.run.dir``."""
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``hydra.sweep.dir``, which holds every job's folder."""
        self._check(config, "hydra.sweep.dir")

    @staticmethod
    def _check(config: DictConfig, key: str) -> None:
        if env_rank() != 0:
            return
        try:
            folder = OmegaConf.select(config, key, throw_on_missing=True)
        except Exception:  # e.g. a ${hydra:...} interpolation, resolvable only once Hydra runs the job
            return
        from medseg.io import check_writable  # numpy and nibabel: loaded once a run starts, not at instantiation

        try:
            check_writable(Path(str(folder)).absolute(), key)  # named in full: Hydra's default is relative
        except ConfigError as err:
            exit_with(err)


class SummarizeSweep(Callback):
    """At the end of every multirun, write ``summary.md``, ``summary.csv`` and ``summary.png`` in the sweep dir; first,
    when the sweep sweeps ``data.fold``, cross-validate it (``crossval/``, as ``scripts/crossval.py DIR`` does) and,
    when it has several settings, compare them with the reference (``compare.*``, as ``scripts/compare.py DIR``).

    It never fails a sweep: any error is logged with the command that retries it (``scripts/crossval.py``,
    ``scripts/compare.py``, ``scripts/summarize.py``).

    Args:
        metric: the ``metrics.json`` key that ranks settings.
        higher_is_better: the direction of ``metric``.
        enabled: set ``hydra.callbacks.summarize_sweep.enabled=false`` to skip the summary (and the cross-validation).
        crossval: set ``hydra.callbacks.summarize_sweep.crossval=false`` to skip the cross-validation (and the
            comparison).
        reference: the setting the comparison compares the others with (``key=value`` pairs, space-separated; None:
            ``scripts/compare.py``'s default, ``model.bottleneck=none``).
    """

    def __init__(self, metric: str = "best_val_dice", higher_is_better: bool = True, enabled: bool = True,
                 crossval: bool = True, reference: str | None = None) -> None:
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.enabled = enabled
        self.crossval = crossval
        self.reference = reference
        self.sweep_dir: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Remember the sweep dir as the launcher resolves it (``${now:}`` is resolved and cached once)."""
        self.sweep_dir = self._sweep_dir(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Cross-validate (when ``data.fold`` is swept) and summarise the sweep; log, never raise."""
        if not self.enabled:
            return
        sweep_dir = self.sweep_dir or self._sweep_dir(config)
        if self.crossval and sweep_dir is not None and self._cross_validate(sweep_dir, config):
            self._compare(sweep_dir, self.reference)
        try:
            from medseg.sweeps.report import summarize_sweep

            summary = summarize_sweep(sweep_dir, self.metric, self.higher_is_better)
        except Exception as err:  # a summary must never turn a finished sweep into a failed one
            log.error(
                "could not summarise the sweep in %s (%s: %s); retry with: python scripts/summarize.py %s",
                sweep_dir,
                type(err).__name__,
                err,
                sweep_dir,
            )
            return
        log.info("sweep summary written to %s/summary.{md,csv,png}\n%s", sweep_dir, summary.text())

    @staticmethod
    def _cross_validate(sweep_dir: str, config: DictConfig) -> bool:
        """``scripts/crossval.py sweep_dir`` when the sweep's runs differ in ``data.fold``; log, never raise. True when
        the sweep has several settings to compare (cross-validated, or not: the comparison reports which lack it)."""
        try:
            from medseg.runs.folders import FOLD_KEY, Sweep, setting_keys

            swept = Sweep.read(sweep_dir).swept
            if FOLD_KEY not in swept:
                return False
            from medseg.evaluation.crossval import cross_validate, score_table

            progress = bool(OmegaConf.select(config, "trainer.progress", default=True))
            for result in cross_validate({"dir": sweep_dir, "inference": {"progress": progress}}):
                log.info("cross-validation written to %s\n%s", result.output, score_table(result.summary))
        except Exception as err:  # a cross-validation must never turn a finished sweep into a failed one
            log.error("could not cross-validate the sweep in %s (%s: %s); retry with: python scripts/crossval.py %s",
                      sweep_dir, type(err).__name__, err, sweep_dir)
            return False
        return bool(setting_keys(swept))

    @staticmethod
    def _compare(sweep_dir: str, reference: str | None) -> None:
        """``scripts/compare.py sweep_dir reference=...``; log, never raise."""
        try:
            from medseg.evaluation.compare import DEFAULT_REFERENCE
            from medseg.evaluation.compare_report import compare_sweep, setting_table

            reference = reference or DEFAULT_REFERENCE
            comparison = compare_sweep(sweep_dir, reference)
            log.info("comparison written to %s: %s\n%s", sweep_dir, ", ".join(comparison.files),
                     setting_table(comparison))
        except Exception as err:  # a comparison must never turn a finished sweep into a failed one
            log.error("could not compare the settings of the sweep in %s (%s: %s); retry with: python "
                      "scripts/compare.py %s 'reference=%s'", sweep_dir, type(err).__name__, err, sweep_dir, reference)

    @staticmethod
    def _sweep_dir(config: DictConfig) -> str | None:
        try:
            return str(config.hydra.sweep.dir)
        except Exception as err:  # an unresolvable sweep dir is reported at the end, not raised here
            log.warning("cannot resolve hydra.sweep.dir: %s", err)
            return None


class TrialFailed(RuntimeError):
    """A run of a sweep that failed (its ``metrics.json`` says why); raised to the sweeper, never in the run."""


class FailedJobsFailTrials(Callback):
    """For the Optuna sweeper: a failed job becomes a *failed* trial instead of crashing the study.

    In a multirun, ``medseg.training.run.train_cli`` records a failing job in its ``metrics.json`` and returns
    NaN, so that Hydra's basic sweeper goes on to the next job. The Optuna sweeper (hydra-optuna-sweeper 1.3,
    optuna 2.10) cannot take NaN: ``study.tell`` rejects it, and the sweeper's own fallback then crashes the
    whole search. This callback turns the NaN result into a failed job, which the Optuna sweeper records as a
    ``FAIL`` trial; with ``hydra.sweeper.max_failure_rate=1.0`` the search goes on. Register it only next to
    the Optuna sweeper: the basic sweeper stops a sweep on failed jobs.
    """

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Mark a job whose objective is NaN as failed, with the reason from its ``metrics.json``."""
        value = job_return._return_value if job_return.status == JobStatus.COMPLETED else None
        if isinstance(value, float) and math.isnan(value):
            job_return.status = JobStatus.FAILED
            job_return.return_value = TrialFailed(_failure_reason(job_return))


def _failure_reason(job_return: JobReturn) -> str:
    """The ``reason`` in the job's ``metrics.json``, or a generic one if it cannot be read."""
    try:
        output_dir = job_return.hydra_cfg.hydra.runtime.output_dir  # type: ignore[union-attr]
        reason = json.loads(RunLayout(output_dir).metrics_file.read_text()).get("reason")
    except Exception:  # the reason is only a message; never fail here
        reason = None
    return f"job failed: {reason or 'the objective (best val Dice) is NaN'}"
