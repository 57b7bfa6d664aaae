"""Benchmarks: ``python scripts/benchmark.py attention [--quick] [--out DIR]``; ``--help`` lists subcommands.

They live in ``benchmarks/`` beside this folder, in the clone (not in medseg's wheel)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the clone's root: benchmarks/ and tools/

from benchmarks.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
