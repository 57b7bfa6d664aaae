"""Evaluate: `python scripts/evaluate.py ckpt=RUN/checkpoints/best.pt input=PATH output=DIR`, or
`python scripts/evaluate.py pred=DIR input=<dataset.json or labels folder>`.

Scores segmentations against their labels: what the checkpoint predicts (written into ``output`` as
``scripts/predict.py`` writes them), or a folder of predictions made by any tool (``pred``). Writes per-case metrics
(``metrics.csv``) and means (``summary.json``). Exit code 0 when every case was evaluated, 1 when any failed or the
checkpoint, input or predictions are unusable.
"""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("evaluate"))  # `medseg evaluate` runs the same command
