"""``trainer.max_minutes``: train for a wall-clock budget instead of a number of epochs.

The schedule (cosine or poly over epochs) must know its length, so the first epoch is timed, validation included,
and sets it: ``1 + floor((budget - first) / per_epoch)`` epochs, where ``per_epoch`` is the training time of an
epoch plus a validation's time shared over ``val_every`` epochs. From then on, training ends after the first epoch
that leaves less than one mean epoch of the budget (that epoch validates, so ``best.pt`` is up to date). The same
rule drives both systems of the nnU-Net comparison (:mod:`benchmarks/peers.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TimeBudget:
    """A training budget in seconds (validation included).

    Args:
        seconds: the budget.
        max_epochs: the most epochs it may span (``trainer.max_epochs``, or nnU-Net's own 1000).
    """

    seconds: float
    max_epochs: int

    def horizon(self, elapsed: float, train_epoch: float, validation: float, val_every: int,
                epochs_done: int = 1) -> int:
        """Epochs the budget spans, decided after ``epochs_done`` epochs.

        Args:
            elapsed: seconds of the epochs done, their validations included.
            train_epoch: seconds of one epoch's training (without validation).
            validation: seconds of one validation.
            val_every: epochs between validations.
            epochs_done: the epochs ``elapsed`` covers.
        """
        per_epoch = max(train_epoch + validation / max(val_every, 1), 1e-9)
        fit = epochs_done + math.floor((self.seconds - elapsed) / per_epoch)
        return int(min(self.max_epochs, max(epochs_done, fit)))

    def spent(self, elapsed: float, epochs_done: int) -> bool:
        """Whether another epoch of the mean length so far would overrun the budget."""
        return epochs_done > 0 and elapsed + elapsed / epochs_done > self.seconds
