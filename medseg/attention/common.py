"""Pieces every attention block shares: token layout, head split, depthwise convs and the block base class.

Layouts used throughout the package:

* spatial: ``(B, C, *spatial)``, the U-Net's layout;
* tokens: ``(B, N, C)``, ``N = prod(spatial)``, row-major (C-order) over ``(D, H, W)`` / ``(H, W)``;
* heads: ``(B, heads, N, head_dim)``, what the functional ops in :mod:`medseg.attention.functional` take.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from einops import rearrange
from monai.networks.layers import Conv
from torch import nn


def to_tokens(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, *spatial)`` -> ``(B, N, C)``, tokens in row-major order."""
    return rearrange(x, "b c ... -> b (...) c")


def to_spatial(tokens: torch.Tensor, spatial_shape: Sequence[int]) -> torch.Tensor:
    """``(B, N, C)`` -> ``(B, C, *spatial_shape)``; the inverse of :func:`to_tokens`."""
    return rearrange(tokens, "b n c -> b c n").unflatten(2, tuple(spatial_shape))


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(B, N, heads * head_dim)`` -> ``(B, heads, N, head_dim)``."""
    return rearrange(x, "b n (h d) -> b h n d", h=num_heads)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, heads, N, head_dim)`` -> ``(B, N, heads * head_dim)``; the inverse of :func:`split_heads`."""
    return rearrange(x, "b h n d -> b n (h d)")


def depthwise_conv(channels: int, spatial_dims: int, kernel_size: int) -> nn.Module:
    """A ``spatial_dims``-D depthwise convolution with 'same' padding: ``(B, C, *sp) -> (B, C, *sp)``."""
    if kernel_size % 2 != 1:
        raise ValueError(f"depthwise kernel_size must be odd to keep the spatial size, got {kernel_size}")
    conv = Conv[Conv.CONV, spatial_dims]
    return conv(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)


class TokenDepthwiseConv(nn.Module):
    """A depthwise convolution applied to tokens: ``(B, N, C)`` on a ``spatial_shape`` grid -> ``(B, N, C)``.

    Serves as MaSA's LCE, CSWin's LePE and focused linear attention's rank restoration (all three are a
    depthwise conv of the values added to the attention output).
    """

    def __init__(self, channels: int, spatial_dims: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = depthwise_conv(channels, spatial_dims, kernel_size)

    def forward(self, tokens: torch.Tensor, spatial_shape: Sequence[int]) -> torch.Tensor:
        return to_tokens(self.conv(to_spatial(tokens, spatial_shape)))


class SpatialAttention(nn.Module, ABC):
    """Base class of every registered attention block: ``(B, C, *spatial) -> (B, C, *spatial)``.

    Owns the fused ``qkv`` projection and the output projection. A subclass implements :meth:`mix`, which
    turns q, k, v tokens ``(B, N, C)`` into attended tokens ``(B, N, C)``. :meth:`attend` is the token-level
    entry point the :class:`~medseg.attention.block.TransformerBlock` uses; :meth:`forward` wraps it for
    channels-first feature maps of any spatial size.

    Args:
        dim: channel width ``C``.
        spatial_dims: 2 or 3.
        num_heads: attention heads; must divide ``dim``.
    """

    def __init__(self, dim: int, spatial_dims: int, num_heads: int) -> None:
        super().__init__()
        if spatial_dims not in (2, 3):
            raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims}")
        if num_heads < 1 or dim % num_heads != 0:
            raise ValueError(f"num_heads={num_heads} must be a positive divisor of the channel width dim={dim}")
        self.dim = dim
        self.spatial_dims = spatial_dims
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    @abstractmethod
    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        """Attend: q, k, v ``(B, N, C)`` on a ``spatial_shape`` grid -> ``(B, N, C)`` (before ``proj``)."""

    def attend(self, x: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        """Token-level attention: ``(B, N, C)`` -> ``(B, N, C)``, tokens row-major over ``spatial_shape``."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(self.mix(q, k, v, spatial_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, *spatial)`` -> ``(B, C, *spatial)``."""
        if x.ndim != self.spatial_dims + 2 or x.shape[1] != self.dim:
            raise ValueError(
                f"{type(self).__name__} expects (B, {self.dim}, <{self.spatial_dims} spatial axes>), "
                f"got {tuple(x.shape)}"
            )
        spatial_shape = tuple(x.shape[2:])
        return to_spatial(self.attend(to_tokens(x), spatial_shape), spatial_shape)
