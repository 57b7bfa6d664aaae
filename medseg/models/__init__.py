"""Model factory: ``model.name`` selects medseg's slotted U-Net or one of MONAI's reference networks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from medseg.models.unet import SlottedUNet, per_axis_strides

__all__ = ["SlottedUNet", "build_model", "per_axis_strides"]


def _monai_unet(cfg: Mapping[str, Any], in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    from monai.networks.nets import UNet

    return UNet(spatial_dims=cfg["spatial_dims"], in_channels=in_channels, out_channels=out_channels,
                channels=list(cfg["channels"]), strides=list(cfg["strides"]), num_res_units=2, norm="instance")


def _monai_swinunetr(cfg: Mapping[str, Any], in_channels: int, out_channels: int,
                     patch_size: Sequence[int]) -> nn.Module:
    from monai.networks.nets import SwinUNETR

    if any(s % 32 for s in patch_size):
        raise ValueError(f"model.name=monai_swinunetr needs data.patch_size divisible by 32, got {list(patch_size)}")
    return SwinUNETR(in_channels=in_channels, out_channels=out_channels, feature_size=24,
                     spatial_dims=cfg["spatial_dims"])


def _monai_unetr(cfg: Mapping[str, Any], in_channels: int, out_channels: int, patch_size: Sequence[int]) -> nn.Module:
    from monai.networks.nets import UNETR

    if any(s % 16 for s in patch_size):
        raise ValueError(f"model.name=monai_unetr needs data.patch_size divisible by 16, got {list(patch_size)}")
    return UNETR(in_channels=in_channels, out_channels=out_channels, img_size=tuple(patch_size),
                 spatial_dims=cfg["spatial_dims"], feature_size=16)


def _slotted_unet(cfg: Mapping[str, Any], in_channels: int, out_channels: int,
                  patch_size: Sequence[int]) -> nn.Module:
    return SlottedUNet(
        spatial_dims=cfg["spatial_dims"], in_channels=in_channels, out_channels=out_channels,
        channels=list(cfg["channels"]), strides=list(cfg["strides"]), kernel_size=cfg["kernel_size"],
        norm=cfg["norm"], dropout=cfg["dropout"], deep_supervision=cfg["deep_supervision"],
        bottleneck=cfg["bottleneck"], bottleneck_depth=cfg["bottleneck_depth"], decoder=cfg["decoder"],
        decoder_levels=cfg["decoder_levels"], attention=cfg["attention"], checkpointing=cfg["checkpointing"],
        channels_last=cfg["channels_last"],
    )


MODELS = {
    "unet": _slotted_unet,
    "monai_unet": _monai_unet,
    "monai_swinunetr": _monai_swinunetr,
    "monai_unetr": _monai_unetr,
}


def build_model(model_cfg: Mapping[str, Any], in_channels: int, out_channels: int,
                patch_size: Sequence[int]) -> nn.Module:
    """Build the network described by the plain-dict ``model`` config node.

    ``model_cfg["strides"]`` must already be resolved (planned or set). ``patch_size`` is the
    training patch, which some MONAI networks need at construction.
    """
    name = model_cfg["name"]
    if name not in MODELS:
        raise ValueError(f"model.name={name!r}: expected one of {', '.join(MODELS)}")
    return MODELS[name](model_cfg, in_channels, out_channels, patch_size)
