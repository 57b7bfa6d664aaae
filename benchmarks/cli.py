"""Benchmarks behind ``scripts/benchmark.py``, one module per subcommand.

To add a subcommand ``<name>``: write ``medseg/benchmark/<name>.py`` with a function
``add_subcommand(subparsers)`` that adds its parser and sets ``func`` (``args -> exit code``) as a
default, then add ``"<name>"`` to :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from medseg.io import atomic_write_json, atomic_write_text
from medseg.tables import markdown_table

SUBCOMMANDS: tuple[str, ...] = ("attention", "models", "quality", "peers", "gpu", "prediction", "scan_prediction")


def targets_markdown(targets: Sequence[Mapping[str, Any]], value_format: str = ".3g") -> str:
    """The markdown table of a report's targets (``Target`` as dicts): label, value, goal, and whether it is met."""
    met = {True: "yes", False: "**no**", None: "n/a"}
    rows = [[t["label"], t["value"], f"{t['relation']} {t['goal']:g}", met[t["met"]]] for t in targets]
    return markdown_table(["target", "value", "goal", "met"], rows, formats={"value": value_format}, missing="n/a")


def write_report(out: Path | None, name: str, markdown: str, report: Mapping[str, Any]) -> None:
    """Write ``<out>/<name>.md`` and ``<out>/<name>.json`` (atomically; nothing when ``out`` is None)."""
    if out is not None:
        atomic_write_text(out / f"{name}.md", markdown)
        atomic_write_json(out / f"{name}.json", report)


def build_parser() -> argparse.ArgumentParser:
    """The benchmarks' parser (``scripts/benchmark.py``, ``medseg benchmark``) with one sub-parser per entry of
    :data:`SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(description="medseg benchmarks")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_subcommand(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns its exit code."""
    args = build_parser().parse_args(argv)
    return args.func(args)
