"""What the U-Net's attention slots attend to, for one voxel: exact attention rows without an ``N x N`` matrix.

The fused kernels (SDPA, FlexAttention) never hold the attention weights. :func:`attention_maps` runs one
ordinary forward pass in which :func:`capture_mix` hooks every attention block's
:meth:`~medseg.attention.common.SpatialAttention.mix`; the hook asks the block for the query token's row
(:meth:`~medseg.attention.common.SpatialAttention.attention_row`), ``O(N)`` memory per head, and the forward
pass goes on unchanged.

>>> maps = attention_maps(model, image, query=(40, 52, 18), voxel_spacing=(0.8, 0.8, 2.5))
>>> [(m.slot, m.block, m.kind, tuple(m.weights.shape)) for m in maps]  # weights: (heads, *grid)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from medseg.attention.common import SpatialAttention
from medseg.attention.registry import ATTENTION_BLOCKS
from medseg.errors import ConfigError
from medseg.models.unet import SlottedUNet, level_spacing, stride_to_level
from medseg.models.unwrap import unwrap_model

MixHook = Callable[[SpatialAttention, torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, ...], torch.Tensor], None]
"""``hook(attention, q, k, v, spatial_shape, out)``: :meth:`SpatialAttention.mix`'s inputs and its output."""


@dataclass
class AttentionMap:
    """One query's attention in one transformer block of one U-Net slot. Tensors are float32 on the CPU."""

    slot: str
    """The U-Net slot: ``bottleneck`` or ``decoder_slots.<level>`` (the module's name in :class:`SlottedUNet`)."""
    block: int
    """Index of the transformer block within the slot."""
    kind: str
    """Registry name of the block class (``masa``, ``masa_decomposed``, ``focused_linear``, ``cswin``, ``mha``)."""
    grid: tuple[int, ...]
    """Token grid of the slot (after the U-Net's padding of the input to a multiple of its total stride)."""
    query: tuple[int, ...]
    """The query's position on ``grid``."""
    spacing_mm: tuple[float, ...] | None
    """Physical size of one token of ``grid`` per axis (voxel spacing x stride to the slot's level); None when no
    voxel spacing was given."""
    weights: torch.Tensor
    """``(heads, *grid)``: the row of the attention matrix the block applies to the values; each head sums to 1."""
    decay: torch.Tensor | None
    """``(heads, *grid)``: ``gamma_h ** dist(query, .)`` with the block's own spacing-aware distance (``masa``,
    ``masa_decomposed``); else None."""
    content: torch.Tensor | None
    """``(heads, *grid)``: ``masa``'s content part ``softmax(q_i . K / sqrt(d))`` alone (``weights`` is
    proportional to ``content * decay``); else None."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """Block-specific ``(heads or 1, *grid)`` maps, e.g. ``focused_linear``'s ``dwc_footprint``: where the
    rank-restoration depthwise conv reads around the query (kernel magnitudes, normalised to sum to 1)."""
    gain: torch.Tensor | None = None
    """``(heads,)`` where the block scales the attended values: its attention output for the query is
    ``gain * (weights @ V)`` (``focused_linear``: ``S / (S + N * 1e-6)``, below 1 only for a query whose features the
    ReLU kernel all but silences); None where it is 1."""
    stride: tuple[int, ...] | None = None
    """Voxels of the input per token of ``grid``, per axis: token ``t`` covers voxels ``t * stride`` to
    ``(t + 1) * stride - 1``."""


@dataclass(frozen=True)
class Slot:
    """An attention slot of a :class:`SlottedUNet`: its name, feature level and attention blocks in order."""

    name: str
    level: int
    attentions: tuple[SpatialAttention, ...]


def attention_slots(model: nn.Module) -> list[Slot]:
    """The slots of ``model`` (DDP / ``torch.compile`` wrappers are unwrapped) that hold attention blocks, in the
    order the forward pass runs them: the bottleneck, then the decoder slots from the lowest resolution up.
    Empty for a slot-less model or a pure-CNN U-Net."""
    net = unwrap_model(model)
    if not isinstance(net, SlottedUNet):
        return []
    candidates = [("bottleneck", len(net.strides), net.bottleneck)]
    candidates += [(f"decoder_slots.{i}", i, net.decoder_slots[i]) for i in reversed(range(len(net.decoder_slots)))]
    slots = [
        Slot(name, level, tuple(m for m in module.modules() if isinstance(m, SpatialAttention)))
        for name, level, module in candidates
    ]
    return [slot for slot in slots if slot.attentions]


def token_position(voxel: Sequence[int], stride: Sequence[int], grid: Sequence[int]) -> tuple[int, ...]:
    """The token of a ``grid`` ``stride`` times coarser than the input that holds ``voxel``: ``voxel // stride``,
    clipped to the grid."""
    return tuple(min(int(v) // s, g - 1) for v, s, g in zip(voxel, stride, grid))


@contextmanager
def capture_mix(attentions: Iterable[SpatialAttention], hook: MixHook) -> Iterator[None]:
    """For the duration, every call of ``attention.mix(q, k, v, spatial_shape)`` of the given blocks also calls
    ``hook(attention, q, k, v, spatial_shape, out)`` with its ``(B, N, C)`` output ``out`` (before ``proj``).

    ``q, k, v`` are the ``(B, N, C)`` tokens the block's ``mix`` receives (before any rotary encoding a block
    applies inside it). The blocks are restored exactly on exit, also after an error.
    """
    saved: list[tuple[SpatialAttention, Callable | None]] = []

    def hooked(attention: SpatialAttention, mix: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
            out = mix(q, k, v, spatial_shape)
            hook(attention, q, k, v, spatial_shape, out)
            return out

        return run

    try:
        for attention in attentions:
            saved.append((attention, vars(attention).get("mix")))
            attention.mix = hooked(attention, attention.mix)
        yield
    finally:
        for attention, previous in reversed(saved):
            if previous is None:
                del attention.mix
            else:
                attention.mix = previous


def block_kind(attention: SpatialAttention) -> str:
    """The registry name of ``attention``'s class (its class name when it is not registered)."""
    return next((name for name, cls in ATTENTION_BLOCKS.items() if type(attention) is cls), type(attention).__name__)


def has_attention_rows(cls: type[SpatialAttention]) -> bool:
    """Whether blocks of class ``cls`` implement :meth:`SpatialAttention.attention_row` (it is optional)."""
    return cls.attention_row is not SpatialAttention.attention_row


def _check(net: nn.Module, slots: list[Slot], image: torch.Tensor, query: Sequence[int],
           voxel_spacing: Sequence[float] | None) -> None:
    """One-line ConfigErrors for a model without attention slots, a block without rows, a wrong image shape, query
    or spacing."""
    if not slots:
        raise ConfigError(
            f"{type(net).__name__} has no attention slot: attention maps need medseg's U-Net (SlottedUNet) with "
            f"bottleneck or decoder set to one of {list(ATTENTION_BLOCKS)}"
        )
    with_rows = [name for name, cls in ATTENTION_BLOCKS.items() if has_attention_rows(cls)]
    for slot in slots:
        for attention in slot.attentions:
            if not attention.mixes_tokens:
                raise ConfigError(
                    f"attention block {block_kind(attention)!r} (slot {slot.name}) mixes no tokens (the ablation "
                    f"without attention), so it has no attention map; blocks with attention maps: {with_rows}"
                )
            if not has_attention_rows(type(attention)):
                raise ConfigError(
                    f"attention block {block_kind(attention)!r} ({type(attention).__name__}, slot {slot.name}) has no "
                    f"attention rows: it does not implement SpatialAttention.attention_row; blocks with attention "
                    f"maps: {with_rows}"
                )
    ndim = net.spatial_dims
    if image.ndim != ndim + 2 or image.shape[0] != 1:
        raise ConfigError(f"attention maps need one image of shape (1, C, <{ndim} spatial axes>), got "
                          f"{tuple(image.shape)}")
    spatial = tuple(image.shape[2:])
    if len(query) != ndim or not all(0 <= int(q) < s for q, s in zip(query, spatial)):
        valid = ", ".join(f"0..{s - 1}" for s in spatial)
        raise ConfigError(f"query voxel {tuple(query)} lies outside the image of shape {spatial}: valid range per "
                          f"axis {valid}")
    if voxel_spacing is not None and (len(voxel_spacing) != ndim or min(voxel_spacing) <= 0):
        raise ConfigError(f"voxel_spacing {tuple(voxel_spacing)} needs {ndim} positive values (mm per voxel, one per "
                          f"spatial axis)")


def _flat_index(position: Sequence[int], grid: Sequence[int]) -> int:
    """Row-major index of ``position`` on ``grid`` (the token order of ``(B, N, C)``)."""
    index = 0
    for p, g in zip(position, grid):
        index = index * g + p
    return index


def _on_grid(row: torch.Tensor | None, grid: tuple[int, ...]) -> torch.Tensor | None:
    """``(1, heads, N)`` -> ``(heads, *grid)`` float32 on the CPU."""
    return None if row is None else row[0].float().cpu().unflatten(-1, grid)


def _attention_map(attention: SpatialAttention, slot: Slot, block: int, q: torch.Tensor, k: torch.Tensor,
                   spatial_shape: tuple[int, ...], query: Sequence[int], strides: list[tuple[int, ...]],
                   voxel_spacing: Sequence[float] | None) -> AttentionMap:
    """The :class:`AttentionMap` of ``attention`` (block ``block`` of ``slot``) for the token holding voxel ``query``.

    ``q, k`` are the ``(1, N, C)`` tokens of the block's ``mix`` on its ``spatial_shape`` grid; ``strides`` are the
    U-Net's per-level strides and ``voxel_spacing`` the input's mm per voxel (or None).
    """
    stride = stride_to_level(strides, slot.level)
    position = token_position(query, stride, spatial_shape)
    row = attention.attention_row(q, k, spatial_shape, _flat_index(position, spatial_shape))
    spacing = level_spacing(voxel_spacing, strides, slot.level)
    return AttentionMap(
        slot=slot.name, block=block, kind=block_kind(attention), grid=spatial_shape, query=position,
        spacing_mm=None if spacing is None else tuple(spacing), weights=_on_grid(row.weights, spatial_shape),
        decay=_on_grid(row.decay, spatial_shape), content=_on_grid(row.content, spatial_shape),
        extras={key: _on_grid(value, spatial_shape) for key, value in row.extras.items()},
        gain=None if row.gain is None else row.gain[0].float().cpu(), stride=stride,
    )


@contextmanager
def _eval_mode(net: nn.Module) -> Iterator[None]:
    """For the duration, ``net`` in eval mode; every module's train/eval mode is restored exactly on exit."""
    modes = {module: module.training for module in net.modules()}
    try:
        net.eval()
        yield
    finally:
        for module, training in modes.items():
            module.training = training


def attention_maps(
    model: nn.Module,
    image: torch.Tensor,
    query: Sequence[int],
    voxel_spacing: Sequence[float] | None = None,
) -> list[AttentionMap]:
    """The attention of every transformer block of every slot of ``model`` for the token that holds ``query``.

    One ordinary forward pass of ``image`` in eval mode under ``torch.no_grad()`` with :func:`capture_mix`; in
    the hook each block computes its query row in ``O(N)`` memory. The model (its ``mix`` methods and every
    module's train/eval mode) is restored exactly afterwards.

    Args:
        model: a :class:`SlottedUNet`, possibly wrapped by DDP or ``torch.compile`` (unwrapped; the forward pass
            runs eagerly).
        image: ``(1, C, *spatial)``, exactly what the network gets, on the model's device.
        query: a voxel of ``image``, one index per spatial axis.
        voxel_spacing: mm per voxel of ``image`` per spatial axis, for ``AttentionMap.spacing_mm``.

    Returns:
        One :class:`AttentionMap` per slot and block, in forward order.

    Raises:
        ConfigError: a model without an attention slot, a block that has no attention rows (``identity`` mixes no
            tokens), an image not of shape ``(1, C, *spatial)``, a query outside the image or a bad
            ``voxel_spacing``.
    """
    net = unwrap_model(model)
    slots = attention_slots(net)
    _check(net, slots, image, query, voxel_spacing)
    where = {attention: (slot, block) for slot in slots for block, attention in enumerate(slot.attentions)}
    maps: list[AttentionMap] = []

    def record(attention: SpatialAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               spatial_shape: tuple[int, ...], out: torch.Tensor) -> None:
        maps.append(_attention_map(attention, *where[attention], q, k, spatial_shape, query, net.strides,
                                   voxel_spacing))

    with _eval_mode(net), torch.no_grad(), capture_mix(where, record):
        net(image)
    return maps
