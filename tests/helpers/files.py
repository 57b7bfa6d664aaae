"""Reading back the files medseg writes."""

from __future__ import annotations

import csv
from pathlib import Path


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header, every value as written."""
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))
