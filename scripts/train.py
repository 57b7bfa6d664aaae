"""Train a segmentation model: `python scripts/train.py [key=value ...]` (Hydra; `--help`, `--cfg job`, `-m`)."""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("train"))  # `medseg train` runs the same command
