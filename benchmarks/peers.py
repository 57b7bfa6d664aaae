"""``benchmark.py peers``: medseg against nnU-Net v2 on the same data, cases, machine and wall-clock budget.

``python scripts/benchmark.py peers data.root=<MSD or nnU-Net v2 folder> [data.format=nnunet] budget_minutes=N``

Systems (``systems=nnunet,medseg,medseg_masa`` by default; each in its own process, one after the other):

* ``nnunet``: nnU-Net v2 in its default configuration (``3d_fullres``): fingerprint, plan, preprocess, train for the
  budget (:mod:`benchmarks.nnunet_peer`), predict the validation cases with its own inferer (mirroring,
  Gaussian tiles), score them with its own evaluator; ``nnunet_2d``: the same with nnU-Net's ``2d`` configuration,
  which nnU-Net also trains and which can win on strongly anisotropic data (on request: ``systems=...,nnunet_2d``);
* ``medseg``: ``scripts/train.py`` with the planned defaults of ``data=msd|nnunet`` and ``trainer.max_minutes``,
  then ``scripts/evaluate.py`` on the validation cases; ``medseg_masa``: the same with ``model.bottleneck=masa``.

Both train on medseg's split of fold ``data.fold`` (written as nnU-Net's ``splits_final.json``) and their predictions
are scored alike by medseg in the original geometry (:func:`score_folder`); nnU-Net's Dice is cross-checked against its
own evaluator. The report (``peers.md`` / ``peers.json`` under ``--out``) gives Dice and HD95 per class, lesion-wise
detection per class (sensitivity, false positives per case, Dice per found lesion) beside Dice averaged as nnU-Net
does (a case without the class in reference and prediction left out), the wall time of each stage, step time, peak
RAM of the process tree (the resident sets of the process and its workers summed: an upper bound, the same measure
for every system), the optimiser steps in the budget, the plans side by side, and how soon medseg's validation Dice
(during training) reached nnU-Net's final Dice.

nnU-Net is the optional ``peers`` extra,
installed with the README's command, which keeps the torch installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import REPO
from benchmarks.common import add_results_argument, compose_train_config, machine, tree_rss_bytes, write_report
from medseg.io import atomic_write_json
from medseg.runs.layout import RunLayout
from medseg.tables import markdown_table, text_table

log = logging.getLogger("medseg")

NNUNET_DATASET_ID = 990
"""The id of the nnU-Net dataset the benchmark writes (inside its own nnU-Net folders under ``--out``)."""
NNUNET_SYSTEMS = {"nnunet": "3d_fullres", "nnunet_2d": "2d"}
"""nnU-Net system -> its configuration."""
MEDSEG_SYSTEMS: dict[str, tuple[str, ...]] = {"medseg": (), "medseg_masa": ("model.bottleneck=masa",)}
"""medseg system -> its overrides."""
SYSTEMS = [*NNUNET_SYSTEMS, *MEDSEG_SYSTEMS]
DEFAULT_SYSTEMS = ("nnunet", *MEDSEG_SYSTEMS)
MEDSEG_COMMON = ("trainer.progress=false", "trainer.max_epochs=100000")
"""Every medseg run: the budget alone ends training."""
DICE_AGREEMENT = 1e-3
"""nnU-Net's own Dice per class must agree with medseg's scoring of the same predictions to this."""
INSTALL_HINT = ("nnU-Net v2 is not installed: pip install -e \".[peers]\" \"torch==$(python -c 'import torch; "
                "print(torch.__version__)')\" (the optional extra pins nnunetv2; the torch pin keeps your torch)")


# --- measuring a process tree -------------------------------------------------------------------


@dataclass
class Command:
    """One command run as a process tree: its wall time and peak resident memory (sampled every 0.5 s)."""

    argv: list[str]
    log_file: Path
    env: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    peak_rss_bytes: int = 0

    def run(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with self.log_file.open("w") as out:
            process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.5):
                    self.peak_rss_bytes = max(self.peak_rss_bytes, tree_rss_bytes(process.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            code = process.wait()
            done.set()
            sampler.join()
        self.seconds = time.perf_counter() - started
        if code != 0:
            tail = "\n".join(self.log_file.read_text().splitlines()[-15:])
            raise RuntimeError(f"{' '.join(self.argv[:3])} ... failed (exit {code}); log {self.log_file}:\n{tail}")


# --- the dataset in nnU-Net's layout -----------------------------------------------------------


def _link(link: Path, target: str | Path) -> None:
    """``link`` -> ``target`` resolved, replacing a link an earlier run left there."""
    link.unlink(missing_ok=True)
    link.symlink_to(Path(target).resolve())


def _nifti_channels(image: str | Sequence[str], case: str, folder: Path) -> None:
    """Link (or, for a 4D MSD image, split) one case's channels as ``<case>_<XXXX>.nii.gz`` into ``folder``."""
    import nibabel as nib

    files = [image] if isinstance(image, str) else list(image)
    if len(files) > 1 or nib.load(files[0]).ndim == 3:
        for channel, path in enumerate(files):
            _link(folder / f"{case}_{channel:04d}.nii.gz", path)
        return
    volume = nib.load(files[0])
    data = np.asanyarray(volume.dataobj)
    for channel in range(data.shape[3]):
        nib.save(nib.Nifti1Image(data[..., channel], volume.affine, volume.header),
                 folder / f"{case}_{channel:04d}.nii.gz")


def write_nnunet_raw(info: Any, raw: Path) -> Path:
    """The training cases of a medseg dataset as nnU-Net v2 raw data (links to the NIfTI files); its folder. Written
    again over an earlier run's (more folds into the same output)."""
    folder = raw / f"Dataset{NNUNET_DATASET_ID:03d}_{info.name.replace(' ', '')[:40] or 'Peers'}"
    for sub in ("imagesTr", "labelsTr"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for entry in info.training:
        if not str(entry["label"]).endswith(".nii.gz"):
            raise ValueError(f"{entry['label']}: the peers benchmark takes .nii.gz datasets")
        _nifti_channels(entry["image"], entry["case"], folder / "imagesTr")
        _link(folder / "labelsTr" / f"{entry['case']}.nii.gz", entry["label"])
    spec = info.label_spec
    labels: dict[str, Any] = {"background": 0}
    if spec.region_based:  # nnU-Net v2's region syntax
        labels.update(zip(spec.output_names, spec.output_values))
    else:
        labels.update((name, value) for name, value in zip(spec.output_names, spec.label_values[1:]))
    if spec.ignore_value is not None:
        labels["ignore"] = spec.ignore_value
    meta = {
        "channel_names": {str(i): name for i, name in enumerate(info.channel_names)},
        "labels": labels,
        **({"regions_class_order": spec.written_values} if spec.region_based else {}),
        "numTraining": len(info.training),
        "file_ending": ".nii.gz",
    }
    atomic_write_json(folder / "dataset.json", meta)
    return folder


# --- the systems ---------------------------------------------------------------------------------


@dataclass
class SystemResult:
    """One system's run: scores in the original geometry, time per stage, steps, memory and plan."""

    system: str
    dice: dict[str, float]
    hd95_mm: dict[str, float]
    mean_dice: float
    dice_empty_left_out: dict[str, float]
    """Dice per class as nnU-Net averages it: a case without the class in reference and prediction is left out (medseg
    scores it 1)."""
    detection: dict[str, dict[str, float]]
    """Per class, lesion-wise (:func:`medseg.scoring.detection.detection_summary`): lesions, found, sensitivity,
    false positives per case, Dice per found lesion."""
    seconds: dict[str, float]
    steps: int
    step_seconds: float
    peak_ram_gb: float
    plan: dict[str, Any]
    curve: list[tuple[float, float]] = field(default_factory=list)
    """medseg: (training seconds so far, validation Dice during training) per validated epoch."""
    notes: list[str] = field(default_factory=list)


def _scores(scored: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`SystemResult` fields of :func:`score_folder`'s result."""
    classes = scored["summary"]["classes"]
    return {"dice": {name: m["dice"] for name, m in classes.items()},
            "hd95_mm": {name: m["hd95_mm"] for name, m in classes.items()},
            "mean_dice": scored["summary"]["foreground_mean"]["dice"],
            "dice_empty_left_out": scored["dice_empty_left_out"], "detection": scored["detection"]}


def score_folder(info: Any, cases: Sequence[Mapping[str, Any]], predictions: Path) -> dict[str, Any]:
    """medseg's scoring of ``<case>.nii.gz`` predictions against the cases' labels, in the original geometry:
    ``summary`` (:func:`medseg.scoring.per_case.summarize`), ``dice_empty_left_out`` and ``detection`` per class."""
    from medseg.data.reading import drop_trailing_singletons, read_file
    from medseg.scoring.detection import detection_summary
    from medseg.scoring.metrics import defined_mean, undefined_when_empty
    from medseg.scoring.per_case import read_reference, score_case, summarize

    spec = info.label_spec
    rows = []
    for entry in cases:
        prediction, affine = read_file(str(predictions / f"{entry['case']}.nii.gz"))
        prediction = np.rint(drop_trailing_singletons(prediction)).astype(np.int64)
        reference, spacing = read_reference(str(entry["label"]), prediction.shape, affine, str(entry["image"]), spec)
        rows.extend(score_case(entry["case"], prediction, reference, spacing, spec, tolerance_mm=1.0))
    by_class = {name: [row for row in rows if row["class_name"] == name] for name in spec.outputs.values()}
    return {"summary": summarize(rows, spec.outputs),
            "dice_empty_left_out": {name: defined_mean(undefined_when_empty({"dice": row["dice"]}, row["flags"])["dice"]
                                                       for row in class_rows) for name, class_rows in by_class.items()},
            "detection": {name: detection_summary(class_rows) for name, class_rows in by_class.items()}}


def nnunet_dice_check(summary: Mapping[str, Any], medseg_dice: Mapping[str, float], spec: Any) -> list[str]:
    """Notes on where nnU-Net's evaluator and medseg's scoring of the same predictions differ (Dice per output).

    nnU-Net's ``summary.json`` keys a class by its value, a region by its values as a tuple (``"(1, 2, 3)"``).
    """
    notes = []
    for name, values in zip(spec.output_names, spec.output_values):
        key = str(tuple(values)) if spec.region_based else str(values[0])
        theirs = summary["mean"].get(key, {}).get("Dice")
        if theirs is None or abs(theirs - medseg_dice[name]) > DICE_AGREEMENT:
            notes.append(f"{name}: nnU-Net's evaluator {theirs}, medseg {medseg_dice[name]:.4f}. nnU-Net leaves a "
                         f"case out of a class's mean when both prediction and reference are empty (NaN); medseg "
                         f"scores it 1.0")
    if not notes:
        notes.append(f"nnU-Net's own evaluator agrees with medseg's Dice per class to {DICE_AGREEMENT:g}")
    return notes


MEASURED = "measured.json"
"""Each system's folder keeps its commands' wall time and peak RAM here, so ``--collect`` can rebuild the report."""


def _record(folder: Path, **commands: Command) -> None:
    atomic_write_json(folder / MEASURED, {name: {"seconds": c.seconds, "peak_rss_bytes": c.peak_rss_bytes}
                                          for name, c in commands.items()})


def _measured(folder: Path) -> dict[str, dict[str, float]]:
    return json.loads((folder / MEASURED).read_text())


def train_nnunet(system: str, info: Any, train_ids: list[str], val_ids: list[str], out: Path, budget_s: float) -> None:
    """nnU-Net v2 in its own folders under ``out/<system>`` (see :mod:`benchmarks.nnunet_peer`)."""
    base = out / system
    folders = {name: base / name for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")}
    raw = write_nnunet_raw(info, folders["nnUNet_raw"])
    splits = folders["nnUNet_preprocessed"] / raw.name / "splits_final.json"
    splits.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(splits, [{"train": train_ids, "val": val_ids}])  # fold 0 = medseg's fold
    command = Command([sys.executable, "-m", "benchmarks.nnunet_peer", str(NNUNET_DATASET_ID),
                       NNUNET_SYSTEMS[system], "0", str(budget_s), str(base / "result.json")], base / "nnunet.log",
                      {name: str(path) for name, path in folders.items()})
    command.run()
    _record(base, nnunet=command)


NNUNET_NORMALIZATION = {"ZScoreNormalization": "zscore", "CTNormalization": "ct", "NoNormalization": "none"}
"""nnU-Net's normalisation classes by medseg's names for the same scheme."""


def nnunet_plan(plans: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """nnU-Net's plan in medseg's terms: axes in the image's (x, y, z) order, where nnU-Net lists (z, y, x)."""
    arch = plans["architecture"]["arch_kwargs"]
    return {"target spacing (mm)": [round(v, 3) for v in plans["spacing"][::-1]],
            "patch size": plans["patch_size"][::-1],
            "pooling per axis": [stride[::-1] for stride in arch["strides"][1:]],
            "features per stage": arch["features_per_stage"],
            "normalisation": [NNUNET_NORMALIZATION.get(n, n) for n in plans["normalization_schemes"]],
            "batch size (patches)": plans["batch_size"],
            "epochs x iterations": f"{report['epochs']} x {report['iterations_per_epoch']}"}


def collect_nnunet(system: str, info: Any, val_cases: Sequence[Mapping[str, Any]], out: Path) -> SystemResult:
    """nnU-Net's run under ``out/<system>``, its predictions scored by medseg and cross-checked with its evaluator."""
    base = out / system
    report, measured = json.loads((base / "result.json").read_text()), _measured(base)["nnunet"]
    scores = _scores(score_folder(info, val_cases, Path(report["predictions"])))
    timings = report["timings"]
    return SystemResult(
        system=system, **scores,
        seconds={"planning + preprocessing": timings["planning"] + timings["preprocessing"],
                 "training": timings["training"], "prediction": timings["prediction"],
                 "total": measured["seconds"]},
        steps=report["steps"], step_seconds=report["budget_seconds_used"] / max(report["steps"], 1),
        peak_ram_gb=measured["peak_rss_bytes"] / 2**30, plan=nnunet_plan(report["plans"], report),
        notes=nnunet_dice_check(report["nnunet_summary"], scores["dice"], info.label_spec),
    )


def train_medseg(system: str, overrides: Sequence[str], data_overrides: Sequence[str], out: Path,
                 budget_s: float) -> None:
    """``scripts/train.py`` for the budget, then ``scripts/evaluate.py`` on the fold's validation cases."""
    run_dir = out / system
    train = Command([sys.executable, "scripts/train.py", *data_overrides, *MEDSEG_COMMON, *overrides,
                     f"trainer.max_minutes={budget_s / 60.0}", f"hydra.run.dir={run_dir}"], run_dir / "train.log")
    train.run()
    root = next(o.split("=", 1)[1] for o in data_overrides if o.startswith("data.root="))
    evaluate = Command([sys.executable, "scripts/evaluate.py", f"ckpt={RunLayout(run_dir).best_checkpoint}",
                        f"input={Path(root) / 'dataset.json'}", "split=validation", f"output={run_dir / 'predictions'}",
                        "inference.progress=false"], run_dir / "evaluate.log")
    evaluate.run()
    _record(run_dir, train=train, evaluate=evaluate)


def medseg_plan(cfg: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A medseg run's resolved plan, as :func:`nnunet_plan` shows nnU-Net's."""
    from medseg.config import DataConfig
    from medseg.data.transforms import samples_per_volume

    data, model = cfg["data"], cfg["model"]
    normalization = data["normalization"]
    per_volume = samples_per_volume(DataConfig(samples_per_volume=data["samples_per_volume"]), model["spatial_dims"])
    return {"target spacing (mm)": [round(v, 3) for v in data["spacing"]], "patch size": data["patch_size"],
            "pooling per axis": model["strides"], "features per stage": model["channels"],
            "normalisation": [normalization["scheme"] if isinstance(normalization, Mapping) else normalization],
            "batch size (patches)": cfg["trainer"]["batch_size"] * per_volume,
            "epochs x iterations": f"{metrics['epochs']} x {metrics['history'][0].get('steps', '?')}"}


def collect_medseg(system: str, info: Any, val_cases: Sequence[Mapping[str, Any]], out: Path) -> SystemResult:
    """A medseg system's run under ``out/<system>``: its predictions scored as nnU-Net's are, its metrics, plan and
    measurements."""
    from medseg.runs.checkpoint import load_checkpoint

    run_dir = out / system
    metrics, measured = json.loads((run_dir / "metrics.json").read_text()), _measured(run_dir)
    scores = _scores(score_folder(info, val_cases, run_dir / "predictions"))
    steps = sum(record.get("steps", 0) for record in metrics["history"])
    train_s, evaluate_s = measured["train"]["seconds"], measured["evaluate"]["seconds"]
    return SystemResult(
        system=system, **scores,
        seconds={"planning + preprocessing": train_s - metrics["train_seconds"], "training": metrics["train_seconds"],
                 "prediction": evaluate_s, "total": train_s + evaluate_s},
        steps=steps, step_seconds=metrics["train_seconds"] / max(steps, 1),
        peak_ram_gb=measured["train"]["peak_rss_bytes"] / 2**30,
        plan=medseg_plan(load_checkpoint(RunLayout(run_dir).best_checkpoint)["config"], metrics),
        curve=[(r["train_seconds"], r["val_dice"]) for r in metrics["history"] if "val_dice" in r],
    )


# --- the report ----------------------------------------------------------------------------------


def seconds_to_reach(curve: Sequence[tuple[float, float]], dice: float) -> float | None:
    """The training seconds after which the validation Dice during training first reached ``dice`` (None: never)."""
    return next((seconds for seconds, value in curve if value >= dice), None)


PLAN_REASONS = {
    "target spacing (mm)": "both take the median spacing, except along an axis much thicker than the others",
    "patch size": "nnU-Net fits the patch to a GPU memory target of 8 GB; medseg to the machine of `plan.device` "
                  "(a GPU's memory up to 8 GB, `plan.memory_gb`, or on a CPU a small voxel budget)",
    "pooling per axis": "both pool an axis until its feature map is about 4 voxels; the patch sets how often",
    "features per stage": "both plan 32 features doubling to 320 per stage on real data; medseg keeps "
                          "`model.channels` when it is set",
    "normalisation": "both pick CT (clip to the foreground's 0.5-99.5 percentiles, global z-score) or per-image "
                     "z-score from the modality",
    "batch size (patches)": "nnU-Net's batch follows its memory target; medseg's is `trainer.batch_size` x "
                            "`data.samples_per_volume`",
    "epochs x iterations": "nnU-Net's epoch is a fixed number of iterations (250, fewer for short budgets); medseg's "
                           "is one pass over the training cases",
}


LESIONS_TEXT = ("A lesion is a connected component of a class in the reference (voxels touching by a face, edge or "
                "corner), found when a predicted voxel of the class lies in it; a false positive is a predicted "
                "component that touches none; a found lesion's Dice is against the predicted components that "
                "overlap it, without other lesions' voxels. \"Dice (empty left out)\" averages as nnU-Net does: a "
                "case without the class in reference and prediction does not count, where the Dice column scores it "
                "1.")


def plan_differences(results: Sequence[SystemResult]) -> list[str]:
    """One sentence for each plan entry that differs between nnU-Net and medseg's default."""
    by_system = {r.system: r for r in results}
    if "nnunet" not in by_system or "medseg" not in by_system:
        return []
    theirs, mine = by_system["nnunet"].plan, by_system["medseg"].plan
    return [f"**{key}**: nnU-Net {theirs[key]}, medseg {mine[key]}; {PLAN_REASONS[key]}."
            for key in theirs if str(theirs[key]) != str(mine.get(key))]


def report_tables(results: Sequence[SystemResult]) -> tuple[tuple[list[str], list[list[Any]]], ...]:
    """(scores, lesions, costs, plans) as (header, rows) tables."""
    classes = list(results[0].dice)
    scores = (["system", "mean Dice", *[f"Dice {c}" for c in classes], *[f"HD95 {c} (mm)" for c in classes]],
              [[r.system, r.mean_dice, *[r.dice[c] for c in classes], *[r.hd95_mm[c] for c in classes]]
               for r in results])
    stages = ["planning + preprocessing", "training", "prediction"]
    costs = (["system", *[f"{s} (s)" for s in stages], "total (s)", "optimiser steps", "s/step",
              "peak RAM, RSS sum (GB)"],
             [[r.system, *[r.seconds.get(s) for s in stages], r.seconds["total"], r.steps, r.step_seconds,
               r.peak_ram_gb] for r in results])
    lesions = (["system", "class", "Dice", "Dice (empty left out)", "lesions found", "sensitivity",
                "false positives / case", "Dice per found lesion"],
               [[r.system, c, r.dice[c], r.dice_empty_left_out[c],
                 f"{r.detection[c]['found']} of {r.detection[c]['lesions']}", r.detection[c]["sensitivity"],
                 r.detection[c]["false_positives_per_case"], r.detection[c]["dice_per_lesion"]]
                for r in results for c in classes])
    keys = list(PLAN_REASONS)
    plans = (["plan", *[r.system for r in results]], [[k, *[str(r.plan.get(k)) for r in results]] for k in keys])
    return scores, lesions, costs, plans


def to_markdown(meta: Mapping[str, Any], results: Sequence[SystemResult]) -> str:
    scores, lesions, costs, plans = report_tables(results)
    lines = [f"# medseg vs nnU-Net v2: {meta['dataset']}, fold {meta['fold']}, {meta['budget_minutes']:g} min of "
             f"training each", "", f"{meta['machine']}; {meta['num_train']} training and {meta['num_val']} "
             f"validation cases; scored by medseg in the original geometry.", "", "## Scores", "",
             markdown_table(*scores, missing="n/a"), "", "## Lesions", "", LESIONS_TEXT, "",
             markdown_table(*lesions, missing="n/a"), "", "## Cost", "",
             markdown_table(*costs, missing="n/a"), "", "## Plans", "",
             markdown_table(*plans), ""]
    lines += [f"- {sentence}" for sentence in plan_differences(results)]
    nnunets = [r for r in results if r.system in NNUNET_SYSTEMS]
    if nnunets:
        best = max(nnunets, key=lambda r: r.mean_dice)
        lines += ["", "## Notes", ""]
        lines += [f"- {r.system}: {note}" for r in nnunets for note in r.notes]
        for r in results:
            if r.curve:
                reached = seconds_to_reach(r.curve, best.mean_dice)
                lines.append(f"- {r.system}: validation Dice during training reached {best.system}'s final "
                             f"{best.mean_dice:.4f} " + (f"after {reached:.0f} s of training" if reached is not None
                                                         else "not within the budget"))
    return "\n".join(lines) + "\n"


OWN_KEYS = ("budget_minutes", "systems")
"""The benchmark's own ``key=value`` arguments."""


def parse_overrides(items: Sequence[str], own_keys: Sequence[str] = OWN_KEYS) -> tuple[dict[str, str], list[str]]:
    """``key=value`` arguments: the benchmark's own (``own_keys``) and medseg's ``data.*`` and ``model.*``
    (``model.channels=[...]`` trains medseg's systems on the network of nnU-Net's plan; nnU-Net plans its own)."""
    own, data = {}, []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: expected key=value, got {item!r}")
        if key in own_keys:
            own[key] = value
        elif key.startswith(("data.", "model.")):
            data.append(item)
        else:
            raise SystemExit(f"error: unknown argument {key!r}; expected {', '.join(f'{k}=' for k in own_keys)}, "
                             f"data.*= or model.*=")
    return own, data


def run(args: argparse.Namespace) -> int:
    """Run every system on the same fold and budget; print and write ``peers.md`` / ``peers.json``."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    own, data_overrides = parse_overrides(args.overrides)
    systems = own.get("systems", ",".join(DEFAULT_SYSTEMS)).split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"error: systems={','.join(unknown)}: expected some of {','.join(SYSTEMS)}")
    if set(systems) & set(NNUNET_SYSTEMS) and importlib.util.find_spec("nnunetv2") is None:
        raise SystemExit(f"error: {INSTALL_HINT}")
    if not any(o.startswith("data.root=") for o in data_overrides):
        raise SystemExit("error: data.root=<MSD or nnU-Net v2 folder> is required")
    budget_s = 60.0 * float(own.get("budget_minutes", "10"))

    from medseg.data.datalist import dataset_cache_dir, dataset_from_config, split_cases, splits_path
    from medseg.training.checks import check_config

    data_format = next((o.split("=", 1)[1] for o in data_overrides if o.startswith("data.format=")), "msd")
    data_overrides = [f"data={data_format}", *(o for o in data_overrides if not o.startswith("data.format="))]
    data = check_config(compose_train_config([*data_overrides, f"output_dir={args.out}"])).data
    if data.fold == "all":
        raise SystemExit("error: data.fold=all has no held-out cases to score; choose a fold")
    info = dataset_from_config(data)
    train_cases, val_cases = split_cases(info, data.fold, data.num_folds, data.split_seed,
                                         splits_path(dataset_cache_dir(data.root, data.cache_dir), data))
    out = args.out
    for system in [] if args.collect else systems:
        log.info("peers: %s for %.0f s of training", system, budget_s)
        if system in NNUNET_SYSTEMS:
            train_nnunet(system, info, [c["case"] for c in train_cases], [c["case"] for c in val_cases], out,
                         budget_s)
        else:
            train_medseg(system, MEDSEG_SYSTEMS[system], data_overrides, out, budget_s)
    results = [collect_nnunet(system, info, val_cases, out) if system in NNUNET_SYSTEMS
               else collect_medseg(system, info, val_cases, out) for system in systems]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = {"dataset": str(data.root), "fold": data.fold, "budget_minutes": budget_s / 60.0,
            "machine": machine(device), "torch": torch.__version__, "num_train": len(train_cases),
            "num_val": len(val_cases)}
    markdown = to_markdown(meta, results)
    for table in report_tables(results):
        print(text_table(*table))
    write_report(out, "peers", markdown, {"meta": meta, "results": [asdict(r) for r in results]}, args, device)
    print(f"\nreport: {out / 'peers.md'}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py peers``' arguments."""
    parser.add_argument("overrides", nargs="*", help="data.root=..., data.format=msd|nnunet, data.fold=0, "
                                                     f"budget_minutes=10, systems={','.join(DEFAULT_SYSTEMS)} "
                                                     f"(or any of {','.join(SYSTEMS)})")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmark/peers"),
                        help="runs, nnU-Net's folders, peers.md and peers.json go here")
    add_results_argument(parser)
    parser.add_argument("--collect", action="store_true",
                        help="train nothing: rebuild the report from the runs already under --out")
