"""Distributed data parallel through ``torchrun`` or SLURM: the process group and the collectives medseg uses.

NCCL is used on CUDA and gloo on the CPU. ``trainer.batch_size`` is per process, so the global batch is
``batch_size x world_size``. Where the ranks come from: :mod:`medseg.runtime.launch`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from medseg.errors import MedsegError, TrainingError
from medseg.runtime.launch import DistInfo, distributed_environment

T = TypeVar("T")


@contextmanager
def process_group(device: torch.device) -> Iterator[tuple[DistInfo, torch.device]]:
    """Join the process group of ``torchrun`` or ``srun`` (if any) for the run; yields the ranks and this
    rank's device. Ranks > 0 keep their log lines out of the run's log file. The group is left at the end."""
    info = distributed_environment()
    device = local_device(device, info)
    if info.enabled and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    _quiet_other_ranks(info)
    try:
        yield info, device
    finally:
        if info.enabled and dist.is_initialized():
            dist.destroy_process_group()


def local_device(device: torch.device, info: DistInfo) -> torch.device:
    """Each rank's own GPU under DDP (``LOCAL_RANK`` modulo the visible GPUs); the device unchanged otherwise.

    The modulo covers SLURM jobs that bind one GPU per task (each task then sees a single ``cuda:0``).
    """
    if device.type == "cuda" and info.enabled:
        return torch.device("cuda", info.local_rank % max(1, torch.cuda.device_count()))
    return device


def _quiet_other_ranks(info: DistInfo) -> None:
    """Detach the root logger's file handlers on ranks > 0, so the run's log file holds rank 0's lines only."""
    if info.is_main:
        return
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


def on_main_rank(fn: Callable[[], T], info: DistInfo) -> T:
    """``fn()`` on rank 0 alone, its result given to every rank (the others wait).

    An error on rank 0 is raised on every rank: a :class:`~medseg.errors.MedsegError` as itself; anything
    else as itself on rank 0 (with its traceback) and as a :class:`~medseg.errors.TrainingError` naming it
    on the others, so no rank is left waiting.
    """
    if not info.enabled:
        return fn()
    result, error, failure = None, None, None
    if info.is_main:
        try:
            result = fn()
        except MedsegError as err:
            error = err
        except Exception as err:
            failure = err
    shared = broadcast_object((result, error, None if failure is None else f"{type(failure).__name__}: {failure}"),
                              info)
    if failure is not None:
        raise failure
    result, error, message = shared
    if error is not None:
        raise error
    if message is not None:
        raise TrainingError(f"rank 0 failed: {message}")
    return result


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
