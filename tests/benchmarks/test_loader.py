"""``benchmark.py loader`` on the tiny demo: every ``data.augment`` chain timed on the same cached cases, and the
workers a given training step needs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.cli import main
from medseg.data.transforms import AUGMENTATIONS


def test_every_chain_is_timed_per_patch_and_sized_for_a_step(tmp_path: Path, tiny_demo_root: Path) -> None:
    out = tmp_path / "out"
    code = main(["loader", f"data.root={tiny_demo_root}", "data.patch_size=[16,16,8]", "data.spacing=[1,1,2]",
                 "--patches", "4", "--warmup", "1", "--cases", "2", "--step", "0.001", "--batch", "2",
                 "--out", str(out)])
    assert code == 0
    report = json.loads((out / "loader.json").read_text())
    chains = {row["augment"]: row for row in report["chains"]}
    assert set(chains) == set(AUGMENTATIONS)
    for row in chains.values():
        assert row["cpu_ms_per_patch"] > 0
        assert math.isclose(row["patches_per_core_second"], 1000 / row["cpu_ms_per_patch"])
        assert row["workers_for_step"] == math.ceil(row["cpu_ms_per_patch"] / 1000 * 2 / 0.001)
    assert chains["light"]["vs_light"] == 1.0
    assert report["meta"]["patch"] == [16, 16, 8] and "loader data.root=" in report["meta"]["command"]
    assert (out / "loader.md").read_text().count("\n| ") == len(AUGMENTATIONS) + 1
