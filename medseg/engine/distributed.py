"""Distributed data parallel through ``torchrun`` or SLURM: process-group setup, rank helpers, collectives.

Where the ranks come from, first match wins:

* ``torchrun`` (or any launcher that sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``);
* a SLURM job step (``srun``, e.g. the Hydra submitit launcher with ``tasks_per_node > 1``): ``SLURM_PROCID``,
  ``SLURM_STEP_NUM_TASKS`` (or ``SLURM_NTASKS``) and ``SLURM_LOCALID`` are mapped to the torchrun variables,
  ``MASTER_ADDR`` defaults to the first node of the step and ``MASTER_PORT`` to a port derived from the job id;
* otherwise a single process.

NCCL is used on CUDA and gloo on the CPU. ``trainer.batch_size`` is per process, so the global batch is
``batch_size x world_size``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
MASTER_PORT_RANGE = (20000, 40000)
"""``MASTER_PORT`` under SLURM when unset: ``low + job_id % (high - low)``, the same on every task of the job."""


@dataclass(frozen=True)
class DistInfo:
    """This process's place among the ranks (``world_size == 1``: no DDP)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM compressed host list: ``"gpu[03-05,9],cpu1"`` -> ``"gpu03"``."""
    first = re.split(r",(?![^\[]*\])", nodelist.strip())[0]
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)


def slurm_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The torchrun variables of an ``srun`` task with more than one task in its step; ``{}`` otherwise.

    Returns ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, plus ``MASTER_ADDR`` /
    ``MASTER_PORT`` unless ``env`` already has them. A batch script or ``salloc`` shell (no job step:
    no ``SLURM_STEP_NUM_TASKS``) is a single process, so a plain ``python scripts/train.py`` there never waits
    for ranks that will not come.
    """
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return {}
    world_size = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", "1"))
    if world_size <= 1:
        return {}
    nodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or "1")
    out = {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(max(1, world_size // max(1, nodes))),
    }
    if "MASTER_ADDR" not in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        out["MASTER_ADDR"] = first_slurm_host(nodelist)
    if "MASTER_PORT" not in env:
        low, high = MASTER_PORT_RANGE
        out["MASTER_PORT"] = str(low + int(env.get("SLURM_JOB_ID", "0")) % (high - low))
    return out


def distributed_environment(env: MutableMapping[str, str]) -> DistInfo:
    """Ranks from ``env`` (torchrun's variables, else SLURM's, which are then written into ``env``)."""
    if not all(key in env for key in TORCHRUN_KEYS):
        env.update(slurm_environment(env))
    world_size = int(env.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    return DistInfo(int(env["RANK"]), world_size, int(env.get("LOCAL_RANK", "0")))


def env_rank() -> int:
    """This process's rank from the environment alone (before or without a process group)."""
    return distributed_environment(dict(os.environ)).rank


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group set up by ``torchrun`` or ``srun`` (if any); returns this process's ranks."""
    info = distributed_environment(os.environ)
    if not info.enabled:
        return info
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(local_device(device, info))
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return info


def local_device(device: torch.device, info: DistInfo) -> torch.device:
    """Each rank's own GPU under DDP (``LOCAL_RANK`` modulo the visible GPUs); the device unchanged otherwise.

    The modulo covers SLURM jobs that bind one GPU per task (each task then sees a single ``cuda:0``).
    """
    if device.type == "cuda" and info.enabled:
        return torch.device("cuda", info.local_rank % max(1, torch.cuda.device_count()))
    return device


def quiet_other_ranks(info: DistInfo) -> None:
    """Detach the root logger's file handlers on ranks > 0, so the run's log file holds rank 0's lines only."""
    if info.is_main:
        return
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


def hydra_rank_overrides() -> list[str]:
    """Hydra overrides that keep ``torchrun`` ranks > 0 from writing a run directory of their own.

    Every rank runs Hydra, and each would create ``outputs/<date>/<time>`` from its own clock (a second
    apart is two directories). Ranks > 0 run in the current directory without ``.hydra/`` or a log file
    and take rank 0's output directory from it (:func:`broadcast_object` in ``medseg.engine.run.train``).
    """
    if env_rank() == 0:
        return []
    return ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout"]


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``obj``, in rank order (a one-element list without DDP)."""
    if not info.enabled:
        return [obj]
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not info.enabled:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def reduce_max(value: float, info: DistInfo, device: torch.device) -> float:
    """The largest ``value`` over all ranks (``value`` itself without DDP).

    ``device`` is the training device (NCCL reduces CUDA tensors only).
    """
    if not info.enabled:
        return value
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def any_rank(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on at least one (e.g. a non-finite loss).

    Ranks that must take the same branch around a collective (skip a backward, stop mid-epoch) agree
    through this, so one rank never waits in a gradient all-reduce that the others skipped.
    """
    return reduce_max(float(flag), info, device) > 0


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
