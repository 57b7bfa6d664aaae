"""``benchmark.py scaling``'s parts that need no prediction: nnU-Net's plans from a medseg config (nnU-Net's axis
order), the sweeps' bookkeeping (the shared point run once, a system's larger sizes skipped once the cap stopped it),
the memory cap on a process tree, the report and its figure; and, marked slow, a tiny medseg-only run."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import scaling
from benchmarks.cli import main
from benchmarks.common import OverCap, wait_under_cap
from benchmarks.scaling import (
    Measured,
    check_systems,
    nnunet_dataset_json,
    nnunet_plans,
    once,
    render_figure,
    sweep_points,
    sweep_rows,
    to_markdown,
    write_nnunet_model,
)

MEDSEG_CONFIG = {"model": {"channels": [8, 16, 32, 64], "strides": [2, [2, 2, 1], [2, 1, 1]], "kernel_size": 3},
                 "data": {"spacing": [0.8, 1.0, 2.5], "patch_size": [96, 80, 48]}}
"""A checkpoint's config as far as the plans read it, each axis (x, y, z) different so that an unreversed one shows."""


def test_nnunets_plans_hold_medsegs_network_and_window_with_the_axes_reversed() -> None:
    configuration = nnunet_plans(MEDSEG_CONFIG)["configurations"]["3d_fullres"]
    assert configuration["patch_size"] == [48, 80, 96], "SimpleITK's (z, y, x)"
    assert configuration["spacing"] == [2.5, 1.0, 0.8]
    assert configuration["normalization_schemes"] == ["ZScoreNormalization"] and configuration["use_mask_for_norm"] == [
        False], "medseg's zscore: the whole image's mean and std"
    arch = configuration["architecture"]
    assert arch["network_class_name"].endswith("unet.PlainConvUNet")
    kwargs = arch["arch_kwargs"]
    assert kwargs["n_stages"] == 4 and kwargs["features_per_stage"] == [8, 16, 32, 64]
    assert kwargs["strides"] == [[1, 1, 1], [2, 2, 2], [1, 2, 2], [1, 1, 2]], "none at the first stage, then (z, y, x)"
    assert kwargs["kernel_sizes"] == [[3, 3, 3]] * 4
    assert kwargs["n_conv_per_stage"] == [2] * 4 and kwargs["n_conv_per_stage_decoder"] == [2] * 3


def test_nnunets_dataset_json_names_medsegs_labels_and_channels() -> None:
    dataset = {"labels": {"0": "background", "1": "liver", "2": "spleen"}, "channel_names": ["CT"]}
    assert nnunet_dataset_json(dataset) == {"channel_names": {"0": "CT"},
                                            "labels": {"background": 0, "liver": 1, "spleen": 2},
                                            "numTraining": 0, "file_ending": ".nii.gz"}


def test_the_nnunet_model_folder_loads_as_nnunets_predictor_loads_it(tmp_path: Path) -> None:
    pytest.importorskip("nnunetv2", reason="nnU-Net v2 is an optional extra (peers)")
    import torch

    from benchmarks.long_scan import untrained_checkpoint
    from benchmarks.scan_prediction import NNUNET_CHECKPOINT_GLOBALS, nnunet_network

    ckpt = untrained_checkpoint(tmp_path / "medseg.pt", classes=3, patch=[32, 32, 16], channels=[4, 8])
    folder = write_nnunet_model(tmp_path / "nnunet", ckpt)
    plans, dataset = (json.loads((folder / name).read_text()) for name in ("plans.json", "dataset.json"))
    assert plans["configurations"]["3d_fullres"]["patch_size"] == [16, 32, 32]
    assert dataset["labels"] == {"background": 0, "structure 1": 1, "structure 2": 2}
    with torch.serialization.safe_globals(NNUNET_CHECKPOINT_GLOBALS):
        checkpoint = torch.load(folder / "fold_0" / "checkpoint_final.pth", weights_only=True)
    assert checkpoint["init_args"]["configuration"] == "3d_fullres" and checkpoint["trainer_name"] == "nnUNetTrainer"
    network = nnunet_network(plans, "3d_fullres", dataset)
    network.load_state_dict(checkpoint["network_weights"])  # strict: every weight of the network, nothing more
    assert network(torch.zeros(1, 1, 16, 32, 32)).shape == (1, 3, 16, 32, 32)


def grid(**changes: object) -> argparse.Namespace:
    return argparse.Namespace(**{"slices": [400, 60, 200], "classes": [30, 2], "at_slices": 60, "at_classes": 30,
                                 **changes})


def test_the_sweeps_share_one_point() -> None:
    args = grid()
    assert sweep_points("slices", args) == [(60, 30), (200, 30), (400, 30)]
    assert sweep_points("classes", args) == [(60, 2), (60, 30)]


def test_a_stopped_run_skips_the_larger_sizes_of_its_sweep_and_the_shared_point_runs_once() -> None:
    calls: list[tuple[str, int, int]] = []

    def measure(system: str, slices: int, classes: int) -> Measured:
        calls.append((system, slices, classes))
        stopped = system == "nnunet" and slices * classes >= 200 * 30
        return Measured(3.4, 12.5 if stopped else 2.0, stopped=stopped)

    measured = once(measure)
    args = grid()
    rows = [row for sweep in ("slices", "classes") for system in ("medseg", "nnunet")
            for row in sweep_rows(sweep, system, sweep_points(sweep, args), measured)]
    states = {(r["sweep"], r["system"], r["slices"], r["classes"]): r["state"] for r in rows}
    assert states[("slices", "nnunet", 60, 30)] == "done"
    assert states[("slices", "nnunet", 200, 30)] == "stopped: over cap at 3 s"
    assert states[("slices", "nnunet", 400, 30)] == "not run: over cap at 200"
    assert states[("slices", "medseg", 400, 30)] == "done"
    assert states[("classes", "nnunet", 60, 30)] == "done", "the classes sweep stops at its own sizes"
    assert calls.count(("medseg", 60, 30)) == 1 and calls.count(("nnunet", 60, 30)) == 1, "shared by both sweeps"
    assert ("nnunet", 400, 30) not in calls
    skipped = next(r for r in rows if r["state"].startswith("not run"))
    assert skipped["seconds"] is None and skipped["peak_gb"] is None


def test_a_class_sweep_names_the_class_count_it_stopped_at() -> None:
    rows = sweep_rows("classes", "nnunet", [(60, 2), (60, 30), (60, 100)],
                      lambda system, slices, classes: Measured(1.0, 1.0, stopped=classes == 30))
    assert [r["state"] for r in rows] == ["done", "stopped: over cap at 1 s", "not run: over cap at 30"]


def test_unknown_systems_are_refused_in_one_line() -> None:
    with pytest.raises(SystemExit, match="--systems monai: expected some of medseg, nnunet"):
        check_systems(["medseg", "monai"])


def test_nnunet_without_its_package_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scaling.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match=r'--systems nnunet: nnU-Net v2 is not installed: pip install -e "\.\[peers'):
        check_systems(["medseg", "nnunet"])


def sleeper(holding_mb: int, in_a_child: bool = False) -> list[str]:
    """A Python process that holds ``holding_mb`` MB (itself, or a process it starts) and then sleeps."""
    hold = f"b = bytearray({holding_mb} * 2**20); import time; time.sleep(600)"
    if in_a_child:
        hold = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {hold!r}]); time.sleep(600)"
    return [sys.executable, "-c", hold]


@pytest.mark.parametrize("in_a_child", [False, True], ids=["itself", "its child"])
def test_the_cap_kills_a_process_tree_that_holds_more_than_it(in_a_child: bool) -> None:
    process = subprocess.Popen(sleeper(400, in_a_child))
    with pytest.raises(OverCap) as stopped:
        wait_under_cap(process, 200 * 2**20, "sleeper")
    assert process.returncode == -9 and stopped.value.peak_bytes > 200 * 2**20


def test_a_process_under_the_cap_gives_its_exit_code() -> None:
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert wait_under_cap(process, 2**40, "exits") == 3


def report(cap_gb: float | None = 12.0) -> dict:
    runs = [{"sweep": "slices", "system": "medseg", "slices": 60, "classes": 30, "seconds": 10.0, "peak_gb": 1.5,
             "state": "done"},
            {"sweep": "slices", "system": "nnunet", "slices": 60, "classes": 30, "seconds": 8.0, "peak_gb": 12.3,
             "state": "stopped: over cap at 8 s"},
            {"sweep": "slices", "system": "nnunet", "slices": 200, "classes": 30, "seconds": None, "peak_gb": None,
             "state": "not run: over cap at 60"},
            {"sweep": "classes", "system": "medseg", "slices": 60, "classes": 30, "seconds": 10.0, "peak_gb": 1.5,
             "state": "done"}]
    meta = {"machine": "CPU, 2 threads", "torch": "2.x", "size": 512, "patch": [96, 96, 48], "channels": [8, 16],
            "slab_slices": 8, "cap_gb": cap_gb, "at_slices": 60, "at_classes": 30, "scan_spacing": [0.8, 0.8, 1.5],
            "network_spacing": [1.5, 1.5, 1.5], "overlap": 0.5, "systems": ["medseg", "nnunet"]}
    return {"meta": meta, "runs": runs}


def test_the_markdown_has_one_row_per_run_with_its_state() -> None:
    markdown = to_markdown(report())
    assert "| slices | nnunet | 60 | 30 | 8.0 | 12.30 | stopped: over cap at 8 s |" in markdown
    assert "| slices | nnunet | 200 | 30 |  |  | not run: over cap at 60 |" in markdown
    assert "runs stopped above 12 GB resident" in markdown
    assert "no memory cap" in to_markdown(report(cap_gb=None))


def test_the_figure_plots_time_and_memory_against_both_sweeps_with_the_cap() -> None:
    fig = render_figure(report())
    axes = fig.axes
    assert len(axes) == 4, "seconds and memory, each against slices and against classes"
    memory = axes[2]
    caps = [line for line in memory.get_lines() if line.get_label() == "cap 12 GB"]
    assert len(caps) == 1 and list(caps[0].get_ydata()) == [12.0, 12.0]
    stopped = next(line for line in memory.get_lines() if line.get_label() == "nnunet: stopped over the cap")
    assert list(stopped.get_xdata()) == [60] and list(stopped.get_ydata()) == [12.3]


@pytest.mark.slow
def test_the_scaling_benchmark_predicts_each_point_once_and_writes_its_report(tmp_path: Path) -> None:
    code = main(["scaling", "--size", "48", "--slices", "9", "14", "--classes", "2", "4", "--at-slices", "9",
                 "--at-classes", "4", "--systems", "medseg", "--patch", "32", "32", "16", "--channels", "4", "8",
                 "--slab-slices", "2", "--out", str(tmp_path)])
    assert code == 0
    rows = json.loads((tmp_path / "scaling.json").read_text())["runs"]
    assert [(r["sweep"], r["slices"], r["classes"]) for r in rows] == [
        ("slices", 9, 4), ("slices", 14, 4), ("classes", 9, 2), ("classes", 9, 4)]
    assert all(r["state"] == "done" and r["peak_gb"] > 0 for r in rows)
    assert sorted(p.name for p in tmp_path.glob("medseg_*")) == ["medseg_14x4", "medseg_9x2", "medseg_9x4"]
    assert (tmp_path / "scaling.png").stat().st_size > 0 and (tmp_path / "scaling.md").exists()
