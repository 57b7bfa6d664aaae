"""The checks of a training config (``scripts/train.py``, ``scripts/plan.py``) against the registries it selects from.

:func:`check_config` turns a composed config into a typed :class:`~medseg.config.TrainConfig`, or raises
:class:`~medseg.errors.ConfigError` with one line that names the key and what is valid. The keys no builder checks
are checked against the registry they select from (losses, optimizers, ...); the checks the builders make (each
slot's block and its ``model.attention`` values, the model's name and norm, the normalisation) are run here at
start-up rather than written again, so a new registry entry needs no change here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from omegaconf import DictConfig, OmegaConf

from medseg.attention.common import check_spatial_dims
from medseg.attention.registry import block_choices, check_blocks, load_blocks
from medseg.config import DataConfig, InferenceConfig, TrainConfig
from medseg.data.datalist import DATASET_FORMATS
from medseg.data.resampling import RESAMPLINGS
from medseg.data.transforms import AUGMENT_ON, AUGMENTATIONS, check_normalization
from medseg.errors import ConfigError, keyed
from medseg.models import check_model, check_patch
from medseg.optim import OPTIMIZERS, SCHEDULES
from medseg.runtime.device import PRECISIONS
from medseg.training.losses import LOSSES
from medseg.training.prepare import CACHE_MODES
from medseg.typed_config import check_choices, to_typed

PLAN_SOURCES = ("data", "init")
"""The values of ``data.plan_from``: plan the null plannable keys from the dataset, or take them all from the
checkpoint the run starts from (:func:`medseg.training.planning.plan_of_checkpoint`)."""


def _choices() -> dict[str, Sequence[str]]:
    """The keys with a fixed set of values that no builder checks, and that set, read from the registry it selects
    from (the blocks', the model's and the normalisation's keys are checked by their builders:
    :func:`_check_builders`)."""
    return {
        "data.format": list(DATASET_FORMATS), "data.cache": list(CACHE_MODES), "data.plan_from": list(PLAN_SOURCES),
        "data.augment": list(AUGMENTATIONS), "data.augment_on": list(AUGMENT_ON),
        "data.resampling": list(RESAMPLINGS),
        "trainer.loss": list(LOSSES), "trainer.optimizer": list(OPTIMIZERS), "trainer.scheduler": list(SCHEDULES),
        "trainer.precision": list(PRECISIONS),
    }


def _check_builders(cfg: TrainConfig) -> None:
    """The checks the builders make (the spatial dims, the model name, norm and strides, the patch against them when
    both are set with one size per axis, each slot's block and its ``model.attention`` values, the normalisation),
    made at start-up, before any data is read."""
    model = cfg.model
    with keyed("model"):
        check_spatial_dims(model.spatial_dims)
    check_model(model)
    if cfg.data.patch_size is not None and len(cfg.data.patch_size) == model.spatial_dims:
        check_patch(model, cfg.data.patch_size)
    check_blocks({"model.bottleneck": model.bottleneck, "model.decoder": model.decoder}, model.spatial_dims,
                 **asdict(model.attention))
    if cfg.data.normalization is not None:
        check_normalization(cfg.data.normalization)


def _check_block_names(cfg: DictConfig) -> None:
    """Hydra's trap: ``model.bottleneck=<name>`` next to a config group would replace the node, so a block given as a
    mapping (a config group) instead of a name is refused."""
    for key in ("bottleneck", "decoder"):
        value = OmegaConf.select(cfg, f"model.{key}")
        if isinstance(value, DictConfig):
            raise ConfigError(
                f"model.{key} must be a block name (a string), got a mapping {OmegaConf.to_container(value)}. "
                f"Write model.{key}=<name>; block hyperparameters go in model.attention.*. "
                f"Valid names: {', '.join(block_choices())}")


def _check_start(cfg: TrainConfig) -> None:
    """How the run starts: ``trainer.init_from`` begins a new run from another run's weights, ``trainer.resume`` and
    ``ckpt_path`` continue one, so they exclude each other; ``data.plan_from=init`` needs a checkpoint to start from."""
    continues = [key for key, value in (("trainer.resume", cfg.trainer.resume), ("ckpt_path", cfg.ckpt_path)) if value]
    if cfg.trainer.init_from and continues:
        raise ConfigError(f"trainer.init_from (a new run from another run's weights) cannot be combined with "
                          f"{' or '.join(continues)} (continuing a run): set only one of them")
    if cfg.data.plan_from == "init" and not (cfg.trainer.init_from or continues):
        raise ConfigError("data.plan_from=init takes the plan from the checkpoint the run starts from: set "
                          "trainer.init_from=<checkpoint>, or data.plan_from=data")


def _check_inference(cfg: TrainConfig) -> None:
    """Validation reads the ``inference`` node's sliding window only: it runs on ``trainer.device`` in
    ``trainer.precision`` with torch, so another ``inference.device``, ``precision`` or ``backend`` is refused."""
    defaults = InferenceConfig()
    for key, trainer_key in (("device", "trainer.device"), ("precision", "trainer.precision"), ("backend", None)):
        value = getattr(cfg.inference, key)
        if value != getattr(defaults, key):
            instead = f"; set {trainer_key}" if trainer_key else ""
            raise ConfigError(f"inference.{key}={value}: training validates on trainer.device in trainer.precision "
                              f"with torch; inference.{key} is for predict and evaluate{instead}")


def _check_values(cfg: TrainConfig) -> None:
    """The values of ``cfg`` against the registries and against each other (each number against its range is
    :func:`~medseg.typed_config.to_typed`'s check)."""
    check_choices(cfg, _choices())
    _check_inference(cfg)
    _check_builders(cfg)
    model, data = cfg.model, cfg.data
    if model.channels is not None and len(model.channels) < 2:
        raise ConfigError(f"model.channels={model.channels}: need at least two levels")
    if model.channels is not None and model.strides is not None and len(model.strides) != len(model.channels) - 1:
        raise ConfigError(f"model.strides has {len(model.strides)} entries; model.channels has {len(model.channels)} "
                          f"levels, so expected {len(model.channels) - 1} strides")
    levels = (len(model.channels) if model.channels is not None
              else len(model.strides) + 1 if model.strides is not None else None)  # None: the depth is planned
    if levels is not None and model.decoder_levels > levels - 1:  # >= 0 is its range
        raise ConfigError(f"model.decoder_levels={model.decoder_levels}: expected 0..{levels - 1}")
    if data.spacing is not None and len(data.spacing) != 3:
        raise ConfigError(f"data.spacing={data.spacing}: expected 3 entries (mm along R, A, S), also in 2D")
    if data.patch_size is not None and len(data.patch_size) not in (2, 3):
        raise ConfigError(f"data.patch_size={data.patch_size}: expected 2 or 3 sizes")
    if data.regions is not None and not (isinstance(data.regions, Mapping) and all(
            isinstance(v, list) and all(isinstance(i, int) for i in v) for v in data.regions.values())):
        raise ConfigError(f"data.regions={data.regions!r}: expected a mapping region name -> list of label values, "
                          f"e.g. {{whole_tumor:[1,2,4],tumor_core:[2,4],enhancing:[4]}}")
    _check_start(cfg)
    if cfg.plan.nnunet_configuration is not None and not cfg.plan.file:
        raise ConfigError(f"plan.nnunet_configuration={cfg.plan.nnunet_configuration} names a configuration of "
                          "nnU-Net's plans: set plan.file=<nnUNetPlans.json>")
    if data.fold != "all" and not (isinstance(data.fold, int) and 0 <= data.fold < data.num_folds):
        raise ConfigError(f"data.fold={data.fold!r}: expected 0..{data.num_folds - 1} or all")


def check_config(cfg: TrainConfig | Mapping[str, Any] | DictConfig) -> TrainConfig:
    """Check ``cfg`` against the schema and the registries; return it as a typed :class:`TrainConfig`.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, a required value left unset, an unknown
            block or choice, or inconsistent shapes. The message names the key and lists what is valid.
    """
    if isinstance(cfg, TrainConfig):
        cfg = OmegaConf.structured(cfg)
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    load_blocks(OmegaConf.select(node, "model.block_modules", default=None) or [])
    _check_block_names(node)
    data_format = OmegaConf.select(node, "data.format", default=None) or DataConfig.format
    typed = to_typed(TrainConfig, node, context=f" for data={data_format}")
    _check_values(typed)
    return typed
