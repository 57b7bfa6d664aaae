"""The optimizer and the learning-rate schedule of ``trainer.*``: torch's own, chosen by name."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    LinearLR,
    LRScheduler,
    PolynomialLR,
    SequentialLR,
)

from medseg.config import TrainerConfig

POLY_POWER = 0.9
"""nnU-Net's polynomial decay exponent."""

OPTIMIZERS: dict[str, Callable[[Iterable[torch.nn.Parameter], TrainerConfig], Optimizer]] = {
    "adamw": lambda params, t: torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay),
    "sgd": lambda params, t: torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, nesterov=True,
                                             weight_decay=t.weight_decay),
}
"""The values of ``trainer.optimizer`` -> ``builder(parameters, trainer config)``."""

SCHEDULES: dict[str, Callable[[Optimizer, int], LRScheduler]] = {
    "cosine": lambda optimizer, epochs: CosineAnnealingLR(optimizer, T_max=epochs),
    "poly": lambda optimizer, epochs: PolynomialLR(optimizer, total_iters=epochs, power=POLY_POWER),
    "none": lambda optimizer, epochs: ConstantLR(optimizer, factor=1.0, total_iters=0),
}
"""The values of ``trainer.scheduler`` -> ``builder(optimizer, epochs it spans)``, stepped once per epoch."""


def build_optimizer(parameters: Iterable[torch.nn.Parameter], trainer: TrainerConfig) -> Optimizer:
    """The ``trainer.optimizer`` over the trainable ``parameters``."""
    return OPTIMIZERS[trainer.optimizer]([p for p in parameters if p.requires_grad], trainer)


def build_scheduler(optimizer: Optimizer, trainer: TrainerConfig) -> LRScheduler:
    """``trainer.warmup_epochs`` of linear warm-up (epoch e at ``(e + 1) / warmup`` of the lr), then the schedule.

    The schedule decays over the remaining ``max_epochs - warmup_epochs`` epochs; step it once per epoch.
    """
    warmup = trainer.warmup_epochs
    schedule = SCHEDULES[trainer.scheduler](optimizer, max(1, trainer.max_epochs - warmup))
    if warmup <= 0:
        return schedule
    ramp = LinearLR(optimizer, start_factor=1.0 / warmup, end_factor=1.0, total_iters=max(1, warmup - 1))
    return SequentialLR(optimizer, [ramp, schedule], milestones=[warmup])
