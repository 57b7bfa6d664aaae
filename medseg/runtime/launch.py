"""Where this process stands among DDP ranks, from the environment alone (no torch: scripts read it first).

The ranks come from, first match wins:

* ``torchrun`` (or any launcher that sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``);
* a SLURM job step with more than one task (``srun``, e.g. the Hydra submitit launcher with
  ``tasks_per_node > 1``): submitit's ``TorchDistributedEnvironment`` reads the SLURM variables (rank, world
  size, local rank, the first node as ``MASTER_ADDR``, ``MASTER_PORT`` from the job id unless set) and they
  are exported as the torchrun variables;
* otherwise a single process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from medseg.errors import ConfigError

TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


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


SINGLE_PROCESS = DistInfo()
"""No DDP."""


def in_multi_task_slurm_step(env: Mapping[str, str]) -> bool:
    """Inside an ``srun`` step of several tasks. A batch script or ``salloc`` shell (no step) is one process,
    so a plain ``python scripts/train.py`` there never waits for ranks that will not come."""
    return "SLURM_PROCID" in env and int(env.get("SLURM_STEP_NUM_TASKS") or "1") > 1


def slurm_environment() -> dict[str, str]:
    """The torchrun variables of this ``srun`` task (``os.environ``), from submitit; ``{}`` outside such a step.

    ``MASTER_ADDR`` and ``MASTER_PORT`` already in the environment are kept.

    Raises:
        ConfigError: submitit (the ``slurm`` extra) is not installed.
    """
    if not in_multi_task_slurm_step(os.environ):
        return {}
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:
        raise ConfigError("DDP in a SLURM step needs submitit: pip install 'medseg[slurm]'") from None
    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")  # submitit's test for "inside a SLURM job"
    slurm = TorchDistributedEnvironment()
    return {"RANK": str(slurm.rank), "WORLD_SIZE": str(slurm.world_size), "LOCAL_RANK": str(slurm.local_rank),
            "LOCAL_WORLD_SIZE": str(slurm.local_world_size),
            "MASTER_ADDR": os.environ.get("MASTER_ADDR", slurm.master_addr),
            "MASTER_PORT": str(slurm.master_port)}


def distributed_environment() -> DistInfo:
    """Ranks from the environment: torchrun's variables, else SLURM's (exported as torchrun's)."""
    if not all(key in os.environ for key in TORCHRUN_KEYS):
        os.environ.update(slurm_environment())
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return SINGLE_PROCESS
    return DistInfo(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))


def env_rank() -> int:
    """This process's rank from the environment alone (before or without a process group)."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    return int(os.environ.get("SLURM_PROCID", "0")) if in_multi_task_slurm_step(os.environ) else 0


def hydra_rank_overrides() -> list[str]:
    """Hydra overrides that keep ``torchrun`` ranks > 0 from writing a run directory of their own.

    Every rank runs Hydra, and each would create ``outputs/<date>/<time>`` from its own clock (a second
    apart is two directories). Ranks > 0 run in the current directory without ``.hydra/`` or a log file
    and take rank 0's output directory from it (:func:`medseg.runtime.distributed.broadcast_object`).
    """
    if env_rank() == 0:
        return []
    return ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout"]
