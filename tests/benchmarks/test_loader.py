"""``benchmark.py loader`` on the tiny demo: every ``data.augment`` chain timed on the same cached cases, nnU-Net's
chain on the workers and on the device, nnU-Net v2's own loader where installed, and the workers a given training
step needs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.cli import main
from benchmarks.loader import NNUNET, nnunet_installed, write_nnunet_cases
from medseg.data.reading import IMAGE, LABEL
from medseg.data.transforms import AUGMENTATIONS


def test_every_chain_is_timed_per_patch_and_sized_for_a_step(tmp_path: Path, tiny_demo_root: Path) -> None:
    out = tmp_path / "out"
    code = main(["loader", f"data.root={tiny_demo_root}", "data.patch_size=[16,16,8]", "data.spacing=[1,1,2]",
                 "--patches", "4", "--warmup", "1", "--cases", "2", "--step", "0.001", "--batch", "2",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    report = json.loads((out / "loader.json").read_text())
    chains = {(row["augment"], row["where"]): row for row in report["chains"]}
    expected = {(name, "workers") for name in AUGMENTATIONS} | {("nnunet", "device")}
    expected |= {(NNUNET, "workers")} if nnunet_installed() else set()
    assert set(chains) == expected
    for (_name, where), row in chains.items():
        assert row["worker_cpu_ms_per_patch"] > 0
        assert math.isclose(row["patches_per_core_second"], 1000 / row["worker_cpu_ms_per_patch"])
        assert row["workers_for_step"] == math.ceil(row["worker_cpu_ms_per_patch"] / 1000 * 2 / 0.001)
        assert (row["device_ms_per_patch"] is not None and row["device_ms_per_patch"] > 0) == (where == "device")
    assert chains[("light", "workers")]["vs_light"] == 1.0
    (target,) = report["targets"]
    if nnunet_installed():
        assert target["value"] == pytest.approx(chains[("nnunet", "device")]["worker_cpu_ms_per_patch"]
                                                / chains[(NNUNET, "workers")]["worker_cpu_ms_per_patch"])
    else:
        assert target["value"] is None
    assert report["meta"]["patch"] == [16, 16, 8] and "loader data.root=" in report["meta"]["command"]
    assert report["provenance"]["machine"]["cpu_count"] and report["provenance"]["versions"]["torch"]
    assert (out / "loader.md").read_text().count("\n| ") == len(expected) + 1 + 2  # the chains, the target


@pytest.mark.skipif(not nnunet_installed(), reason="needs nnunetv2")
def test_nnunets_loader_reads_the_same_cases_in_its_axis_order(tmp_path: Path) -> None:
    """The cases nnU-Net's loader reads are medseg's, the slice axis moved first, with nnU-Net's class locations
    (a channel index first, then the voxel)."""
    from nnunetv2.training.dataloading.nnunet_dataset import nnUNetDatasetNumpy

    image = torch.arange(2 * 4 * 5 * 3, dtype=torch.float32).reshape(2, 4, 5, 3)
    label = torch.zeros(1, 4, 5, 3, dtype=torch.int8)
    label[0, 1, 2, 0] = 1
    (identifier,) = write_nnunet_cases([{IMAGE: image, LABEL: label}], tmp_path, slice_axis=2)
    data, seg, _, properties = nnUNetDatasetNumpy(str(tmp_path), [identifier]).load_case(identifier)
    np.testing.assert_array_equal(data, image.permute(0, 3, 1, 2).numpy())
    np.testing.assert_array_equal(seg, label.permute(0, 3, 1, 2).numpy())
    np.testing.assert_array_equal(properties["class_locations"][1], [[0, 0, 1, 2]])
