"""The training entry point behind ``scripts/train.py``: config in, trained model and metrics out.

Known failures (bad config, bad data, bad checkpoint, diverged training) end a single run with a
one-line error and exit code 1. In a multirun sweep the failing job is recorded as failed, with its
reason, in its ``metrics.json``, and the sweep goes on.
"""

from __future__ import annotations

import logging
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel

from medseg.config import ConfigError, to_plain, validate_config
from medseg.data.datalist import DatasetError
from medseg.engine.checkpoint import CheckpointError
from medseg.engine.data import prepare_data
from medseg.engine.distributed import (
    broadcast_object,
    cleanup,
    env_rank,
    init_distributed,
    local_device,
    quiet_other_ranks,
)
from medseg.engine.trainer import (
    Trainer,
    TrainingError,
    TrainingInterrupted,
    deterministic_algorithms,
    resolve_device,
    seed_everything,
)
from medseg.io import atomic_write_json
from medseg.models import build_model

log = logging.getLogger("medseg")

KNOWN_ERRORS = (ConfigError, DatasetError, CheckpointError, TrainingError, ValueError, FileNotFoundError)
HPARAM_KEYS = ("model.name", "model.spatial_dims", "model.bottleneck", "model.bottleneck_depth", "model.decoder",
               "model.decoder_levels", "trainer.lr", "trainer.batch_size", "trainer.seed", "trainer.max_epochs")


def hparams_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The flat hyperparameters logged to TensorBoard's HParams tab (attention keys included)."""
    out: dict[str, Any] = {}
    for key in HPARAM_KEYS:
        section, name = key.split(".")
        out[key] = cfg[section][name]
    out.update({f"model.attention.{k}": v for k, v in cfg["model"]["attention"].items()})
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in out.items()}


def train(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """Validate ``cfg``, prepare the data, build the model, train, and write every output; returns the metrics."""
    plain = to_plain(validate_config(cfg))
    tcfg = plain["trainer"]
    device = resolve_device(tcfg["device"])
    dist_info = init_distributed(device)
    device = local_device(device, dist_info)
    quiet_other_ranks(dist_info)
    restore_determinism = deterministic_algorithms(tcfg["deterministic"])
    try:
        # every rank reads and writes rank 0's run directory (ranks > 0 may have none of their own)
        plain["output_dir"] = broadcast_object(plain["output_dir"], dist_info)
        output_dir = Path(plain["output_dir"])
        seed_everything(tcfg["seed"])
        data = prepare_data(plain, output_dir, dist_info, progress=tcfg["progress"])
        resolved = {**plain, "data": data.data_cfg, "model": data.model_cfg}
        seed_everything(tcfg["seed"])  # the initial weights depend on the seed alone
        model = build_model(data.model_cfg, data.info.in_channels, data.info.num_classes, data.net_patch_size)
        model = model.to(device)
        if dist_info.enabled:
            model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if tcfg["compile"]:  # after DDP, so the compiler splits graphs at DDP's bucket boundaries (DDPOptimizer)
            model = torch.compile(model)
        trainer = Trainer(resolved, data, model, device, output_dir, dist_info)
        last = output_dir / "checkpoints" / "last.pt"
        if plain["ckpt_path"]:
            trainer.resume(Path(plain["ckpt_path"]))
        elif tcfg["resume"]:
            if last.is_file():
                trainer.resume(last)
            else:
                log.warning("trainer.resume=true but %s does not exist: starting from scratch", last)
        metrics = trainer.fit()
        trainer.write_metrics(metrics)
        if trainer.tb is not None:
            trainer.tb.hparams(hparams_of(resolved), {"hparam/best_val_dice": metrics["best_val_dice"]})
        if dist_info.is_main:
            log.info("run finished; outputs in %s\n%s", output_dir, trainer.summary(metrics))
        return metrics
    finally:
        restore_determinism()
        cleanup(dist_info)


def _is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def resume_command() -> str | None:
    """The command line that resumes this Hydra run: its overrides, its run directory and ``trainer.resume=true``."""
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    dropped = ("trainer.resume", "ckpt_path")  # resume from the run's own last.pt, not from the original ckpt_path
    overrides = [o for o in hydra_cfg.overrides.task if o.split("=", 1)[0].lstrip("+~") not in dropped]
    return shlex.join(["python", sys.argv[0], *overrides, f"hydra.run.dir={hydra_cfg.runtime.output_dir}",
                       "trainer.resume=true"])


def train_cli(cfg: DictConfig) -> float:
    """``scripts/train.py``'s task function; returns best val Dice (the Optuna objective)."""
    try:
        return float(train(cfg)["best_val_dice"])
    except TrainingInterrupted as err:
        log.error("%s", err)
        command = resume_command()
        if command and env_rank() == 0:
            log.error("to resume: %s", command)
        sys.exit(err.exit_code)
    except Exception as err:  # a sweep records any failure and goes on; a single run reports known ones cleanly
        if _is_multirun():
            reason = f"{type(err).__name__}: {err}"
            log.error("job failed: %s\n%s", reason, traceback.format_exc())
            if env_rank() == 0:  # a DDP job (SLURM tasks_per_node > 1) records its failure once
                atomic_write_json(Path(HydraConfig.get().runtime.output_dir) / "metrics.json",
                                  {"status": "failed", "reason": reason})
            return float("nan")
        if isinstance(err, KNOWN_ERRORS):
            log.error("%s", err)
            sys.exit(1)
        raise
