"""``benchmark.py peers``: nnU-Net's layout of a medseg dataset, the report, the process-tree memory, and (slow, with
the ``peers`` extra) a one-minute run of every system on a tiny dataset."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from benchmarks.cli import main
from benchmarks.peers import (
    SystemResult,
    nnunet_plan,
    plan_differences,
    seconds_to_reach,
    to_markdown,
    tree_rss_bytes,
    write_nnunet_raw,
)
from medseg.data.datalist import load_dataset


def test_tree_rss_counts_the_children(tmp_path: Path) -> None:
    alone = tree_rss_bytes(os.getpid())
    assert alone > 10 * 2**20  # this interpreter with torch loaded
    # the child says when it has touched its 200 MB, then waits for its stdin to close
    with subprocess.Popen([sys.executable, "-c", "import sys; x = bytearray(200 * 2**20); print('touched', "
                           "flush=True); sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as child:
        try:
            assert child.stdout.readline() == "touched\n"
            assert tree_rss_bytes(os.getpid()) - alone > 150 * 2**20
        finally:
            child.kill()


def test_nnunet_layout_links_every_case_and_splits_4d_images(tmp_path: Path, tiny_demo_root: Path) -> None:
    info = load_dataset(tiny_demo_root)
    folder = write_nnunet_raw(info, tmp_path / "raw")
    meta = json.loads((folder / "dataset.json").read_text())
    assert meta["numTraining"] == len(info.training) and meta["file_ending"] == ".nii.gz"
    assert meta["labels"] == {name: value for value, name in info.labels.items()}
    case = info.training[0]
    image = folder / "imagesTr" / f"{case['case']}_0000.nii.gz"
    assert image.is_symlink() and image.resolve() == Path(case["image"]).resolve()
    assert (folder / "labelsTr" / f"{case['case']}.nii.gz").resolve() == Path(case["label"]).resolve()
    assert write_nnunet_raw(info, tmp_path / "raw") == folder, "written again over itself (more folds, one output)"
    assert image.resolve() == Path(case["image"]).resolve()

    # a two-channel MSD case is one 4D file: nnU-Net wants one file per channel
    msd = tmp_path / "msd"
    (msd / "imagesTr").mkdir(parents=True)
    (msd / "labelsTr").mkdir()
    volume, affine = np.stack([np.full((4, 5, 6), c, np.float32) for c in (1.0, 2.0)], axis=-1), np.diag([2.0, 1, 1, 1])
    nib.save(nib.Nifti1Image(volume, affine), msd / "imagesTr" / "a.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros((4, 5, 6), np.uint8), affine), msd / "labelsTr" / "a.nii.gz")
    (msd / "dataset.json").write_text(json.dumps({
        "name": "two", "modality": {"0": "T1", "1": "T2"}, "labels": {"0": "background", "1": "x"},
        "training": [{"image": "./imagesTr/a.nii.gz", "label": "./labelsTr/a.nii.gz"}], "test": []}))
    folder = write_nnunet_raw(load_dataset(msd), tmp_path / "raw2")
    for channel, value in enumerate((1.0, 2.0)):
        split = nib.load(folder / "imagesTr" / f"a_{channel:04d}.nii.gz")
        assert split.shape == (4, 5, 6) and np.all(np.asarray(split.dataobj) == value)


def _result(system: str, dice: float, patch: list[int], curve: list[tuple[float, float]] | None = None) -> SystemResult:
    return SystemResult(
        system=system, dice={"organ": dice}, hd95_mm={"organ": 2.0}, mean_dice=dice,
        dice_empty_left_out={"organ": dice - 0.1},
        detection={"organ": {"lesions": 4, "found": 3, "sensitivity": 0.75, "false_positives_per_case": 0.5,
                             "dice_per_lesion": 0.625}},
        seconds={"training": 60.0, "total": 90.0}, steps=10, step_seconds=6.0, peak_ram_gb=1.5,
        plan={"target spacing (mm)": [1, 1, 1], "patch size": patch, "pooling per axis": [[2, 2, 2]],
              "features per stage": [32, 64], "normalisation": "zscore", "batch size (patches)": 2,
              "epochs x iterations": "5 x 2"},
        curve=curve or [])


def test_report_names_each_plan_difference_and_the_time_to_reach_nnunet() -> None:
    nnunet = _result("nnunet", 0.80, [64, 64, 64])
    medseg = _result("medseg", 0.85, [48, 48, 48], curve=[(10.0, 0.5), (20.0, 0.81), (30.0, 0.85)])
    (sentence,) = plan_differences([nnunet, medseg])
    assert sentence.startswith("**patch size**: nnU-Net [64, 64, 64], medseg [48, 48, 48]")
    assert seconds_to_reach(medseg.curve, 0.80) == 20.0
    assert seconds_to_reach(medseg.curve, 0.9) is None
    markdown = to_markdown({"dataset": "d", "fold": 0, "budget_minutes": 1.0, "machine": "m", "num_train": 6,
                            "num_val": 2}, [nnunet, medseg])
    assert "| medseg | 0.85" in markdown
    assert "| medseg | organ | 0.8500 | 0.7500 | 3 of 4 | 0.7500 | 0.5000 | 0.6250 |" in markdown, "the lesions table"
    assert "medseg: validation Dice during training reached nnunet's final 0.8000 after 20 s" in markdown


def test_every_nnunet_configuration_is_cross_checked_and_the_best_one_is_the_mark() -> None:
    nnunet, nnunet_2d = _result("nnunet", 0.80, [64, 64, 64]), _result("nnunet_2d", 0.82, [256, 256])
    for result in (nnunet, nnunet_2d):
        result.notes = [f"{result.system} agrees"]
    medseg = _result("medseg", 0.85, [48, 48, 48], curve=[(10.0, 0.5), (20.0, 0.81), (30.0, 0.85)])
    markdown = to_markdown({"dataset": "d", "fold": 0, "budget_minutes": 1.0, "machine": "m", "num_train": 6,
                            "num_val": 2}, [nnunet, nnunet_2d, medseg])
    assert "- nnunet: nnunet agrees" in markdown and "- nnunet_2d: nnunet_2d agrees" in markdown
    assert "medseg: validation Dice during training reached nnunet_2d's final 0.8200 after 30 s" in markdown


def test_nnunet_plan_in_medseg_terms() -> None:
    plans = {"spacing": [5.0, 0.7, 0.7], "patch_size": [20, 160, 192], "normalization_schemes": ["CTNormalization"],
             "batch_size": 2, "architecture": {"arch_kwargs": {"strides": [[1, 1, 1], [1, 2, 2], [2, 2, 2]],
                                                               "features_per_stage": [32, 64, 128]}}}
    plan = nnunet_plan(plans, {"epochs": 3, "iterations_per_epoch": 250})
    assert plan["target spacing (mm)"] == [0.7, 0.7, 5.0] and plan["patch size"] == [192, 160, 20]  # (x, y, z)
    assert plan["pooling per axis"] == [[2, 2, 1], [2, 2, 2]] and plan["normalisation"] == ["ct"]
    assert plan["epochs x iterations"] == "3 x 250"


def test_bad_arguments_stop_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match="unknown argument 'trainer.lr'"):
        main(["peers", "trainer.lr=1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="systems=foo"):
        main(["peers", "data.root=x", "systems=foo", "--out", str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[peers\]"'):
        main(["peers", "data.root=x", "--out", str(tmp_path)])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("nnunetv2") is None, reason="needs the peers extra (nnunetv2)")
def test_one_minute_of_every_system_on_a_tiny_dataset(tmp_path: Path, tiny_demo_root: Path) -> None:
    assert main(["peers", f"data.root={tiny_demo_root}", "budget_minutes=1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "peers.json").read_text())
    (tmp_path / "peers.json").unlink()
    assert main(["peers", f"data.root={tiny_demo_root}", "--collect", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "peers.json").read_text())["results"] == report["results"]  # rebuilt as it was
    systems = {r["system"]: r for r in report["results"]}
    assert set(systems) == {"nnunet", "medseg", "medseg_masa"}
    for result in systems.values():
        assert 0.0 <= result["mean_dice"] <= 1.0 and result["steps"] > 0 and result["peak_ram_gb"] > 0.1
        assert result["seconds"]["training"] < 60.0 * 1.5  # the budget, give or take the last epoch
    assert "nnunet: nnU-Net's own evaluator" in (tmp_path / "peers.md").read_text()
