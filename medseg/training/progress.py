"""Where a training run stands: what its checkpoints save and a resume restores, one dataclass for both.

:class:`Progress`'s fields are the checkpoint's entries of the run's progress (the model, optimizer, scheduler, AMP
scaler, random states and config are saved beside them by :meth:`medseg.training.trainer.Trainer.state`), so that
saving (:meth:`Progress.saved`), restoring (:meth:`Progress.restored`) and the keys a resume needs
(:data:`PROGRESS_KEYS`) cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass
class Progress:
    """A run's progress; each field is the checkpoint entry of the same name."""

    epoch: int = 0
    """Completed epochs."""
    best_metric: float = -1.0
    """``best.pt``'s validation Dice (the mean over the foreground outputs); -1 before a full validation scored it."""
    best_epoch: int = -1
    """The epoch whose weights ``best.pt`` holds; -1 before one was chosen."""
    best_per_class: dict[str, float] = field(default_factory=dict)
    """``best.pt``'s Dice per output."""
    pseudo_dice_ema: float | None = None
    """``trainer.val_iterations``: the moving average of the pseudo-Dice (None before the first)."""
    best_pseudo_dice_ema: float = -1.0
    """Its best, whose weights ``best.pt`` holds."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """One record per completed epoch (loss, lr, steps, validation, seconds)."""
    epoch_losses: list[float] = field(default_factory=list)
    """The finite losses of the current epoch so far."""
    nonfinite_total: int = 0
    """Steps skipped for a non-finite loss or gradient, over the run."""
    nonfinite_streak: int = 0
    """Such steps in a row, up to now."""
    train_seconds: float = 0.0
    """Seconds of the completed epochs, their validation included."""
    step_seconds: float = 0.0
    """Seconds of the training steps alone (validation excluded) ..."""
    steps_run: int = 0
    """... and their number: ``step_seconds / steps_run`` is the time per step."""
    wall_seconds: float = 0.0
    """The wall time of the processes the run was resumed from, up to their checkpoint."""
    started_from: str | None = None
    """``trainer.init_from``: the weights the run started from, in words; None from scratch."""

    def saved(self, step: int, wall_seconds: float) -> dict[str, Any]:
        """The checkpoint's entries at ``step`` of the current epoch (0: between epochs, which holds no epoch's
        losses nor streak), the run's wall time so far being ``wall_seconds``."""
        between_epochs = {} if step else {"epoch_losses": [], "nonfinite_streak": 0}
        return asdict(replace(self, wall_seconds=wall_seconds, **between_epochs))

    @classmethod
    def restored(cls, state: Mapping[str, Any]) -> Progress:
        """The progress a checkpoint's entries (:meth:`saved`) hold."""
        return cls(**{key: state[key] for key in PROGRESS_KEYS})


PROGRESS_KEYS = tuple(item.name for item in fields(Progress))
"""The checkpoint entries of :class:`Progress`."""
