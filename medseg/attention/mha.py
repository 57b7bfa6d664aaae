"""Standard multi-head self-attention (Vaswani et al., 2017) on fused SDPA, with 2D/3D position encodings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from medseg.attention import functional
from medseg.attention.common import AttentionRow, SpatialAttention, merge_heads, split_heads
from medseg.attention.position import (
    check_rope,
    relative_bias,
    relative_bias_row,
    rotated_heads,
    sincos_embedding,
)
from medseg.attention.registry import register_attention
from medseg.errors import check_parameter

POSITION_ENCODINGS = ("sincos", "relative", "none")
"""The values of ``model.attention.pe``."""

DEFAULT_RELATIVE_SIZE = 16
"""``max_relative_size = 0``: the table holds exact per-offset entries for grids up to this many tokens per
axis (cropped to the actual grid); larger grids interpolate it."""


@register_attention("mha")
class MultiHeadAttention(SpatialAttention):
    """Global multi-head attention with a selectable position encoding.

    * ``sincos``: fixed 2D/3D sin/cos absolute embedding of the actual grid, added to the tokens before
      the q/k/v projection (any width: leftover channels get zeros).
    * ``relative``: a learned scalar bias per head and offset ``(dd, dh, dw)``, added to the logits: Swin's
      relative position bias (Liu et al., 2021), not Shaw et al.'s per-offset key/value embeddings. The
      table is cropped / interpolated to the actual grid.
    * ``none``: no position information (permutation-equivariant).

    Independently, ``rope=axial`` rotates q and k (:func:`medseg.attention.position.axial_rope`), a relative
    encoding without parameters. Maps ``(B, C, *spatial) -> (B, C, *spatial)``.

    Args:
        dim: channel width ``C``.
        spatial_dims: 2 or 3.
        num_heads: attention heads; must divide ``dim``.
        pe: ``sincos`` | ``relative`` | ``none``.
        max_relative_size: tokens per axis the relative table covers; 0 uses ``DEFAULT_RELATIVE_SIZE`` (16).
        rope: ``none`` | ``axial``.
    """

    def __init__(
        self,
        dim: int,
        spatial_dims: int,
        num_heads: int = 4,
        pe: str = "sincos",
        max_relative_size: int = 0,
        rope: str = "none",
    ) -> None:
        super().__init__(dim, spatial_dims, num_heads)
        check_parameter("pe", pe, POSITION_ENCODINGS)
        self.pe = pe
        self.rope = check_rope(rope, self.head_dim, spatial_dims)
        if pe == "relative":
            extent = 2 * (int(max_relative_size) or DEFAULT_RELATIVE_SIZE) - 1
            self.relative_table = nn.Parameter(torch.zeros(num_heads, *(extent,) * spatial_dims))
            nn.init.trunc_normal_(self.relative_table, std=0.02)

    @property
    def bias_heads(self) -> int:
        """A learned relative bias: one plane per head, and its gradient as many again."""
        return 2 * self.num_heads if self.pe == "relative" else 0

    def attend(self, x: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        if self.pe == "sincos":
            x = x + sincos_embedding(spatial_shape, self.dim, x.device, x.dtype)
        return super().attend(x, spatial_shape)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        q, k = rotated_heads(q, k, self.num_heads, self.rope, spatial_shape)
        bias = relative_bias(self.relative_table, spatial_shape).to(q.dtype) if self.pe == "relative" else None
        return merge_heads(F.scaled_dot_product_attention(q, k, split_heads(v, self.num_heads), attn_mask=bias))

    def attention_row(
        self, q: torch.Tensor, k: torch.Tensor, spatial_shape: tuple[int, ...], index: int
    ) -> AttentionRow:
        """:func:`~medseg.attention.functional.softmax_row`, with the relative position bias's row when
        ``pe=relative``."""
        q, k = rotated_heads(q, k, self.num_heads, self.rope, spatial_shape)
        bias = relative_bias_row(self.relative_table, spatial_shape, index) if self.pe == "relative" else None
        return AttentionRow(functional.softmax_row(q, k, index, bias))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, pe={self.pe!r}, rope={self.rope!r}"
