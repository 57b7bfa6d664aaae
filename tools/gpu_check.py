"""``scripts/gpu_check.py``: medseg's check on one CUDA GPU, in one command and at most 8 minutes, into one folder.

Every part runs the project's own command line (the tests, ``benchmark.py attention`` / ``models``,
``train.py``, ``evaluate.py``) in its own subprocess, with its own time limit, and reads its figures from the
JSON that command writes (``attention.json``, ``models.json``, ``metrics.json``, ``summary.json``, pytest's
JUnit XML), never from its printed text. A part that fails, crashes or hangs loses only itself: it is recorded
as ``failed`` or ``timed out`` with the tail of its output, and the next part runs. ``OUT/results.json`` and
``OUT/results.md`` are rewritten (atomically) before the first part and after each, so a check cut short
still shows what finished (``pending``: not reached). Outputs of the parts go to ``--work`` (default
``OUT/work``). The exit code is 1 when any part failed or timed out.

Schedule (seconds of the default 480 s budget; ``--budget`` scales them). A part's limit runs to the end of its
own share counted from the start of the check, so time an earlier part leaves unused goes to the later ones:

==========================  =====  =================================================================
part                        share  what it runs
==========================  =====  =================================================================
``gpu_tests``                  80  ``pytest -m gpu``: pass/fail of every CUDA test
``attention``                  60  MaSA (FlexAttention) vs flash SDPA without a mask and MaSA's SDPA-bias
                                   path at 16³, 24³, 32³ tokens, bf16, fwd+bwd: time, peak memory, max
                                   difference (target MaSA <= 1.5 x SDPA's time)
``models``                     45  U-Net+MaSA vs SwinUNETR training step at 128³, batch 2, bf16: throughput
                                   (target >= 2 x), peak memory; channels-last (the default), eager
``demo_train``                 70  ``train.py`` on the demo (40 cases), U-Net+MaSA, bf16, 6 epochs of 16 steps
``evaluate_cuda``              25  ``evaluate.py`` of its checkpoint on the demo's validation cases on the GPU
``evaluate_cpu``               25  the same on the CPU; target: the Dice of both within 1e-3
``pipeline``                   45  ``benchmark.py pipeline`` on the demo with nnU-Net's recipe (its planned network
                                   and augmentation): the GPU's busy share and the step time with the augmentation
                                   on the loader workers and on the GPU (``data.augment_on``), at 2, 4 and 8
                                   workers (target: busy share >= 0.9 with the augmentation on the GPU, 4 workers)
``models_channels_first``      25  ``models`` for U-Net+MaSA with ``model.channels_last=false``
``planner``                    35  ``train.py`` on the demo with the network and patch planned for a 1 GB memory
                                   budget (``model.channels=null``, 8 bf16 patches a step): the planner's
                                   estimate beside the measured CUDA peak (target: the peak within the budget)
``models_compiled``            70  ``models`` with ``trainer.compile=true``
==========================  =====  =================================================================

``--dry-run`` rehearses the same parts on the CPU, each tiny: the GPU tests of one file, tiny sizes, networks 8 and
16 wide (the planner's too: its patch and strides planned for a 20 MB budget), a tiny demo (8 cases, 3 steps)
trained in fp32 (the model benchmarks keep bf16), both evaluations on the CPU, the compiled part skipped (compiling
on a CPU takes minutes), CUDA-only targets ``n/a``. The default test suite runs it.

On any machine with a CUDA GPU and medseg's requirements (``pip install -e .``, or, without network, the wheels
of an offline bundle: ``scripts/offline_bundle.py`` and ``docs/offline-install.md``), from the repository root::

    python scripts/gpu_check.py --out outputs/gpu_check

(``python scripts/benchmark.py gpu --out outputs/gpu_check``, its older name, runs the same.)

``results.md`` is printed at the end; ``--budget`` gives the check more (or less) time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from benchmarks import REPO
from benchmarks.common import Target, machine, ratio, size_label, targets_markdown, write_report
from medseg.errors import MedsegError
from medseg.runs.checkpoint import load_checkpoint
from medseg.runs.layout import RunLayout
from medseg.tables import markdown_table

DEFAULT_BUDGET_S = 480.0
TAIL_CHARS = 3000
"""Characters of a part's output kept in ``results.json``."""
STOP_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL for a part past its limit (training saves ``last.pt`` on SIGTERM)."""
DICE_TOLERANCE = 1e-3
NO_CUDA = "no CUDA (dry run on the CPU)"


class GpuCheckError(MedsegError):
    """The check cannot start (no CUDA without ``--dry-run``)."""


@dataclass
class Outcome:
    """What a part's outputs say: its figures and targets, and a status when not ``passed``."""

    figures: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    status: str = "passed"
    note: str = ""


@dataclass(frozen=True)
class Part:
    """One step of the check: a command run in its own subprocess (in the repository root) and how to read it.

    ``command`` None: the part is skipped with ``note``. ``requires``: a file an earlier part must have made.
    """

    name: str
    what: str
    share_s: float
    """Its share of the default budget (:data:`DEFAULT_BUDGET_S`), in seconds."""
    command: list[str] | None
    read: Callable[[], Outcome] = Outcome
    note: str = ""
    requires: Path | None = None


@dataclass
class Record:
    """A part as ``results.json`` holds it."""

    name: str
    what: str
    status: str = "pending"
    """``pending`` | ``passed`` | ``failed`` | ``skipped`` | ``timed out``."""
    seconds: float | None = None
    limit_s: float | None = None
    command: str | None = None
    returncode: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    targets: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    output_tail: str = ""


# ------------------------------------------------------------------------------------------- readers


def _first_line(text: str | None) -> str:
    return (text or "").partition("\n")[0]


def read_pytest(junit: Path) -> Outcome:
    """Counts and failures from pytest's JUnit XML; ``skipped`` when every selected test was skipped."""
    root = ElementTree.parse(junit).getroot()
    counts = {key: sum(int(suite.get(key, 0)) for suite in root.iter("testsuite"))
              for key in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}: {_first_line(problem.get('message'))}"
              for case in root.iter("testcase") for problem in case if problem.tag in ("failure", "error")]
    ran = counts["tests"] - counts["skipped"]
    bad = counts["failures"] + counts["errors"]
    outcome = Outcome({**counts, "passed": ran - bad, "failed_tests": failed},
                      [Target("GPU tests failed or errored", bad if ran else None, "<=", 0)])
    if not counts["tests"]:
        outcome.status, outcome.note = "failed", "no test selected"
    elif not ran:
        outcome.status, outcome.note = "skipped", "every GPU test skipped (no CUDA)"
    elif bad:
        outcome.status = "failed"
    return outcome


def read_attention(report: Mapping[str, Any]) -> Outcome:
    """Per grid: MaSA's and SDPA's fwd+bwd time and peak memory, their ratio, and MaSA's max difference from
    its SDPA-bias path. The time target (MaSA <= 1.5 x SDPA) is CUDA-only."""
    cells = {(c["block"], tuple(c["shape"])): c for c in report["results"]}
    diffs = {tuple(d["shape"]): d["value"] for d in report["max_abs_diff_masa_vs_sdpa_bias"]}
    on_cuda = report["meta"]["device"].startswith("cuda")
    rows, targets = [], []
    for shape in sorted({shape for _, shape in cells}, key=math.prod):
        masa, sdpa, bias = (cells.get((block, shape), {}) for block in ("masa", "sdpa", "masa_sdpa_bias"))
        time_ratio = ratio(masa.get("time_ms"), sdpa.get("time_ms"))
        rows.append({"grid": size_label(shape), "tokens": math.prod(shape), "masa_ms": masa.get("time_ms"),
                     "sdpa_ms": sdpa.get("time_ms"), "masa_over_sdpa": time_ratio,
                     "sdpa_bias_ms": bias.get("time_ms"), "masa_peak_mib": masa.get("peak_mib"),
                     "sdpa_peak_mib": sdpa.get("peak_mib"), "sdpa_bias_peak_mib": bias.get("peak_mib"),
                     "max_abs_diff_vs_sdpa_bias": diffs.get(shape)})
        targets.append(Target(f"MaSA (FlexAttention) / flash SDPA fwd+bwd time, {size_label(shape)}, "
                              f"{report['meta']['precision']}", time_ratio if on_cuda else None, "<=", 1.5))
    outcome = Outcome({"device": report["meta"]["device"], "grids": rows}, targets)
    problems = [f"{c['block']} {size_label(tuple(c['shape']))}: {c['status']} {c['detail']}".strip()
                for c in report["results"] if c["status"] != "ok"]
    if problems:
        outcome.status, outcome.note = "failed", "; ".join(problems)
    elif not on_cuda:
        outcome.note = f"time target: {NO_CUDA}"
    return outcome


def read_models(report: Mapping[str, Any], with_targets: bool) -> Outcome:
    """Per network: training step, throughput (samples/s), inference, peak memory; with ``with_targets``, the
    benchmark's own throughput target (CUDA only: SwinUNETR's step time over U-Net+MaSA's >= 2)."""
    meta = report["meta"]
    rows = [{"model": r["model"], "status": r["status"], "params_m": None if r["params"] is None else r["params"] / 1e6,
             "train_step_s": r["train_s"], "samples_per_s": ratio(meta["batch"], r["train_s"]),
             "inference_s": r["infer_s"], "train_peak_mib": r["train_peak_mib"],
             "inference_peak_mib": r["infer_peak_mib"]} for r in report["results"]]
    on_cuda = meta["device"].startswith("cuda")
    targets = [Target(t["label"], t["value"], t["relation"], t["goal"])
               for t in report["targets"]] if with_targets and on_cuda else []
    setting = f"{'x'.join(map(str, meta['patch']))}, batch {meta['batch']}, {meta['precision']}"
    outcome = Outcome({"machine": meta["machine"], "setting": setting, "overrides": meta["overrides"],
                       "networks": rows}, targets)
    problems = [f"{r['model']}: {r['status']} {r['detail']}" for r in report["results"] if r["status"] != "ok"]
    if problems:
        outcome.status, outcome.note = "failed", "; ".join(problems)
    elif with_targets and not on_cuda:
        outcome.note = f"throughput target: {NO_CUDA}"
    return outcome


PIPELINE_BUSY_GOAL = 0.9
PIPELINE_WORKERS = 4


def read_pipeline(report: Mapping[str, Any]) -> Outcome:
    """Per ``data.augment_on`` and number of workers: the step time, the device's part, the wait for the loader and the
    busy share; the target (CUDA only): with the augmentation on the GPU, 4 workers keep it busy >= 90 % of the time."""
    settings = [dict(row) for row in report["settings"]]
    on_cuda = "cuda" in str(report.get("provenance", {}).get("machine", {}).get("device", ""))
    chosen = next((row["busy_share"] for row in settings
                   if row["augment_on"] == "device" and row["workers"] == PIPELINE_WORKERS), None)
    targets = [Target(f"device busy share, nnU-Net's augmentation on the GPU, {PIPELINE_WORKERS} workers", chosen,
                      ">=", PIPELINE_BUSY_GOAL)] if on_cuda else []
    meta = report["meta"]
    outcome = Outcome({"setting": f"patch {meta['patch']}, {meta['patches_per_step']} patches a step, channels "
                                  f"{meta['channels']}", "settings": settings}, targets)
    if not on_cuda:
        outcome.note = f"busy-share target: {NO_CUDA}"
    return outcome


def read_training(metrics: Mapping[str, Any]) -> Outcome:
    """The demo run's validation Dice (best, per class), epochs, its compute (time, seconds per step, peak memory,
    parameters, GFLOPs of a patch's forward pass) from ``metrics.json``."""
    keys = ("status", "best_val_dice", "val_dice_per_class", "best_epoch", "epochs", "train_seconds",
            "wall_seconds", "seconds_per_step", "peak_memory_mb", "nonfinite_steps", "params",
            "gflops_per_patch_forward")
    outcome = Outcome({key: metrics.get(key) for key in keys})
    if metrics.get("status") != "completed":
        outcome.status, outcome.note = "failed", f"metrics.json status: {metrics.get('status')}"
    return outcome


def read_planner(metrics: Mapping[str, Any], config: Mapping[str, Any], budget_mib: float) -> Outcome:
    """The planned network and patch (``config``, the checkpoint's resolved one), the planner's estimate of a
    training step, the measured peak and their ratio. The target (the peak within ``budget_mib``) is CUDA-only: on
    the CPU ``peak_memory_mb`` is the process's resident peak, runtime included."""
    estimate, peak = metrics.get("estimated_memory_mb"), metrics.get("peak_memory_mb")
    on_cuda = str(config["trainer"]["device"]).startswith("cuda")
    outcome = Outcome({"patch_size": config["data"]["patch_size"], "channels": config["model"]["channels"],
                       "strides": config["model"]["strides"], "budget_mib": budget_mib,
                       "estimated_mib": estimate, "peak_mib": peak, "estimate_over_peak": ratio(estimate, peak)},
                      [Target(f"measured training peak within the {budget_mib:.0f} MiB budget the plan was fit to",
                              peak, "<=", budget_mib)] if on_cuda else [])
    if metrics.get("status") != "completed":
        outcome.status, outcome.note = "failed", f"metrics.json status: {metrics.get('status')}"
    elif not on_cuda:
        outcome.note = f"budget target: {NO_CUDA}"
    return outcome


def class_dice(summary: Mapping[str, Any]) -> dict[str, float]:
    """Mean Dice per foreground class from an evaluation's ``summary.json``."""
    return {name: values["dice"] for name, values in summary.get("classes", {}).items()}


def read_evaluation(summary: Mapping[str, Any], reference: Mapping[str, Any] | None = None,
                    reference_name: str | None = None) -> Outcome:
    """An evaluation's Dice (mean and per class) from ``summary.json``; with ``reference_name`` (another part's
    evaluation of the same checkpoint, whose ``summary.json`` is ``reference``: None when it wrote none), the
    largest per-class Dice difference and its target (<= 1e-3)."""
    dice = class_dice(summary)
    figures: dict[str, Any] = {"device": summary.get("config", {}).get("inference", {}).get("device"),
                               "mean_dice": summary.get("foreground_mean", {}).get("dice"), "dice_per_class": dice,
                               "num_scored": summary.get("num_scored"), "seconds": summary.get("seconds")}
    outcome = Outcome(figures)
    if reference_name is not None:
        other = class_dice(reference or {})
        difference = max((abs(dice[name] - other[name]) for name in dice.keys() & other.keys()), default=None)
        figures[f"max_abs_dice_difference_vs_{reference_name}"] = difference
        outcome.targets.append(Target(f"evaluation Dice of the demo checkpoint, {figures['device']} vs "
                                      f"{reference_name}: max abs. difference over classes", difference, "<=",
                                      DICE_TOLERANCE))
    if summary.get("failed") or not summary.get("num_scored"):
        outcome.status, outcome.note = "failed", f"failed cases: {summary.get('failed')}"
    return outcome


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def read_written(path: Path, reader: Callable[[Any], Outcome],
                 load: Callable[[Path], Any] = load_json) -> Callable[[], Outcome]:
    """A part's ``read``: ``reader`` of ``load(path)`` (the JSON there by default), or a failure when the part's
    command did not write ``path``."""

    def read() -> Outcome:
        if not path.is_file():
            return Outcome(status="failed", note=f"{path.name} was not written")
        return reader(load(path))

    return read


# ------------------------------------------------------------------------------------------- schedule


@dataclass(frozen=True)
class Scale:
    """What differs between the check on CUDA and its dry run on the CPU (lists: command-line arguments)."""

    device: str
    tests: list[str]
    """The test files (or folders) ``gpu_tests`` selects its GPU tests from, relative to the repository root."""
    attention: list[str]
    """``benchmark.py attention``'s ``--sizes`` and repetitions."""
    models: list[str]
    """``benchmark.py models``' sizes and repetitions."""
    networks: list[str]
    """The networks of ``models`` and ``models_compiled``."""
    model_overrides: list[str]
    """The first overrides of every ``models`` part."""
    demo: list[str]
    """The demo training's last overrides."""
    planned: list[str]
    """The planner run's last overrides."""
    planned_channels: str
    """The planner run's ``model.channels``: ``null`` plans the widths with the depth."""
    memory_gb: float
    """The memory budget the planner run's network and patch are planned for."""
    pipeline: list[str] = field(default_factory=list)
    """``benchmark.py pipeline``'s last overrides and arguments (the workers tried, the steps)."""
    precision: str = "bf16"
    """``trainer.precision`` of the training parts."""


ON_CUDA = Scale("cuda", ["tests"], ["16^3", "24^3", "32^3", "--reps", "10", "--max-seconds", "5"],
                ["--gpu-sizes", "--batch", "2", "--max-seconds", "15"], ["unet+masa", "monai_swinunetr"], [],
                ["trainer.max_epochs=6", "trainer.val_every=6"],
                ["trainer.batch_size=4", "trainer.max_epochs=2", "trainer.val_every=2"], "null", 1.0,
                ["--workers", "2", "4", "8", "--steps", "20"])
_TINY = ["model.channels=[8,16]", "model.strides=[2]"]
_ONE_EPOCH = ["trainer.max_epochs=1", "trainer.val_every=1"]
DRY_RUN = Scale("cpu", ["tests/models/test_norms.py"], ["4^3", "--reps", "1"],
                ["--patch", "16", "16", "16", "--batch", "1", "--reps", "1", "--precision", "bf16"], ["unet+masa"],
                _TINY, ["data.num_cases=8", "data.patch_size=[32,32,16]", "data.samples_per_volume=1", *_TINY,
                        *_ONE_EPOCH],
                ["data.num_cases=8", "trainer.batch_size=1", "data.samples_per_volume=1", *_ONE_EPOCH], "[8,16]",
                0.02, ["data.num_cases=8", "data.patch_size=[32,32,16]", "trainer.batch_size=1", *_TINY,
                       "--workers", "1", "2", "--steps", "2", "--warmup", "1"], precision="fp32")
"""The dry run trains in fp32 (a CPU without native bf16 emulates it, minutes for what takes seconds in fp32), and
every part is tiny: one test file collected (collecting the whole suite takes half a minute), the networks 8 and 16
wide; the planner plans the patch and strides of that network for a 20 MB budget (a planned 32-wide network, slided
over the demo's volumes, took minutes on a CPU)."""


def _script(name: str) -> str:
    return str(REPO / "scripts" / name)


@dataclass(frozen=True)
class PartMaker:
    """The check's kinds of part at ``scale``, their commands writing under ``work``."""

    work: Path
    scale: Scale

    @property
    def data_root(self) -> Path:
        """The demo dataset, which ``demo_train`` generates."""
        return self.work / "data" / "demo3d"

    def tests(self, share_s: float) -> Part:
        junit = self.work / "gpu_tests.xml"
        return Part("gpu_tests", "pytest -m gpu: every CUDA test", share_s,
                    [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider",
                     f"--junitxml={junit}", *(str(REPO / path) for path in self.scale.tests)],
                    read_written(junit, read_pytest, load=Path))

    def attention(self, share_s: float) -> Part:
        out = self.work / "attention"
        return Part("attention", "MaSA (FlexAttention) vs flash SDPA and MaSA's SDPA-bias path, bf16 fwd+bwd", share_s,
                    [sys.executable, _script("benchmark.py"), "attention", "--device", self.scale.device,
                     "--precision", "bf16", "--blocks", "masa", "sdpa", "masa_sdpa_bias", "--sizes",
                     *self.scale.attention, "--max-memory-gb", "100", "--out", str(out)],
                    read_written(out / "attention.json", read_attention))

    def models(self, name: str, what: str, share_s: float, networks: Sequence[str], overrides: Sequence[str] = (),
               with_targets: bool = False) -> Part:
        out = self.work / name
        command = [sys.executable, _script("benchmark.py"), "models", *self.scale.models, "--models", *networks,
                   "--device", self.scale.device, "--out", str(out), "--override", *self.scale.model_overrides,
                   *overrides]
        return Part(name, what, share_s, command,
                    read_written(out / "models.json", lambda report: read_models(report, with_targets)))

    def train(self, name: str, what: str, share_s: float, first: Sequence[str], last: Sequence[str],
              reader: Callable[[Any], Outcome], requires: Path | None = None) -> Part:
        """``train.py`` on the demo in the scale's precision, with the overrides ``first``, the common ones, then
        ``last``."""
        run_dir = self.work / name
        command = [sys.executable, _script("train.py"), *first, f"trainer.precision={self.scale.precision}",
                   f"trainer.device={self.scale.device}", f"data.root={self.data_root}", "trainer.progress=false",
                   "trainer.check_data=false", *last, f"hydra.run.dir={run_dir}"]
        return Part(name, what, share_s, command, read_written(run_dir / "metrics.json", reader), requires=requires)

    def planner(self, share_s: float) -> Part:
        """``train`` with the network and patch planned for the scale's memory budget: estimate vs peak."""
        memory_gb = self.scale.memory_gb

        def read(metrics: dict[str, Any]) -> Outcome:
            config = load_checkpoint(RunLayout(self.work / "planner").last_checkpoint)["config"]
            return read_planner(metrics, config, memory_gb * 1024)

        return self.train("planner", "train.py on the demo, network and patch planned for a memory budget: estimate "
                          "vs peak", share_s, [f"model.channels={self.scale.planned_channels}", "model.strides=null",
                                               "data.patch_size=null"],
                          [f"plan.memory_gb={memory_gb:g}", *self.scale.planned], read,
                          requires=self.data_root / "dataset.json")

    def pipeline(self, share_s: float) -> Part:
        """``benchmark.py pipeline`` on the demo with nnU-Net's recipe: busy share and step time per path and
        workers."""
        out = self.work / "pipeline"
        command = [sys.executable, _script("benchmark.py"), "pipeline", "experiment=nnunet",
                   f"data.root={self.data_root}", f"trainer.device={self.scale.device}",
                   f"trainer.precision={self.scale.precision}",
                   "trainer.check_data=false", *self.scale.pipeline, "--out", str(out)]
        return Part("pipeline", "training steps with their loader, nnU-Net's augmentation on the workers and on the "
                    "device, per number of workers: busy share and step time", share_s, command,
                    read_written(out / "pipeline.json", read_pipeline), requires=self.data_root / "dataset.json")

    def evaluation(self, name: str, on: str, share_s: float, reference: str | None = None) -> Part:
        """``evaluate.py`` of the demo training's best checkpoint on ``on``; with ``reference``, the Dice difference
        from that part's evaluation."""
        out, checkpoint = self.work / name, RunLayout(self.work / "demo_train").best_checkpoint
        command = [sys.executable, _script("evaluate.py"), f"ckpt={checkpoint}", f"input={self.data_root}",
                   "split=validation", f"output={out}", f"inference.device={on}", "inference.progress=false"]
        reference_summary = None if reference is None else self.work / reference / "summary.json"

        def read(summary: dict[str, Any]) -> Outcome:
            other = load_json(reference_summary) if reference_summary and reference_summary.is_file() else None
            return read_evaluation(summary, other, reference)

        return Part(name, f"evaluate.py of the demo checkpoint on its validation cases, device={on}", share_s,
                    command, read_written(out / "summary.json", read), requires=checkpoint)


def schedule(work: Path, dry_run: bool) -> list[Part]:
    """The parts of the check (see the module docstring), their commands writing under ``work``."""
    make = PartMaker(work, DRY_RUN if dry_run else ON_CUDA)
    networks, compiled = make.scale.networks, "U-Net+MaSA vs SwinUNETR training step, trainer.compile=true"
    return [
        make.tests(80),
        make.attention(60),
        make.models("models", "U-Net+MaSA vs SwinUNETR training step, channels-last, eager", 45, networks,
                    with_targets=True),
        make.train("demo_train", "train.py on the demo: U-Net+MaSA, bf16, a fixed number of steps", 70,
                   ["model.bottleneck=masa"], make.scale.demo, read_training),
        make.evaluation("evaluate_cuda", make.scale.device, 25),
        make.evaluation("evaluate_cpu", "cpu", 25, reference="evaluate_cuda"),
        make.pipeline(45),
        make.models("models_channels_first", "U-Net+MaSA training step, model.channels_last=false", 25,
                    ["unet+masa"], ["model.channels_last=false"]),
        make.planner(35),
        Part("models_compiled", compiled, 70, None, note="compiling on the CPU takes minutes: runs on CUDA only")
        if dry_run else make.models("models_compiled", compiled, 70, networks, ["trainer.compile=true"], True),
    ]


# ------------------------------------------------------------------------------------------- running


def output_tail(log: Path, chars: int = TAIL_CHARS) -> str:
    """The last ``chars`` characters of a part's log."""
    with log.open("rb") as file:
        file.seek(max(0, log.stat().st_size - 4 * chars))
        return file.read().decode(errors="replace")[-chars:]


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def run_command(command: Sequence[str], limit_s: float, log: Path) -> int | None:
    """Run ``command`` in the repository root in a new process group, output to ``log``; its exit code, or None
    when it passed ``limit_s`` and was stopped (SIGTERM, then SIGKILL to the whole group)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "1"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as output:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            return process.wait(timeout=max(limit_s, 1.0))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return None
        finally:
            _signal_group(process, signal.SIGKILL)  # what the part left running (e.g. compile workers)


def run_part(part: Part, limit_s: float, work: Path) -> Record:
    """Run one part within ``limit_s`` and read its outcome; every failure is recorded, none raised."""
    record = Record(part.name, part.what, note=part.note)
    if part.command is None:
        record.status = "skipped"
        return record
    if part.requires is not None and not part.requires.is_file():
        record.status, record.note = "skipped", f"needs {part.requires}, which an earlier part did not make"
        return record
    record.limit_s = round(limit_s, 1)
    record.command = subprocess.list2cmdline(part.command)
    log = work / f"{part.name}.log"
    started = time.perf_counter()
    record.returncode = run_command(part.command, limit_s, log)
    record.seconds = round(time.perf_counter() - started, 1)
    record.output_tail = output_tail(log)
    if record.returncode is None:
        record.status, record.note = "timed out", f"stopped after its {limit_s:.0f} s limit"
    try:
        outcome = part.read()
    except Exception as error:  # a report in an unexpected shape must not lose the other parts
        outcome = Outcome(status="failed", note=f"reading its outputs failed: {type(error).__name__}: {error}")
    record.figures, record.targets = outcome.figures, [asdict(t) for t in outcome.targets]
    if record.returncode is not None:
        record.status = "failed" if record.returncode else outcome.status
        record.note = outcome.note or (f"exit code {record.returncode}" if record.returncode else "")
    return record


# ------------------------------------------------------------------------------------------- report


def _figure_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{key}: {_figure_text(item)}" for key, item in value.items())
    return str(value)


def _is_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value)


def figure_tables(figures: Mapping[str, Any]) -> list[str]:
    """Markdown lines of a part's figures: a table of the single values, then a table per list of rows."""
    singles = [[key, value] for key, value in figures.items() if not _is_rows(value)]
    lines = [markdown_table(["figure", "value"], singles, formats={"value": _figure_text})] if singles else []
    for key, rows in figures.items():
        if _is_rows(rows):
            headers = list(rows[0])
            lines += ["", f"{key}:", "", markdown_table(headers, [[row.get(h) for h in headers] for row in rows],
                                                       formats=dict.fromkeys(headers, _figure_text), missing="n/a")]
    return lines


def to_markdown(report: Mapping[str, Any]) -> str:
    """``results.md``: the parts' statuses, the targets, then each part's figures (and output tail when it
    did not pass)."""
    meta, records = report["meta"], report["parts"]
    lines = [
        "# medseg GPU check",
        "",
        f"{meta['machine']}, torch {meta['torch']}, CUDA {'yes' if meta['cuda'] else 'no'}"
        f"{'; dry run on the CPU (tiny sizes)' if meta['dry_run'] else ''}; budget {meta['budget_s']:g} s; "
        f"started {meta['started']}.",
        "",
        markdown_table(["part", "status", "seconds", "limit (s)", "note"],
                       [[r["name"], r["status"], r["seconds"], r["limit_s"], r["note"]] for r in records],
                       formats={"seconds": ".0f", "limit (s)": ".0f"}),
        "",
        "## targets",
        "",
        targets_markdown(report["targets"]),
    ]
    for record in records:
        lines += ["", f"## {record['name']}", "", f"{record['what']}. Status: {record['status']}.", ""]
        lines += figure_tables(record["figures"])
        if record["status"] in ("failed", "timed out") and record["output_tail"]:
            lines += ["", "<details><summary>output tail</summary>", "", "```", record["output_tail"].strip(), "```",
                      "", "</details>"]
    return "\n".join(lines) + "\n"


def write_results(out: Path, meta: Mapping[str, Any], records: Sequence[Record]) -> dict[str, Any]:
    """Write ``results.json`` and ``results.md`` (atomically); returns the report."""
    report = {
        "meta": dict(meta),
        "parts": [asdict(r) for r in records],
        "targets": [{**t, "label": f"{t['label']} [{r.name}]"} for r in records for t in r.targets],
    }
    device = "cuda" if meta["cuda"] and not meta["dry_run"] else "cpu"
    write_report(out, "results", to_markdown(report), report, None, device)
    return report


def run_check(parts: Sequence[Part], budget_s: float, out: Path, work: Path, meta: Mapping[str, Any]) -> int:
    """Run ``parts`` in order, each until the end of its share of ``budget_s`` (scaled from
    :data:`DEFAULT_BUDGET_S`) counted from the start; results rewritten before the first and after each.
    Returns 1 when any part failed or timed out, else 0."""
    records = [Record(p.name, p.what, note=p.note) for p in parts]
    write_results(out, meta, records)
    started, deadline = time.monotonic(), 0.0
    for index, part in enumerate(parts):
        deadline += part.share_s * budget_s / DEFAULT_BUDGET_S
        print(f"[gpu check] {part.name} ...", flush=True)
        records[index] = run_part(part, deadline - (time.monotonic() - started), work)
        record = records[index]
        print(f"[gpu check] {part.name}: {record.status}"
              + (f" in {record.seconds:.0f} s (limit {record.limit_s:.0f} s)" if record.seconds is not None else "")
              + (f"; {record.note}" if record.note else ""), flush=True)
        write_results(out, meta, records)
    return int(any(r.status in ("failed", "timed out") for r in records))


def check_meta(dry_run: bool, budget_s: float, work: Path) -> dict[str, Any]:
    """The head of ``results.json``: the machine the parts run on, torch, CUDA, the settings, the start time."""
    device = torch.device("cuda" if torch.cuda.is_available() and not dry_run else "cpu")
    return {"machine": machine(device), "torch": torch.__version__, "cuda": torch.cuda.is_available(),
            "dry_run": dry_run, "budget_s": budget_s,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "work": str(work)}


def run(args: argparse.Namespace) -> int:
    """Run the check (see the module docstring); its exit code."""
    if not args.dry_run and not torch.cuda.is_available():
        raise GpuCheckError("no CUDA device here: run the check on a GPU machine, or --dry-run to rehearse it on the "
                            "CPU")
    out = args.out.resolve()
    work = (args.work or out / "work").resolve()
    code = run_check(schedule(work, args.dry_run), args.budget, out, work, check_meta(args.dry_run, args.budget, work))
    print((out / "results.md").read_text())
    return code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The GPU check's arguments (``scripts/gpu_check.py``, ``benchmark.py gpu``)."""
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu_check"),
                        help="results.json and results.md go here")
    parser.add_argument("--work", type=Path, default=None, help="the parts' outputs and logs (default OUT/work)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                        help="seconds for the whole check, split over the parts")
    parser.add_argument("--dry-run", action="store_true",
                        help="rehearse on the CPU: tiny sizes, a few minutes (each part starts its own process)")
