"""The plan of a training run: its config's null plannable keys filled from the dataset's fingerprint, a plan file or
the checkpoint it starts from (``data.plan_from=init``), and the plan logged (:func:`plan_config`)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from medseg.config import TrainConfig
from medseg.data.datalist import DatasetInfo
from medseg.errors import CheckpointError, ConfigError
from medseg.models.nnunet_stages import NNUNET_FROM_PLAN
from medseg.planning.from_config import (
    apply_plan,
    check_planning,
    dataset_fingerprint,
    plan_from_config,
    plannable_values,
    unset_keys,
    with_plannable,
)
from medseg.planning.plan import Plan
from medseg.planning.plan_file import NETWORK_KEYS, PlanFile, apply_plan_file, read_plan_file
from medseg.planning.report import memory_text
from medseg.runs.checkpoint import load_checkpoint
from medseg.runtime.device import resolve_device
from medseg.training.checks import check_config
from medseg.training.nnunet_start import nnunet_start, with_nnunet_plan, with_nnunet_splits

log = logging.getLogger("medseg")


def plan_config(cfg: TrainConfig, info: DatasetInfo, progress: bool,
                start: Path | None = None) -> tuple[TrainConfig, Plan]:
    """``cfg`` with its null plannable keys filled from the dataset's (cached) fingerprint, and the plan.

    Under ``data.plan_from=init`` the plannable keys are first taken from ``start``, the checkpoint the run starts
    from (``trainer.init_from`` or the one it resumes), so none is left to plan; a run that starts from a trained
    nnU-Net model trains on its plan (:func:`~medseg.training.nnunet_start.with_nnunet_plan`); with ``plan.file``
    from that plan file, medseg's or nnU-Net's (:mod:`medseg.planning.plan_file`), which must have been planned for
    this dataset and whose values are checked as the command line's (:func:`with_plan_file`). Logs the resolved
    preprocessing and network, where they came from, the machine the plan is for (a warning, once, when the run
    trains on another device) and the estimated training memory.

    Raises:
        ConfigError: ``plan.file`` with ``data.plan_from=init``, or a plan file that does not fit the data or network,
            lacks or does not know a key, or holds a value the command line would be refused.
    """
    if cfg.plan.file and cfg.data.plan_from == "init":
        raise ConfigError(f"plan.file={cfg.plan.file} and data.plan_from=init both give the plan: keep one")
    if start is not None and not cfg.trainer.init_from:
        cfg = with_resumed_folds(cfg, start)
    nnunet = nnunet_start(cfg)
    if nnunet is not None:  # nnU-Net's weights fit its plan's network alone
        cfg = with_nnunet_splits(with_nnunet_plan(cfg, nnunet), nnunet, info)
        start = nnunet.checkpoint
    elif cfg.data.plan_from == "init":
        cfg = plan_of_checkpoint(cfg, start)
    fingerprint = dataset_fingerprint(info, cfg.data, progress)
    plan_file = (read_plan_file(cfg.plan.file, fingerprint, cfg.model.spatial_dims, cfg.plan.nnunet_configuration)
                 if cfg.plan.file else None)
    kept = [key for key, value in plannable_values(cfg.data, cfg.model).items() if value is not None]
    if plan_file is not None:
        cfg = with_plan_file(cfg, plan_file)
    planned = unset_keys(cfg.data, cfg.model)
    plan = plan_from_config(fingerprint, cfg.data, cfg.model, cfg.trainer, cfg.plan)
    if plan_file is not None:
        plan = replace(plan, target=plan_file.target, budget=plan_file.budget)
    data, model = apply_plan(cfg.data, cfg.model, plan)
    normalization = data.normalization if isinstance(data.normalization, str) else data.normalization["scheme"]
    if cfg.data.plan_from == "init":
        origin = f"taken from {start}"
    elif plan_file is not None:
        origin = f"taken from plan.file={cfg.plan.file}" + (f" ({nnunet.configuration}, the plan of {start})"
                                                            if nnunet is not None else "")
        if kept:
            origin += f"; kept from the config: {', '.join(kept)}"
    else:
        origin = f"planned: {', '.join(planned) or 'nothing, all set in the config'}"
    spacing = ", ".join(f"{float(mm):.4g}" for mm in data.spacing)
    log.info("preprocessing: spacing [%s] mm, patch %s, strides %s, channels %s, normalization %s (%s)", spacing,
             data.patch_size, model.strides, model.channels, normalization, origin)
    log.info("planned for: %s", plan.target.text())
    trains_on = resolve_device(cfg.trainer.device).type
    if plan.target.device != trains_on:
        log.warning("the plan is for %s but this run trains on %s: its patch and network were sized for the other "
                    "device (plan.device=%s)", plan.target.device, trains_on, cfg.plan.device)
    if plan.memory is not None:
        log.info("memory: %s%s", memory_text(plan.memory), f"; the patch fits {plan.budget}" if plan.budget else "")
    return replace(cfg, data=data, model=model), plan


def with_plan_file(cfg: TrainConfig, plan_file: PlanFile) -> TrainConfig:
    """``cfg`` with the values of ``plan_file`` applied (:func:`~medseg.planning.plan_file.apply_plan_file`) and
    checked as the command line's are (:func:`~medseg.training.checks.check_config`: types, ranges, choices, the
    builders' checks), and a warning naming what the plan holds that medseg builds otherwise. The file's values are
    checked whole, those that keys set in the config win over included, so a file that the command line would refuse
    never trains.

    Raises:
        ConfigError: a value of the file that the command line would be refused, named with ``plan.file``.
    """
    data, model, planning = apply_plan_file(cfg.data, cfg.model, cfg.plan, plan_file)
    file_data, file_model = with_plannable(cfg.data, cfg.model, plan_file.values)  # every value, those the config wins
    try:
        check_config(replace(cfg, data=file_data, model=file_model, plan=planning))  # over too: no bad file passes
        checked = check_config(replace(cfg, data=data, model=model, plan=planning))
        check_planning(checked.plan)
    except ConfigError as err:
        raise ConfigError(f"plan.file={cfg.plan.file}: {err}") from None
    if plan_file.notes:
        log.warning("plan.file=%s: what medseg builds otherwise: %s", cfg.plan.file, "; ".join(plan_file.notes))
    return checked


def with_resumed_folds(cfg: TrainConfig, path: Path) -> TrainConfig:
    """A resumed run keeps the folds it trained on: with ``data.splits`` unset, the ``data.splits`` and
    ``data.num_folds`` of the checkpoint at ``path`` when it has them (a run from nnU-Net's model trains on nnU-Net's
    folds, written into its folder, which the printed resume command does not name)."""
    if cfg.data.splits:
        return cfg
    data = (load_checkpoint(path, needs=("config",))["config"] or {}).get("data") or {}
    if not data.get("splits"):
        return cfg
    log.info("data.splits=%s: the folds the resumed run trained on", data["splits"])
    return replace(cfg, data=replace(cfg.data, splits=data["splits"], num_folds=data["num_folds"]))


def plan_of_checkpoint(cfg: TrainConfig, path: Path | None) -> TrainConfig:
    """``cfg`` with the resolved ``data.spacing``, ``data.patch_size``, ``data.normalization``, ``model.strides`` and
    ``model.channels`` of the checkpoint at ``path`` (``data.plan_from=init``); with ``model.conv_stages=nnunet`` (the
    plan's network) also its network (:data:`~medseg.planning.plan_file.NETWORK_KEYS`), so that a run trained on
    nnU-Net's plan resumes on it.

    Raises:
        ConfigError: no checkpoint (``path`` None: a resume without ``last.pt``).
        CheckpointError: the checkpoint is missing or foreign, or holds no resolved values for these keys.
    """
    if path is None:
        raise ConfigError("data.plan_from=init: there is no checkpoint to take the plan from (trainer.resume=true "
                          "but the run has no last.pt); set trainer.init_from=<checkpoint> or data.plan_from=data")
    source = load_checkpoint(path, needs=("config",))["config"] or {}
    try:
        values = {key: source[key.split(".")[0]][key.split(".")[1]] for key in plannable_values(cfg.data, cfg.model)}
    except (KeyError, TypeError):
        values = {}
    unset = [key for key in plannable_values(cfg.data, cfg.model) if values.get(key) is None]
    if unset:
        raise CheckpointError(f"checkpoint {path} holds no resolved {', '.join(unset)} for data.plan_from=init; "
                              f"use data.plan_from=data")
    data, model = with_plannable(cfg.data, cfg.model, values)
    if model.conv_stages == NNUNET_FROM_PLAN:  # "the plan's network": the checkpoint's, which was an nnU-Net plan's
        try:
            network = {name: source["model"][name] for name in (key.split(".")[1] for key in NETWORK_KEYS)}
        except (KeyError, TypeError):
            raise CheckpointError(f"checkpoint {path} holds no resolved {', '.join(NETWORK_KEYS)} for "
                                  f"model.conv_stages={NNUNET_FROM_PLAN} under data.plan_from=init") from None
        model = replace(model, **network)
    return replace(cfg, data=data, model=model)
