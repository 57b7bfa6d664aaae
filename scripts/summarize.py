"""Summarise a Hydra sweep: `python scripts/summarize.py multirun/<date>/<time> [--metric best_val_dice]`.

Writes summary.md, summary.csv and summary.png into the sweep directory and prints the table and the best
setting. Multiruns write these files themselves when they end; rerun this for a sweep still in progress,
or one that was interrupted.
"""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("summarize"))  # `medseg summarize` runs the same command
