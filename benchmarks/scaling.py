"""``benchmark.py scaling``: how the cost of predicting one scan on the CPU grows with its length and with the number
of classes, medseg beside nnU-Net v2 on the same machine, each run stopped at a memory cap rather than by the system.

``python scripts/benchmark.py scaling [--slices 60 200 400 1000] [--classes 2 10 30 100] [--at-classes 30]
[--at-slices 60] [--systems medseg nnunet] [--cap-gb 12] [--out DIR]``

Two sweeps: the scan's length (``--slices``) at ``--at-classes`` classes, and the classes (``--classes``, background
included) at ``--at-slices`` slices; the point the two share runs once. The scans are ``long_scan``'s synthetic CT
(:func:`benchmarks.long_scan.synthetic_ct`: ``--size`` x ``--size`` x N voxels of 0.8 x 0.8 x 1.5 mm), the networks
untrained (random weights, seed 0: the work and the memory are a trained network's, the segmentation is noise):

* **medseg**: ``medseg predict`` as users run it (``long_scan``'s child process, its checkpoint from
  :func:`benchmarks.long_scan.untrained_checkpoint`: widths ``--channels``, 1.5 mm isotropic, window ``--patch``,
  ``zscore``), slab by slab (``inference.slab_slices``), at its defaults otherwise (overlap 0.5, no mirroring,
  constant windows answered once);
* **nnU-Net**: nnU-Net's own predictor (``scan_prediction``'s child, ``predict_from_files_sequential``, overlap 0.5,
  no mirroring) on a model folder written here (:func:`write_nnunet_model`): one ``3d_fullres`` configuration with
  medseg's spacing, window, strides, widths and kernel in nnU-Net's axis order (it reads NIfTI through SimpleITK,
  whose arrays are ``(z, y, x)``, nibabel's reversed), ``ZScoreNormalization`` over the whole image (medseg's
  ``zscore``), and a ``PlainConvUNet`` of 2 convs a stage, random-initialised by nnU-Net (seed 0).

What differs between the two networks: medseg's encoder stages are residual (MONAI ``UnetResBlock``: two convs and a
skip), nnU-Net's ``PlainConvUNet`` plain (two convs), and medseg's convs have no bias where nnU-Net's have one; both
downsample by a strided first conv and use instance norm, LeakyReLU and transposed-conv up stages with two convs.
nnU-Net also resamples the image with third-order splines and the logits back to the scan with linear
interpolation, the whole (C, X, Y, Z) array at once, where medseg resamples slab by slab; medseg's seconds include
loading its checkpoint, nnU-Net's exclude building its network.

Each run is a process of its own (:func:`benchmarks.common.run_child`): its seconds and peak RSS
(:class:`medseg.runtime.host_memory.PeakRam`). The parent reads each run's resident memory (with any process it
starts) and kills it when it passes ``--cap-gb``: the run is recorded as ``stopped: over cap at T s``, and the
system's larger sizes in that sweep as ``not run: over cap at N``. A run that fails otherwise fails the benchmark,
naming its log. The report: ``scaling.md``, ``scaling.json`` and ``scaling.png`` (time and peak RSS against slices
and against classes, one line per system, the cap drawn, stopped runs marked). nnU-Net is the optional ``peers`` extra,
installed with the README's command, which keeps the torch installed.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import OverCap, add_results_argument, machine, run_child, write_report
from benchmarks.long_scan import NETWORK_SPACING, SCAN_SPACING, synthetic_ct, untrained_checkpoint
from benchmarks.peers import INSTALL_HINT
from medseg.config import SLAB_SLICES
from medseg.io import atomic_write_json
from medseg.tables import markdown_table

DEFAULT_OUT = Path("outputs/benchmark/scaling")
SYSTEMS = ("medseg", "nnunet")
SWEEPS = ("slices", "classes")
"""A sweep is named by the value it varies."""
NNUNET_CONFIGURATION = "3d_fullres"
NNUNET_FOLD = 0
OVERLAP = 0.5
"""Both systems' sliding-window overlap (medseg's default; nnU-Net's ``tile_step_size = 1 - overlap``)."""
DONE = "done"


@dataclass(frozen=True)
class Measured:
    """One run's outcome: its seconds and peak RSS (GB); when the cap ``stopped`` it, the seconds until then and
    the resident memory the parent saw then."""

    seconds: float
    peak_gb: float
    stopped: bool = False

    @property
    def state(self) -> str:
        return f"stopped: over cap at {self.seconds:.0f} s" if self.stopped else DONE


# ------------------------------------------------------------------------------------------- the sweeps


def sweep_points(sweep: str, args: argparse.Namespace) -> list[tuple[int, int]]:
    """The ``(slices, classes)`` of a sweep, smallest first: the lengths at ``--at-classes`` or the class counts at
    ``--at-slices``."""
    if sweep == "slices":
        return [(slices, args.at_classes) for slices in sorted(set(args.slices))]
    return [(args.at_slices, classes) for classes in sorted(set(args.classes))]


def sweep_rows(sweep: str, system: str, points: Sequence[tuple[int, int]],
               measure: Callable[[str, int, int], Measured]) -> list[dict[str, Any]]:
    """The table's rows of one system in one sweep: each point measured (``measure(system, slices, classes)``) in
    order until the cap stops one; the larger points after it are not run."""
    rows: list[dict[str, Any]] = []
    stopped_at: int | None = None
    for slices, classes in points:
        row = {"sweep": sweep, "system": system, "slices": slices, "classes": classes}
        if stopped_at is not None:
            rows.append({**row, "seconds": None, "peak_gb": None, "state": f"not run: over cap at {stopped_at}"})
            continue
        measured = measure(system, slices, classes)
        rows.append({**row, "seconds": measured.seconds, "peak_gb": measured.peak_gb, "state": measured.state})
        if measured.stopped:
            stopped_at = slices if sweep == "slices" else classes
    return rows


def once(measure: Callable[[str, int, int], Measured]) -> Callable[[str, int, int], Measured]:
    """``measure``, each ``(system, slices, classes)`` measured once (the point both sweeps share)."""
    done: dict[tuple[str, int, int], Measured] = {}

    def measured(system: str, slices: int, classes: int) -> Measured:
        key = (system, slices, classes)
        if key not in done:
            done[key] = measure(*key)
        return done[key]

    return measured


# ------------------------------------------------------------------------------------------- nnU-Net's model


def nnunet_plans(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """An nnU-Net v2 plans.json of one ``3d_fullres`` configuration equivalent to the network and preprocessing of
    the medseg training config ``cfg`` (a checkpoint's ``config``), in nnU-Net's axis order: SimpleITK's arrays are
    ``(z, y, x)``, medseg's RAS arrays ``(x, y, z)``, so every per-axis value is reversed."""
    from medseg.models.unet import per_axis_strides

    model, data = cfg["model"], cfg["data"]
    strides = [[1, 1, 1], *([*reversed(s)] for s in per_axis_strides(model["strides"], 3))]
    spacing = [float(v) for v in reversed(data["spacing"])]
    patch = [int(v) for v in reversed(data["patch_size"])]
    kernel = model["kernel_size"]
    resampling = {"resampling_fn_data": "resample_data_or_seg_to_shape",
                  "resampling_fn_data_kwargs": {"is_seg": False, "order": 3, "order_z": 0, "force_separate_z": None},
                  "resampling_fn_seg": "resample_data_or_seg_to_shape",
                  "resampling_fn_seg_kwargs": {"is_seg": True, "order": 1, "order_z": 0, "force_separate_z": None},
                  "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
                  "resampling_fn_probabilities_kwargs": {"is_seg": False, "order": 1, "order_z": 0,
                                                         "force_separate_z": None}}
    architecture = {
        "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
        "arch_kwargs": {"n_stages": len(strides), "features_per_stage": list(model["channels"]),
                        "conv_op": "torch.nn.modules.conv.Conv3d", "kernel_sizes": [[kernel] * 3] * len(strides),
                        "strides": strides, "n_conv_per_stage": [2] * len(strides),
                        "n_conv_per_stage_decoder": [2] * (len(strides) - 1), "conv_bias": True,
                        "norm_op": "torch.nn.modules.instancenorm.InstanceNorm3d",
                        "norm_op_kwargs": {"eps": 1e-5, "affine": True}, "dropout_op": None,
                        "dropout_op_kwargs": None, "nonlin": "torch.nn.LeakyReLU", "nonlin_kwargs": {"inplace": True}},
        "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"]}
    configuration = {"data_identifier": f"nnUNetPlans_{NNUNET_CONFIGURATION}",
                     "preprocessor_name": "DefaultPreprocessor", "batch_size": 2, "patch_size": patch,
                     "median_image_size_in_voxels": patch, "spacing": spacing,
                     "normalization_schemes": ["ZScoreNormalization"], "use_mask_for_norm": [False], **resampling,
                     "architecture": architecture, "batch_dice": False}
    return {"dataset_name": "Dataset999_scaling", "plans_name": "nnUNetPlans",
            "original_median_spacing_after_transp": spacing, "original_median_shape_after_transp": patch,
            "image_reader_writer": "SimpleITKIO", "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2],
            "configurations": {NNUNET_CONFIGURATION: configuration}, "experiment_planner_used": "ExperimentPlanner",
            "label_manager": "LabelManager",
            "foreground_intensity_properties_per_channel": {"0": {}}}  # read by CTNormalization only


def nnunet_dataset_json(dataset: Mapping[str, Any]) -> dict[str, Any]:
    """nnU-Net's dataset.json for a medseg checkpoint's ``dataset`` (its labels, index -> name; its channels)."""
    return {"channel_names": {str(i): name for i, name in enumerate(dataset["channel_names"])},
            "labels": {name: int(index) for index, name in dataset["labels"].items()}, "numTraining": 0,
            "file_ending": ".nii.gz"}


def write_nnunet_model(folder: Path, ckpt: Path) -> Path:
    """nnU-Net's model folder for the medseg checkpoint ``ckpt``'s network: ``plans.json`` (:func:`nnunet_plans`),
    ``dataset.json`` and ``fold_0/checkpoint_final.pth`` in the format nnU-Net's trainer saves, holding its network's
    random initialisation (seed 0); ``folder``."""
    from benchmarks.scan_prediction import nnunet_network
    from medseg.runs.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(ckpt, needs=("config", "dataset"))
    plans, dataset_json = nnunet_plans(checkpoint["config"]), nnunet_dataset_json(checkpoint["dataset"])
    torch.manual_seed(0)
    network = nnunet_network(plans, NNUNET_CONFIGURATION, dataset_json)
    (folder / f"fold_{NNUNET_FOLD}").mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / "plans.json", plans)
    atomic_write_json(folder / "dataset.json", dataset_json)
    torch.save({"network_weights": network.state_dict(), "optimizer_state": None, "grad_scaler_state": None,
                "logging": {}, "_best_ema": None, "current_epoch": 0,
                "init_args": {"plans": plans, "configuration": NNUNET_CONFIGURATION, "fold": NNUNET_FOLD,
                              "dataset_json": dataset_json, "device": "cpu"},
                "trainer_name": "nnUNetTrainer", "inference_allowed_mirroring_axes": (0, 1, 2)},
               folder / f"fold_{NNUNET_FOLD}" / "checkpoint_final.pth")
    return folder


# ------------------------------------------------------------------------------------------- running


class Runner:
    """Builds the scans and models a run needs (once each) under ``out`` and measures one run in its own process."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args, self.out = args, out
        self.cap_bytes = None if args.cap_gb is None else int(args.cap_gb * 2**30)

    def scan(self, slices: int) -> Path:
        path = self.out / f"scan_{slices}" / "scan.nii.gz"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            synthetic_ct(path, slices, self.args.size)
        return path

    def checkpoint(self, classes: int) -> Path:
        path = self.out / "models" / f"medseg_{classes}.pt"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            untrained_checkpoint(path, classes, self.args.patch, self.args.channels)
        return path

    def nnunet_model(self, classes: int) -> Path:
        folder = self.out / "models" / f"nnunet_{classes}"
        if not (folder / f"fold_{NNUNET_FOLD}" / "checkpoint_final.pth").exists():
            write_nnunet_model(folder, self.checkpoint(classes))
        return folder

    def measure(self, system: str, slices: int, classes: int) -> Measured:
        """One prediction of ``system`` on the scan of ``slices`` slices with ``classes`` classes."""
        image = str(self.scan(slices))
        if system == "medseg":
            module = "benchmarks.long_scan"
            spec = {"command": "predict", "input": image, "ckpt": str(self.checkpoint(classes)),
                    "slab_slices": self.args.slab_slices}
        else:
            module = "benchmarks.scan_prediction"
            spec = {"system": "nnunet", "image": image, "case": "scan", "nnunet_model": str(self.nnunet_model(classes)),
                    "fold": str(NNUNET_FOLD), "overlap": OVERLAP, "mirror": False}
        try:
            result = run_child(module, f"{system}_{slices}x{classes}", spec, self.out, self.cap_bytes)
        except OverCap as stopped:
            return Measured(stopped.seconds, stopped.peak_bytes / 2**30, stopped=True)
        return Measured(result["seconds"], result["peak_rss_mb"] / 1024)


def check_systems(systems: Sequence[str]) -> None:
    """Raise SystemExit (one line) for an unknown system, or for nnU-Net where it is not installed."""
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"error: --systems {' '.join(unknown)}: expected some of {', '.join(SYSTEMS)}")
    if "nnunet" in systems and importlib.util.find_spec("nnunetv2") is None:
        raise SystemExit(f"error: --systems nnunet: {INSTALL_HINT}")


def run(args: argparse.Namespace) -> int:
    """Run both sweeps for every system, print and write the report and its figure."""
    check_systems(args.systems)
    out = (args.out or DEFAULT_OUT).resolve()  # the runs' processes start in the clone's root
    out.mkdir(parents=True, exist_ok=True)
    measure = once(Runner(args, out).measure)
    rows = [row for sweep in SWEEPS for system in args.systems
            for row in sweep_rows(sweep, system, sweep_points(sweep, args), measure)]
    report = {"meta": {"machine": machine(torch.device("cpu")), "torch": torch.__version__, "size": args.size,
                       "patch": list(args.patch), "channels": list(args.channels), "slab_slices": args.slab_slices,
                       "cap_gb": args.cap_gb, "at_slices": args.at_slices, "at_classes": args.at_classes,
                       "scan_spacing": list(SCAN_SPACING), "network_spacing": list(NETWORK_SPACING),
                       "overlap": OVERLAP, "systems": list(args.systems)},
              "runs": rows}
    markdown = to_markdown(report)
    print(markdown)
    write_report(out, "scaling", markdown, report, args)
    render_figure(report).savefig(out / "scaling.png", dpi=120)
    return 0


# ------------------------------------------------------------------------------------------- the report


def to_markdown(report: Mapping[str, Any]) -> str:
    """``scaling.md``: the set-up in one paragraph, then one row per run (sweep, system, slices, classes, seconds,
    peak RSS, state)."""
    meta = report["meta"]
    cap = "no memory cap" if meta["cap_gb"] is None else f"runs stopped above {meta['cap_gb']:g} GB resident"
    rows = [[r["sweep"], r["system"], r["slices"], r["classes"], r["seconds"], r["peak_gb"], r["state"]]
            for r in report["runs"]]
    return "\n".join([
        "# How prediction's cost grows with the scan and the classes: medseg and nnU-Net v2", "",
        f"{meta['machine']}, torch {meta['torch']}; synthetic CT {meta['size']} x {meta['size']} x N of "
        f"{' x '.join(map(str, meta['scan_spacing']))} mm; untrained 3D U-Net {meta['channels']} at "
        f"{' x '.join(map(str, meta['network_spacing']))} mm, window {' x '.join(map(str, meta['patch']))} "
        f"(medseg's axes), overlap {meta['overlap']}, no mirroring; medseg slab by slab "
        f"(inference.slab_slices={meta['slab_slices']}); slices swept at {meta['at_classes']} classes, classes at "
        f"{meta['at_slices']} slices; {cap}.", "",
        markdown_table(["sweep", "system", "slices", "classes", "seconds", "peak RSS (GB)", "state"], rows,
                       formats={"seconds": ".1f", "peak RSS (GB)": ".2f"}, missing=""), ""])


def render_figure(report: Mapping[str, Any]) -> Any:
    """``scaling.png``: a 2 x 2 matplotlib Figure (Agg canvas), seconds (top) and peak RSS (bottom) against slices
    (left) and classes (right), one line per system; the cap a dashed line, a stopped run an ``x`` at what it had
    reached."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    meta = report["meta"]
    fig = Figure(figsize=(10, 7.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    for column, sweep in enumerate(SWEEPS):
        fixed = f"{meta['at_classes']} classes" if sweep == "slices" else f"{meta['at_slices']} slices"
        for line, (key, label) in enumerate((("seconds", "seconds"), ("peak_gb", "peak RSS (GB)"))):
            ax = axes[line][column]
            for index, system in enumerate(meta["systems"]):
                runs = [r for r in report["runs"] if r["sweep"] == sweep and r["system"] == system
                        and r[key] is not None]
                colour = f"C{index}"
                ax.plot([r[sweep] for r in runs], [r[key] for r in runs], "o-", color=colour, label=system)
                stopped = [r for r in runs if r["state"] != DONE]
                ax.plot([r[sweep] for r in stopped], [r[key] for r in stopped], "x", color=colour, markersize=12,
                        markeredgewidth=2, label=f"{system}: stopped over the cap" if stopped else None)
            if key == "peak_gb" and meta["cap_gb"] is not None:
                ax.axhline(meta["cap_gb"], color="tab:red", linestyle="--", label=f"cap {meta['cap_gb']:g} GB")
            ax.set(xlabel=sweep, ylabel=label, title=f"{label} against {sweep} ({fixed})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    return fig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py scaling``'s arguments."""
    parser.add_argument("--slices", type=int, nargs="+", default=[60, 200, 400, 1000],
                        help="the scan lengths of the first sweep")
    parser.add_argument("--classes", type=int, nargs="+", default=[2, 10, 30, 100],
                        help="the class counts (background included) of the second sweep")
    parser.add_argument("--at-classes", type=int, default=30, help="the classes of the slices sweep")
    parser.add_argument("--at-slices", type=int, default=60, help="the scan length of the classes sweep")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), help=f"some of {', '.join(SYSTEMS)}")
    parser.add_argument("--cap-gb", type=float, default=12.0,
                        help="stop a run whose resident memory (with its child processes) passes this (GB)")
    parser.add_argument("--size", type=int, default=512, help="the scans' voxels per row and column")
    parser.add_argument("--patch", type=int, nargs=3, default=[96, 96, 48], help="the sliding window (voxels, RAS)")
    parser.add_argument("--channels", type=int, nargs="+", default=[8, 16, 32, 64], help="the U-Net's widths")
    parser.add_argument("--slab-slices", type=int, default=SLAB_SLICES, help="medseg's inference.slab_slices")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"runs, models and scaling.md/.json/.png (default {DEFAULT_OUT})")
    add_results_argument(parser)

