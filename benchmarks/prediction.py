"""``benchmark.py prediction``: whole-volume prediction of a large CT, dense against medseg's fast path.

``python scripts/benchmark.py prediction [--shape 512 512 60] [--channels 16 32 64 128] [--patch 96 96 48] ...``

A CT-like volume as the network sees it after preprocessing: an elliptic body of 0.84 x 0.64 of the field of view,
tissue-like noise inside, air outside at the one value CT normalisation clips it to. A U-Net of the given widths and
strides (untrained: the time does not depend on the weights) predicts it twice with gaussian sliding windows,
densely (every window run, torch, fp32) and with the windows that hold one value answered from one run
(:class:`medseg.inference.sliding_window.ConstantWindows`) on ``--runtime`` in ``--precision`` (torch or openvino,
fp32 or bf16: :mod:`medseg.inference.backends`), in alternating order over ``--reps`` rounds. The report
gives the median seconds of each, the windows run, the peak RSS of the process, the Dice per class of the fast
segmentation against the dense one (target >= 0.999) and the speed-up. ``--out`` writes ``prediction.md`` and
``prediction.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import TimedNetwork, add_results_argument, machine, targets_markdown, write_report
from medseg.config import ModelConfig
from medseg.inference.backends import BACKENDS, window_network
from medseg.inference.sliding_window import SlidingWindow, infer_volume
from medseg.models import build_model
from medseg.runtime.device import amp_dtype
from medseg.runtime.host_memory import PeakRam
from medseg.scoring.metrics import dice
from medseg.tables import markdown_table

AIR = -2.0
"""The normalised value of air: CT normalisation clips everything below the foreground's 0.5 percentile to one
value, about two standard deviations below its mean."""
DICE_TARGET = 0.999
"""The fast segmentation against the dense one, per class."""


def body_in_air(shape: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    """``(1, 1, X, Y, Z)``: an elliptic cylinder along Z, radii 0.42 x 0.32 of the field of view, holding N(0, 1)
    noise; :data:`AIR` around it."""
    rng = np.random.default_rng(seed)
    x, y = np.meshgrid(np.linspace(-0.5, 0.5, shape[0]), np.linspace(-0.5, 0.5, shape[1]), indexing="ij")
    body = (x / 0.42) ** 2 + (y / 0.32) ** 2 <= 1
    volume = np.full(shape, AIR, np.float32)
    volume[body] = rng.standard_normal((int(body.sum()), shape[2])).astype(np.float32)
    return torch.from_numpy(volume)[None, None]


def run(args: argparse.Namespace) -> int:
    """Predict the volume densely and with the fast path; print and write the report."""
    torch.manual_seed(0)
    patch = tuple(args.patch)
    model_cfg = ModelConfig(channels=list(args.channels), strides=[[int(s) for s in level.split(",")]
                                                                   for level in args.strides])
    model = build_model(model_cfg, 1, args.classes, patch).eval()
    networks = {"dense": TimedNetwork(model),
                "fast": TimedNetwork(window_network(model, args.runtime, (1, *patch), args.precision))}
    fast_dtype = amp_dtype(args.precision, torch.device("cpu")) if args.runtime == "torch" else None
    image = body_in_air(tuple(args.shape))
    mirror_axes = (0, 1, 2) if args.mirror else ()
    seconds: dict[str, list[float]] = {"dense": [], "fast": []}
    windows: dict[str, int] = {}
    segmentations: dict[str, torch.Tensor] = {}
    with PeakRam() as ram:
        for rep in range(args.reps):
            for mode in ("dense", "fast") if rep % 2 == 0 else ("fast", "dense"):
                network = networks[mode]
                network.windows, started = 0, time.perf_counter()
                window = SlidingWindow(tuple(patch), 3, 2, args.sw_batch_size, args.overlap,
                                       amp_dtype=fast_dtype if mode == "fast" else None, mirror_axes=mirror_axes,
                                       skip_constant=mode == "fast")
                probs = infer_volume(network, image, window, progress=args.progress)
                seconds[mode].append(time.perf_counter() - started)
                windows[mode], segmentations[mode] = network.windows, probs.argmax(1)[0]
                del probs
    per_class = {k: dice(segmentations["fast"] == k, segmentations["dense"] == k) for k in range(1, args.classes)}
    dense_s, fast_s = (statistics.median(seconds[mode]) for mode in ("dense", "fast"))
    report: dict[str, Any] = {
        "meta": {"machine": machine(torch.device("cpu")), "torch": torch.__version__, "shape": list(args.shape),
                 "runtime": args.runtime, "precision": args.precision,
                 "patch": list(patch), "channels": list(args.channels), "strides": list(args.strides),
                 "overlap": args.overlap, "mirroring": bool(args.mirror), "reps": args.reps},
        "seconds": seconds, "dense_s": dense_s, "fast_s": fast_s, "speedup": dense_s / fast_s,
        "windows": windows["dense"], "windows_run": windows["fast"], "peak_rss_mb": round(ram.peak_bytes / 2**20, 1),
        "dice_fast_vs_dense": per_class,
        "targets": [{"label": f"Dice of the fast segmentation vs the dense one, class {k}", "value": value,
                     "relation": ">=", "goal": DICE_TARGET, "met": value >= DICE_TARGET}
                    for k, value in per_class.items()],
    }
    markdown = to_markdown(report)
    print(markdown)
    write_report(args.out, "prediction", markdown, report, args)
    return 0


def to_markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    rows = [["dense", report["dense_s"], report["windows"], ""],
            [f"fast (constant windows answered; {meta['runtime']}, {meta['precision']})", report["fast_s"],
             report["windows_run"], report["speedup"]]]
    return "\n".join([
        "# Prediction of a large CT on the CPU: dense vs fast", "",
        f"{meta['machine']}, torch {meta['torch']}; volume {' x '.join(map(str, meta['shape']))}, patch "
        f"{' x '.join(map(str, meta['patch']))}, widths {meta['channels']}, strides {meta['strides']}, overlap "
        f"{meta['overlap']}, mirroring {'on' if meta['mirroring'] else 'off'}; median of {meta['reps']}; peak RSS "
        f"{report['peak_rss_mb']:.0f} MB", "",
        markdown_table(["path", "seconds", "windows run", "speed-up"], rows,
                       formats={"seconds": ".1f", "speed-up": ".2f"}), "",
        "## targets", "", targets_markdown(report["targets"], ".5f"), ""])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py prediction``'s arguments."""
    parser.add_argument("--shape", type=int, nargs=3, default=[512, 512, 60], help="the preprocessed volume")
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64, 128], help="the U-Net's widths")
    parser.add_argument("--strides", nargs="+", default=["2,2,1", "2,2,2", "2,2,2"],
                        help="per down-sampling, the stride per axis (len(channels) - 1 of them)")
    parser.add_argument("--patch", type=int, nargs=3, default=[96, 96, 48], help="the sliding window")
    parser.add_argument("--classes", type=int, default=3, help="network outputs, background included")
    parser.add_argument("--overlap", type=float, default=0.5, help="sliding-window overlap (nnU-Net's 0.5)")
    parser.add_argument("--sw-batch-size", type=int, default=1, help="windows per forward pass")
    parser.add_argument("--mirror", action="store_true", help="mirroring over the 3 axes (8 passes)")
    parser.add_argument("--runtime", choices=BACKENDS, default="torch", help="the fast path's backend")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="the fast path's arithmetic")
    parser.add_argument("--reps", type=int, default=1, help="rounds of both paths, alternating their order")
    parser.add_argument("--progress", action="store_true", help="a progress bar over the windows")
    parser.add_argument("--out", type=Path, default=None, help="write prediction.md and prediction.json here")
    add_results_argument(parser)
