"""``benchmark.py long_scan``: the peak RAM of predicting long scans with many classes on the CPU, against the scan's
length (``medseg predict`` as users run it, each prediction a process of its own).

``python scripts/benchmark.py long_scan [--slices 100 200 400] [--classes 30] [--whole 100] [--evaluate 400]``

It builds what it needs: a synthetic CT of 512 x 512 x N voxels (``--size``) of 0.8 x 0.8 x 1.5 mm (int16 HU: air
around an elliptic body of soft tissue with denser organs and noise), and an untrained checkpoint of a 3D U-Net with
``--classes`` outputs (background included) planned at 1.5 mm isotropic, TotalSegmentator's spacing, so the
probabilities are resampled back to the scan's grid (random weights: the memory and the work are those of a trained
network, the segmentation is noise). Each run is ``medseg.inference.predict.predict`` (``medseg predict``'s task:
read, preprocess, sliding windows, resampling back, the label map written) in its own process
(``python -m benchmarks.long_scan SPEC RESULT``), with its peak RSS measured by
:class:`medseg.runtime.host_memory.PeakRam` and its seconds. ``--whole`` also predicts those lengths with
``inference.slab_slices=null`` (the whole scan at once: the probabilities of every voxel and class held), and the
report gives the Dice per class of the slab-wise label map against it (target >= 0.999) and the voxels that differ.
``--evaluate`` runs ``medseg evaluate`` (:func:`medseg.evaluation.evaluate.evaluate`: the prediction, then every
class scored against the label) on those lengths, in a process of its own too, with a label map of ``--classes - 1``
structures written beside the scan (``scan_N/imagesTs/`` and ``scan_N/labelsTs/``: the body cut into sectors around
its axis, one class each). The goals: predict within 3 GB at 400 slices and 4 GB at 1000, evaluate within 3 GB at
400 slices (512 x 512, 30 classes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import (
    add_results_argument,
    compose_train_config,
    machine,
    run_child,
    targets_markdown,
    write_report,
)
from medseg.config import SLAB_SLICES
from medseg.io import atomic_write_json
from medseg.tables import markdown_table

DEFAULT_OUT = Path("outputs/benchmark/long_scan")
SCAN_SPACING = (0.8, 0.8, 1.5)
"""The synthetic CT's voxel size (mm)."""
NETWORK_SPACING = (1.5, 1.5, 1.5)
"""The checkpoint's planned spacing (mm)."""
RAM_TARGETS_GB = {"predict": {400: 3.0, 1000: 4.0}, "evaluate": {400: 3.0}}
"""Command -> scan length -> the goal for its peak RSS (GB), on 512 x 512 slices with 30 classes."""
TARGET_SIZE = 512
TARGET_CLASSES = 30
DICE_TARGET = 0.999


def synthetic_ct(path: Path, slices: int, size: int = 512, seed: int = 0) -> Path:
    """A ``size x size x slices`` int16 CT in HU (:data:`SCAN_SPACING`): -1000 air around an elliptic body of 40 HU
    soft tissue, with a denser ellipse (organs) and noise of 20 HU."""
    import nibabel as nib

    rng = np.random.default_rng(seed)
    x, y = np.meshgrid(np.linspace(-1, 1, size), np.linspace(-1, 1, size), indexing="ij")
    body = (x / 0.8) ** 2 + (y / 0.6) ** 2 < 1
    organs = ((x - 0.2) / 0.3) ** 2 + (y / 0.25) ** 2 < 1
    data = np.full((size, size, slices), -1000, np.int16)
    for z in range(slices):
        plane = np.where(organs, 120, 40) + rng.normal(0, 20, body.shape)
        data[..., z][body] = plane[body].astype(np.int16)
    affine = np.diag([*SCAN_SPACING, 1.0])
    nib.save(nib.Nifti1Image(data, affine), path)
    return path


def synthetic_labels(path: Path, slices: int, classes: int, size: int = 512) -> Path:
    """The uint8 label map of :func:`synthetic_ct`'s scan: its body cut into ``classes - 1`` equal sectors around
    its axis, class ``k`` the ``k``-th counter-clockwise from the -x direction, the same in every slice; 0 outside."""
    import nibabel as nib

    x, y = np.meshgrid(np.linspace(-1, 1, size), np.linspace(-1, 1, size), indexing="ij")
    body = (x / 0.8) ** 2 + (y / 0.6) ** 2 < 1
    sector = np.minimum(((np.arctan2(y, x) + np.pi) / (2 * np.pi) * (classes - 1)).astype(np.uint8), classes - 2)
    plane = np.where(body, sector + 1, 0).astype(np.uint8)
    data = np.repeat(plane[..., None], slices, axis=2)
    nib.save(nib.Nifti1Image(data, np.diag([*SCAN_SPACING, 1.0])), path)
    return path


def untrained_checkpoint(path: Path, classes: int, patch: Sequence[int], channels: Sequence[int]) -> Path:
    """A checkpoint as training writes it, of an untrained 3D U-Net with ``classes`` outputs on windows of ``patch``
    voxels at :data:`NETWORK_SPACING` (random weights, seed 0)."""
    from medseg.config import DataConfig
    from medseg.data.transforms import window
    from medseg.models import build_model
    from medseg.runs.checkpoint import save_checkpoint
    from medseg.training.checks import check_config

    strides = [2] * (len(channels) - 1)
    cfg = asdict(check_config(compose_train_config(["output_dir=unused"])))
    cfg["model"].update(spatial_dims=3, channels=list(channels), strides=strides, bottleneck="none", decoder="none",
                        decoder_levels=0, deep_supervision=False)
    cfg["data"].update(spacing=list(NETWORK_SPACING), patch_size=list(patch), normalization="zscore")
    labels = {"0": "background", **{str(k): f"structure {k}" for k in range(1, classes)}}
    torch.manual_seed(0)
    state = build_model(cfg["model"], 1, classes, window(DataConfig(**cfg["data"]), 3).net_patch).state_dict()
    dataset = {"labels": labels, "channel_names": ["CT"]}
    return save_checkpoint(path, {"model": state, "config": cfg, "dataset": dataset})


def child(spec_path: str, result_path: str) -> int:
    """Run the one prediction or evaluation (``spec["command"]``) ``spec_path`` describes; write its seconds and
    peak RSS."""
    from medseg.evaluation.evaluate import evaluate
    from medseg.inference.predict import predict
    from medseg.runtime.host_memory import PeakRam

    spec = json.loads(Path(spec_path).read_text())
    task = evaluate if spec["command"] == "evaluate" else predict
    with PeakRam() as ram:
        started = time.perf_counter()
        result = task({"ckpt": spec["ckpt"], "input": spec["input"], "output": spec["output"],
                       "inference": {"device": "cpu", "progress": False, "slab_slices": spec["slab_slices"]}})
        seconds = time.perf_counter() - started
    atomic_write_json(Path(result_path), {"seconds": seconds, "peak_rss_mb": ram.peak_bytes / 2**20,
                                          "exit_code": result.exit_code})
    return result.exit_code


def _run(name: str, spec: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """One prediction or evaluation in its own process (:func:`~benchmarks.common.run_child`); its result."""
    result = run_child(__name__, name, spec, out)
    return {**result, "segmentation": str(out / name / "prediction" / "scan.nii.gz")}


def _agreement(slabs: str, whole: str, classes: int) -> dict[str, Any]:
    """Dice per class (present in either) of two label maps, and the voxels where they differ."""
    import nibabel as nib

    from medseg.scoring.metrics import dice

    a, b = (np.asarray(nib.load(path).dataobj) for path in (slabs, whole))
    present = [k for k in range(1, classes) if (a == k).any() or (b == k).any()]
    scores = {k: float(dice(torch.from_numpy(a == k), torch.from_numpy(b == k))) for k in present}
    return {"min_dice": min(scores.values(), default=1.0), "voxels_differing": int((a != b).sum())}


def run(args: argparse.Namespace) -> int:
    """Build the scans, their labels and the checkpoint, predict (and evaluate) each, write the report."""
    out = (args.out or DEFAULT_OUT).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ckpt = untrained_checkpoint(out / "untrained.pt", args.classes, args.patch, args.channels)
    rows: list[dict[str, Any]] = []
    for slices in sorted(set(args.slices) | set(args.whole) | set(args.evaluate)):
        folder = out / f"scan_{slices}"
        (folder / "imagesTs").mkdir(parents=True, exist_ok=True)
        image = synthetic_ct(folder / "imagesTs" / "scan.nii.gz", slices, args.size)
        base = {"command": "predict", "input": str(image), "ckpt": str(ckpt), "slab_slices": args.slab_slices}
        runs = {}
        if slices in args.slices:
            runs["slab"] = _run(f"{slices}_slabs", base, out)
        if slices in args.whole:
            runs["whole"] = _run(f"{slices}_whole", {**base, "slab_slices": None}, out)
        if slices in args.evaluate:
            (folder / "labelsTs").mkdir(exist_ok=True)
            synthetic_labels(folder / "labelsTs" / "scan.nii.gz", slices, args.classes, args.size)
            runs["evaluate"] = _run(f"{slices}_evaluate", {**base, "command": "evaluate", "input": str(folder)}, out)
        row: dict[str, Any] = {"slices": slices}
        for kind in ("slab", "whole", "evaluate"):
            row[f"{kind}_peak_gb"] = runs[kind]["peak_rss_mb"] / 1024 if kind in runs else None
            row[f"{kind}_seconds"] = runs[kind]["seconds"] if kind in runs else None
        if "slab" in runs and "whole" in runs:
            row.update(_agreement(runs["slab"]["segmentation"], runs["whole"]["segmentation"], args.classes))
        rows.append(row)
    report = {"meta": {"machine": machine(torch.device("cpu")), "torch": torch.__version__, "classes": args.classes,
                       "size": args.size, "patch": list(args.patch), "channels": list(args.channels),
                       "slab_slices": args.slab_slices,
                       "scan_spacing": list(SCAN_SPACING), "network_spacing": list(NETWORK_SPACING)},
              "runs": rows, "targets": targets(rows, args.size, args.classes)}
    markdown = to_markdown(report)
    print(markdown)
    write_report(out, "long_scan", markdown, report, args)
    return 0


def targets(rows: Sequence[Mapping[str, Any]], size: int, classes: int) -> list[dict[str, Any]]:
    """The goals of :data:`RAM_TARGETS_GB` the runs measured (512 x 512 scans with 30 classes only), and the slabs'
    agreement with the whole scan."""
    found = []
    for command, column in (("predict", "slab_peak_gb"), ("evaluate", "evaluate_peak_gb")):
        for row in rows:
            goal = RAM_TARGETS_GB[command].get(row["slices"])
            if goal is not None and row[column] is not None and (size, classes) == (TARGET_SIZE, TARGET_CLASSES):
                found.append({"label": f"{command}: peak RSS (GB), {size} x {size} x {row['slices']}, {classes} "
                                       f"classes", "value": row[column], "relation": "<=", "goal": goal,
                              "met": row[column] <= goal})
    return found + [{"label": f"min Dice per class, slabs vs whole scan, {row['slices']} slices",
                     "value": row["min_dice"], "relation": ">=", "goal": DICE_TARGET,
                     "met": row["min_dice"] >= DICE_TARGET} for row in rows if "min_dice" in row]


def to_markdown(report: Mapping[str, Any]) -> str:
    meta = report["meta"]
    rows = [[r["slices"], r["slab_peak_gb"], r["slab_seconds"], r["whole_peak_gb"], r["whole_seconds"],
             r.get("min_dice"), r.get("voxels_differing"), r["evaluate_peak_gb"], r["evaluate_seconds"]]
            for r in report["runs"]]
    return "\n".join([
        "# Peak RAM of predicting and evaluating long scans on the CPU", "",
        f"{meta['machine']}, torch {meta['torch']}; synthetic CT {meta['size']} x {meta['size']} x N of "
        f"{' x '.join(map(str, meta['scan_spacing']))} mm, untrained 3D U-Net {meta['channels']} with "
        f"{meta['classes']} classes at {' x '.join(map(str, meta['network_spacing']))} mm, window "
        f"{' x '.join(map(str, meta['patch']))}, inference.slab_slices={meta['slab_slices']}", "",
        markdown_table(["slices", "peak RSS (GB)", "seconds", "whole scan: peak RSS (GB)", "whole scan: seconds",
                        "min Dice vs whole", "voxels differing", "evaluate: peak RSS (GB)", "evaluate: seconds"],
                       rows, formats={"peak RSS (GB)": ".2f", "seconds": ".0f", "whole scan: peak RSS (GB)": ".2f",
                                      "whole scan: seconds": ".0f", "min Dice vs whole": ".4f",
                                      "evaluate: peak RSS (GB)": ".2f", "evaluate: seconds": ".0f"}, missing=""), "",
        "## targets", "", targets_markdown(report["targets"], ".4g"), ""])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py long_scan``'s arguments."""
    parser.add_argument("--slices", type=int, nargs="*", default=[100, 200, 400],
                        help="the lengths predicted slab by slab")
    parser.add_argument("--whole", type=int, nargs="*", default=[100],
                        help="lengths also predicted as one slab (inference.slab_slices=null), for comparison")
    parser.add_argument("--evaluate", type=int, nargs="*", default=[],
                        help="lengths also evaluated (medseg evaluate) against a label map of --classes - 1 structures")
    parser.add_argument("--size", type=int, default=512, help="the scans' voxels per row and column")
    parser.add_argument("--classes", type=int, default=30, help="the network's outputs, background included")
    parser.add_argument("--patch", type=int, nargs=3, default=[96, 96, 48], help="the sliding window (voxels)")
    parser.add_argument("--channels", type=int, nargs="+", default=[8, 16, 32, 64], help="the U-Net's widths")
    parser.add_argument("--slab-slices", type=int, default=SLAB_SLICES,
                        help="inference.slab_slices of the slab-wise runs")
    parser.add_argument("--out", type=Path, default=None, help=f"runs and long_scan.md/.json (default {DEFAULT_OUT})")
    add_results_argument(parser)


if __name__ == "__main__":
    sys.exit(child(*sys.argv[1:]))
