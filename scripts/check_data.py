"""Verify a dataset before training: `python scripts/check_data.py data=msd data.root=/path/to/Task09_Spleen`.

Checks every case (missing or corrupt files, shapes, affines, channels, label values, NaN/Inf) and
prints one report of all problems. Exit code 0 when the dataset has no errors, 1 otherwise.
"""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("check-data"))  # `medseg check-data` runs the same command
