"""Train a segmentation model: `python scripts/train.py [key=value ...]` (Hydra; `--help`, `--cfg job`, `-m`)."""

import sys

from medseg.commands import train

if __name__ == "__main__":
    sys.exit(train())  # `medseg train` runs the same command
