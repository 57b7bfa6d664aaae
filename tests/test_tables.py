"""The table renderer: every cell shown by its column's format, columns aligned, markdown that parses back."""

from __future__ import annotations

import math

import numpy as np
import pytest

from medseg.tables import format_cell, markdown_table, text_table

HEADERS = ["model", "params", "dice", "seconds"]
ROWS = [["unet+masa", 1_848_403, 0.81234, 12.04], ["monai_unet", 1_190_000, math.nan, None],
        ["a longer model name", 7, 0.5, 3.5]]
FORMATS = {"params": ",", "seconds": ".1f"}


def expected_cells(row: list) -> list[str]:
    """The cells of ``row`` written out by hand from the formats above (Dice: the default 4 decimals)."""
    name, params, dice, seconds = row
    return [name, f"{params:,}", "nan" if math.isnan(dice) else f"{dice:.4f}",
            "" if seconds is None else f"{seconds:.1f}"]


def column_spans(rule: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of dashes in a text table's rule line."""
    spans, start = [], None
    for index, char in enumerate(rule + " "):
        if char == "-" and start is None:
            start = index
        elif char != "-" and start is not None:
            spans.append((start, index))
            start = None
    return spans


def test_text_table_shows_every_cell_in_its_column() -> None:
    lines = text_table(HEADERS, ROWS, formats=FORMATS, indent="  ").splitlines()
    assert len(lines) == 2 + len(ROWS) and all(line.startswith("  ") for line in lines)
    spans = column_spans(lines[1])
    assert len(spans) == len(HEADERS)
    for line, cells in zip(lines[2:], map(expected_cells, ROWS)):
        padded = line.ljust(spans[-1][1])
        shown = [padded[start:end] for start, end in spans]
        assert [text.strip() for text in shown] == cells
        assert shown[0] == cells[0].ljust(len(shown[0]))  # text left-aligned
        assert all(text == cell.rjust(len(text)) for text, cell in zip(shown[1:], cells[1:]))  # numbers right
    assert [lines[0][start:end].strip() for start, end in spans] == HEADERS
    assert all(line == line.rstrip() for line in lines)


def test_markdown_table_parses_back_with_numeric_columns_right_aligned() -> None:
    lines = markdown_table(HEADERS, [*ROWS, ["x | y", 1, 0.0, 1.0]], formats=FORMATS).splitlines()

    def cells(line: str) -> list[str]:
        return [cell.strip().replace(r"\|", "|") for cell in line.strip("|").split(" | ")]

    assert cells(lines[0]) == HEADERS
    assert lines[1].strip("|").split("|") == ["---", "---:", "---:", "---:"]  # text left, numbers right
    assert [cells(line) for line in lines[2:]] == [*map(expected_cells, ROWS), expected_cells(["x | y", 1, 0.0, 1.0])]


def test_alignment_can_be_chosen_and_blanks_do_not_decide_it() -> None:
    rows = [["a", "OOM", 1.0], ["b", 2.5, ""]]
    rule = markdown_table(["name", "time", "ratio"], rows).splitlines()[1]
    assert rule == "|---|---|---:|"  # "OOM" makes time a text column; the blank leaves ratio numeric
    chosen = markdown_table(["name", "time", "ratio"], rows, align="<><").splitlines()[1]
    assert chosen == "|---|---:|---|"
    with pytest.raises(ValueError, match="align"):
        text_table(["name", "time"], [], align="<")


def test_cells_formats_and_line_breaks() -> None:
    assert format_cell(None, missing="n/a") == "n/a"
    assert format_cell(np.float32(0.25), ".0%") == "25%" and format_cell(np.int64(1234), ",") == "1,234"
    assert format_cell("text", ".3g") == "text"  # a number format leaves text alone
    assert format_cell(True, ".3g") == "True"
    assert format_cell([1, 2], lambda value: "+".join(map(str, value))) == "1+2"
    table = text_table(["reason"], [["first line\nsecond line"]])
    assert table.splitlines()[-1] == "first line second line"


def test_rows_must_match_the_headers() -> None:
    with pytest.raises(ValueError, match="row 1 has 1 cells for 2 columns"):
        markdown_table(["a", "b"], [[1, 2], [3]])
    assert text_table(["only", "headers"], []).splitlines()[0].split() == ["only", "headers"]
