"""The attention benchmark runs end to end in --quick mode."""

from __future__ import annotations

import json
from pathlib import Path

from medseg.attention import available_blocks
from medseg.benchmark import main


def test_quick_attention_benchmark(tmp_path: Path) -> None:
    assert main(["attention", "--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "attention.json").read_text())
    rows = {r["block"] for r in report["results"]}
    assert rows == {*available_blocks(), "masa_naive", "sdpa"}
    assert all(r["status"] == "ok" and r["time_ms"] > 0 and r["peak_mib"] > 0 for r in report["results"])
    assert all(d["value"] < 1e-5 for d in report["max_abs_diff_masa_vs_naive"])
    markdown = (tmp_path / "attention.md").read_text()
    assert "masa_naive" in markdown and "## targets" in markdown
