"""Position helpers shared by the blocks: token distances, sin/cos embeddings, relative-bias tables, rotary
encoding.

Every grid is row-major (C-order) over ``(D, H, W)`` or ``(H, W)``, matching
:func:`medseg.attention.common.to_tokens`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from monai.networks.blocks.pos_embed_utils import build_sincos_position_embedding

from medseg.attention.common import even_split, split_heads, tensor_cache
from medseg.errors import ParameterError, check_parameter

_INTERPOLATION = {1: "linear", 2: "bilinear", 3: "trilinear"}

ROTARY_ENCODINGS = ("none", "axial")
"""The values of ``model.attention.rope``."""

ROPE_BASE = 10000.0
"""Rotary frequencies per axis are ``ROPE_BASE ** -linspace(0, 1, pairs)``, as in RMT's ``theta_shift``."""


def axis_scales(ndim: int, spacing: Sequence[float] | None) -> tuple[float, ...]:
    """Per-axis distance units: ``spacing / min(spacing)``, or all ones when ``spacing`` is None.

    With them one step along the finest axis counts 1 and a step along a coarser axis counts its
    physical length in units of the finest spacing.
    """
    if spacing is None:
        return (1.0,) * ndim
    values = tuple(float(s) for s in spacing)
    if len(values) != ndim:
        raise ValueError(f"spacing {values} needs one entry per spatial axis ({ndim})")
    if min(values) <= 0:
        raise ValueError(f"spacing must be positive, got {values}")
    smallest = min(values)
    return tuple(s / smallest for s in values)


def manhattan_distance(
    spatial_shape: Sequence[int],
    scales: Sequence[float],
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Scaled Manhattan distance between all token pairs: ``(N, N)``, ``sum_a |i_a - j_a| * scales[a]``.

    Built by broadcasting one ``(size_a, size_a)`` table per axis, so the only ``N x N`` allocation is the
    result itself.
    """
    ndim = len(spatial_shape)
    dist = torch.zeros((), device=device, dtype=dtype)
    for axis, (size, scale) in enumerate(zip(spatial_shape, scales)):
        index = torch.arange(size, device=device, dtype=dtype)
        view = [1] * (2 * ndim)
        view[axis] = view[ndim + axis] = size
        dist = dist + ((index[:, None] - index[None, :]).abs() * scale).view(view)
    n = math.prod(spatial_shape)
    return dist.reshape(n, n)


def grid_coordinates(spatial_shape: Sequence[int]) -> torch.Tensor:
    """Integer coordinates of every token: ``(N, ndim)``, row-major."""
    axes = [torch.arange(s) for s in spatial_shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(spatial_shape))


def manhattan_row(
    spatial_shape: Sequence[int],
    scales: Sequence[float],
    index: int,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Row ``index`` of :func:`manhattan_distance`: ``(N,)``, the scaled distance from token ``index`` to every
    token, without the ``N x N`` table."""
    coords = grid_coordinates(spatial_shape).to(device=device, dtype=dtype)
    scale = torch.tensor(scales, device=device, dtype=dtype)
    return ((coords - coords[index]).abs() * scale).sum(-1)


@tensor_cache()
def _sincos_table(spatial_shape: tuple[int, ...], dim: int) -> torch.Tensor:
    ndim = len(spatial_shape)
    usable = dim - dim % (2 * ndim)  # MONAI needs dim % 4 == 0 (2D) / dim % 6 == 0 (3D)
    table = torch.zeros(1, math.prod(spatial_shape), dim)
    if usable:
        with warnings.catch_warnings():  # MONAI calls torch.meshgrid without `indexing` (defaults to "ij")
            warnings.simplefilter("ignore", UserWarning)
            table[..., :usable] = build_sincos_position_embedding(list(spatial_shape), usable, ndim).detach()
    return table


def sincos_embedding(spatial_shape: Sequence[int], dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Fixed 2D/3D sin/cos absolute position embedding for the actual grid: ``(1, N, dim)``.

    Any ``dim`` works: MONAI's embedding fills the largest multiple of ``2 * ndim`` channels and the
    leftover channels are zero.
    """
    return _sincos_table(tuple(spatial_shape), dim).to(device=device, dtype=dtype)


@tensor_cache()
def relative_position_index(spatial_shape: tuple[int, ...], device: torch.device | None = None) -> torch.Tensor:
    """Index of offset ``(n - m)`` in a flattened ``(2*S_a - 1, ...)`` table, for all pairs: ``(N, N)``."""
    coords = grid_coordinates(spatial_shape)
    return _offset_index(coords[:, None, :] - coords[None, :, :], spatial_shape).to(device)


def _offset_index(offsets: torch.Tensor, spatial_shape: Sequence[int]) -> torch.Tensor:
    """Flat index of offsets ``(..., ndim)`` (``-(S_a - 1) .. S_a - 1`` per axis) in a ``(2*S_a - 1, ...)`` table."""
    sizes = torch.tensor(spatial_shape)
    extents = 2 * sizes - 1
    strides = torch.ones_like(extents)
    for axis in range(len(spatial_shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * extents[axis + 1]
    return ((offsets + (sizes - 1)) * strides).sum(-1)


def resize_grid(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Interpolate a channels-first grid ``(B, C, *grid)`` to ``(B, C, *size)`` (identity when equal)."""
    size = tuple(size)
    if tuple(x.shape[2:]) == size:
        return x
    return F.interpolate(x, size=size, mode=_INTERPOLATION[len(size)], align_corners=False)


def relative_bias(table: torch.Tensor, spatial_shape: Sequence[int]) -> torch.Tensor:
    """Gather a learned relative-position bias for the actual grid.

    Args:
        table: ``(heads, *extent)``, one entry per offset; entry ``extent_a // 2`` is offset 0 on axis ``a``.
        spatial_shape: the token grid ``S``; it needs offsets ``-(S_a - 1) .. S_a - 1``.

    Returns:
        ``(1, heads, N, N)``, 4-D so that SDPA broadcasts it over the batch without a copy. Axes where the
        table is larger than ``2 * S_a - 1`` are cropped around offset 0 (exact per-offset parameters); if the
        grid still needs a larger table it is interpolated.
    """
    index = relative_position_index(tuple(spatial_shape), table.device)
    return _fit_relative_table(table, spatial_shape).flatten(1)[:, index].unsqueeze(0)


def relative_bias_row(table: torch.Tensor, spatial_shape: Sequence[int], index: int) -> torch.Tensor:
    """Row ``index`` of :func:`relative_bias` (query token ``index``, every key): ``(heads, N)``, without the
    ``N x N`` index."""
    coords = grid_coordinates(spatial_shape)
    flat = _offset_index(coords[index] - coords, spatial_shape).to(table.device)
    return _fit_relative_table(table, spatial_shape).flatten(1)[:, flat]


def _fit_relative_table(table: torch.Tensor, spatial_shape: Sequence[int]) -> torch.Tensor:
    """``(heads, *extent) -> (heads, *(2 * S_a - 1))``: cropped around offset 0 where larger, then interpolated."""
    target = tuple(2 * s - 1 for s in spatial_shape)
    crop = tuple(
        slice((e - t) // 2, (e - t) // 2 + t) if e > t else slice(None) for e, t in zip(table.shape[1:], target)
    )
    return resize_grid(table[(slice(None), *crop)].unsqueeze(0), target).squeeze(0)


def check_rope(rope: str, head_dim: int, spatial_dims: int) -> str:
    """``rope`` for a block of ``head_dim`` channels per head; returns it.

    Raises:
        ParameterError: an unknown value, or ``axial`` with fewer than one channel pair per spatial axis.
    """
    check_parameter("rope", rope, ROTARY_ENCODINGS)
    if rope == "axial" and head_dim // 2 < spatial_dims:
        raise ParameterError("rope", "axial", f"rotates one channel pair per spatial axis at least: it needs a "
                             f"head dimension >= {2 * spatial_dims}, got {head_dim} (fewer num_heads)")
    return rope


def rotated_heads(
    q: torch.Tensor, k: torch.Tensor, num_heads: int, rope: str, spatial_shape: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k tokens ``(B, N, C)`` -> ``(B, heads, N, head_dim)`` as the attention op gets them: split into heads and,
    with ``rope=axial``, rotated (:func:`axial_rope`)."""
    q, k = (split_heads(t, num_heads) for t in (q, k))
    if rope == "axial":
        q, k = axial_rope(q, spatial_shape), axial_rope(k, spatial_shape)
    return q, k


@tensor_cache()
def _rope_tables(
    spatial_shape: tuple[int, ...], head_dim: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of every token's rotation angles: ``(N, 2 * (head_dim // 2))`` each, each angle
    written twice (once per channel of its pair)."""
    coords = grid_coordinates(spatial_shape).to(device=device, dtype=dtype)
    angles = [
        coords[:, axis, None] * ROPE_BASE ** -torch.linspace(0, 1, pairs, device=device, dtype=dtype)
        for axis, pairs in enumerate(even_split(head_dim // 2, len(spatial_shape)))
    ]
    angle = torch.cat(angles, dim=-1).repeat_interleave(2, dim=-1)
    return angle.cos(), angle.sin()


def axial_rope(x: torch.Tensor, spatial_shape: Sequence[int]) -> torch.Tensor:
    """Axial rotary position encoding: ``(..., N, head_dim) -> (..., N, head_dim)``.

    The ``head_dim // 2`` channel pairs ``(2i, 2i + 1)`` are split over the spatial axes as evenly as possible
    (earlier axes first, in order); pair ``i`` of axis ``a``'s share is rotated by the angle
    ``n_a * ROPE_BASE ** -(i / (P_a - 1))`` (``P_a`` pairs, RMT's frequencies), ``n_a`` the token's index along
    ``a``. An odd last channel is left as it is. Rotating q and k makes ``q_n . k_m`` depend on ``m - n``
    only. Computed in at least float32; returns ``x``'s dtype.
    """
    shape = tuple(int(s) for s in spatial_shape)
    work = torch.promote_types(x.dtype, torch.float32)
    cos, sin = _rope_tables(shape, x.shape[-1], x.device, work)
    rotated = cos.shape[-1]
    head = x[..., :rotated].to(work)
    pairs = head.unflatten(-1, (-1, 2))
    turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)  # (x0, x1) -> (-x1, x0)
    out = (head * cos + turned * sin).to(x.dtype)
    return torch.cat((out, x[..., rotated:]), dim=-1) if rotated < x.shape[-1] else out


def clear_caches() -> None:
    """Release the cached sin/cos tables, relative-position indices and rotary tables."""
    for cached in (_sincos_table, relative_position_index, _rope_tables):
        cached.cache_clear()
