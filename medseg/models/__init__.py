"""Model factory: ``model.name`` selects medseg's slotted U-Net or one of MONAI's reference networks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from torch import nn

from medseg.config import ModelConfig
from medseg.errors import ConfigError, check_choice
from medseg.models.norms import NORMS
from medseg.models.unet import SlottedUNet, per_axis_strides
from medseg.typed_config import to_typed

__all__ = ["MODELS", "NORMS", "SlottedUNet", "build_model", "per_axis_strides", "unwrap_model"]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP and ``torch.compile`` wrappers (whose state_dict keys are clean)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def _monai_unet(cfg: ModelConfig, in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    from monai.networks.nets import UNet

    return UNet(spatial_dims=cfg.spatial_dims, in_channels=in_channels, out_channels=out_channels,
                channels=list(cfg.channels), strides=list(cfg.strides), num_res_units=2, norm="instance")


def _require_divisible(patch_size: Sequence[int], divisor: int, name: str) -> None:
    if any(s % divisor for s in patch_size):
        raise ConfigError(f"model.name={name} needs data.patch_size divisible by {divisor}, got {list(patch_size)}")


def _monai_swinunetr(cfg: ModelConfig, in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    from monai.networks.nets import SwinUNETR

    _require_divisible(patch_size, 32, "monai_swinunetr")
    return SwinUNETR(in_channels=in_channels, out_channels=out_channels, feature_size=24,
                     spatial_dims=cfg.spatial_dims)


def _monai_unetr(cfg: ModelConfig, in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    from monai.networks.nets import UNETR

    _require_divisible(patch_size, 16, "monai_unetr")
    return UNETR(in_channels=in_channels, out_channels=out_channels, img_size=tuple(patch_size),
                 spatial_dims=cfg.spatial_dims, feature_size=16)


def _slotted_unet(cfg: ModelConfig, in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    return SlottedUNet(
        spatial_dims=cfg.spatial_dims, in_channels=in_channels, out_channels=out_channels,
        channels=list(cfg.channels), strides=list(cfg.strides), kernel_size=cfg.kernel_size,
        encoder_blocks=cfg.encoder_blocks, decoder_convs=cfg.decoder_convs, norm=cfg.norm,
        dropout=cfg.dropout, deep_supervision=cfg.deep_supervision, bottleneck=cfg.bottleneck,
        bottleneck_depth=cfg.bottleneck_depth, decoder=cfg.decoder, decoder_levels=cfg.decoder_levels,
        attention=asdict(cfg.attention), checkpointing=cfg.checkpointing, channels_last=cfg.channels_last,
        patch_size=patch_size,
    )


MODELS: dict[str, Callable[[ModelConfig, int, int, Sequence[int]], nn.Module]] = {
    "unet": _slotted_unet,
    "monai_unet": _monai_unet,
    "monai_swinunetr": _monai_swinunetr,
    "monai_unetr": _monai_unetr,
}
"""The values of ``model.name``: name -> ``builder(model_cfg, in_channels, out_channels, patch_size)``."""


def check_model(cfg: ModelConfig) -> None:
    """Refuse a ``model.name`` or ``model.norm`` that no registry holds (:func:`build_model` checks this first)."""
    check_choice("model.name", cfg.name, MODELS)
    check_choice("model.norm", cfg.norm, NORMS)


def build_model(model_cfg: ModelConfig | Mapping[str, Any], in_channels: int, out_channels: int,
                patch_size: Sequence[int]) -> nn.Module:
    """Build the network of a ``model`` config (a :class:`ModelConfig`, or a mapping of its keys).

    ``model.strides`` must already be resolved (planned or set). ``patch_size`` is the network's training
    patch, which some MONAI networks need at construction.

    Raises:
        ConfigError: an unknown ``model.name``, unresolved strides, or a patch the network cannot take.
    """
    cfg = to_typed(ModelConfig, model_cfg)
    check_model(cfg)
    if cfg.strides is None:
        raise ConfigError("model.strides is null: plan it from the data first (medseg.planning.plan)")
    return MODELS[cfg.name](cfg, in_channels, out_channels, patch_size)
