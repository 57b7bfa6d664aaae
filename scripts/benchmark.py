"""Benchmarks: ``python scripts/benchmark.py attention [--quick] [--out DIR]``; ``--help`` lists subcommands."""

import sys

from medseg.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
