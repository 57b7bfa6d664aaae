"""Compare a cross-validated sweep's settings with a reference: `python scripts/compare.py DIR [reference=KEY=VALUE]`.

DIR is a multirun that sweeps data.fold (say `-m model.bottleneck=none,identity,masa data.fold=0,1,2,3,4
trainer.seed=0,1`), cross-validated (its callback did it, or scripts/crossval.py DIR). Writes compare.md,
compare.csv, compare.json and compare.png into DIR and prints the table. Exit code 0, or 1 with one line of error.
"""

from __future__ import annotations

import argparse
import sys

from medseg.errors import MedsegError
from medseg.evaluation.compare import DEFAULT_REFERENCE, FILES, compare_sweep, setting_table

METHOD = """\
Each setting's out-of-fold per-case Dice, HD95 and NSD (seeds averaged per case) is paired with the reference's on
the same cases: the mean difference with a bootstrap 95% interval and a Wilcoxon signed-rank p, Holm-corrected across
the settings; the verdict is better or worse when that p < 0.05 and the interval excludes 0, else no evidence."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=METHOD, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n")[1])
    parser.add_argument("sweep_dir", help="the multirun directory (one folder per job, and crossval/)")
    parser.add_argument("reference", nargs="?", default=f"reference={DEFAULT_REFERENCE}",
                        metavar="reference=KEY=VALUE",
                        help=f"the setting the others are compared with: key=value pairs (quoted and space-separated "
                             f"for several) that pick one setting (default: reference={DEFAULT_REFERENCE})")
    args = parser.parse_args(argv)
    key, _, args.reference = args.reference.partition("=")
    if key != "reference" or not args.reference:
        parser.error(f"{key}: expected reference=KEY=VALUE, e.g. reference={DEFAULT_REFERENCE}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        comparison = compare_sweep(args.sweep_dir, args.reference)
    except MedsegError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(setting_table(comparison))
    print(f"\nwritten: {', '.join(f'{args.sweep_dir}/{name}' for name in FILES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
