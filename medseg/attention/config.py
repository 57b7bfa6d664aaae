"""The shared ``model.attention`` node: one set of hyperparameters that every attention block reads from.

Each block takes the keys it needs and ignores the rest, so a single node serves every slot and a
Hydra sweep over ``model.attention.gamma`` or ``model.attention.focusing_factor`` needs no other change.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class AttentionConfig:
    """Hyperparameters shared by all attention blocks (the ``model.attention`` config node)."""

    num_heads: int = 4
    """Attention heads; must divide the channel width of every slot."""
    gamma: float = 0.9
    """MaSA decay base in (0, 1]; the weight between tokens n and m is ``gamma ** manhattan(n, m)``."""
    heads_range: float = 0.0
    """0: one gamma for all heads; > 0: per-head ``1 - (1 - gamma) * 2 ** (-heads_range * h / num_heads)``."""
    spacing: list[float] | None = None
    """Voxel spacing in mm, ordered like the spatial axes (D, H, W) or (H, W), at the network input.
    When set, MaSA distances are physical (mm / smallest spacing). None: distances in voxels."""
    focusing_factor: float = 3.0
    """Focused linear attention: the power ``p`` of the focusing function."""
    kernel_size: int = 5
    """Depthwise-conv kernel for MaSA's LCE and focused linear attention's rank restoration."""
    split_size: int = 2
    """CSWin stripe width in tokens."""
    pe: str = "sincos"
    """MHA position encoding: ``sincos`` | ``relative`` | ``none``."""
    max_relative_size: int = 0
    """MHA relative bias: table size per axis; 0 sizes it for the actual grid, else it is interpolated."""
    mlp_ratio: float = 4.0
    """Hidden width of the transformer block's FFN as a multiple of the channel width."""
    drop_path: float = 0.0
    """Stochastic-depth rate of the transformer block's residual branches."""
    layer_scale: float | None = None
    """Initial value of the per-channel layer scale; None disables it."""


ATTENTION_KEYS: tuple[str, ...] = tuple(f.name for f in fields(AttentionConfig))
