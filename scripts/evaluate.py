"""Evaluate a checkpoint: `python scripts/evaluate.py ckpt=RUN/checkpoints/best.pt input=PATH output=DIR`.

Predicts every case of ``input`` into ``output`` in the input's own geometry and, where labels exist,
writes per-case metrics (``metrics.csv``) and means (``summary.json``). Exit code 0 when every case
was evaluated, 1 when any failed or the checkpoint/input is unusable.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from medseg.engine.evaluate import evaluate_cli


@hydra.main(version_base="1.3", config_path="../configs", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: evaluate and exit with the status."""
    code = evaluate_cli(cfg)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
