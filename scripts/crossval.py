"""Cross-validate a multirun of folds: `python scripts/crossval.py DIR` (DIR from `train.py -m data.fold=0,1,2,3,4`).

Each finished fold predicts its own validation cases in their original geometry; the out-of-fold predictions of
all cases are scored together (DIR/crossval/summary.json, metrics.csv, summary.md) and the postprocessing is
decided on them (DIR/crossval/postprocessing.json). Exit code 0, or 1 when a case or the multirun is unusable.
"""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("crossval"))  # `medseg crossval` runs the same command
