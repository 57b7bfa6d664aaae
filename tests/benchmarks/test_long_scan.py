"""``benchmark.py long_scan`` on tiny scans: it builds its CT, its labels and its untrained checkpoint, predicts each
length in a process of its own slab by slab (and one length as a whole scan, one evaluated against its labels), and
reports the peak RSS and the agreement."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from benchmarks.cli import main
from benchmarks.long_scan import SCAN_SPACING, synthetic_ct, synthetic_labels


def test_the_synthetic_ct_is_air_around_a_body(tmp_path: Path) -> None:
    image = nib.load(synthetic_ct(tmp_path / "ct.nii.gz", slices=3, size=40))
    data = np.asarray(image.dataobj)
    assert data.shape == (40, 40, 3) and data.dtype == np.int16
    assert np.allclose(nib.affines.voxel_sizes(image.affine), SCAN_SPACING)
    assert data[0, 0, 0] == -1000 and data[20, 20, 1] > -200, "air in the corner, tissue in the middle"


def test_the_synthetic_labels_cut_the_body_into_one_sector_per_class(tmp_path: Path) -> None:
    size, slices, classes = 60, 3, 5
    image = nib.load(synthetic_ct(tmp_path / "ct.nii.gz", slices=slices, size=size))
    labels = nib.load(synthetic_labels(tmp_path / "labels.nii.gz", slices, classes, size))
    data = np.asarray(labels.dataobj)
    assert data.shape == (size, size, slices) and data.dtype == np.uint8 and np.allclose(labels.affine, image.affine)
    assert np.array_equal(data > 0, np.asarray(image.dataobj) > -1000), "the labels cover the body"
    assert (data == data[..., :1]).all(), "the same in every slice"
    counts = np.bincount(data[..., 0].ravel(), minlength=classes)[1:]
    assert len(counts) == classes - 1 and counts.min() > 0.9 * counts.max(), "four sectors of about equal size"
    below, above = size // 2 - 1, size // 2  # y just below and just above 0
    assert data[5, above, 0] == 0 and data[12, below, 0] == 1 and data[12, above, 0] == 4, (
        "counter-clockwise from -x: the first sector just below the -x axis, the last just above it")


@pytest.mark.full
def test_the_long_scan_benchmark_reports_peak_ram_per_length_and_the_whole_scans_agreement(tmp_path: Path) -> None:
    code = main(["long_scan", "--size", "48", "--slices", "9", "14", "--whole", "9", "--evaluate", "9",
                 "--classes", "4", "--patch", "32", "32", "16", "--channels", "4", "8", "--slab-slices", "2",
                 "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "long_scan.json").read_text())
    rows = {row["slices"]: row for row in report["runs"]}
    assert sorted(rows) == [9, 14] and all(row["slab_peak_gb"] > 0 for row in rows.values())
    assert rows[9]["voxels_differing"] == 0 and rows[9]["min_dice"] == 1.0, "slab by slab is the whole scan's"
    assert rows[14]["whole_peak_gb"] is None and rows[14]["evaluate_peak_gb"] is None
    assert rows[9]["evaluate_peak_gb"] > 0, "evaluate measured in a process of its own"
    with (tmp_path / "9_evaluate" / "prediction" / "metrics.csv").open() as handle:
        scored = list(csv.DictReader(handle))
    assert [row["class_name"] for row in scored] == ["structure 1", "structure 2", "structure 3"]
    assert all(float(row["ref_ml"]) > 0 for row in scored), "every class is in the labels"
    assert "| 14 |" in (tmp_path / "long_scan.md").read_text()
