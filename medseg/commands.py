"""The command line: ``medseg <command> [arguments]``, and the commands behind ``scripts/*.py``.

The commands are one table, :data:`COMMANDS`: each reads ``sys.argv`` and returns the exit code. ``medseg <command>``
(:func:`main`, the ``medseg`` entry point of ``pyproject.toml``) runs it, and so does ``scripts/<command>.py``
(:func:`run_command`, one line), so both take the same arguments. The Hydra commands (:class:`HydraCommand`: train,
predict, evaluate, crossval, export, visualize, plan, check-data) take ``key=value`` overrides, ``--help``, ``--cfg
job`` and ``-m`` on the configs of :data:`medseg.hydra_config.CONFIG_DIR`; compare and summarize parse their arguments
with argparse. (The benchmarks and the GPU check are no commands of the package: they run from a clone,
``scripts/benchmark.py`` and ``scripts/gpu_check.py``.)

Nothing here loads torch or MONAI at import: each command imports its stage when it runs, so ``medseg --help``,
``medseg <command> --help`` and a mistyped key answer without loading them.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from medseg.cli import one_line_errors, run
from medseg.config import SCHEMAS, CheckDataConfig, PlanCommandConfig
from medseg.errors import MedsegError
from medseg.hydra_config import CONFIG_DIR
from medseg.runtime.launch import hydra_rank_overrides
from medseg.typed_config import to_typed
from medseg.version import __version__

if TYPE_CHECKING:
    from medseg.evaluation.external import ExternalSource

DATA_EXAMPLE = " (e.g. data=msd data.root=/path/to/Task09_Spleen)"


def lazy(module: str, name: str) -> Callable[[DictConfig], object]:
    """The function ``name`` of ``module``, imported when it is called: torch and MONAI load only when a job runs."""

    def call(cfg: DictConfig) -> object:
        return getattr(importlib.import_module(module), name)(cfg)

    return call


def _plan(cfg: DictConfig) -> None:
    from medseg.planning.report import plan_report  # numpy and nibabel load only when a job runs

    print(plan_report(to_typed(PlanCommandConfig, cfg, context=DATA_EXAMPLE)))


def _check_data(cfg: DictConfig) -> int:
    from medseg.data.verify import check_data_cli

    settings = to_typed(CheckDataConfig, cfg, context=DATA_EXAMPLE)
    return check_data_cli(settings.data, progress=settings.progress)


def _rank_overrides(argv: list[str]) -> None:
    argv += hydra_rank_overrides()  # torchrun ranks > 0 write no run directory of their own


def _folder_first(argv: list[str]) -> None:
    if len(argv) > 1 and "=" not in argv[1] and not argv[1].startswith("-"):
        argv[1] = f"dir={argv[1]}"  # the multirun folder may come first, without its key


@dataclass(frozen=True)
class HydraCommand:
    """A command on a config of :data:`~medseg.hydra_config.CONFIG_DIR`: ``key=value`` overrides, ``--help``,
    ``--cfg job`` and ``-m``, checked against its schema (:func:`medseg.cli.run`) before Hydra runs ``job``."""

    config: str
    """The config's name (``configs/<config>.yaml``), its schema's in :data:`~medseg.config.SCHEMAS`."""
    job: Callable[[DictConfig], object]
    """Run on the composed config: its value is Hydra's (training's best Dice, a sweeper's objective); a non-zero
    int is the exit code."""
    summary: str
    """``medseg --help``'s line."""
    argv: Callable[[list[str]], None] | None = None
    """Rewrites ``sys.argv`` before Hydra reads it."""

    def __call__(self) -> int:
        if self.argv is not None:
            self.argv(sys.argv)

        @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=self.config)
        @one_line_errors
        def task(cfg: DictConfig) -> object:
            result = self.job(cfg)
            if type(result) is int and result:
                sys.exit(result)
            return result

        return run(task, SCHEMAS[self.config])


# --------------------------------------------------------------------------------------------- argparse commands

COMPARE_METHOD = """\
Each setting's out-of-fold per-case Dice, HD95, NSD and lesion-wise detection are paired with the reference's on the
same cases: the mean difference with a bootstrap 95% interval (cases and seeds resampled) and a Wilcoxon or bootstrap
p, Holm-corrected across the settings; better or worse when p < 0.05 and the interval excludes 0, else no evidence."""

COMPARE_INPUT = """\
DIR is a multirun that sweeps data.fold (say `-m model.bottleneck=none,identity,masa data.fold=0,1,2,3,4
trainer.seed=0,1`), cross-validated (its callback did it, or `medseg crossval DIR`). nnunet=RESULTS adds nnU-Net v2's
cross-validation (its trained-model folder, with fold_<k>/validation/) as the setting `nnunet`, and extra=NAME=DIR any
other tool's out-of-fold label maps, both scored by medseg on the same cases (train the sweep on nnU-Net's folds with
data.splits=<its splits_final.json>); reference=nnunet makes it the reference. detect=0.01 adds the cases a
difference of 0.01 (in each metric's unit) needs. Writes compare.md, compare.csv, compare.json and compare.png (and
compare.curve.png when the settings differ in one numeric key) into DIR, named compare.<reference>.* for a reference
other than the default, and prints the table. Exit code 0, or 1 with one line of error."""


def compare_options(options: Sequence[str],
                    parser: argparse.ArgumentParser) -> tuple[str, list[ExternalSource], float | None]:
    """``reference=...``, ``nnunet=...``, ``extra=NAME=DIR`` and ``detect=...`` options of ``compare``: the reference,
    the sources of other tools' predictions and the difference to size the cases for (a bad option ends the command
    with argparse's usage error)."""
    from medseg.errors import ConfigError
    from medseg.evaluation.compare import DEFAULT_REFERENCE
    from medseg.evaluation.external import parse_source

    reference, sources, detect = DEFAULT_REFERENCE, [], None
    for option in options:
        key, _, value = option.partition("=")
        if key == "reference" and value:
            reference = value
            continue
        if key == "detect":
            try:
                detect = float(value)
            except ValueError:
                detect = math.nan
            if not detect > 0 or math.isinf(detect):
                parser.error(f"detect={value}: expected a positive difference, in the metrics' units (detect=0.01)")
            continue
        try:
            sources.append(parse_source(option))
        except ConfigError as err:
            parser.error(f"{err} (or reference=KEY=VALUE, e.g. reference={DEFAULT_REFERENCE})")
    return reference, sources, detect


def compare(argv: Sequence[str] | None = None) -> int:
    """Paired verdicts of a cross-validated sweep's settings against a reference (DIR [reference=KEY=VALUE]
    [nnunet=RESULTS] [extra=NAME=DIR ...] [detect=DIFFERENCE])."""
    from medseg.evaluation.compare import DEFAULT_REFERENCE
    from medseg.evaluation.compare_report import compare_sweep, setting_table

    parser = argparse.ArgumentParser(description=COMPARE_METHOD, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=COMPARE_INPUT)
    parser.add_argument("sweep_dir", help="the multirun directory (one folder per job, and crossval/)")
    parser.add_argument("options", nargs="*",
                        metavar="reference=KEY=VALUE | nnunet=RESULTS | extra=NAME=DIR | detect=DIFFERENCE",
                        help=f"reference: the setting the others are compared with, key=value pairs (quoted and "
                             f"space-separated for several) that pick one setting, or a name (nnunet) (default: "
                             f"reference={DEFAULT_REFERENCE}); nnunet, extra: other tools' out-of-fold predictions; "
                             f"detect: the cases a difference of this size needs")
    args = parser.parse_args(argv)
    reference, sources, detect = compare_options(args.options, parser)
    try:
        comparison = compare_sweep(args.sweep_dir, reference, external=sources, detect=detect)
    except MedsegError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(setting_table(comparison))
    print(f"\nwritten: {', '.join(f'{args.sweep_dir}/{name}' for name in comparison.files)}")
    return 0


def summarize(argv: Sequence[str] | None = None) -> int:
    """Rank a sweep's settings: summary.md, summary.csv and summary.png in the sweep folder (DIR [--metric KEY])."""
    from medseg.sweeps.report import summarize_sweep

    parser = argparse.ArgumentParser(description=summarize.__doc__)
    parser.add_argument("sweep_dir", help="the multirun directory (holds one folder per job)")
    parser.add_argument(
        "--metric",
        default="best_val_dice",
        help="metrics.json key (or dice_<class>) that ranks settings (default: best_val_dice)",
    )
    parser.add_argument("--lower-is-better", action="store_true", help="rank by the smallest metric instead")
    parser.add_argument("--no-plot", action="store_true", help="skip summary.png")
    args = parser.parse_args(argv)
    try:
        summary = summarize_sweep(args.sweep_dir, args.metric, not args.lower_is_better, plot=not args.no_plot)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(summary.text())
    print(f"\nwritten: {args.sweep_dir}/summary.md, summary.csv" + ("" if args.no_plot else ", summary.png"))
    return 0


# --------------------------------------------------------------------------------------------- medseg <command>

COMMANDS: dict[str, Callable[[], int]] = {
    "train": HydraCommand("train", lazy("medseg.training.run", "train_cli"),
                          "Train a segmentation model (key=value overrides; -m sweeps).", _rank_overrides),
    "predict": HydraCommand("predict", lazy("medseg.inference.predict", "predict_cli"),
                            "Segment a folder, a series or a dataset split with a checkpoint or an ensemble (no labels "
                            "needed)."),
    "evaluate": HydraCommand("evaluate", lazy("medseg.evaluation.evaluate", "evaluate_cli"),
                             "Score segmentations against labels: a checkpoint's predictions, or a folder made by any "
                             "tool (pred=DIR)."),
    "crossval": HydraCommand("crossval", lazy("medseg.evaluation.crossval", "crossval_cli"),
                             "Score a multirun of folds on its out-of-fold predictions; decide the postprocessing (DIR "
                             "or dir=DIR).", _folder_first),
    "compare": compare,
    "export": HydraCommand("export", lazy("medseg.export", "export_cli"),
                           "Export a checkpoint to ONNX or TorchScript with its preprocessing.json."),
    "visualize": HydraCommand("visualize", lazy("medseg.visualize", "visualize_cli"),
                              "Write the attention maps of one voxel in every attention slot of a checkpoint."),
    "plan": HydraCommand("plan", _plan, "Print a dataset's fingerprint and the automatic plan."),
    "check-data": HydraCommand("check_data", _check_data,
                               "Verify every case of a dataset and report all problems (exit 1 on any error)."),
    "summarize": summarize,
}
"""``medseg <name>`` -> its command; ``scripts/<name with _ for ->.py`` runs the same one."""


def summary(command: Callable[[], int]) -> str:
    """A command's line in ``medseg --help``: a :class:`HydraCommand`'s summary, else its docstring's first line."""
    return command.summary if isinstance(command, HydraCommand) else (command.__doc__ or "").splitlines()[0]


def run_command(name: str) -> int:
    """``scripts/<name>.py``: the command ``name`` on the script's own command line."""
    return COMMANDS[name]()


def usage() -> str:
    """``medseg --help``: every command with the first line of its docstring."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary(command)}" for name, command in COMMANDS.items()]
    return ("usage: medseg <command> [arguments]\n\n"
            "The commands take the same arguments as scripts/<command>.py: `medseg <command> --help` lists them.\n\n"
            "commands:\n" + "\n".join(lines) + "\n\noptions:\n  -h, --help  this list\n  --version   medseg's version")


def main(argv: Sequence[str] | None = None) -> int:
    """``medseg <command> [arguments]``: run the command on ``arguments``, as ``scripts/<command>.py`` would."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 1
    if args[0] == "--version":
        print(f"medseg {__version__}")
        return 0
    name, *rest = args
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean {near[0]}?" if near else "."
        print(f"error: unknown command {name!r}{hint} Commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 1
    sys.argv = [f"medseg {name}", *rest]  # what the command's parser reads (and names itself by)
    return COMMANDS[name]()
