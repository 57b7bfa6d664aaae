"""A training run, behind ``scripts/train.py``: check the config, read, check the data, plan, build, fit.

Errors medseg raises on purpose (:class:`~medseg.errors.MedsegError`) end a single run with one line and exit
code 1 (:func:`medseg.cli.one_line_errors`); any other error shows its traceback. In a multirun sweep a failing
job is recorded as failed, with its reason, in its ``metrics.json``, and the sweep goes on.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel

from medseg.config import TrainConfig
from medseg.data.datalist import dataset_from_config
from medseg.data.verify import check_dataset
from medseg.errors import TrainingInterrupted
from medseg.io import atomic_write_json, check_writable, remove_temporaries
from medseg.models import build_model
from medseg.models.compute import patch_forward_flops
from medseg.runs.layout import RunLayout
from medseg.runs.lock import acquire
from medseg.runtime.device import resolve_device
from medseg.runtime.distributed import broadcast_object, on_main_rank, process_group
from medseg.runtime.host_memory import PeakRam
from medseg.runtime.launch import DistInfo, env_rank
from medseg.training.checks import check_config
from medseg.training.loop import GracefulStop
from medseg.training.losses import resolve_class_weights
from medseg.training.planning import plan_config
from medseg.training.prepare import prepare_data
from medseg.training.trainer import Trainer, seed_everything

log = logging.getLogger("medseg")

HPARAM_KEYS = ("model.name", "model.spatial_dims", "model.bottleneck", "model.bottleneck_depth", "model.decoder",
               "model.decoder_levels", "trainer.lr", "trainer.batch_size", "trainer.seed", "trainer.max_epochs")


def train(cfg: TrainConfig | Mapping[str, Any] | DictConfig) -> dict[str, Any]:
    """Check ``cfg``, read, check and plan the data, build the model, train; returns the metrics."""
    started = time.perf_counter()
    cfg = check_config(cfg)
    progress = cfg.trainer.progress
    with (process_group(resolve_device(cfg.trainer.device)) as (dist, device), deterministic(cfg.trainer.deterministic),
          PeakRam() as ram, ExitStack() as stack):
        # every rank reads and writes rank 0's run directory (ranks > 0 may have none of their own)
        output_dir = Path(broadcast_object(cfg.output_dir, dist))
        stack.enter_context(owned_folder(output_dir, dist))
        seed_everything(cfg.trainer.seed)
        info = on_main_rank(lambda: dataset_from_config(cfg.data), dist)  # the demo is generated once
        if cfg.trainer.check_data:
            on_main_rank(lambda: check_dataset(info, progress=progress), dist)
        resume = resume_path(cfg, output_dir)
        start = Path(cfg.trainer.init_from) if cfg.trainer.init_from else resume  # data.plan_from=init reads it
        cfg, plan = on_main_rank(lambda: plan_config(cfg, info, progress, start), dist)
        class_weights = resolve_class_weights(cfg.trainer.class_weights, info, plan.class_voxels)
        data = prepare_data(cfg, info, plan, output_dir, dist)
        seed_everything(cfg.trainer.seed)  # the initial weights depend on the seed alone
        model = build_model(cfg.model, info.in_channels, info.num_outputs, data.window.net_patch)
        flops = patch_forward_flops(cfg.model, info.in_channels, info.num_outputs,
                                    data.window.net_patch) if dist.is_main else None
        trainer = Trainer(cfg, data, wrap_model(model, device, dist, cfg.trainer.compile), device, output_dir, dist,
                          class_weights, run_started=started)
        if cfg.trainer.init_from:
            trainer.init_weights(start)
        elif resume is not None:
            trainer.resume(resume)
        metrics = trainer.fit()
        metrics["gflops_per_patch_forward"] = None if flops is None else round(flops / 1e9, 4)
        metrics["peak_ram_mb"] = round(ram.peak_bytes / 2**20, 1)  # this process and its loader workers, whole run
        if plan.memory is not None:  # the planner's estimate of one training step, beside peak_memory_mb on CUDA
            metrics["estimated_memory_mb"] = round(plan.memory.total / 2**20, 1)
        if plan.target is not None:
            metrics["planned_for"] = plan.target.as_dict()  # device, precision and budget the plan was sized for
        trainer.finish(metrics, hparams_of(cfg))
        return metrics


@contextmanager
def owned_folder(output_dir: Path, dist: DistInfo) -> Iterator[None]:
    """The run folder locked by rank 0 for the whole run (:func:`medseg.runs.lock.acquire`): a second training
    there stops with one line on every rank; the lock goes when the run ends, however it ends. Once it owns the
    folder, the run removes the half-written files a killed run left there (:func:`medseg.io.remove_temporaries`).
    A folder it cannot write into stops the run first, with one line."""

    def claim() -> Path:
        check_writable(output_dir, "output_dir")
        return acquire(output_dir)

    lock = on_main_rank(claim, dist)
    try:
        if dist.is_main:
            for path in remove_temporaries(output_dir):
                log.warning("removed %s, half-written by a run that was killed", path)
        yield
    finally:
        if dist.is_main:
            lock.unlink(missing_ok=True)


def resume_path(cfg: TrainConfig, output_dir: Path) -> Path | None:
    """The checkpoint the run resumes: ``ckpt_path``, else under ``trainer.resume`` the run's ``last.pt`` when it
    exists (a warning when not: the run starts from scratch); None for a new run."""
    if cfg.ckpt_path:
        return Path(cfg.ckpt_path)
    last = RunLayout(output_dir).last_checkpoint
    if cfg.trainer.resume and not last.is_file():
        log.warning("trainer.resume=true but %s does not exist: starting from scratch", last)
    return last if cfg.trainer.resume and last.is_file() else None


@contextmanager
def deterministic(enabled: bool):
    """``trainer.deterministic``: deterministic torch algorithms for the run (those without one warn).

    cuBLAS is deterministic only with ``CUBLAS_WORKSPACE_CONFIG`` set before its first use, so it is set here
    unless already set. The previous mode is restored at the end.
    """
    if not enabled:
        yield
        return
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def wrap_model(model: torch.nn.Module, device: torch.device, dist: DistInfo, compile: bool) -> torch.nn.Module:
    """The model on ``device``, DDP-wrapped under DDP, then compiled if asked.

    Compiling after the DDP wrap lets the compiler split graphs at DDP's bucket boundaries (DDPOptimizer).
    """
    model = model.to(device)
    if dist.enabled:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return torch.compile(model) if compile else model


def hparams_of(cfg: TrainConfig) -> dict[str, Any]:
    """The flat hyperparameters logged to TensorBoard's HParams tab (attention keys included)."""
    plain = asdict(cfg)
    out = {key: plain[key.split(".")[0]][key.split(".")[1]] for key in HPARAM_KEYS}
    out.update({f"model.attention.{k}": v for k, v in plain["model"]["attention"].items()})
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in out.items()}


def _is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


RESUME_DROPPED = ("trainer.resume", "ckpt_path", "trainer.init_from", "hydra.run.dir", "hydra.sweep.dir")
"""The overrides a resume command leaves out: it resumes from the run's own ``last.pt``, in the same folder."""


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
"""Hydra's grid sweeper: launched again with the same sweep folder, it gives each run its old number and folder."""


def resume_command() -> str | None:
    """The command line that resumes this Hydra run: its overrides, its run directory and ``trainer.resume=true``;
    in a multirun of Hydra's grid sweeper, the sweep's command line with its sweep directory, which resumes every run
    it did not finish. None outside Hydra, and for another sweeper (Optuna's samples its runs anew: a run folder of
    a second launch would hold another setting's checkpoint)."""
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        if OmegaConf.select(hydra_cfg, "sweeper._target_") != BASIC_SWEEPER:
            return None
        args, folder = sys.argv[1:], f"hydra.sweep.dir={Path(hydra_cfg.sweep.dir).absolute()}"
    else:
        args, folder = list(hydra_cfg.overrides.task), f"hydra.run.dir={hydra_cfg.runtime.output_dir}"
    kept = [arg for arg in args if _override_key(arg) not in RESUME_DROPPED]
    return shlex.join([*typed_program(), *kept, folder, "trainer.resume=true"])


def typed_program() -> list[str]:
    """The words that started this command as the user typed them: ``medseg train`` (the ``medseg`` entry point names
    the command so in ``sys.argv[0]``, :func:`medseg.commands.main`), else ``python <script>``."""
    program = sys.argv[0]
    return program.split(" ") if program.startswith("medseg ") else ["python", program]


def _override_key(arg: str) -> str | None:
    """The key an override of the command line sets; None for anything else (``-m``, a flag's value)."""
    try:
        return OverridesParser.create().parse_override(arg).key_or_group
    except HydraException:  # not an override: -m, a flag or its value
        return None


def stop(message: str, exit_code: int) -> NoReturn:
    """End a run stopped by a signal: ``message``, the command that resumes it, and ``exit_code`` (128 + the signal,
    as a shell reports a process the signal ended). In a multirun no further run starts: the exit leaves Hydra's
    launcher."""
    log.error("%s", message)
    command = resume_command()
    if command and env_rank() == 0:
        log.error("to resume%s: %s", " the sweep" if _is_multirun() else "", command)
    sys.exit(exit_code)


def train_cli(cfg: DictConfig) -> float:
    """``scripts/train.py``'s task function; returns best val Dice (the Optuna objective).

    In a multirun a failing run is recorded (``metrics.json``) and the sweep goes on, but a run that got SIGINT or
    SIGTERM stops the sweep however it ended (:attr:`~medseg.training.loop.GracefulStop.latest_signal`): stopped and
    saved, failed after the signal, or completed in the epoch the signal came in.
    """
    try:
        best = float(train(cfg)["best_val_dice"])
    except TrainingInterrupted as err:
        stop(str(err), err.exit_code)
    except KeyboardInterrupt:  # SIGINT before training started, or after it ended: Python's default handler
        stop("stopped by SIGINT outside the training loop (before it started, or after it ended)",
             128 + signal.SIGINT)
    except Exception as err:
        if not _is_multirun():
            raise
        reason = f"{type(err).__name__}: {err}"  # a sweep records any failure and goes on
        log.error("job failed: %s\n%s", reason, traceback.format_exc())
        if env_rank() == 0:  # a DDP job (SLURM tasks_per_node > 1) records its failure once
            atomic_write_json(RunLayout(HydraConfig.get().runtime.output_dir).metrics_file,
                              {"status": "failed", "reason": reason})
        stop_sweep_if_signalled("failed")
        return float("nan")
    stop_sweep_if_signalled("completed")
    return best


def stop_sweep_if_signalled(ended: str) -> None:
    """In a multirun, stop the sweep after a run that ``ended`` (failed, completed) once SIGINT or SIGTERM came."""
    signum = GracefulStop.latest_signal
    if signum and _is_multirun():
        stop(f"stopped by {signal.Signals(signum).name}: this run {ended} after the signal came, and no further run "
             f"of the sweep starts", 128 + signum)
