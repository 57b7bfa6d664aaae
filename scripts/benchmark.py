"""Benchmarks: ``python scripts/benchmark.py attention [--quick] [--out DIR]``; ``--help`` lists subcommands."""

import sys

from medseg.commands import benchmark

if __name__ == "__main__":
    sys.exit(benchmark())  # `medseg benchmark` runs the same command
