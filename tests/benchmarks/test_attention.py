"""The attention benchmark runs end to end in --quick mode."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.cli import main
from benchmarks.common import peak_bytes
from medseg.attention import ATTENTION_BLOCKS, available_blocks
from medseg.models.inspect import has_attention_rows


def test_quick_attention_benchmark(tmp_path: Path) -> None:
    assert main(["attention", "--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "attention.json").read_text())
    rows = {r["block"] for r in report["results"]}
    assert rows == {*available_blocks(), "masa_naive", "sdpa"}
    assert all(r["status"] == "ok" and r["time_ms"] > 0 for r in report["results"])
    mixing = [r for r in report["results"] if getattr(ATTENTION_BLOCKS.get(r["block"]), "mixes_tokens", True)]
    assert {r["block"] for r in mixing} == rows - {"identity"}  # the identity allocates nothing
    assert all(r["peak_mib"] > 0 for r in mixing)
    assert all(d["value"] < 1e-5 for d in report["max_abs_diff_masa_vs_naive"])
    markdown = (tmp_path / "attention.md").read_text()
    assert "masa_naive" in markdown and "## targets" in markdown


def test_quick_maps_benchmark_measures_every_blocks_attention_row(tmp_path: Path) -> None:
    assert main(["attention", "--maps", "--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "attention_maps.json").read_text())
    assert {(r["block"], tuple(r["shape"])) for r in report["results"]} == {
        (name, shape) for name in available_blocks() for shape in [(4, 4, 4), (6, 6)]
    }
    with_rows = [r for r in report["results"] if has_attention_rows(ATTENTION_BLOCKS[r["block"]])]
    assert with_rows and all(r["status"] == "ok" and 0 < r["peak_mib"] < 1 for r in with_rows)
    assert "## targets" in (tmp_path / "attention_maps.md").read_text()


def test_cpu_peak_counts_allocations_and_frees_in_time_order() -> None:
    mib = 2**20

    def allocate() -> list[torch.Tensor]:
        first = torch.empty(mib, dtype=torch.uint8)
        second = torch.empty(2 * mib, dtype=torch.uint8)  # 3 MiB alive: the peak
        del first
        return [second, torch.empty(mib // 2, dtype=torch.uint8)]  # 2.5 MiB alive

    peak, out = peak_bytes(allocate, torch.device("cpu"))
    assert peak == 3 * mib and [t.numel() for t in out] == [2 * mib, mib // 2]
    peak, _ = peak_bytes(lambda: [torch.empty(mib, dtype=torch.uint8) for _ in range(4)], torch.device("cpu"))
    assert peak == 4 * mib  # all four alive in the list

    def churn() -> None:
        for _ in range(4):
            block = torch.empty(mib, dtype=torch.uint8)
            del block  # freed before the next

    assert peak_bytes(churn, torch.device("cpu"))[0] == mib
