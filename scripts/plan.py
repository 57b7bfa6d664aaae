"""Print the automatic plan of a dataset: `python scripts/plan.py data=msd data.root=DIR [model.channels=null ...]`.

``data=demo3d`` (the default) generates the demo dataset at ``data.root`` first if it is missing. Dataset and
config errors print one line and exit with status 1.
"""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("plan"))  # `medseg plan` runs the same command
