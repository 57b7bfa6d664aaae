"""Pieces every attention block shares: token layout, head split, depthwise convs and the block base class.

Layouts used throughout the package:

* spatial: ``(B, C, *spatial)``, the U-Net's layout;
* tokens: ``(B, N, C)``, ``N = prod(spatial)``, row-major (C-order) over ``(D, H, W)`` / ``(H, W)``;
* heads: ``(B, heads, N, head_dim)``, what the functional ops in :mod:`medseg.attention.functional` take.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from medseg.errors import ParameterError

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

GRID_CACHE_SIZE = 4
"""Entries of each per-grid tensor cache (decay biases, relative-position indices, rotary tables): what one U-Net
needs, one grid per attention slot level (the bottleneck and up to three decoder levels)."""

Builder = TypeVar("Builder", bound=Callable[..., Any])


def tensor_cache(maxsize: int = GRID_CACHE_SIZE) -> Callable[[Builder], Builder]:
    """``functools.lru_cache`` for a function that builds constant tensors, which it always builds outside
    inference mode.

    A tensor first built under ``torch.inference_mode()`` (a validation loop, a prediction in a notebook) is an
    inference tensor, and autograd refuses to save one for backward, so a later training step at the same grid
    would fail. ``inference_mode(False)`` makes the cached tensor a normal one whatever mode the first call ran in.
    """

    def decorate(build: Builder) -> Builder:
        return lru_cache(maxsize=maxsize)(torch.inference_mode(False)(build))  # type: ignore[return-value]

    return decorate


FLOAT32_BYTES = 4
"""Bytes per element the bias-memory estimate assumes (float32 training; bf16 autocast halves the real figure)."""


def even_split(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` integers as evenly as possible, the larger ones first: ``(4, 3) -> [2, 1, 1]``."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def dense_bias_bytes(grid: Sequence[int], heads: int, dtype_bytes: int = FLOAT32_BYTES) -> int:
    """Bytes of a dense attention bias of ``heads`` planes ``(N, N)``, ``N = prod(grid)``."""
    return heads * math.prod(grid) ** 2 * dtype_bytes


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


def _depthwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Depthwise 'same' convolution of ``(B, C, *sp)`` with ``weight`` ``(C, 1, k, ...)``, odd ``k``."""
    return _CONV[x.ndim - 2](x, weight, bias, padding=weight.shape[-1] // 2, groups=x.shape[1])


class _DepthwiseConvFunction(torch.autograd.Function):
    """:func:`_depthwise` whose backward pass is two more forward convolutions.

    ``grad_x = conv(grad, flipped weight)``; ``grad_w[c] = sum_b xcorr(pad(x)[b, c], grad[b, c])``, run as one
    grouped convolution with the gradient as the kernel: on the CPU, faster than PyTorch's native depthwise
    backward, whose cost grows far faster than the voxel count when the cores are shared.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return _depthwise(x, weight, bias)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        spatial = tuple(range(2, x.ndim))
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _depthwise(grad, weight.flip(spatial), None).to(x.dtype)
        if ctx.needs_input_grad[1]:
            batch, channels, pad = x.shape[0], x.shape[1], weight.shape[-1] // 2
            padded = F.pad(x, (pad,) * (2 * len(spatial))).reshape(
                1, batch * channels, *(s + 2 * pad for s in x.shape[2:])
            )
            kernels = grad.reshape(batch * channels, 1, *grad.shape[2:])
            grad_w = _CONV[len(spatial)](padded, kernels, groups=batch * channels)
            grad_w = grad_w.reshape(batch, channels, *weight.shape[2:]).sum(0).unsqueeze(1).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_b = grad.sum((0, *spatial)).to(weight.dtype)
        return grad_x, grad_w, grad_b


class DepthwiseConv(nn.Module):
    """Depthwise convolution with 'same' padding and bias: ``(B, C, *sp) -> (B, C, *sp)``.

    Initialised like ``nn.ConvNd``. On CPU it runs :class:`_DepthwiseConvFunction` (fast backward); on other
    devices the native kernels.

    Args:
        channels: ``C``.
        spatial_dims: 1, 2 or 3.
        kernel_size: odd kernel side.
    """

    def __init__(self, channels: int, spatial_dims: int, kernel_size: int) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ParameterError("kernel_size", kernel_size, "expected an odd size, which keeps the spatial size")
        self.weight = nn.Parameter(torch.empty(channels, 1, *(kernel_size,) * spatial_dims))
        self.bias = nn.Parameter(torch.empty(channels))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(kernel_size**spatial_dims)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            return _DepthwiseConvFunction.apply(x, self.weight, self.bias)
        return _depthwise(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"channels={self.weight.shape[0]}, kernel_size={tuple(self.weight.shape[2:])}"


class TokenDepthwiseConv(nn.Module):
    """A depthwise convolution applied to tokens: ``(B, N, C)`` on a ``spatial_shape`` grid -> ``(B, N, C)``.

    Serves as MaSA's LCE, CSWin's LePE and focused linear attention's rank restoration (all three are a
    depthwise conv of the values added to the attention output).
    """

    def __init__(self, channels: int, spatial_dims: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = DepthwiseConv(channels, spatial_dims, kernel_size)

    def forward(self, tokens: torch.Tensor, spatial_shape: Sequence[int]) -> torch.Tensor:
        return to_tokens(self.conv(to_spatial(tokens, spatial_shape)))


@dataclass
class AttentionRow:
    """One query token's attention over the grid, what :meth:`SpatialAttention.attention_row` returns.

    Every tensor is ``(B, heads, N)`` (``(B, 1, N)`` where one map serves all heads), at least float32.
    """

    weights: torch.Tensor
    """The row of the matrix the block applies to the values (before any conv term), each head summing to 1."""
    decay: torch.Tensor | None = None
    """MaSA: the spatial decay ``gamma_h ** dist(query, .)``."""
    content: torch.Tensor | None = None
    """MaSA: the content part ``softmax(q_i k^T / sqrt(d))`` alone (``weights`` is proportional to
    ``content * decay``)."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """Block-specific maps, e.g. a conv term's footprint around the query."""
    gain: torch.Tensor | None = None
    """``(B, heads)`` where the block scales the attended values (its output for the query is
    ``gain * (weights @ v)``; focused linear attention's normaliser epsilon); None where it is 1."""


def check_spatial_dims(spatial_dims: int) -> None:
    """``spatial_dims`` is 2 or 3: the one check of it, for the blocks and the training config (``model.spatial_dims``)
    alike."""
    if spatial_dims not in (2, 3):
        raise ParameterError("spatial_dims", spatial_dims, "expected 2 or 3")


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

    mixes_tokens: ClassVar[bool] = True
    """False for a block whose token mixer is the identity (the ``identity`` ablation): it has no ``qkv`` and
    ``proj``, and no attention map to show."""

    def __init__(self, dim: int, spatial_dims: int, num_heads: int) -> None:
        super().__init__()
        check_spatial_dims(spatial_dims)
        if num_heads < 1 or dim % num_heads != 0:
            raise ParameterError("num_heads", num_heads, f"expected a positive divisor of the channel width {dim}")
        self.dim = dim
        self.spatial_dims = spatial_dims
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        if self.mixes_tokens:
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

    @property
    def bias_heads(self) -> int:
        """``(N, N)`` planes of dense attention bias a training step of this block holds (0: none).

        :func:`dense_bias_bytes` turns them into bytes; the U-Net checks them against
        ``model.attention.max_bias_gb`` when it builds a slot.
        """
        return 0

    @abstractmethod
    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        """Attend: q, k, v ``(B, N, C)`` on a ``spatial_shape`` grid -> ``(B, N, C)`` (before ``proj``)."""

    def attention_row(
        self, q: torch.Tensor, k: torch.Tensor, spatial_shape: tuple[int, ...], index: int
    ) -> AttentionRow:
        """Row ``index`` (a query token) of the attention :meth:`mix` applies to the values, in ``O(N)`` memory.

        ``q, k`` are :meth:`mix`'s inputs ``(B, N, C)``. Optional: a block without it runs and trains as usual,
        only :mod:`medseg.models.inspect` cannot show its attention.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement attention_row")

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
