"""Cross-shaped window (CSWin) attention (Dong et al., CVPR 2022), generalised to 3D."""

from __future__ import annotations

import warnings
from functools import cache

import torch
from torch import nn

from medseg.attention import functional
from medseg.attention.common import (
    AttentionRow,
    DepthwiseConv,
    SpatialAttention,
    TokenDepthwiseConv,
    even_split,
    merge_heads,
    split_heads,
    to_spatial,
    to_tokens,
)
from medseg.attention.registry import register_attention
from medseg.errors import ParameterError, check_parameter

LEPE_KERNEL = 3
"""CSWin's locally-enhanced positional encoding is a 3x3(x3) depthwise conv on v."""

LEPE_MODES = ("map", "stripe")
"""The values of ``model.attention.lepe``: one conv over the whole map, or official CSWin's conv inside each
stripe (zero-padded at the stripe borders), one conv per head group."""


@cache
def _warn_uneven_split(num_heads: int, split: tuple[int, ...]) -> None:
    """Warn once per process and split that the head groups differ in size."""
    warnings.warn(
        f"cswin: num_heads={num_heads} does not divide evenly over the {len(split)} spatial axes; "
        f"heads per stripe axis: {list(split)}. Use a multiple of {len(split)} heads for equal groups.",
        UserWarning,
        stacklevel=3,
    )


def heads_per_axis(num_heads: int, spatial_dims: int) -> list[int]:
    """Distribute heads over one stripe group per spatial axis as evenly as possible (earlier axes first).

    An uneven split (4 heads in 3D: 2/1/1) works, with a one-time warning that names it.
    """
    if num_heads < spatial_dims:
        raise ParameterError("num_heads", num_heads,
                             f"cswin needs at least {spatial_dims} (one stripe group per spatial axis)")
    split = even_split(num_heads, spatial_dims)
    if num_heads % spatial_dims:
        _warn_uneven_split(num_heads, tuple(split))
    return split


@register_attention("cswin")
class CSWinAttention(SpatialAttention):
    """Stripe attention in parallel head groups, one group per spatial axis, plus LePE.

    The heads of group ``a`` attend inside stripes that run the full length of axis ``a`` and are
    ``split_size`` tokens wide on the other axes (:func:`medseg.attention.functional.stripe_attention`);
    in 2D these are CSWin's horizontal and vertical stripes, in 3D they are rods (a token reaches every
    other token after 3 blocks, not 2). Maps ``(B, C, *sp) -> (B, C, *sp)``.

    LePE, a 3x3(x3) depthwise conv of v added to the output, runs over the whole map (``lepe="map"``) or, as
    in official CSWin, inside each stripe of each head group with that group's own conv (``lepe="stripe"``,
    :func:`medseg.attention.functional.within_stripes`).

    Args:
        dim: channel width ``C``.
        spatial_dims: 2 or 3.
        num_heads: attention heads; must divide ``dim`` and be at least ``spatial_dims``.
        split_size: stripe width in tokens.
        lepe: ``map`` | ``stripe``.
    """

    def __init__(
        self, dim: int, spatial_dims: int, num_heads: int = 4, split_size: int = 2, lepe: str = "map"
    ) -> None:
        super().__init__(dim, spatial_dims, num_heads)
        if split_size < 1:
            raise ParameterError("split_size", split_size, "expected >= 1")
        check_parameter("lepe", lepe, LEPE_MODES)
        self.split_size = int(split_size)
        self.group_heads = heads_per_axis(num_heads, spatial_dims)
        self.lepe_mode = lepe
        self.lepe: nn.Module = (
            TokenDepthwiseConv(dim, spatial_dims, LEPE_KERNEL)
            if lepe == "map"
            else nn.ModuleList(DepthwiseConv(h * self.head_dim, spatial_dims, LEPE_KERNEL) for h in self.group_heads)
        )

    def _lepe(self, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        """LePE of the values ``(B, N, C) -> (B, N, C)``."""
        if self.lepe_mode == "map":
            return self.lepe(v, spatial_shape)
        groups = v.split([h * self.head_dim for h in self.group_heads], dim=-1)
        return torch.cat(
            [
                to_tokens(
                    functional.within_stripes(conv, to_spatial(vg, spatial_shape), spatial_shape, axis, self.split_size)
                )
                for axis, (conv, vg) in enumerate(zip(self.lepe, groups))
            ],
            dim=-1,
        )

    def _groups(self, *tokens: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """Per stripe axis, its head group of each ``(B, N, C)`` tensor as ``(B, group heads, N, head_dim)``."""
        return list(zip(*(split_heads(t, self.num_heads).split(self.group_heads, dim=1) for t in tokens)))

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        out = torch.cat(
            [
                functional.stripe_attention(qg, kg, vg, spatial_shape, axis, self.split_size)
                for axis, (qg, kg, vg) in enumerate(self._groups(q, k, v))
            ],
            dim=1,
        )
        return merge_heads(out) + self._lepe(v, spatial_shape)

    def attention_row(
        self, q: torch.Tensor, k: torch.Tensor, spatial_shape: tuple[int, ...], index: int
    ) -> AttentionRow:
        """Each head group's :func:`~medseg.attention.functional.stripe_row`: non-zero only on the stripe of that
        group's axis that holds the query (LePE not included)."""
        rows = [
            functional.stripe_row(qg, kg, spatial_shape, axis, self.split_size, index)
            for axis, (qg, kg) in enumerate(self._groups(q, k))
        ]
        return AttentionRow(torch.cat(rows, dim=1))

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, group_heads={self.group_heads}, split_size={self.split_size}, "
                f"lepe={self.lepe_mode!r}")
