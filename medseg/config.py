"""The config contract: a typed schema for everything users type, and the validation run before any work.

``validate_config`` turns a composed Hydra config into a checked one, or raises :class:`ConfigError` with
a one-line message that names the key and lists what is valid. It catches the silent Hydra trap of
design.md: ``model.bottleneck`` given as a mapping instead of a block name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from medseg.attention import available_blocks
from medseg.attention.config import AttentionConfig

MODEL_NAMES = ("unet", "monai_unet", "monai_swinunetr", "monai_unetr")
DATA_FORMATS = ("demo", "msd", "nnunet")
NORMALIZATIONS = ("zscore", "ct", "none")


class ConfigError(ValueError):
    """A config value medseg cannot use; the message names the key and what was expected."""


@dataclass
class ModelConfig:
    name: str = "unet"
    spatial_dims: int = 3
    channels: list[int] = field(default_factory=lambda: [16, 32, 64, 128])
    strides: list[Any] | None = field(default_factory=lambda: [2, 2, 2])
    kernel_size: int = 3
    norm: str = "instance"
    dropout: float = 0.0
    deep_supervision: bool = False
    checkpointing: bool = False
    channels_last: bool = True
    bottleneck: str = "none"
    bottleneck_depth: int = 2
    decoder: str = "none"
    decoder_levels: int = 1
    attention: AttentionConfig = field(default_factory=AttentionConfig)


@dataclass
class DataConfig:
    format: str = "demo"
    root: str = "data/demo3d"
    num_cases: int = 40
    fold: Any = 0
    num_folds: int = 5
    split_seed: int = 12345
    spacing: list[float] | None = None
    patch_size: list[int] | None = None
    normalization: Any = None
    pos_fraction: float = 0.67
    samples_per_volume: int | None = None
    augment: bool = True
    cache: str = "auto"
    cache_dir: str | None = None
    num_workers: int = 0


@dataclass
class TrainerConfig:
    max_epochs: int = 6
    batch_size: int = 2
    lr: float = 3e-3
    weight_decay: float = 3e-5
    optimizer: str = "adamw"
    momentum: float = 0.99
    scheduler: str = "cosine"
    warmup_epochs: int = 0
    val_every: int = 2
    sw_batch_size: int = 4
    sw_overlap: float = 0.25
    device: str = "auto"
    precision: str = "auto"
    seed: int = 0
    deterministic: bool = False
    compile: bool = False
    grad_clip: float | None = 12.0
    max_nonfinite_steps: int = 20
    resume: bool = False
    progress: bool = True
    log_images: bool = True
    check_data: bool = True


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    task_name: str = "train"
    output_dir: str = "outputs/train"
    ckpt_path: str | None = None


CHOICES: dict[str, tuple[str, ...]] = {
    "model.name": MODEL_NAMES,
    "data.format": DATA_FORMATS,
    "data.cache": ("auto", "memory", "disk", "none"),
    "trainer.optimizer": ("adamw", "sgd"),
    "trainer.scheduler": ("cosine", "poly", "none"),
    "trainer.precision": ("auto", "bf16", "fp16", "fp32"),
    "model.attention.pe": ("sincos", "relative", "none"),
    "model.norm": ("instance", "batch", "group"),
}


def block_choices() -> tuple[str, ...]:
    """Valid values of ``model.bottleneck`` and ``model.decoder``."""
    return ("none", *available_blocks())


def _schema_keys(path: str) -> list[str]:
    """The valid keys of the schema node at ``path`` ("" for the root)."""
    node = OmegaConf.structured(TrainConfig)
    if path:
        node = OmegaConf.select(node, path)
    return list(node.keys()) if isinstance(node, DictConfig) else []


def _check_block_names(cfg: DictConfig) -> None:
    for key in ("bottleneck", "decoder"):
        value = OmegaConf.select(cfg, f"model.{key}")
        if isinstance(value, DictConfig):
            raise ConfigError(
                f"model.{key} must be a block name (a string), got a mapping {OmegaConf.to_container(value)}. "
                f"Write model.{key}=<name>; block hyperparameters go in model.attention.*. "
                f"Valid names: {', '.join(block_choices())}"
            )


def _check_values(cfg: DictConfig) -> None:
    model, data = cfg.model, cfg.data
    for key in ("bottleneck", "decoder"):
        if model[key] not in block_choices():
            raise ConfigError(
                f"model.{key}={model[key]!r} is not a known attention block. "
                f"Valid names: {', '.join(block_choices())}"
            )
    for key, choices in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in choices:
            raise ConfigError(f"{key}={value!r}: expected one of {', '.join(choices)}")
    if model.spatial_dims not in (2, 3):
        raise ConfigError(f"model.spatial_dims={model.spatial_dims}: expected 2 or 3")
    if len(model.channels) < 2:
        raise ConfigError(f"model.channels={list(model.channels)}: need at least two levels")
    if model.strides is not None and len(model.strides) != len(model.channels) - 1:
        raise ConfigError(
            f"model.strides has {len(model.strides)} entries; model.channels has {len(model.channels)} "
            f"levels, so expected {len(model.channels) - 1} strides"
        )
    if not 0 <= model.decoder_levels <= len(model.channels) - 1:
        raise ConfigError(f"model.decoder_levels={model.decoder_levels}: expected 0..{len(model.channels) - 1}")
    if isinstance(data.normalization, str) and data.normalization not in NORMALIZATIONS:
        raise ConfigError(f"data.normalization={data.normalization!r}: expected one of {', '.join(NORMALIZATIONS)}")
    if data.patch_size is not None and len(data.patch_size) not in (2, 3):
        raise ConfigError(f"data.patch_size={list(data.patch_size)}: expected 2 or 3 sizes")
    if not 0.0 <= data.pos_fraction <= 1.0:
        raise ConfigError(f"data.pos_fraction={data.pos_fraction}: expected a fraction in [0, 1]")
    if not 0.0 < model.attention.gamma <= 1.0:
        raise ConfigError(f"model.attention.gamma={model.attention.gamma}: expected a decay in (0, 1]")


def validate_config(cfg: DictConfig | dict) -> DictConfig:
    """Check ``cfg`` against the schema and the block registry; return it typed and read-only.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, an unknown block or choice, or
            inconsistent shapes. The message names the key and lists what is valid.
    """
    cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    _check_block_names(cfg)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)
    except ConfigKeyError as err:
        parent = str(err.full_key).rsplit(".", 1)[0] if "." in str(err.full_key) else ""
        valid = _schema_keys(parent)
        raise ConfigError(
            f"unknown config key {err.full_key!r}; valid keys{f' under {parent!r}' if parent else ''}: "
            f"{', '.join(valid)}"
        ) from None
    except ValidationError as err:
        raise ConfigError(f"{err.full_key}: {err.msg}") from None
    _check_values(merged)
    OmegaConf.set_readonly(merged, True)
    return merged


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain Python types (for checkpoints and JSON)."""
    return OmegaConf.to_container(cfg, resolve=True, structured_config_mode=None)  # type: ignore[return-value]
