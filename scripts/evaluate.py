"""Evaluate a checkpoint: `python scripts/evaluate.py ckpt=RUN/checkpoints/best.pt input=PATH output=DIR`.

Predicts every case of ``input`` into ``output`` in the input's own geometry and, where labels exist,
writes per-case metrics (``metrics.csv``) and means (``summary.json``). Exit code 0 when every case
was evaluated, 1 when any failed or the checkpoint/input is unusable.
"""

import sys

import hydra
from omegaconf import DictConfig

from medseg.cli import one_line_errors, run
from medseg.config import EvaluateConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="evaluate")
@one_line_errors
def main(cfg: DictConfig) -> None:
    """Hydra entry point: evaluate and exit with the status."""
    from medseg.evaluation.evaluate import evaluate_cli  # torch and MONAI load only when a job runs

    code = evaluate_cli(cfg)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    run(main, EvaluateConfig)
