"""The transformer block that wraps every attention slot (RMT's ``RetBlock`` layout)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from monai.networks.layers import DropPath
from torch import nn
from torch.utils.checkpoint import checkpoint

from medseg.attention.common import DepthwiseConv, SpatialAttention, TokenDepthwiseConv, to_spatial, to_tokens
from medseg.errors import check_parameter

CPE_KERNEL = 3
"""Kernel of the conditional position encoding ``x + DWConv(x)`` in front of the attention."""

FFN_KINDS = ("mlp", "dwconv")
"""The values of ``model.attention.ffn``: a plain MLP, or RMT's with a depthwise conv inside the hidden layer."""

FFN_CONV_KERNEL = 3
"""Kernel of the depthwise conv in RMT's FFN (``ffn=dwconv``)."""


class FeedForward(nn.Sequential):
    """The block's FFN on tokens: ``(B, N, C)`` on a ``spatial_shape`` grid -> ``(B, N, C)``.

    ``mlp``: ``Linear(C, hidden) -> GELU -> Linear(hidden, C)``. ``dwconv`` (RMT's ``FeedForwardNetwork``):
    ``h = GELU(Linear(x))``, then ``h + DWConv3(h)`` on the token grid, then ``Linear(hidden, C)``. The linear
    layers are ``self[0]`` and ``self[2]`` in both kinds (the same state-dict keys).

    Args:
        dim: channel width ``C``.
        hidden: hidden width.
        spatial_dims: 2 or 3 (the grid of the conv).
        kind: ``mlp`` | ``dwconv``.
    """

    def __init__(self, dim: int, hidden: int, spatial_dims: int, kind: str = "mlp") -> None:
        check_parameter("ffn", kind, FFN_KINDS)
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.conv = TokenDepthwiseConv(hidden, spatial_dims, FFN_CONV_KERNEL) if kind == "dwconv" else None

    def forward(self, x: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        hidden = self[1](self[0](x))
        if self.conv is not None:
            hidden = hidden + self.conv(hidden, spatial_shape)
        return self[2](hidden)


class LayerScale(nn.Module):
    """Per-channel learnable scale (CaiT): ``(..., C) -> (..., C)``."""

    def __init__(self, dim: int, init_value: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), float(init_value)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class TransformerBlock(nn.Module):
    """``x + DWConv3(x)`` -> ``x + DropPath(LS(Attn(LN(x))))`` -> ``x + DropPath(LS(FFN(LN(x))))``.

    Maps ``(B, C, *spatial) -> (B, C, *spatial)``; the attention and FFN run on ``(B, N, C)`` tokens.

    Args:
        attention: the attention module (its ``dim`` and ``spatial_dims`` set the block's).
        mlp_ratio: FFN hidden width as a multiple of ``C``.
        drop_path: stochastic-depth rate of both residual branches.
        layer_scale: initial per-channel layer scale; None disables it.
        checkpointing: recompute attention and FFN in the backward pass (saves activation memory) while
            training.
        ffn: ``mlp`` | ``dwconv`` (:class:`FeedForward`).
    """

    def __init__(
        self,
        attention: SpatialAttention,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.0,
        layer_scale: float | None = None,
        checkpointing: bool = False,
        ffn: str = "mlp",
    ) -> None:
        super().__init__()
        dim = attention.dim
        hidden = int(round(dim * float(mlp_ratio)))
        self.cpe = DepthwiseConv(dim, attention.spatial_dims, CPE_KERNEL)
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = attention
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, hidden, attention.spatial_dims, ffn)
        self.drop_path = DropPath(float(drop_path)) if drop_path else nn.Identity()
        self.attention_scale = LayerScale(dim, layer_scale) if layer_scale is not None else nn.Identity()
        self.ffn_scale = LayerScale(dim, layer_scale) if layer_scale is not None else nn.Identity()
        self.checkpointing = checkpointing

    def _run(self, fn: Callable[..., torch.Tensor], *args: object) -> torch.Tensor:
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def _attend(self, x: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        return self.attention.attend(self.attention_norm(x), spatial_shape)

    def _feed_forward(self, x: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        return self.ffn(self.ffn_norm(x), spatial_shape)

    @torch.no_grad()
    def start_as_identity(self) -> None:
        """Zero the last layer of each residual branch, so that the block maps ``x`` to ``x`` until it trains: the
        position conv, the attention's output projection (for a mixer without one, the pre-norm's affine, its only
        weights) and the FFN's output linear. Their gradients are not zero, so the block still learns from its first
        step."""
        last_layers = [self.cpe, self.ffn[2],
                       self.attention.proj if self.attention.mixes_tokens else self.attention_norm]
        for layer in last_layers:
            layer.weight.zero_()
            layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, *spatial) -> (B, C, *spatial)``."""
        spatial_shape = tuple(x.shape[2:])
        x = to_tokens(x + self.cpe(x))
        x = x + self.drop_path(self.attention_scale(self._run(self._attend, x, spatial_shape)))
        x = x + self.drop_path(self.ffn_scale(self._run(self._feed_forward, x, spatial_shape)))
        return to_spatial(x, spatial_shape)
