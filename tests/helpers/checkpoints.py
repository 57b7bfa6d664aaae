"""Checkpoints as the trainer writes them, of tiny U-Nets, and a "model" that returns its input."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medseg.config import DataConfig
from medseg.data.transforms import window
from medseg.models import build_model
from medseg.runs.checkpoint import save_checkpoint
from medseg.training.checks import check_config
from tests.helpers.configs import compose_config
from tests.helpers.volumes import LABELS

CHECKPOINT_SPACING = (1.0, 1.0, 1.5)
"""The spacing (mm) :func:`save_test_checkpoint`'s checkpoints resample to (the demo's is 0.8 x 0.8 x 2)."""
TINY_MODEL = {"name": "unet", "channels": [8, 16], "strides": [2], "kernel_size": 3, "norm": "instance",
              "dropout": 0.0, "deep_supervision": False, "bottleneck": "none", "bottleneck_depth": 1,
              "decoder": "none", "decoder_levels": 0, "checkpointing": False, "channels_last": True}
MASA_GAMMA = 0.3
"""The MaSA decay of :func:`masa_checkpoint`'s block."""
MASA_SPACING = (1.0, 1.0, 2.0)
"""The spacing (mm) :func:`masa_checkpoint`'s checkpoints resample to."""


def save_test_checkpoint(path: Path, spatial_dims: int = 3, spacing=CHECKPOINT_SPACING, patch=(32, 32, 16),
                         normalization: Any = "zscore", state: dict | None = None,
                         channel_names: tuple[str, ...] = ("MRI",), labels: dict[str, str] = LABELS,
                         data: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """A checkpoint as the trainer writes it: a real resolved config, a tiny SlottedUNet (weights drawn with
    ``seed``), the dataset description. ``data``: more ``data`` keys (``root``, ``fold``, ...)."""
    cfg = asdict(check_config(compose_config(["output_dir=unused"])))
    cfg["model"].update(TINY_MODEL, spatial_dims=spatial_dims)
    cfg["data"].update(spacing=list(spacing), patch_size=list(patch), normalization=normalization, **(data or {}))
    if state is None:
        torch.manual_seed(seed)
        net_patch = window(DataConfig(**cfg["data"]), spatial_dims).net_patch
        state = build_model(cfg["model"], len(channel_names), len(labels), net_patch).state_dict()
    dataset = {"labels": labels, "channel_names": list(channel_names)}
    return save_checkpoint(path, {"model": state, "config": cfg, "dataset": dataset})


def masa_checkpoint(path: Path, spatial_dims: int = 3, bottleneck: str = "masa") -> Path:
    """A checkpoint of a tiny U-Net with one ``bottleneck`` block whose q and k are zero: each attention row is
    the decay alone, ``gamma ** dist`` normalised, which peaks at the query token."""
    cfg = asdict(check_config(compose_config(["output_dir=unused"])))
    cfg["model"].update(spatial_dims=spatial_dims, channels=[4, 8], strides=[2], bottleneck=bottleneck,
                        bottleneck_depth=1, decoder="none", decoder_levels=0)
    cfg["model"]["attention"].update(num_heads=2, gamma=MASA_GAMMA)
    cfg["data"].update(spacing=list(MASA_SPACING), patch_size=[16, 16, 8], normalization="zscore")
    torch.manual_seed(0)
    net_patch = window(DataConfig(**cfg["data"]), spatial_dims).net_patch
    state = build_model(cfg["model"], 1, 3, net_patch).state_dict()
    for key in state:
        if ".qkv." in key:
            state[key] = torch.zeros_like(state[key])
    dataset = {"labels": LABELS, "channel_names": ["MRI"]}
    return save_checkpoint(path, {"model": state, "config": cfg, "dataset": dataset})


class OracleNet(nn.Module):
    """A "model" whose input channels are the one-hot label: its logits are the (resampled) one-hot label."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 20.0 * x
