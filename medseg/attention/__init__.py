"""Attention blocks for the U-Net's slots, chosen by name.

>>> from medseg.attention import build_attention, available_blocks
>>> block = build_attention("masa", dim=128, spatial_dims=3, num_heads=4, gamma=0.9)
>>> # block maps (B, 128, D, H, W) -> (B, 128, D, H, W)

Pure tensor ops live in :mod:`medseg.attention.functional`; one module per block family
(:mod:`~medseg.attention.masa`, :mod:`~medseg.attention.focused_linear`, :mod:`~medseg.attention.cswin`,
:mod:`~medseg.attention.mha`, and :mod:`~medseg.attention.identity`, the ablation without attention);
:mod:`~medseg.attention.registry` turns names into modules and checks a config's
block settings. :mod:`medseg.models.inspect` recomputes a trained U-Net's attention rows for one voxel.
"""

from medseg.attention.block import TransformerBlock
from medseg.attention.common import SpatialAttention
from medseg.attention.registry import (
    ATTENTION_BLOCKS,
    available_blocks,
    build_attention,
    build_transformer_block,
    register_attention,
)

__all__ = [
    "ATTENTION_BLOCKS",
    "SpatialAttention",
    "TransformerBlock",
    "available_blocks",
    "build_attention",
    "build_transformer_block",
    "register_attention",
]
