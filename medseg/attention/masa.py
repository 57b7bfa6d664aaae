"""Manhattan self-attention (MaSA) from RMT (Fan et al., CVPR 2024): full and decomposed forms."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from medseg.attention import functional
from medseg.attention.common import (
    AttentionRow,
    SpatialAttention,
    TokenDepthwiseConv,
    merge_heads,
    split_heads,
)
from medseg.attention.position import axis_scales, check_rope, rotated_heads
from medseg.attention.registry import register_attention


def head_gammas(gamma: float, heads_range: float, num_heads: int) -> float | tuple[float, ...]:
    """Per-head decays ``gamma_h = 1 - (1 - gamma) * 2 ** (-heads_range * h / num_heads)``.

    ``heads_range = 0`` returns the single float ``gamma`` (one decay shared by all heads);
    ``gamma = 0.75, heads_range = 4`` reproduces official RMT's multi-scale decays.
    """
    functional.check_gamma([gamma])
    if heads_range == 0:
        return gamma
    return tuple(1.0 - (1.0 - gamma) * 2.0 ** (-heads_range * h / num_heads) for h in range(num_heads))


@register_attention("masa")
class MaSA(SpatialAttention):
    """Full Manhattan self-attention with the local context enhancement (LCE) of RMT.

    ``out = proj(MaSA(q, k, v) + DWConv_k(v))``; see :func:`medseg.attention.functional.masa`.
    Maps ``(B, C, *spatial) -> (B, C, *spatial)``.

    Args:
        dim: channel width ``C``.
        spatial_dims: 2 or 3.
        num_heads: attention heads; must divide ``dim``.
        gamma: decay base in [0, 1].
        heads_range: 0 for one decay; > 0 for RMT's per-head decays (:func:`head_gammas`).
        spacing: voxel spacing per spatial axis at this feature level; distances become physical
            (in units of the smallest spacing). None: distances in voxels.
        kernel_size: LCE depthwise-conv kernel.
        rope: ``none``, or ``axial`` to rotate q and k by :func:`medseg.attention.position.axial_rope` (the
            axial, 3D-capable counterpart of RMT's ``theta_shift``).
    """

    attention = staticmethod(functional.masa)
    """The functional op (``q, k, v, spatial_shape, gamma, spacing=...``); subclasses swap it."""

    def __init__(
        self,
        dim: int,
        spatial_dims: int,
        num_heads: int = 4,
        gamma: float = 0.9,
        heads_range: float = 0.0,
        spacing: Sequence[float] | None = None,
        kernel_size: int = 5,
        rope: str = "none",
    ) -> None:
        super().__init__(dim, spatial_dims, num_heads)
        self.gamma = head_gammas(float(gamma), float(heads_range), num_heads)
        self.spacing = None if spacing is None else axis_scales(spatial_dims, spacing)
        self.rope = check_rope(rope, self.head_dim, spatial_dims)
        self.lce = TokenDepthwiseConv(dim, spatial_dims, kernel_size)

    @property
    def bias_heads(self) -> int:
        """The decay bias's planes: one shared decay, one per head, or none when every ``gamma`` is 1."""
        log_gamma = functional.log_gammas(self.gamma, self.num_heads)
        return len(log_gamma) if any(log_gamma) else 0

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        q, k = rotated_heads(q, k, self.num_heads, self.rope, spatial_shape)
        out = self.attention(q, k, split_heads(v, self.num_heads), spatial_shape, self.gamma, spacing=self.spacing)
        return merge_heads(out) + self.lce(v, spatial_shape)

    def decay_row(self, spatial_shape: tuple[int, ...], index: int, device: torch.device) -> torch.Tensor:
        """The decay map ``gamma_h ** dist(index, .)`` with this block's distance: ``(heads, N)``."""
        log_decay = functional.log_decay_row(spatial_shape, self.gamma, self.num_heads, index, spacing=self.spacing,
                                             device=device)
        return log_decay.exp().expand(self.num_heads, -1)

    def attention_row(
        self, q: torch.Tensor, k: torch.Tensor, spatial_shape: tuple[int, ...], index: int
    ) -> AttentionRow:
        """:func:`~medseg.attention.functional.masa_row`, its decay and its content part (LCE not included)."""
        q, k = rotated_heads(q, k, self.num_heads, self.rope, spatial_shape)
        weights = functional.masa_row(q, k, spatial_shape, self.gamma, index, spacing=self.spacing)
        decay = self.decay_row(spatial_shape, index, q.device).expand_as(weights)
        return AttentionRow(weights, decay=decay, content=functional.softmax_row(q, k, index))

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, gamma={self.gamma}, spacing={self.spacing}, "
                f"rope={self.rope!r}")


@register_attention("masa_decomposed")
class MaSADecomposed(MaSA):
    """Decomposed MaSA: axial attention along W, then H (then D) with 1-D decays, plus LCE.

    Same arguments as :class:`MaSA`; see :func:`medseg.attention.functional.masa_decomposed`. Its biases are
    per line (``L x L``), so it holds no ``N x N`` bias.
    """

    attention = staticmethod(functional.masa_decomposed)
    bias_heads = 0

    def attention_row(
        self, q: torch.Tensor, k: torch.Tensor, spatial_shape: tuple[int, ...], index: int
    ) -> AttentionRow:
        """:func:`~medseg.attention.functional.masa_decomposed_row` (the axial chain's effective row) and the
        decay map (LCE not included)."""
        q, k = rotated_heads(q, k, self.num_heads, self.rope, spatial_shape)
        weights = functional.masa_decomposed_row(q, k, spatial_shape, self.gamma, index, spacing=self.spacing)
        return AttentionRow(weights, decay=self.decay_row(spatial_shape, index, q.device).expand_as(weights))
