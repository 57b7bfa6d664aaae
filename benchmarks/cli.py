"""``scripts/benchmark.py COMMAND [arguments]``: one subcommand per module, imported only when it runs.

A subcommand's module has a docstring (its ``--help``), ``add_arguments(parser)`` and ``run(args) -> exit code``;
so ``benchmark.py --help`` imports none of them, and a module that fails to import breaks only its own subcommand.
To add a benchmark ``<name>``: write ``benchmarks/<name>.py`` with those two functions and add it to
:data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from medseg.cli import one_line_errors


@dataclass(frozen=True)
class Subcommand:
    """Where a subcommand's code lives, and its line in ``benchmark.py --help``."""

    module: str
    help: str


SUBCOMMANDS: dict[str, Subcommand] = {
    "attention": Subcommand("benchmarks.attention", "time and memory of every attention block"),
    "models": Subcommand("benchmarks.models", "train/inference time and memory of whole networks"),
    "quality": Subcommand("benchmarks.quality", "Dice of medseg vs MONAI UNet / SwinUNETR at the same budget"),
    "peers": Subcommand("benchmarks.peers", "medseg vs nnU-Net v2 on the same data, cases and budget"),
    "nnunet_crossval": Subcommand("benchmarks.nnunet_crossval",
                                  "nnU-Net v2 on every fold for a budget, as compare.py nnunet=RESULTS reads it"),
    "prediction": Subcommand("benchmarks.prediction", "whole-volume CPU prediction of a large CT, dense vs fast"),
    "scan_prediction": Subcommand("benchmarks.scan_prediction",
                                  "one large scan predicted on the CPU by medseg and nnU-Net"),
    "long_scan": Subcommand("benchmarks.long_scan", "peak RAM of predicting long scans with many classes vs length"),
    "scaling": Subcommand("benchmarks.scaling",
                          "time and peak RAM of prediction vs slices and classes, medseg and nnU-Net, memory-capped"),
    "loader": Subcommand("benchmarks.loader", "CPU time per training patch of each data.augment chain"),
    "pipeline": Subcommand("benchmarks.pipeline", "step time and device busy share per data.augment_on and workers"),
    "shift": Subcommand("benchmarks.shift", "a cross-validated sweep's folds on their validation cases under a "
                        "scanner shift, for compare.py"),
    "gpu": Subcommand("tools.gpu_check", "the GPU check: scripts/gpu_check.py under its older name"),
}
"""``benchmark.py <name>`` -> its module (under the clone's root) and help."""


def command_parser(module: str, prog: str) -> argparse.ArgumentParser:
    """The command line of ``module`` (imported now): its docstring as the description, the arguments its
    ``add_arguments`` adds, and its ``run`` as the parsed namespace's ``run`` (a ``MedsegError`` there prints one
    line and exits with 1)."""
    imported = importlib.import_module(module)
    parser = argparse.ArgumentParser(prog=prog, description=imported.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    imported.add_arguments(parser)
    parser.set_defaults(run=one_line_errors(imported.run))
    return parser


def run_command(module: str, prog: str, argv: Sequence[str]) -> int:
    """Parse ``argv`` with :func:`command_parser` and run ``module``; its exit code. The namespace's
    ``command_line`` is the command as typed in the clone (``python scripts/benchmark.py models --out DIR``), which
    the reports record beside their figures."""
    args = command_parser(module, prog).parse_args(argv)
    script, *subcommand = prog.split()
    args.command_line = shlex.join(["python", f"scripts/{script}", *subcommand, *argv])
    return args.run(args)


def build_parser() -> argparse.ArgumentParser:
    """``benchmark.py``'s own parser: the subcommand's name, then its arguments (parsed by its module)."""
    width = max(map(len, SUBCOMMANDS))
    listing = "\n".join(f"  {name:<{width}}  {sub.help}" for name, sub in SUBCOMMANDS.items())
    parser = argparse.ArgumentParser(prog="benchmark.py", description="medseg's benchmarks, run from a clone.",
                                     epilog=f"commands:\n{listing}\n\n`benchmark.py COMMAND --help` gives a command's "
                                            f"arguments.", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=SUBCOMMANDS, metavar="COMMAND", help="one of the commands below")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the command's arguments")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``benchmark.py COMMAND [arguments]``: run the command on ``arguments``; its exit code."""
    args = build_parser().parse_args(argv)
    return run_command(SUBCOMMANDS[args.command].module, f"benchmark.py {args.command}", args.arguments)
