"""Tables for people: one renderer, two outputs (aligned plain text for the terminal, GitHub markdown for files).

Every table medseg prints or writes (the end-of-run summary, evaluation, sweep reports, the dataset plan, the
benchmarks) goes through :func:`text_table` or :func:`markdown_table`, so cells are formatted and aligned the
same way everywhere:

* a cell is formatted by its column's entry in ``formats`` (keyed by header): a format spec for numbers
  (``".1f"``, ``","``, ``".3g"``, ``".2%"``) or a function of the value; without one, by :func:`format_value`.
  ``None`` is a blank cell (``missing``); a line break inside a cell becomes a space.
* a column whose cells are all numbers (blanks aside) is right-aligned, any other left-aligned, unless
  ``align`` gives one character per column: ``<`` left, ``>`` right.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

CellFormat = str | Callable[[Any], str]
"""How one column shows its values: a format spec for numbers, or a function of the value."""


def format_value(value: Any, digits: int = 4) -> str:
    """Floats to ``digits`` decimals (NaN as ``nan``), everything else as ``str``."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def is_number(value: Any) -> bool:
    """True for ints and floats (numpy's too), False for booleans and everything else."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def format_cell(value: Any, fmt: CellFormat | None = None, digits: int = 4, missing: str = "") -> str:
    """A cell's text: ``missing`` for None, else by ``fmt`` (a spec applies to numbers only) or :func:`format_value`."""
    if value is None:
        return missing
    if callable(fmt):
        return fmt(value)
    if fmt is not None and is_number(value):
        return format(value, fmt)
    return format_value(value, digits)


def _layout(headers: Sequence[str], rows: Sequence[Sequence[Any]], formats: Mapping[str, CellFormat] | None,
            align: str | None, digits: int, missing: str) -> tuple[list[list[str]], list[bool]]:
    """The formatted cells of ``rows`` and, per column, whether it is right-aligned."""
    for index, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"table row {index} has {len(row)} cells for {len(headers)} columns: {row!r}")
    if align is not None and (len(align) != len(headers) or set(align) - {"<", ">"}):
        raise ValueError(f"align={align!r}: expected one '<' or '>' per column ({len(headers)})")
    formats = formats or {}
    cells = [[" ".join(format_cell(value, formats.get(header), digits, missing).splitlines())
              for header, value in zip(headers, row)] for row in rows]
    if align is not None:
        return cells, [char == ">" for char in align]
    present = [[row[i] for row in rows if row[i] is not None and row[i] != ""] for i in range(len(headers))]
    return cells, [bool(values) and all(map(is_number, values)) for values in present]


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *,
               formats: Mapping[str, CellFormat] | None = None, align: str | None = None, digits: int = 4,
               missing: str = "", indent: str = "") -> str:
    """An aligned plain-text table for the terminal: header, a rule of dashes, one line per row.

    Args:
        headers: the column titles.
        rows: one sequence of values per row, as many as ``headers``.
        formats: per-column cell formats, keyed by header (see the module docstring).
        align: one ``<`` (left) or ``>`` (right) per column; None: numbers right, the rest left.
        digits: decimals of floats in columns without a format.
        missing: the text of None cells.
        indent: put in front of every line.

    Raises:
        ValueError: a row with another number of cells than ``headers``, or a malformed ``align``.
    """
    cells, right = _layout(headers, rows, formats, align, digits, missing)
    widths = [max([len(header), *(len(row[i]) for row in cells)]) for i, header in enumerate(headers)]

    def line(texts: Sequence[str]) -> str:
        padded = (text.rjust(width) if r else text.ljust(width) for text, width, r in zip(texts, widths, right))
        return (indent + "  ".join(padded)).rstrip()

    return "\n".join([line(headers), line(["-" * width for width in widths]), *map(line, cells)])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *,
                   formats: Mapping[str, CellFormat] | None = None, align: str | None = None, digits: int = 4,
                   missing: str = "") -> str:
    """A GitHub-flavoured markdown table (``|`` inside a cell escaped); the arguments of :func:`text_table`."""
    cells, right = _layout(headers, rows, formats, align, digits, missing)

    def line(texts: Sequence[str]) -> str:
        return "| " + " | ".join(text.replace("|", r"\|") for text in texts) + " |"

    rule = "|" + "|".join("---:" if r else "---" for r in right) + "|"
    return "\n".join([line(headers), rule, *map(line, cells)])


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation of the finite values (std 0 for one value, NaN for none)."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan, math.nan
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0



def format_mean_std(values: Sequence[float], digits: int = 4) -> str:
    """``"0.8123 ± 0.0101"``, or ``"nan"`` when no value is finite."""
    mean, std = mean_std(values)
    return "nan" if math.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"
