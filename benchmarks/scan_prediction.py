"""``benchmark.py scan_prediction``: one large scan predicted on the CPU by medseg, in several settings, and by
nnU-Net v2's ``nnUNetPredictor``, from the file to the written segmentation.

``python scripts/benchmark.py scan_prediction --image CT.nii.gz --ckpt best.pt [--nnunet-model DIR] [--label L]``

Each run is a process of its own (``python -m benchmarks.scan_prediction SPEC RESULT`` in the clone's root), so that
its peak RSS (:class:`medseg.runtime.host_memory.PeakRam`) is its own. medseg's runs go through the predict stage's
inferer (:class:`medseg.inference.inferer.Inferer`: ``preprocess``, ``file_slabs``) with each stage timed: reading
(the file, in RAS), resampling, normalisation (each transform of the inferer's chain timed by :class:`StageTimes`),
the windows (the network's share of them timed apart by the inferer's ``network``, a
:class:`~benchmarks.common.TimedNetwork`; the rest is cutting, padding, gaussian blending and resampling back to the
file's grid, slab by slab), writing. The
settings (``--settings``; none: nnU-Net alone):

* ``dense``: torch, fp32, every window run: the reference that the others must equal (Dice >= 0.999; without it
  in ``--settings``, the report has no such column);
* ``fast``: windows holding one value per channel (air) answered from one run (``evaluate.py``'s default);
* ``fast_bf16``: the same with ``inference.precision=bf16``; ``openvino``, ``openvino_bf16``: with
  ``inference.backend=openvino``; ``openvino_int8``: its network quantised to int8 (``inference.precision=int8``,
  calibrated on the checkpoint's training cases; a calibration, when the checkpoint has no cached one yet, is part
  of the setup, not of the seconds).

nnU-Net's run (``--nnunet-model``: a trained model folder with ``plans.json``, ``dataset.json`` and
``fold_F/checkpoint_final.pth``) is nnU-Net's own predictor (``predict_from_files_sequential``) on its network
rebuilt from the plans, at the same overlap (``tile_step_size = 1 - overlap``) and mirroring (``--mirror``: every
run mirrored over the 3 axes), its network timed as medseg's is. The report gives the seconds and peak RSS of each
run, the network's seconds and its rate in GFLOP/s (a window's convolutions, :func:`~benchmarks.common.window_gflop`,
times the windows run, over those seconds) beside this CPU's fp32 matrix-product rate
(:func:`~benchmarks.common.fp32_matmul_gflops`, the most the convolutions can expect), medseg's stages, the Dice
per class of each medseg run against medseg's dense one and against nnU-Net's, and against ``--label`` where one is
given, on the whole scan and in the body (``--body``: HU above -500), since a network's output on windows wholly in
air, where instance normalisation divides rounding noise by its epsilon, is noise. ``--collect`` adds the runs
earlier invocations left under ``--out``. nnU-Net is the optional ``peers`` extra,
installed with the README's command, which keeps the torch installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.transforms import Compose, Spacingd

from benchmarks.common import (
    TimedNetwork,
    add_results_argument,
    fp32_matmul_gflops,
    machine,
    ratio,
    run_child,
    targets_markdown,
    window_gflop,
    write_report,
)
from medseg.data.datalist import case_id
from medseg.io import atomic_write_json
from medseg.scoring.metrics import dice
from medseg.tables import markdown_table

SETTINGS: dict[str, dict[str, Any]] = {
    "dense": {"skip_constant": False},
    "fast": {},
    "fast_bf16": {"precision": "bf16"},
    "openvino": {"backend": "openvino"},
    "openvino_bf16": {"backend": "openvino", "precision": "bf16"},
    "openvino_int8": {"backend": "openvino", "precision": "int8"},
}
"""medseg setting -> what it changes of the ``inference`` node's defaults (torch, fp32 on the CPU, constant windows
answered)."""
STAGES = ("reading", "resampling", "normalisation", "network", "blending and back", "writing")
DICE_TARGET = 0.999
"""Every medseg setting against medseg's dense result, per class."""
TIME_TARGET = 0.5
"""medseg's fastest setting against nnU-Net's time, at the same network, overlap and mirroring."""
RAM_TARGET_GB = 3.0
NUMPY_SCALAR = np.float64(0).__reduce__()[0]
"""The function a pickled numpy scalar is rebuilt with (``numpy._core.multiarray.scalar`` in numpy 2,
``numpy.core.multiarray.scalar`` before), found through the public pickling protocol, not a private module."""
NNUNET_CHECKPOINT_GLOBALS = [NUMPY_SCALAR, np.dtype, type(np.dtype("float64")), type(np.dtype("float32"))]
"""What an nnU-Net checkpoint holds besides tensors and plain values (numpy scalars in its training log), allowed
to ``torch.load(weights_only=True)``."""
DEFAULT_OUT = Path("outputs/benchmark/scan_prediction")


def _transform_stage(index: int, transform: object) -> str:
    """The stage of the ``index``-th transform of the eval chain: reading, resampling or normalisation."""
    return "reading" if index == 0 else "resampling" if isinstance(transform, Spacingd) else "normalisation"


class StageTimes(Compose):
    """The transforms of ``chain`` (an inferer's preprocessing), each one's seconds added to its stage in ``seconds``
    (:func:`_transform_stage`) as it runs. The transforms are the chain's own, so the inferer inverts with this
    chain as it would with ``chain``."""

    def __init__(self, chain: Compose, seconds: dict[str, float]) -> None:
        super().__init__(chain.transforms, chain.map_items, chain.unpack_items, chain.log_stats, chain.lazy,
                         chain.overrides)
        self.seconds = seconds

    def __call__(self, input_: Any, start: int = 0, end: int | None = None, threading: bool = False,
                 lazy: bool | None = None) -> Any:
        for index in range(start, len(self.transforms) if end is None else end):
            started = time.perf_counter()
            input_ = super().__call__(input_, start=index, end=index + 1, threading=threading, lazy=lazy)
            self.seconds[_transform_stage(index, self.transforms[index])] += time.perf_counter() - started
        return input_


def predict_medseg(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Predict ``spec["image"]`` with ``spec["ckpt"]`` as ``evaluate.py`` does, each stage timed; writes
    ``<output>/<case>.nii.gz``."""
    from medseg.inference.cases import Case
    from medseg.inference.checks import check_config
    from medseg.inference.inferer import Inferer, collect, inference_network, original_affine
    from medseg.inference.model import load_model
    from medseg.inference.output import write_label_map
    from medseg.inference.resample_back import Grids

    stages = dict.fromkeys(STAGES, 0.0)
    cfg = check_config({"ckpt": spec["ckpt"], "input": spec["image"], "output": spec["output"],
                        "inference": {"device": "cpu", "overlap": spec["overlap"], "tta": spec["mirror"],
                                      "progress": False, **spec["setting"]}})
    started = time.perf_counter()
    net = load_model(spec["ckpt"])
    gflop = window_gflop(net.model, [net.in_channels, *net.window.net_patch])
    # the network the inferer would run on the windows (the runtime's), timed
    timed = TimedNetwork(inference_network(net, cfg.inference))
    inferer = Inferer(net, cfg.inference, StageTimes(net.preprocessing, stages), network=timed)
    setup = time.perf_counter() - started
    case = Case(spec["case"], spec["image"])
    data = inferer.preprocess(case)
    started = time.perf_counter()
    prediction = collect(inferer.file_slabs(data), Grids.of(data["image"]).file_shape, original_affine(data),
                         net.label_spec)
    stages["network"] = timed.seconds
    stages["blending and back"] = time.perf_counter() - started - timed.seconds
    started = time.perf_counter()
    write_label_map(Path(spec["output"]), case, prediction.label_map(), prediction.affine)
    stages["writing"] = time.perf_counter() - started
    return {"stages": stages, "setup_s": setup, "windows_run": timed.windows, "network_s": timed.seconds,
            "window_gflop": gflop, "preprocessed_shape": list(data["image"].shape[1:])}


def nnunet_network(plans: Mapping[str, Any], configuration: str, dataset_json: Mapping[str, Any]) -> torch.nn.Module:
    """The network nnU-Net's trainer builds for ``configuration`` of ``plans`` (a plans.json's content) on
    ``dataset_json``'s channels and labels, without deep supervision; its ``state_dict`` is a checkpoint's
    ``network_weights``."""
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    from nnunetv2.utilities.label_handling.label_handling import determine_num_input_channels
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    manager = PlansManager(dict(plans))
    config = manager.get_configuration(configuration)
    return nnUNetTrainer.build_network_architecture(
        manager, config, determine_num_input_channels(manager, config, dataset_json),
        manager.get_label_manager(dataset_json).num_segmentation_heads, enable_deep_supervision=False)


def predict_nnunet(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Predict ``spec["image"]`` with nnU-Net's predictor on its trained network; writes ``<output>/<case>.nii.gz``."""
    from batchgenerators.utilities.file_and_folder_operations import load_json
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    from nnunetv2.utilities.label_handling.label_handling import determine_num_input_channels
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    started = time.perf_counter()
    folder = Path(spec["nnunet_model"])
    dataset_json = load_json(str(folder / "dataset.json"))
    plans_json = load_json(str(folder / "plans.json"))
    plans = PlansManager(plans_json)
    with torch.serialization.safe_globals(NNUNET_CHECKPOINT_GLOBALS):
        checkpoint = torch.load(folder / f"fold_{spec['fold']}" / "checkpoint_final.pth", map_location="cpu",
                                weights_only=True)
    configuration = plans.get_configuration(checkpoint["init_args"]["configuration"])
    network = nnunet_network(plans_json, checkpoint["init_args"]["configuration"], dataset_json)
    predictor = nnUNetPredictor(tile_step_size=1 - spec["overlap"], use_gaussian=True, use_mirroring=spec["mirror"],
                                perform_everything_on_device=False, device=torch.device("cpu"), allow_tqdm=False)
    predictor.manual_initialization(network, plans, configuration, [checkpoint["network_weights"]], dataset_json,
                                    checkpoint["trainer_name"], checkpoint.get("inference_allowed_mirroring_axes"))
    gflop = window_gflop(network, [determine_num_input_channels(plans, configuration, dataset_json),
                                   *configuration.patch_size])
    timed = predictor.network = TimedNetwork(predictor.network)  # the predictor loads the weights into it
    setup = time.perf_counter() - started
    predictor.predict_from_files_sequential([[spec["image"]]], [str(Path(spec["output"]) / spec["case"])])
    return {"setup_s": setup, "patch": list(configuration.patch_size), "windows_run": timed.windows,
            "network_s": timed.seconds, "window_gflop": gflop}


def child(spec_path: str, result_path: str) -> int:
    """Run the one prediction ``spec_path`` describes; write its seconds (setup apart), peak RSS and output."""
    from medseg.runtime.host_memory import PeakRam

    spec = json.loads(Path(spec_path).read_text())
    Path(spec["output"]).mkdir(parents=True, exist_ok=True)
    with PeakRam() as ram:
        started = time.perf_counter()
        result = (predict_nnunet if spec["system"] == "nnunet" else predict_medseg)(spec)
        seconds = time.perf_counter() - started - result["setup_s"]
    atomic_write_json(Path(result_path), {**result, "seconds": seconds, "peak_rss_mb": ram.peak_bytes / 2**20,
                                          "segmentation": str(Path(spec["output"]) / f"{spec['case']}.nii.gz")})
    return 0


def _labels(path: str | Path) -> np.ndarray:
    import nibabel as nib

    return np.asarray(nib.load(str(path)).dataobj)


def _dice(a: np.ndarray, b: np.ndarray, classes: Sequence[int]) -> dict[str, float]:
    """Dice per class of label maps ``a`` and ``b`` (1 where a class is in neither)."""
    return {str(k): float(dice(torch.from_numpy(a == k), torch.from_numpy(b == k))) for k in classes}


def run(args: argparse.Namespace) -> int:
    """Run every prediction, compare the segmentations, print and write the report."""
    unknown = sorted(set(args.settings) - set(SETTINGS))
    if unknown:
        raise SystemExit(f"error: --settings {' '.join(unknown)}: expected some of {', '.join(SETTINGS)}")
    out = (args.out or DEFAULT_OUT).resolve()  # the runs' processes start in the clone's root
    base = {"image": str(args.image.resolve()), "case": case_id(args.image), "overlap": args.overlap,
            "ckpt": str(args.ckpt.resolve()),
            "nnunet_model": str(args.nnunet_model.resolve()) if args.nnunet_model else None, "fold": args.fold}
    suffix = "+mirror" if args.mirror else ""
    names = [*(["nnunet"] if args.nnunet_model else []), *args.settings]
    matmul = fp32_matmul_gflops()  # before the runs, while this process has the CPU to itself
    runs: dict[str, dict[str, Any]] = {}
    for name in names:
        spec = ({"system": "nnunet"} if name == "nnunet" else {"system": "medseg", "setting": SETTINGS[name]})
        runs[f"{name}{suffix}"] = run_child(__name__, f"{name}{suffix}", {**base, **spec, "mirror": args.mirror}, out)
    for result in sorted(out.glob("*/result.json")) if args.collect else []:  # the runs of earlier invocations
        if result.parent.name.endswith("+mirror") == args.mirror:
            runs.setdefault(result.parent.name, json.loads(result.read_text()))
    runs = {name: runs[name] for name in sorted(runs, key=lambda n: (not n.startswith("nnunet"), n != "dense"))}
    report = compare(runs, args, out, matmul)
    markdown = to_markdown(report)
    print(markdown)
    write_report(out, "scan_prediction", markdown, report, args)
    return 0


def network_rate(result: Mapping[str, Any]) -> float | None:
    """GFLOP/s of a run's network: its windows' convolutions and matrix products (:func:`window_gflop` per window)
    over the seconds the network ran; None for a run without those figures (one from before they were kept)."""
    windows, gflop = result.get("windows_run"), result.get("window_gflop")
    return ratio(None if windows is None or gflop is None else windows * gflop, result.get("network_s"))


def compare(runs: Mapping[str, dict[str, Any]], args: argparse.Namespace, out: Path,
            matmul_gflops: float) -> dict[str, Any]:
    """The report: each run's figures (the network's rate beside ``matmul_gflops``, this CPU's fp32 matrix product),
    its Dice against medseg's dense run, nnU-Net's and the label; the targets."""
    maps = {name: _labels(run["segmentation"]) for name, run in runs.items()}
    reference = _labels(args.label) if args.label else None
    classes = sorted(int(k) for k in np.unique(np.concatenate([np.unique(m) for m in maps.values()])) if k > 0)
    suffix = "+mirror" if args.mirror else ""
    dense, nnunet = f"dense{suffix}", f"nnunet{suffix}"
    rows, targets = [], []
    body = _labels(args.image) > args.body
    for name, result in runs.items():
        row: dict[str, Any] = {"run": name, "seconds": result["seconds"], "peak_rss_mb": result["peak_rss_mb"],
                               "windows_run": result.get("windows_run"), "network_s": result.get("network_s"),
                               "network_gflops": network_rate(result), "stages": result.get("stages")}
        if name != nnunet and dense in maps:
            row["dice_vs_dense"] = _dice(maps[name], maps[dense], classes)
            row["dice_vs_dense_in_body"] = _dice(np.where(body, maps[name], 0), np.where(body, maps[dense], 0), classes)
            for where, key in (("", "dice_vs_dense"), (" in the body", "dice_vs_dense_in_body")):
                targets += [{"label": f"{name}: Dice vs medseg's dense result{where}, class {k}", "value": v,
                             "relation": ">=", "goal": DICE_TARGET, "met": v >= DICE_TARGET}
                            for k, v in row[key].items()]
        if nnunet in maps and name != nnunet:
            row["dice_vs_nnunet"] = _dice(maps[name], maps[nnunet], classes)
            row["time_vs_nnunet"] = result["seconds"] / runs[nnunet]["seconds"]
        if reference is not None:
            row["dice_vs_label"] = _dice(maps[name], reference, classes)
        rows.append(row)
    if nnunet in runs:
        best = min((r for r in rows if r["run"] != nnunet), key=lambda r: r["seconds"])
        targets.append({"label": f"{best['run']}: time vs nnU-Net's", "value": best["time_vs_nnunet"],
                        "relation": "<=", "goal": TIME_TARGET, "met": best["time_vs_nnunet"] <= TIME_TARGET})
    peak = max(r["peak_rss_mb"] for r in rows if not r["run"].startswith("nnunet")) / 1024
    targets.append({"label": "medseg's largest peak RSS (GB)", "value": peak, "relation": "<=", "goal": RAM_TARGET_GB,
                    "met": peak <= RAM_TARGET_GB})
    return {"meta": {"machine": machine(torch.device("cpu")), "torch": torch.__version__, "image": str(args.image),
                     "shape": list(maps[next(iter(maps))].shape), "overlap": args.overlap, "ckpt": str(args.ckpt),
                     "nnunet_model": str(args.nnunet_model) if args.nnunet_model else None,
                     "mirror": args.mirror, "fp32_matmul_gflops": matmul_gflops, "out": str(out)},
            "runs": rows, "targets": targets}


def _dice_text(values: Mapping[str, float] | None) -> str:
    return ", ".join(f"{v:.4f}" for v in values.values()) if values else ""


def to_markdown(report: Mapping[str, Any]) -> str:
    meta = report["meta"]
    rows = [[r["run"], r["seconds"], r.get("time_vs_nnunet"), r["peak_rss_mb"] / 1024, r["windows_run"],
             r.get("network_s"), r.get("network_gflops"),
             *(_dice_text(r.get(f"dice_vs_{other}")) for other in ("dense", "dense_in_body", "nnunet", "label"))]
            for r in report["runs"]]
    stage_rows = [[r["run"], *(r["stages"][s] for s in STAGES)] for r in report["runs"] if r["stages"]]
    return "\n".join([
        "# Predicting one large scan on the CPU: medseg and nnU-Net v2", "",
        f"{meta['machine']}, torch {meta['torch']}; {meta['image']} "
        f"({' x '.join(map(str, meta['shape']))}), overlap {meta['overlap']}, mirroring "
        f"{'on' if meta['mirror'] else 'off'}; this CPU's fp32 matrix product: "
        f"{meta.get('fp32_matmul_gflops', float('nan')):.0f} GFLOP/s, the most a network's convolutions can expect",
        "",
        markdown_table(["run", "seconds", "x nnU-Net", "peak RSS (GB)", "windows run", "network s", "GFLOP/s",
                        "Dice vs dense", "in the body", "Dice vs nnU-Net", "Dice vs label"], rows,
                       formats={"seconds": ".1f", "x nnU-Net": ".2f", "peak RSS (GB)": ".2f", "network s": ".1f",
                                "GFLOP/s": ".0f"}, missing=""), "",
        "## medseg's stages (seconds)", "",
        markdown_table(["run", *STAGES], stage_rows, formats={s: ".1f" for s in STAGES}), "",
        "## targets", "", targets_markdown(report["targets"], ".4g"), ""])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py scan_prediction``'s arguments."""
    parser.add_argument("--image", type=Path, required=True, help="the scan (NIfTI), e.g. a 512 x 512 x 60 CT")
    parser.add_argument("--ckpt", type=Path, required=True, help="medseg's checkpoint")
    parser.add_argument("--nnunet-model", type=Path, default=None,
                        help="nnU-Net's trained model folder (plans.json, dataset.json, fold_F/)")
    parser.add_argument("--fold", default="0", help="nnU-Net's fold folder")
    parser.add_argument("--label", type=Path, default=None, help="the scan's reference label map, if any")
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS),
                        help=f"medseg's settings: some of {', '.join(SETTINGS)}")
    parser.add_argument("--overlap", type=float, default=0.5, help="sliding-window overlap (nnU-Net's 0.5)")
    parser.add_argument("--mirror", action="store_true", help="every run mirrored (8 passes in 3D)")
    parser.add_argument("--body", type=float, default=-500.0,
                        help="the body: the scan's voxels above this value (HU in CT), where Dice is also given")
    parser.add_argument("--collect", action="store_true",
                        help="also report the runs that earlier invocations left under --out (the same mirroring)")
    parser.add_argument("--out", type=Path, default=None, help="the runs and scan_prediction.md/.json "
                                                               f"(default {DEFAULT_OUT})")
    add_results_argument(parser)


if __name__ == "__main__":
    sys.exit(child(*sys.argv[1:]))
