"""Plain-text and markdown tables for end-of-run summaries, evaluation and sweep reports."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def format_value(value: Any, digits: int = 4) -> str:
    """Floats to ``digits`` decimals (NaN as ``nan``), everything else as ``str``."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 4) -> str:
    """An aligned plain-text table, for the terminal."""
    cells = [[format_value(v, digits) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths)), line]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 4) -> str:
    """A GitHub-flavoured markdown table."""
    out = ["| " + " | ".join(map(str, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(format_value(v, digits) for v in row) + " |" for row in rows]
    return "\n".join(out)
