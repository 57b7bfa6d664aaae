"""Attention blocks for the U-Net's slots, chosen by name.

>>> from medseg.attention import build_attention, available_blocks
>>> block = build_attention("masa", dim=128, spatial_dims=3, num_heads=4, gamma=0.9)
>>> # block maps (B, 128, D, H, W) -> (B, 128, D, H, W)

Pure tensor ops live in :mod:`medseg.attention.functional`; one module per block family
(:mod:`~medseg.attention.masa`, :mod:`~medseg.attention.focused_linear`, :mod:`~medseg.attention.cswin`,
:mod:`~medseg.attention.mha`, and :mod:`~medseg.attention.identity`, the ablation without attention);
:mod:`~medseg.attention.registry` turns names into modules, loads other packages' blocks and checks a config's
block settings.
Importing this package registers medseg's blocks, in the order :func:`available_blocks` lists them.
:mod:`medseg.models.inspect` recomputes a trained U-Net's attention rows for one voxel.
"""

from medseg.attention.block import TransformerBlock
from medseg.attention.common import SpatialAttention
from medseg.attention.registry import (
    ATTENTION_BLOCKS,
    available_blocks,
    build_attention,
    build_transformer_block,
    load_blocks,
    register_attention,
)

# Importing a block registers it: this order is available_blocks()'s.
# isort: off
from medseg.attention.masa import MaSA, MaSADecomposed
from medseg.attention.focused_linear import FocusedLinearAttention
from medseg.attention.cswin import CSWinAttention
from medseg.attention.mha import MultiHeadAttention
from medseg.attention.identity import IdentityMixer
# isort: on


__all__ = [
    "ATTENTION_BLOCKS",
    "CSWinAttention",
    "FocusedLinearAttention",
    "IdentityMixer",
    "MaSA",
    "MaSADecomposed",
    "MultiHeadAttention",
    "SpatialAttention",
    "TransformerBlock",
    "available_blocks",
    "build_attention",
    "build_transformer_block",
    "load_blocks",
    "register_attention",
]
