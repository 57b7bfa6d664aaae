"""Evaluate a checkpoint: `python scripts/evaluate.py ckpt=RUN/checkpoints/best.pt input=PATH output=DIR`.

Predicts every case of ``input`` into ``output`` in the input's own geometry and, where labels exist,
writes per-case metrics (``metrics.csv``) and means (``summary.json``). Exit code 0 when every case
was evaluated, 1 when any failed or the checkpoint/input is unusable.
"""

import sys

from medseg.commands import evaluate

if __name__ == "__main__":
    sys.exit(evaluate())  # `medseg evaluate` runs the same command
