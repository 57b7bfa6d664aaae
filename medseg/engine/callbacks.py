"""Hydra callbacks: write the sweep summary when a multirun ends.

Registered in ``configs/train.yaml`` under ``hydra.callbacks``. Hydra instantiates callbacks for every run,
single or multirun, so this module imports nothing heavy; the summary code loads only at the end of a sweep.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("medseg")


class SummarizeSweep(Callback):
    """At the end of every multirun, write ``summary.md``, ``summary.csv`` and ``summary.png`` in the sweep dir.

    It never fails a sweep: any error is logged with the command that retries it (``scripts/summarize.py``).

    Args:
        metric: the ``metrics.json`` key that ranks settings.
        higher_is_better: the direction of ``metric``.
        enabled: set ``hydra.callbacks.summarize_sweep.enabled=false`` to skip the summary.
    """

    def __init__(self, metric: str = "best_val_dice", higher_is_better: bool = True, enabled: bool = True) -> None:
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.enabled = enabled
        self.sweep_dir: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Remember the sweep dir as the launcher resolves it (``${now:}`` is resolved and cached once)."""
        self.sweep_dir = self._sweep_dir(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Summarise the sweep; log, never raise."""
        if not self.enabled:
            return
        sweep_dir = self.sweep_dir or self._sweep_dir(config)
        try:
            from medseg.engine.sweep import summarize_sweep

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
    def _sweep_dir(config: DictConfig) -> str | None:
        try:
            return str(config.hydra.sweep.dir)
        except Exception as err:  # an unresolvable sweep dir is reported at the end, not raised here
            log.warning("cannot resolve hydra.sweep.dir: %s", err)
            return None
