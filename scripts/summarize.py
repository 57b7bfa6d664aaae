"""Summarise a Hydra sweep: `python scripts/summarize.py multirun/<date>/<time> [--metric best_val_dice]`.

Writes summary.md, summary.csv and summary.png into the sweep directory and prints the table and the best
setting. Multiruns write these files themselves when they end; rerun this for a sweep still in progress,
or one that was interrupted.
"""

from __future__ import annotations

import argparse
import sys

from medseg.sweeps.report import summarize_sweep


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", help="the multirun directory (holds one folder per job)")
    parser.add_argument(
        "--metric",
        default="best_val_dice",
        help="metrics.json key (or dice_<class>) that ranks settings (default: best_val_dice)",
    )
    parser.add_argument("--lower-is-better", action="store_true", help="rank by the smallest metric instead")
    parser.add_argument("--no-plot", action="store_true", help="skip summary.png")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summary = summarize_sweep(args.sweep_dir, args.metric, not args.lower_is_better, plot=not args.no_plot)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(summary.text())
    print(f"\nwritten: {args.sweep_dir}/summary.md, summary.csv" + ("" if args.no_plot else ", summary.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
