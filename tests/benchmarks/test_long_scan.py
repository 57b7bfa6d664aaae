"""``benchmark.py long_scan`` on tiny scans: it builds its CT and its untrained checkpoint, predicts each length in a
process of its own slab by slab (and one length as a whole scan), and reports the peak RSS and the agreement."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np

from benchmarks.cli import main
from benchmarks.long_scan import SCAN_SPACING, synthetic_ct


def test_the_synthetic_ct_is_air_around_a_body(tmp_path: Path) -> None:
    image = nib.load(synthetic_ct(tmp_path / "ct.nii.gz", slices=3, size=40))
    data = np.asarray(image.dataobj)
    assert data.shape == (40, 40, 3) and data.dtype == np.int16
    assert np.allclose(nib.affines.voxel_sizes(image.affine), SCAN_SPACING)
    assert data[0, 0, 0] == -1000 and data[20, 20, 1] > -200, "air in the corner, tissue in the middle"


def test_the_long_scan_benchmark_reports_peak_ram_per_length_and_the_whole_scans_agreement(tmp_path: Path) -> None:
    code = main(["long_scan", "--size", "48", "--slices", "9", "14", "--whole", "9", "--classes", "4",
                 "--patch", "32", "32", "16", "--channels", "4", "8", "--slab-slices", "2", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "long_scan.json").read_text())
    rows = {row["slices"]: row for row in report["runs"]}
    assert sorted(rows) == [9, 14] and all(row["slab_peak_gb"] > 0 for row in rows.values())
    assert rows[9]["voxels_differing"] == 0 and rows[9]["min_dice"] == 1.0, "slab by slab is the whole scan's"
    assert rows[14]["whole_peak_gb"] is None
    assert "| 14 |" in (tmp_path / "long_scan.md").read_text()
