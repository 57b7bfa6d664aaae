"""Focused linear attention from FLatten Transformer (Han et al., ICCV 2023)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from medseg.attention import functional
from medseg.attention.common import AttentionRow, SpatialAttention, TokenDepthwiseConv, to_tokens
from medseg.attention.position import resize_grid
from medseg.attention.registry import register_attention
from medseg.errors import ParameterError


@register_attention("focused_linear")
class FocusedLinearAttention(SpatialAttention):
    """Focused linear attention with a learned positional term on k and depthwise-conv rank restoration.

    ``out = proj(FLA(q, k + pos, v; softplus(scale)) + DWConv_k(v))`` where FLA is
    :func:`medseg.attention.functional.focused_linear`. The depthwise conv works per head with weights
    shared across heads (as in FLatten). The positional term ``pos`` is zero-initialised (as in FLatten) and
    stored either on a ``positional_size``-sided grid, interpolated to the actual grid, or, with
    ``positional_size=0``, one value per token of the slot's grid ``grid`` (official FLatten; another grid at
    run time interpolates it). Cost linear in the token count. Maps ``(B, C, *sp) -> (B, C, *sp)``.

    Args:
        dim: channel width ``C``.
        spatial_dims: 2 or 3.
        num_heads: attention heads; must divide ``dim``.
        focusing_factor: the focusing power ``p``.
        kernel_size: rank-restoration depthwise-conv kernel.
        positional_size: side of the grid the positional term is stored on; 0 for the slot's own grid.
        grid: the token grid the slot sees in training (the U-Net passes it); needed when ``positional_size=0``.
    """

    def __init__(
        self,
        dim: int,
        spatial_dims: int,
        num_heads: int = 4,
        focusing_factor: float = 3.0,
        kernel_size: int = 5,
        positional_size: int = 8,
        grid: Sequence[int] | None = None,
    ) -> None:
        super().__init__(dim, spatial_dims, num_heads)
        if positional_size < 0:
            raise ParameterError("positional_size", positional_size, "expected >= 0")
        if positional_size == 0 and grid is None:
            raise ParameterError("positional_size", 0, "stores one positional value per token of the slot's grid, "
                                 "which is known only inside the U-Net (build_model(..., patch_size)); pass grid= or a "
                                 "positive size")
        self.focusing_factor = float(focusing_factor)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        stored = tuple(int(s) for s in grid) if positional_size == 0 else (int(positional_size),) * spatial_dims
        self.positional = nn.Parameter(torch.zeros(1, dim, *stored))
        self.rank_restoration = TokenDepthwiseConv(self.head_dim, spatial_dims, kernel_size)

    def keys(self, k: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        """k tokens ``(B, N, C)`` plus the positional term on the actual grid: what the attention op gets."""
        return k + to_tokens(resize_grid(self.positional, spatial_shape))

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        k = self.keys(k, spatial_shape)
        out = functional.focused_linear(q, k, v, self.num_heads, self.focusing_factor, scale=F.softplus(self.scale))
        per_head = rearrange(v, "b n (h d) -> (b h) n d", h=self.num_heads)
        restored = rearrange(self.rank_restoration(per_head, spatial_shape), "(b h) n d -> b n (h d)", h=self.num_heads)
        return out + restored

    def attention_row(
        self, q: torch.Tensor, k: torch.Tensor, spatial_shape: tuple[int, ...], index: int
    ) -> AttentionRow:
        """:func:`~medseg.attention.functional.focused_linear_row` (with its ``gain``), and in
        ``extras["dwc_footprint"]`` (``(B, 1, N)``, one map for all heads, which share the conv) the
        rank-restoration conv's footprint around the query (:func:`~medseg.attention.functional.conv_footprint`)."""
        weights, gain = functional.focused_linear_row(q, self.keys(k, spatial_shape), self.num_heads,
                                                      self.focusing_factor, index, scale=F.softplus(self.scale))
        footprint = functional.conv_footprint(self.rank_restoration.conv.weight, spatial_shape, index)
        return AttentionRow(weights, extras={"dwc_footprint": footprint.expand(len(weights), 1, -1)}, gain=gain)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, focusing_factor={self.focusing_factor}, "
                f"positional={tuple(self.positional.shape[2:])}")
