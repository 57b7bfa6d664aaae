"""Cross-shaped window (CSWin) attention (Dong et al., CVPR 2022), generalised to 3D."""

from __future__ import annotations

import torch

from medseg.attention import functional
from medseg.attention.common import SpatialAttention, TokenDepthwiseConv, merge_heads, split_heads
from medseg.errors import ConfigError

LEPE_KERNEL = 3
"""CSWin's locally-enhanced positional encoding is a 3x3(x3) depthwise conv on v."""


def heads_per_axis(num_heads: int, spatial_dims: int) -> list[int]:
    """Distribute heads over one stripe group per spatial axis as evenly as possible (earlier axes first)."""
    if num_heads < spatial_dims:
        raise ConfigError(
            f"cswin needs model.attention.num_heads >= {spatial_dims} (one stripe group per spatial axis), "
            f"got {num_heads}"
        )
    base, extra = divmod(num_heads, spatial_dims)
    return [base + (axis < extra) for axis in range(spatial_dims)]


class CSWinAttention(SpatialAttention):
    """Stripe attention in parallel head groups, one group per spatial axis, plus LePE.

    The heads of group ``a`` attend inside stripes that run the full length of axis ``a`` and are
    ``split_size`` tokens wide on the other axes (:func:`medseg.attention.functional.stripe_attention`);
    in 2D these are CSWin's horizontal and vertical stripes. Maps ``(B, C, *sp) -> (B, C, *sp)``.

    Args:
        dim: channel width ``C``.
        spatial_dims: 2 or 3.
        num_heads: attention heads; must divide ``dim`` and be at least ``spatial_dims``.
        split_size: stripe width in tokens.
    """

    def __init__(self, dim: int, spatial_dims: int, num_heads: int = 4, split_size: int = 2) -> None:
        super().__init__(dim, spatial_dims, num_heads)
        if split_size < 1:
            raise ConfigError(f"model.attention.split_size must be >= 1, got {split_size}")
        self.split_size = int(split_size)
        self.group_heads = heads_per_axis(num_heads, spatial_dims)
        self.lepe = TokenDepthwiseConv(dim, spatial_dims, LEPE_KERNEL)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        groups = zip(*(split_heads(t, self.num_heads).split(self.group_heads, dim=1) for t in (q, k, v)))
        out = torch.cat(
            [
                functional.stripe_attention(qg, kg, vg, spatial_shape, axis, self.split_size)
                for axis, (qg, kg, vg) in enumerate(groups)
            ],
            dim=1,
        )
        return merge_heads(out) + self.lepe(v, spatial_shape)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, group_heads={self.group_heads}, split_size={self.split_size}"
