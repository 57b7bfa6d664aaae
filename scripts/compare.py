"""Compare a cross-validated sweep's settings with a reference: `python scripts/compare.py DIR [reference=KEY=VALUE]`.

`--help` says what DIR must hold, the method and the files it writes.
"""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("compare"))  # `medseg compare` runs the same command
