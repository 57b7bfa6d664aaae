"""The plan of a training config: :func:`plan_from_config` plans what the data and model configs leave null around
what they set, fits the patch to the training-memory budget of the device (:func:`memory_budget`) by the
network's estimated memory (:mod:`medseg.planning.memory`), or on a CPU to a voxel budget, and
:func:`apply_plan` fills the configs' ``null`` keys from the plan."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from medseg.config import DataConfig, ModelConfig, PlanningConfig, TrainerConfig
from medseg.data.datalist import DatasetInfo, dataset_cache_dir
from medseg.data.transforms import samples_per_volume
from medseg.errors import ConfigError, check_choice
from medseg.planning.fingerprint import FINGERPRINT_FILE, compute_fingerprint
from medseg.planning.memory import MemoryEstimate, estimate_training_memory
from medseg.planning.plan import (
    BASE_CHANNELS,
    BASE_VOXEL_BUDGET,
    MemoryBudget,
    Plan,
    PlanTarget,
    bytes_text,
    make_plan,
    planned_channels,
)
from medseg.runtime.device import PRECISIONS, amp_dtype, resolve_device

GB = 2**30
"""Bytes per GB of ``plan.memory_gb``."""


def voxel_budget_for(model: ModelConfig) -> int:
    """Patch voxel budget for a model: ``BASE_VOXEL_BUDGET`` scaled by ``BASE_CHANNELS / channels[0]``.

    The first level's activations (channels[0] x patch voxels) dominate memory, so halving the width
    doubles the patch: 3D with channels[0]=32 -> 48**3 voxels, with 16 -> 2 * 48**3. A planned network
    (``model.channels`` null) starts with ``BASE_CHANNELS``.
    """
    first = model.channels[0] if model.channels else BASE_CHANNELS
    return int(BASE_VOXEL_BUDGET[model.spatial_dims] * BASE_CHANNELS / first)


PLAN_DEVICES = ("auto", "cuda", "cpu")
"""The values of ``plan.device``: ``auto`` is ``trainer.device`` on this machine."""


def check_planning(planning: PlanningConfig) -> None:
    """Raise :class:`ConfigError` for a ``plan`` node that cannot be planned with: an unknown device or precision, a
    memory budget of 0 or less."""
    check_choice("plan.device", planning.device, PLAN_DEVICES)
    if planning.precision is not None:
        check_choice("plan.precision", planning.precision, PRECISIONS)
    if planning.memory_gb is not None and not planning.memory_gb > 0:
        raise ConfigError(f"plan.memory_gb={planning.memory_gb:g}: expected a positive number of GB, or null for the "
                          f"default (the GPU's memory up to plan.reference_gb={planning.reference_gb:g} GB; the voxel "
                          "budget on a CPU)")
    if not planning.reference_gb > 0:
        raise ConfigError(f"plan.reference_gb={planning.reference_gb:g}: expected a positive number of GB")


def memory_budget(planning: PlanningConfig, device: torch.device) -> tuple[int | None, str]:
    """The training memory (bytes) a patch planned for ``device`` may need, and where that figure comes from.

    ``plan.memory_gb`` when set; else for CUDA the GPU's memory, at most ``plan.reference_gb``, or
    ``plan.reference_gb`` itself where this machine has no GPU (planning for another machine); else None: on a CPU
    time, not memory, limits training, and the patch keeps the voxel budget (:func:`voxel_budget_for`). The ``plan``
    node is checked by the caller (:func:`plan_target`)."""
    if planning.memory_gb is not None:
        return int(planning.memory_gb * GB), f"plan.memory_gb={planning.memory_gb:g}"
    if device.type == "cuda" and not torch.cuda.is_available():
        return int(planning.reference_gb * GB), (
            f"plan.memory_gb=null: plan.reference_gb={planning.reference_gb:g} GB, no GPU on this machine to read")
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return min(total, int(planning.reference_gb * GB)), (
            f"plan.memory_gb=null: the GPU's {bytes_text(total)}, at most "
            f"plan.reference_gb={planning.reference_gb:g} GB")
    return None, "plan.memory_gb=null on a CPU"


def plan_target(planning: PlanningConfig, trainer: TrainerConfig) -> tuple[PlanTarget, torch.dtype | None]:
    """The machine a plan is for, and its autocast dtype (None: fp32).

    ``plan.device`` (``auto``: ``trainer.device`` resolved on this machine; ``cuda`` needs no GPU here), the precision
    ``plan.precision`` or else ``trainer.precision`` (``auto``: bf16 on CUDA, fp32 on a CPU), and
    :func:`memory_budget`.

    Raises:
        ConfigError: the ``plan`` node is not valid, or ``plan.device=auto`` with a ``trainer.device`` this machine
            lacks.
    """
    check_planning(planning)
    device = resolve_device(trainer.device) if planning.device == "auto" else torch.device(planning.device)
    amp = amp_dtype(planning.precision or trainer.precision, device)
    limit, source = memory_budget(planning, device)
    precision = next(name for name, dtype in PRECISIONS.items() if dtype == amp)  # fp32 before auto
    return PlanTarget(device.type, precision, limit, source), amp


def plan_from_config(fingerprint: Mapping[str, Any], data: DataConfig, model: ModelConfig,
                     trainer: TrainerConfig | None = None, planning: PlanningConfig | None = None) -> Plan:
    """:func:`make_plan` for the configs, keeping the user-set (non-null) spacing, patch, strides and channels.

    The patch is fit to the memory budget of the machine the plan is for (:func:`plan_target`), by the estimated
    training memory of the network for ``trainer.batch_size x data.samples_per_volume`` patches, the plan's precision
    and ``trainer.optimizer`` (:func:`~medseg.planning.memory.estimate_training_memory`); for a CPU without
    ``plan.memory_gb``, to :func:`voxel_budget_for`. ``model.channels`` null plans the depth with the patch and
    the widths by :func:`planned_channels`. The plan reports the estimate at its patch and its target. ``trainer``
    and ``planning`` default to their configs' defaults.
    """
    trainer, planning = trainer or TrainerConfig(), planning or PlanningConfig()
    target, amp = plan_target(planning, trainer)
    batch = trainer.batch_size * samples_per_volume(data, model.spatial_dims)

    def estimate(patch: Sequence[int], strides: list[list[int]]) -> MemoryEstimate:
        channels = model.channels or planned_channels(len(strides) + 1, model.spatial_dims)
        return estimate_training_memory(
            replace(model, channels=list(channels), strides=strides), patch, len(fingerprint["channel_names"]),
            len(fingerprint["labels"]), batch, amp, trainer.optimizer)

    levels = len(model.channels) - 1 if model.channels else None
    plan = make_plan(
        fingerprint,
        spatial_dims=model.spatial_dims,
        num_levels=levels,
        voxel_budget=voxel_budget_for(model),
        target_spacing=data.spacing,
        patch_size=data.patch_size,
        strides=model.strides,
        memory=None if target.memory_bytes is None else MemoryBudget(target.memory_bytes, estimate),
    )
    return replace(plan, channels=list(model.channels or plan.channels), memory=estimate(plan.patch_size, plan.strides),
                   budget=f"{plan.budget}; {target.source}" if plan.budget else "", target=target)


def dataset_fingerprint(info: DatasetInfo, data: DataConfig, progress: bool = True) -> dict[str, Any]:
    """The fingerprint of ``info``, cached in the dataset's cache folder (``data.cache_dir``, else
    :func:`~medseg.data.datalist.dataset_cache_dir`), as training and ``scripts/plan.py`` read it."""
    cache_file = dataset_cache_dir(info.root, data.cache_dir) / FINGERPRINT_FILE
    return compute_fingerprint(info, cache_file, progress)


def plannable_values(data: DataConfig, model: ModelConfig) -> dict[str, Any]:
    """The keys planning fills when they are null, with their values in the configs."""
    return {"data.spacing": data.spacing, "data.patch_size": data.patch_size,
            "data.normalization": data.normalization, "model.strides": model.strides,
            "model.channels": model.channels}


def unset_keys(data: DataConfig, model: ModelConfig) -> list[str]:
    """The plannable keys the configs leave null: planning fills them."""
    return [key for key, value in plannable_values(data, model).items() if value is None]


def with_plannable(data: DataConfig, model: ModelConfig, values: Mapping[str, Any]) -> tuple[DataConfig, ModelConfig]:
    """Copies of the configs with every plannable key set to its entry in ``values`` (keyed as
    :func:`plannable_values` names them)."""
    return (replace(data, spacing=values["data.spacing"], patch_size=values["data.patch_size"],
                    normalization=values["data.normalization"]),
            replace(model, strides=values["model.strides"], channels=values["model.channels"]))


def fill_unset(data: DataConfig, model: ModelConfig, values: Mapping[str, Any]) -> tuple[DataConfig, ModelConfig]:
    """Copies of the configs with each null plannable key set to a copy of its entry in ``values``; keys set in the
    configs are kept."""
    return with_plannable(data, model, {key: copy.deepcopy(values[key]) if value is None else value
                                        for key, value in plannable_values(data, model).items()})


def apply_plan(data: DataConfig, model: ModelConfig, plan: Plan) -> tuple[DataConfig, ModelConfig]:
    """Copies of the configs with their null plannable keys (:func:`plannable_values`) taken from ``plan``.

    User-set (non-null) values are kept; ``normalization`` becomes the plan's dict. A 2D model's two
    in-plane spacings become the plan's 3 RAS entries (which hold them), since volumes are resampled in 3D.
    """
    if data.spacing is not None and len(data.spacing) != 3:
        data = replace(data, spacing=None)
    return fill_unset(data, model, {"data.spacing": plan.target_spacing, "data.patch_size": plan.patch_size,
                                    "data.normalization": plan.normalization, "model.strides": plan.strides,
                                    "model.channels": plan.channels})
