"""The identity token mixer: the ablation of every attention block (MetaFormer's IdentityFormer, Yu et al., 2022)."""

from __future__ import annotations

import torch

from medseg.attention.common import SpatialAttention
from medseg.attention.registry import register_attention


@register_attention("identity")
class IdentityMixer(SpatialAttention):
    """A token mixer that mixes nothing: ``attend(x) = x``, no parameters.

    In a :class:`~medseg.attention.block.TransformerBlock` it keeps everything else of the block (the
    conditional position conv, both norms, the FFN, layer scale, drop path), so ``model.bottleneck=identity``
    is the same network as any attention block without the attention itself: it lacks the block's ``qkv`` and
    ``proj`` linears (``4 C^2 + 4 C`` parameters) and its own extras (MaSA's LCE conv, FLatten's positional
    term, ...). Each token then meets its neighbours only through the position conv. Maps
    ``(B, C, *spatial) -> (B, C, *spatial)``.

    Args:
        dim: channel width ``C``.
        spatial_dims: 2 or 3.
    """

    mixes_tokens = False

    def __init__(self, dim: int, spatial_dims: int) -> None:
        super().__init__(dim, spatial_dims, num_heads=1)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        """Each token keeps its value: ``v`` ``(B, N, C)``."""
        return v

    def attend(self, x: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        """``(B, N, C)`` -> the same tokens: no projections around the (identity) mix."""
        return self.mix(x, x, x, spatial_shape)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
