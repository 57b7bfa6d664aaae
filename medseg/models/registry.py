"""The model registry: ``model.name`` selects medseg's slotted U-Net or one of MONAI's reference networks; the checks
of a ``model`` config and its training patch, and :func:`build_model`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from torch import nn

from medseg.config import ModelConfig
from medseg.errors import ConfigError, check_choice, keyed
from medseg.models.conv_stages import CONV_STAGES, available_conv_stages
from medseg.models.norms import NORMS
from medseg.models.unet import SlottedUNet, per_axis_strides, per_level_kernels, stride_to_level
from medseg.typed_config import to_typed


def _monai_unet(cfg: ModelConfig, in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    from monai.networks.nets import UNet

    return UNet(spatial_dims=cfg.spatial_dims, in_channels=in_channels, out_channels=out_channels,
                channels=list(cfg.channels), strides=list(cfg.strides), num_res_units=2, norm="instance")


def _monai_swinunetr(cfg: ModelConfig, in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    from monai.networks.nets import SwinUNETR

    return SwinUNETR(in_channels=in_channels, out_channels=out_channels, feature_size=24,
                     spatial_dims=cfg.spatial_dims)


def _monai_unetr(cfg: ModelConfig, in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    from monai.networks.nets import UNETR

    return UNETR(in_channels=in_channels, out_channels=out_channels, img_size=tuple(patch_size),
                 spatial_dims=cfg.spatial_dims, feature_size=16)


def _slotted_unet(cfg: ModelConfig, in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    return SlottedUNet(
        spatial_dims=cfg.spatial_dims, in_channels=in_channels, out_channels=out_channels,
        channels=list(cfg.channels), strides=list(cfg.strides), kernel_size=cfg.kernel_size,
        encoder_blocks=cfg.encoder_blocks, decoder_convs=cfg.decoder_convs, conv_stages=cfg.conv_stages, norm=cfg.norm,
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


MODEL_KEYS = {"patch_size": "data.patch_size"}
"""The config keys of the network parameters whose key is not ``model.<parameter>``: what :func:`keyed` names in
the errors of the networks built from a ``model`` config."""


PATCH_DIVISORS = {"monai_swinunetr": 32, "monai_unetr": 16}
"""The MONAI transformers, which take no ``model.strides``: what each side of their patch must be a multiple of."""


def check_model(cfg: ModelConfig) -> None:
    """Refuse a ``model.name``, ``model.norm`` or ``model.conv_stages`` that no registry holds, a
    ``model.kernel_size`` that does not give each level of ``model.channels`` odd kernels (:func:`per_level_kernels`),
    and strides the conv stages cannot pool by (:func:`build_model` checks this first).

    Raises:
        ConfigError: naming the ``model`` key.
    """
    check_choice("model.name", cfg.name, MODELS)
    check_choice("model.norm", cfg.norm, NORMS)
    check_choice("model.conv_stages", cfg.conv_stages, available_conv_stages())
    if cfg.name != "unet":
        return
    with keyed("model", MODEL_KEYS):
        per_level_kernels(cfg.kernel_size, None if cfg.channels is None else len(cfg.channels), cfg.spatial_dims)
        strides = None if cfg.strides is None else per_axis_strides(cfg.strides, cfg.spatial_dims)
    limit = CONV_STAGES[cfg.conv_stages].max_stride
    if strides is None or limit is None:
        return
    too_large = [s for level in strides for s in level if s > limit]
    if too_large:
        any_stride = ", ".join(name for name in available_conv_stages() if CONV_STAGES[name].max_stride is None)
        raise ConfigError(f"model.strides={cfg.strides}: {CONV_STAGES[cfg.conv_stages].max_stride_reason}, got "
                          f"{too_large[0]} (model.conv_stages {any_stride} pool by any stride)")


def check_patch(cfg: ModelConfig, patch_size: Sequence[int]) -> None:
    """Refuse a training patch (one size per spatial axis) that the network of ``cfg`` cannot take: a side that is not
    a multiple of what the MONAI transformers need (:data:`PATCH_DIVISORS`); with ``model.strides`` resolved, a side
    not divisible by the total stride for monai_unet (which does not pad), or a bottleneck of one voxel (normalising
    it needs more). :func:`build_model` checks this first; training checks it at start-up when both are set.

    Raises:
        ConfigError: naming ``data.patch_size`` (and ``model.strides``) and what the patch must be.
    """
    patch = [int(s) for s in patch_size]
    if len(patch) != cfg.spatial_dims:
        raise ConfigError(f"data.patch_size={patch}: the {cfg.spatial_dims}D model needs {cfg.spatial_dims} sizes")
    divisor = PATCH_DIVISORS.get(cfg.name)
    if divisor is not None and any(s % divisor for s in patch):
        raise ConfigError(f"model.name={cfg.name} needs data.patch_size divisible by {divisor}, got {patch}")
    if divisor is not None or cfg.strides is None:
        return
    with keyed("model", MODEL_KEYS):
        strides = per_axis_strides(cfg.strides, cfg.spatial_dims)
    total = list(stride_to_level(strides, len(strides)))
    if cfg.name == "monai_unet" and any(s % t for s, t in zip(patch, total)):
        raise ConfigError(f"model.name=monai_unet needs data.patch_size divisible by the total stride {total} of "
                          f"model.strides={cfg.strides}, got {patch}")
    bottleneck = [-(-s // t) for s, t in zip(patch, total)]  # medseg's U-Net pads the patch to the total stride
    if math.prod(bottleneck) < 2:
        raise ConfigError(f"data.patch_size={patch} pooled by model.strides={cfg.strides} (total {total}) leaves a "
                          f"bottleneck of {bottleneck} voxels, too few to normalise: a larger patch or fewer levels")


def build_model(model_cfg: ModelConfig | Mapping[str, Any], in_channels: int, out_channels: int,
                patch_size: Sequence[int]) -> nn.Module:
    """Build the network of a ``model`` config (a :class:`ModelConfig`, or a mapping of its keys).

    ``model.strides`` must already be resolved (planned or set). ``patch_size`` is the network's training
    patch, which some MONAI networks need at construction.

    Raises:
        ConfigError: an unknown ``model.name``, unresolved strides, a patch the network cannot take, or a value the
            network refuses (its :class:`~medseg.errors.ParameterError`, naming the config key instead of the
            parameter: :data:`MODEL_KEYS`).
    """
    cfg = to_typed(ModelConfig, model_cfg)
    check_model(cfg)
    if cfg.strides is None:
        raise ConfigError("model.strides is null: plan it from the data first (medseg.planning.plan)")
    if patch_size is not None:  # None: a network for no particular patch (the planner's memory estimate)
        check_patch(cfg, patch_size)
    with keyed("model", MODEL_KEYS):
        return MODELS[cfg.name](cfg, in_channels, out_channels, patch_size)
