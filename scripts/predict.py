"""Predict with a checkpoint: `python scripts/predict.py ckpt=RUN/checkpoints/best.pt input=PATH output=DIR`.

Segments every case of ``input`` (a folder of images or DICOM series, or a dataset split; no labels needed) into
``output`` in the input's own geometry, with ``summary.json``. Exit code 0 when every case was predicted, 1 when any
failed or the checkpoint/input is unusable. ``scripts/evaluate.py`` scores predictions against labels.
"""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("predict"))  # `medseg predict` runs the same command
