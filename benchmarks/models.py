"""``benchmark.py models``: training-step time, inference time, peak memory and size of whole networks.

Rows (:func:`all_rows`): medseg's U-Net with each bottleneck choice (``unet+<block>``: ``none`` and every
registered block) and every other ``model.name`` (MONAI's ``UNet``, ``SwinUNETR`` with feature size 24,
``UNETR``). Each row's config is the training config composed as ``scripts/train.py`` composes it, with
``model.bottleneck=<block>`` or ``model.name=<network>`` (and ``--override``), so the figures describe what
users run. Every row gets the same input: ``(batch, 1, *patch)`` float32 images, 3 classes (the demo task).

* **Train step**: the trainer's own :class:`~medseg.training.trainer.TrainStep`, built as the trainer builds it
  (its loss, ``trainer.optimizer``, ``trainer.grad_clip``, the precision's autocast and loss scaling; compiled
  under ``trainer.compile``): forward, loss, backward, clip, step, non-finite steps skipped. Median of
  ``--reps`` timed steps after ``--warmup`` untimed ones.
* **Inference**: one forward of the same batch in eval mode under ``torch.no_grad`` (a patch, not a
  sliding window over a volume). Median of ``--reps``, after the memory run as warm-up.
* Timing is **round-robin**: every network is built first, then each round runs every network once, so a
  change in machine load during the benchmark (shared machines) hits all rows alike and their ratios stay fair.
* **Peak memory** (MiB, all tensors alive at the high-water mark): on CUDA ``torch.cuda.max_memory_allocated``
  during one step. On the CPU the same quantity from the allocator events ``torch.profiler`` records
  (``profile_memory=True``, :func:`benchmarks.common.peak_bytes`) during one step, plus the tensors
  alive before it (parameters, gradients, optimizer state, batch). Memory that libraries allocate outside
  PyTorch's allocator (oneDNN scratch, the Python heap) is not included. Training is measured in steady
  state (after warm-up, so the optimizer state exists); inference before any training (no gradients, no
  optimizer).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import (
    MIB,
    Target,
    add_results_argument,
    compose_train_config,
    machine,
    peak_bytes,
    ratio,
    targets_markdown,
    time_ms,
    write_report,
)
from medseg.attention.registry import block_choices
from medseg.config import ModelConfig, TrainConfig
from medseg.data.datalist import DatasetInfo
from medseg.data.demo import DEMO_LABELS
from medseg.models import MODELS, build_model
from medseg.optim import build_optimizer
from medseg.runtime.device import PRECISIONS, amp_dtype, autocast
from medseg.runtime.launch import SINGLE_PROCESS
from medseg.tables import CellFormat, markdown_table, text_table
from medseg.training.checks import check_config
from medseg.training.losses import build_loss
from medseg.training.run import wrap_model
from medseg.training.trainer import TrainStep

UNET_ROW = f"{ModelConfig.name}+"
"""Rows named ``unet+<block>`` are medseg's U-Net with ``model.bottleneck=<block>``."""
NO_RUN_DIR = "output_dir=unused"
"""The benchmark writes no run directory, and outside a Hydra run the default cannot resolve."""
REFERENCE = "monai_swinunetr"
DATASET = DatasetInfo(root=Path(), format="demo", name="benchmark", labels={int(k): v for k, v in DEMO_LABELS.items()},
                      channel_names=["image"], training=[])
"""What every network is built and trained for: the demo task's classes and its one input channel."""
IN_CHANNELS, NUM_CLASSES = DATASET.in_channels, DATASET.num_classes


@dataclass(frozen=True)
class Sizes:
    """One benchmark setting: patch, batch, autocast precision, repetitions."""

    patch: tuple[int, int, int]
    batch: int
    precision: str
    reps: int
    warmup: int


CPU_SIZES = Sizes((64, 64, 64), batch=2, precision="fp32", reps=3, warmup=1)
GPU_SIZES = Sizes((128, 128, 128), batch=4, precision="bf16", reps=10, warmup=3)
QUICK_SIZES = Sizes((32, 32, 64), batch=2, precision="fp32", reps=1, warmup=1)
"""For tests. SwinUNETR's deepest stage must keep more than one voxel (instance norm): 32x32x64 is its least input."""


@dataclass
class Row:
    """One network's measurements (None where it did not run)."""

    model: str
    status: str = "ok"
    """``ok`` | ``oom`` | ``error``."""
    detail: str = ""
    params: int | None = None
    train_s: float | None = None
    infer_s: float | None = None
    train_peak_mib: float | None = None
    infer_peak_mib: float | None = None


def all_rows() -> list[str]:
    """Every row: the U-Net with each bottleneck choice (``none``, then the registered blocks), then the other
    networks of ``model.name``; read from the registries, so a newly registered block is a row."""
    return [*(UNET_ROW + block for block in block_choices()), *(name for name in MODELS if name != ModelConfig.name)]


def train_config(row: str, overrides: Sequence[str] = (), patch: Sequence[int] = CPU_SIZES.patch) -> TrainConfig:
    """The checked training config of ``row``: ``scripts/train.py``'s, with the row's block or network and the
    benchmark's ``patch`` (checked against the network at start-up, as training checks its own).

    Raises:
        ConfigError: an override names an unknown key or an invalid value.
    """
    choice = f"model.bottleneck={row.removeprefix(UNET_ROW)}" if row.startswith(UNET_ROW) else f"model.name={row}"
    patch_size = f"data.patch_size=[{','.join(map(str, patch))}]"
    return check_config(compose_train_config([choice, patch_size, *overrides, NO_RUN_DIR]))


def _tensor_bytes(tensors: Sequence[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def resident_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None, batch: Sequence[torch.Tensor]) -> int:
    """Bytes of the tensors alive between steps: parameters, gradients, optimizer state, batch."""
    params = list(model.parameters())
    state = (
        []
        if optimizer is None
        else [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    )
    return _tensor_bytes([*params, *(p.grad for p in params), *state, *batch])


def absolute_peak_mib(fn: Callable[[], object], device: torch.device, before: int) -> float:
    """Peak MiB of all tensors while ``fn`` runs: ``before`` (CPU: tensors alive already) plus the rise above it.

    On CUDA the allocator's own count of what is allocated replaces ``before``.
    """
    if device.type == "cuda":
        before = torch.cuda.memory_allocated(device)
    rise, _ = peak_bytes(fn, device)
    return (before + rise) / MIB


def make_inference(model: nn.Module, image: torch.Tensor, amp: torch.dtype | None) -> Callable[[], torch.Tensor]:
    """One eval-mode, no-grad forward of ``image`` as a closure."""

    def infer() -> torch.Tensor:
        model.eval()
        with torch.no_grad(), autocast(image.device, amp):
            return model(image)

    return infer


@dataclass
class Runnable:
    """A built network with its measurements so far and its two timed closures (None after a failure)."""

    row: Row
    infer: Callable[[], torch.Tensor] | None = None
    step: Callable[[], float | None] | None = None
    """One training step on the benchmark's batch: :attr:`trainer_step` in train mode."""
    trainer_step: TrainStep | None = None


def _record_failure(row: Row, error: Exception) -> None:
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    out_of_memory = "out of memory" in message.lower() or "can't allocate" in message.lower()
    row.status, row.detail = ("oom" if out_of_memory else "error"), message[:200]


def prepare(name: str, cfg: TrainConfig, sizes: Sizes, device: torch.device) -> Runnable:
    """Build ``name`` from ``cfg`` as the trainer would, measure its parameters and peak memory (inference
    first, then training after the warm-up steps)."""
    runnable = Runnable(Row(name))
    amp = amp_dtype(cfg.trainer.precision, device)
    generator = torch.Generator().manual_seed(0)
    image = torch.randn(sizes.batch, IN_CHANNELS, *sizes.patch, generator=generator).to(device)
    label = torch.randint(0, NUM_CLASSES, (sizes.batch, 1, *sizes.patch), generator=generator).to(device)
    try:
        torch.manual_seed(0)
        model = build_model(cfg.model, IN_CHANNELS, NUM_CLASSES, sizes.patch)
        runnable.row.params = sum(p.numel() for p in model.parameters())
        model = wrap_model(model, device, SINGLE_PROCESS, cfg.trainer.compile)
        infer = make_inference(model, image, amp)
        runnable.row.infer_peak_mib = absolute_peak_mib(infer, device, resident_bytes(model, None, [image]))
        step = TrainStep(model, build_loss(cfg, DATASET, None), build_optimizer(model.parameters(), cfg.trainer),
                         cfg.trainer.grad_clip, amp, device)

        def train() -> float | None:
            model.train()  # inference left it in eval mode
            return step(image, label)

        for _ in range(sizes.warmup):
            train()
        resident = resident_bytes(model, step.optimizer, [image, label])
        runnable.row.train_peak_mib = absolute_peak_mib(train, device, resident)
        runnable.infer, runnable.step, runnable.trainer_step = infer, train, step
    except (RuntimeError, ValueError) as error:  # torch.OutOfMemoryError is a RuntimeError, ConfigError a ValueError
        _record_failure(runnable.row, error)
    return runnable


def interleaved_seconds(runnables: Sequence[Runnable], device: torch.device, reps: int, max_seconds: float) -> None:
    """Median seconds of inference and of a training step per network, timed round-robin.

    Each round runs every network's inference and training step once, so a change in machine load during
    the benchmark hits all rows and both columns alike and the ratios between them stay fair. A network
    leaves the rounds after ``reps`` rounds or once its runs add up to ``max_seconds``.
    """
    times: dict[str, dict[str, list[float]]] = {r.row.model: {"infer": [], "step": []} for r in runnables}
    for _ in range(reps):
        for runnable in runnables:
            spent = times[runnable.row.model]
            over_budget = bool(spent["step"]) and sum(map(sum, spent.values())) >= max_seconds
            if runnable.step is None or over_budget:
                continue
            try:
                for kind in ("infer", "step"):
                    spent[kind].append(time_ms(getattr(runnable, kind), device, 1, float("inf"))[0] / 1000)
            except RuntimeError as error:  # e.g. out of memory
                _record_failure(runnable.row, error)
                runnable.infer = runnable.step = None
    for runnable in runnables:
        spent = times[runnable.row.model]
        if runnable.row.status == "ok" and spent["step"]:
            runnable.row.infer_s, runnable.row.train_s = (statistics.median(spent[k]) for k in ("infer", "step"))


def measure(configs: Mapping[str, TrainConfig], sizes: Sizes, device: torch.device, max_seconds: float) -> list[Row]:
    """Every network's figures (``configs``: row -> :func:`train_config`; see the module docstring); a network's
    errors and OOMs are recorded, not raised."""
    runnables = []
    for name, cfg in configs.items():
        started = time.perf_counter()
        runnables.append(prepare(name, cfg, sizes, device))
        row = runnables[-1].row
        print(f"{name:>22}: {row.status} {row.detail} ({time.perf_counter() - started:.0f} s to build, warm up "
              f"and measure memory)", file=sys.stderr)
    interleaved_seconds(runnables, device, sizes.reps, max_seconds)
    gc.collect()
    return [r.row for r in runnables]


def _per_reference(rows: Sequence[Row], key: str) -> dict[str, float | None]:
    """Each row's ``key`` divided by the reference row's (SwinUNETR), None where either is missing."""
    ref = next((r for r in rows if r.model == REFERENCE), None)
    return {r.model: ratio(getattr(r, key), None if ref is None else getattr(ref, key)) for r in rows}


def targets(rows: Sequence[Row], sizes: Sizes, device: torch.device) -> list[Target]:
    """CPU: U-Net+MaSA step time <= 0.25 x SwinUNETR's. GPU (128³ bf16): its throughput >= 2 x SwinUNETR's."""
    step = _per_reference(rows, "train_s")["unet+masa"] if any(r.model == "unet+masa" for r in rows) else None
    where = f"{'x'.join(map(str, sizes.patch))}, batch {sizes.batch}, {sizes.precision}, {device.type}"
    if device.type == "cuda":
        return [
            Target(f"unet+masa training throughput / SwinUNETR's ({where})", None if not step else 1 / step, ">=", 2.0)
        ]
    return [Target(f"unet+masa train step time / SwinUNETR's ({where})", step, "<=", 0.25)]


RATIO = "× Swin"
TABLE_FORMATS: dict[str, CellFormat] = {
    "params (M)": ".3g", "train step (s)": ".3g", "inference (s)": ".3g", RATIO: ".2g",
    "train peak (MiB)": ",.0f", "inference peak (MiB)": ",.0f",
}
TABLE_STYLE: dict[str, Any] = {"formats": TABLE_FORMATS, "align": "<" + ">" * 8, "missing": "n/a"}
"""How :func:`table` is shown, in the terminal and in ``models.md``."""


def table(rows: Sequence[Row]) -> tuple[list[str], list[list[Any]]]:
    """Headers and values of the results table (ratios against SwinUNETR); a failed row shows its status
    and error instead of the times. Render it with :data:`TABLE_STYLE`."""
    ratios = {key: _per_reference(rows, key) for key in ("train_s", "infer_s", "train_peak_mib")}
    headers = ["model", "params (M)", "train step (s)", RATIO, "inference (s)", RATIO, "train peak (MiB)", RATIO,
               "inference peak (MiB)"]
    cells = []
    for r in rows:
        params = None if r.params is None else r.params / 1e6
        if r.status != "ok":
            cells.append([r.model, params, r.status.upper(), None, r.detail[:60], None, None, None, None])
            continue
        cells.append([r.model, params, r.train_s, ratios["train_s"][r.model], r.infer_s, ratios["infer_s"][r.model],
                      r.train_peak_mib, ratios["train_peak_mib"][r.model], r.infer_peak_mib])
    return headers, cells


def to_markdown(report: dict[str, Any], rows: Sequence[Row]) -> str:
    meta = report["meta"]
    lines = [
        "# Networks: training step, inference, peak memory",
        "",
        f"{meta['machine']}, torch {meta['torch']}, MONAI {meta['monai']}; input {meta['batch']} × 1 × "
        f"{'×'.join(map(str, meta['patch']))}, {meta['precision']}, 3 classes; medians of {meta['reps']} runs "
        f"after {meta['warmup']} warm-up. Rows: the training config with `model.bottleneck=<block>` (medseg's "
        f"U-Net) or `model.name=<network>`; train step: the trainer's own (DiceCE, {meta['optimizer']}, "
        f"grad clip {meta['grad_clip']}). Peak memory: {meta['memory_method']}.",
        "",
        markdown_table(*table(rows), **TABLE_STYLE),
        "",
        "## targets",
        "",
        targets_markdown(report["targets"]),
    ]
    return "\n".join(lines) + "\n"


def choose_sizes(args: argparse.Namespace) -> Sizes:
    """``--quick`` / ``--gpu-sizes`` presets, else the CPU defaults; explicit flags override the preset."""
    base = QUICK_SIZES if args.quick else GPU_SIZES if args.gpu_sizes else CPU_SIZES
    return Sizes(
        patch=tuple(args.patch) if args.patch else base.patch,
        batch=args.batch or base.batch,
        precision=args.precision or base.precision,
        reps=args.reps or base.reps,
        warmup=base.warmup if args.warmup is None else args.warmup,
    )


def run(args: argparse.Namespace) -> int:
    """Measure every row, print the markdown report, and write ``models.md`` / ``models.json`` under ``--out``."""
    device = torch.device(args.device)
    sizes = choose_sizes(args)
    configs = {name: train_config(name, [*args.override, f"trainer.precision={sizes.precision}"], sizes.patch)
               for name in args.models}
    rows = measure(configs, sizes, device, args.max_seconds)
    trainer = configs[args.models[0]].trainer  # the same for every row
    import monai

    report = {
        "meta": {
            "machine": machine(device),
            "device": str(device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "monai": monai.__version__,
            **asdict(sizes),
            "memory_method": (
                "torch.cuda.max_memory_allocated"
                if device.type == "cuda"
                else "PyTorch CPU-allocator high-water mark (torch.profiler) plus the tensors alive before the step"
            ),
            "optimizer": trainer.optimizer,
            "lr": trainer.lr,
            "grad_clip": trainer.grad_clip,
            "overrides": list(args.override),
        },
        "results": [asdict(r) for r in rows],
        "targets": [asdict(t) for t in targets(rows, sizes, device)],
    }
    print(text_table(*table(rows), **TABLE_STYLE))
    markdown = to_markdown(report, rows)
    print("\n" + markdown.split("## targets", 1)[1].strip())
    write_report(args.out, "models", markdown, report, args, device)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py models``' arguments."""
    parser.add_argument("--models", nargs="+", default=all_rows(), choices=all_rows(), help="rows to measure")
    parser.add_argument(
        "--gpu-sizes",
        action="store_true",
        help=f"{'x'.join(map(str, GPU_SIZES.patch))}, batch {GPU_SIZES.batch}, bf16, {GPU_SIZES.reps} reps",
    )
    parser.add_argument("--quick", action="store_true", help="32x32x64, batch 2, one rep (for tests)")
    parser.add_argument("--patch", type=int, nargs=3, default=None, help="override the preset's patch")
    parser.add_argument("--batch", type=int, default=None, help="override the preset's batch")
    parser.add_argument("--precision", choices=list(PRECISIONS), default=None,
                        help="override the preset's (trainer.precision)")
    parser.add_argument("--reps", type=int, default=None, help="timed runs (median)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed training steps first")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="time budget of a row's timed runs")
    parser.add_argument("--override", nargs="*", default=[], help="extra config overrides, e.g. model.channels=[...]")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="write models.md and models.json here")
    add_results_argument(parser)
