"""A run that starts from a trained nnU-Net v2 model (``trainer.init_from=<its folder, a fold_<k> or a checkpoint>``).

The run trains on the model's plan (:func:`with_nnunet_plan`: ``plan.file`` or ``data.plan_from=init``, the
checkpoint's configuration), so medseg builds nnU-Net's network layer for layer; :func:`start_from_nnunet` maps the
weights into it by structure (:func:`medseg.models.nnunet_weights.nnunet_state_dict`, which refuses a misfit in one
line naming both sides), puts the head's channels in the run's class order (matched by name; other classes
re-initialise the heads, other input channels the first conv), starts every attention slot as the identity (so the
loaded network's function is nnU-Net's before the first step), and refuses a fold whose training cases the run
validates on.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from medseg.config import TrainConfig
from medseg.data.datalist import DatasetInfo
from medseg.data.labels import LabelSpec
from medseg.errors import CheckpointError, ConfigError
from medseg.io import atomic_write_json
from medseg.models import SlottedUNet, build_model, unwrap_model
from medseg.models.conv_stages import get_conv_stages
from medseg.models.nnunet_stages import NNUNET_FROM_PLAN, NNUNET_NETWORKS
from medseg.models.nnunet_weights import nnunet_state_dict
from medseg.planning.from_config import dataset_fingerprint
from medseg.planning.nnunet_plans import ras_axes
from medseg.runs.checkpoint import load_fitting_state
from medseg.runs.nnunet_model import NnunetModel, nnunet_model_folder, read_nnunet_model

log = logging.getLogger("medseg")

HEADS = ("head.", "deep_heads.")
"""The state-dict prefixes of medseg's segmentation heads, whose output channels are the classes."""


def nnunet_start(cfg: TrainConfig) -> NnunetModel | None:
    """The nnU-Net model ``trainer.init_from`` names (its fold ``data.fold`` for a trained-model folder), or None
    when it names none (no ``init_from``, or a medseg checkpoint)."""
    path = cfg.trainer.init_from
    if not path or nnunet_model_folder(path) is None:
        return None
    return read_nnunet_model(path, cfg.data.fold)


def with_nnunet_plan(cfg: TrainConfig, source: NnunetModel) -> TrainConfig:
    """``cfg`` set to train on ``source``'s plan: ``plan.nnunet_configuration`` the checkpoint's configuration, and
    under ``data.plan_from=init`` ``plan.file`` its folder's ``plans.json`` with ``model.conv_stages=nnunet``.

    Raises:
        ConfigError: neither ``plan.file`` nor ``data.plan_from=init``, another configuration named, or conv stages
            that cannot hold nnU-Net's weights.
    """
    where = f"trainer.init_from={cfg.trainer.init_from}"
    planning = cfg.plan
    if planning.nnunet_configuration not in (None, source.configuration):
        raise ConfigError(f"plan.nnunet_configuration={planning.nnunet_configuration}: {where} is "
                          f"{source.describe()}, trained with {source.configuration}")
    model, data = cfg.model, cfg.data
    if data.plan_from == "init":
        planning = replace(planning, file=str(source.plans_file))
        model, data = replace(model, conv_stages=NNUNET_FROM_PLAN), replace(data, plan_from="data")
    elif not planning.file:
        raise ConfigError(f"{where} is {source.describe()}: the run trains on its plan; set plan.file="
                          f"{source.plans_file} (or data.plan_from=init)")
    stages = get_conv_stages(model.conv_stages)
    if all(stages is not get_conv_stages(name) for name in (NNUNET_FROM_PLAN, *NNUNET_NETWORKS.values())):
        raise ConfigError(f"model.conv_stages={model.conv_stages} cannot hold the weights of {where}: set "
                          f"model.conv_stages={NNUNET_FROM_PLAN} (the plan's network; recipe=nnunet sets it)")
    return replace(cfg, model=model, data=data,
                   plan=replace(planning, nnunet_configuration=source.configuration))


SPLITS_FILE = "nnunet_splits.json"
"""Where a run from nnU-Net's model writes nnU-Net's folds (:func:`with_nnunet_splits`), in its folder."""


def with_nnunet_splits(cfg: TrainConfig, source: NnunetModel, info: DatasetInfo) -> TrainConfig:
    """``cfg`` training on ``source``'s folds when ``data.splits`` is unset, the model has two folds or more and was
    trained on this dataset: each fold's held-out cases (its ``validation/`` folder) and the dataset's other cases,
    written as ``splits_final.json`` is to :data:`SPLITS_FILE` in the run's folder, with ``data.num_folds`` their
    number. So fold k starts from fold k's model and validates on the cases it held out."""
    folds = source.folds_held_out()
    cases = [case["case"] for case in info.training]
    if cfg.data.splits or folds is None or len(folds) < 2 or not set(cases) & {case for fold in folds for case in fold}:
        return cfg
    path = Path(cfg.output_dir) / SPLITS_FILE
    atomic_write_json(path, [{"train": [case for case in cases if case not in held_out], "val": held_out}
                             for held_out in folds])
    log.info("data.splits: nnU-Net's %d folds, read from %s (fold_<k>/validation), written to %s", len(folds),
             source.folder, path)
    return replace(cfg, data=replace(cfg.data, splits=str(path), num_folds=len(folds)))


def output_names(spec: LabelSpec) -> list[str]:
    """The name of each output channel of a network trained on ``spec``: every class, background first (softmax),
    or every region (sigmoid)."""
    return list(spec.regions) if spec.regions is not None else [spec.labels[i] for i in range(spec.num_classes)]


def output_order(source: LabelSpec, target: LabelSpec) -> list[int] | None:
    """For each of ``target``'s output channels, the channel of ``source`` with its name; None when the two do not
    name the same outputs with the same activation (the heads are then trained afresh)."""
    theirs, ours = output_names(source), output_names(target)
    if source.activation != target.activation or sorted(theirs) != sorted(ours):
        return None
    return [theirs.index(name) for name in ours]


def _in_class_order(mapped: dict[str, torch.Tensor], order: list[int] | None) -> dict[str, torch.Tensor]:
    """``mapped`` with each head tensor's output channels taken in ``order``; without an order, no head entries."""
    heads = {key for key in mapped if key.startswith(HEADS)}
    if order is None:
        return {key: tensor for key, tensor in mapped.items() if key not in heads}
    return {key: tensor[order] if key in heads else tensor for key, tensor in mapped.items()}


def check_no_leak(source: NnunetModel, info: DatasetInfo, val_cases: list[str]) -> str:
    """Refuse a start whose fold trained on a case this run validates on; returns what was checked, for the log.

    The fold's held-out cases are those its ``validation/`` folder predicted. When some of them are this dataset's,
    the datasets are one, and every case the run validates on must be among them (fold k from fold k's model).

    Raises:
        CheckpointError: naming the cases the model trained on and the run validates on.
    """
    held_out = source.validation_cases()
    if held_out is None:
        return (f"{source.checkpoint.parent} has no validation/ folder, so whether its fold trained on this run's "
                "validation cases was not checked")
    if not set(held_out) & {case["case"] for case in info.training}:
        return "its fold's held-out cases are not this dataset's: another dataset"
    leaked = sorted(set(val_cases) - set(held_out))
    if leaked:
        raise CheckpointError(
            f"trainer.init_from={source.checkpoint}: fold {source.fold} of nnU-Net's model trained on "
            f"{len(leaked)} case(s) this run validates on ({', '.join(leaked[:4])}{', ...' if len(leaked) > 4 else ''}"
            "); start data.fold=k from nnU-Net's fold k, with its splits (data.splits=<splits_final.json>)")
    return f"the run validates on cases fold {source.fold} held out"


@dataclass(frozen=True)
class NnunetStart:
    """What :func:`start_from_nnunet` did, for the log."""

    fresh: list[str]
    """The layers of the run's conv stages and heads not taken from nnU-Net (a head or stem of another shape)."""
    identity_slots: list[str]
    classes: str
    """How the head's classes were matched."""
    leak_check: str


def start_from_nnunet(model: torch.nn.Module, cfg: TrainConfig, info: DatasetInfo, source: NnunetModel,
                      val_cases: list[str]) -> NnunetStart:
    """Load ``source``'s weights into ``model`` (built with its plan's values, :func:`with_nnunet_plan`), its heads'
    channels in the run's class order, its attention slots started as the identity.

    Raises:
        CheckpointError: weights that do not fit the network of the plan (one line naming both sides), or a fold that
            trained on a case the run validates on (:func:`check_no_leak`).
    """
    leak = check_no_leak(source, info, val_cases)
    network = unwrap_model(model)
    assert isinstance(network, SlottedUNet)
    axes = ras_axes(source.plans, dataset_fingerprint(info, cfg.data, progress=False), f"plan.file={cfg.plan.file}")
    with torch.random.fork_rng(devices=[]):  # the same network with the model's classes and channels
        like_source = build_model(cfg.model, len(source.channels), source.labels.num_outputs, None)
    mapped = nnunet_state_dict(like_source, source.weights, axes if network.spatial_dims == 3 else axes[1:])
    order = output_order(source.labels, info.label_spec)
    fresh = load_fitting_state(network, _in_class_order(mapped, order))
    if order is None:
        classes = (f"its outputs {output_names(source.labels)} are not this run's {output_names(info.label_spec)}: "
                   "the heads start afresh")
    else:
        reordered = "" if order == sorted(order) else f", its head's channels taken in order {order}"
        classes = f"the same classes{reordered}"
    slots = network.start_slots_as_identity()
    layers = sorted({key.rsplit(".", 1)[0] for key in fresh if not key.startswith(tuple(f"{s}." for s in slots))})
    return NnunetStart(layers, slots, classes, leak)


def read_val_cases(splits_file: Path) -> list[str]:
    """The validation cases of the run's ``splits.json``."""
    return list(json.loads(splits_file.read_text())["val"])
