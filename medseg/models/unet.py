"""The U-Net with attention slots, for 2D and 3D.

Conv stages down, transposed-conv up stages with skip connections back, in one of the styles of
:mod:`medseg.models.conv_stages` (``model.conv_stages``): medseg's own, defined here (residual conv stages of MONAI
``UnetResBlock``, ``encoder_blocks`` of them per level: one by default, nnU-Net's residual encoder with more; MONAI
``UnetUpBlock`` up stages, or one conv per stage as in nnU-Net's ResEnc presets), or nnU-Net's own networks layer for
layer (:mod:`medseg.models.nnunet_stages`). Two kinds of slot take any attention block from the registry by name:

* the **bottleneck**: ``bottleneck_depth`` transformer blocks at the lowest resolution;
* the **decoder**: one transformer block after each of the ``decoder_levels`` lowest-resolution
  decoder stages.

``"none"`` in a slot leaves it a pure CNN. Inputs of any size work: they are padded up to a multiple
of the total stride and the output is cropped back.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from monai.networks.blocks import UnetOutBlock, UnetResBlock, UnetUpBlock
from monai.networks.blocks.dynunet_block import get_conv_layer
from monai.networks.layers.utils import get_act_layer, get_norm_layer
from torch import nn

from medseg.attention import SpatialAttention, build_transformer_block
from medseg.attention.block import TransformerBlock
from medseg.attention.common import dense_bias_bytes
from medseg.errors import ParameterError
from medseg.models.conv_stages import ConvStages, ConvStyle, get_conv_stages, register_conv_stages

StrideSpec = int | Sequence[int]
KernelSpec = int | Sequence[int | Sequence[int]]
"""``kernel_size``: an odd int for every level, or one entry per level, each an int or a per-axis list."""

GB = 2**30
"""Bytes per GB of ``model.attention.max_bias_gb``."""


def _per_axis(entries: Sequence[StrideSpec], spatial_dims: int, parameter: str) -> list[tuple[int, ...]]:
    """Normalise ``[2, (2, 2, 1), ...]`` (the entries of the network's list parameter ``parameter``) to one tuple of
    ``spatial_dims`` ints per entry.

    Raises:
        ParameterError: an entry of another number of axes.
    """
    out = []
    for entry in entries:
        axes = (int(entry),) * spatial_dims if isinstance(entry, int) else tuple(int(s) for s in entry)
        if len(axes) != spatial_dims:
            raise ParameterError(parameter, entries, f"entry {entry} has {len(axes)} axes, expected {spatial_dims}")
        out.append(axes)
    return out


def per_axis_strides(strides: Sequence[StrideSpec], spatial_dims: int) -> list[tuple[int, ...]]:
    """Normalise ``strides`` ``[2, (2, 2, 1), ...]`` to one tuple of ``spatial_dims`` ints per level.

    Raises:
        ParameterError: naming ``strides``, an entry of another number of axes.
    """
    return _per_axis(strides, spatial_dims, "strides")


def per_level_kernels(kernel_size: KernelSpec, num_levels: int | None, spatial_dims: int) -> list[tuple[int, ...]]:
    """``kernel_size`` as one tuple of ``spatial_dims`` odd ints per level (the full-resolution level first):
    an int serves every level and axis, a list gives each level an int or a per-axis list (RAS order).

    Args:
        kernel_size: ``3``, or e.g. ``[[3, 3, 1], [3, 3, 1], 3, 3, 3]``.
        num_levels: the levels of ``channels``; None (planned channels) checks the entries only.
        spatial_dims: 2 or 3.

    Raises:
        ParameterError: naming ``kernel_size``, a list of another length, or an entry that is not odd ints >= 1 of
            ``spatial_dims`` axes.
    """
    levels = "" if num_levels is None else f"{num_levels} "
    expected = ParameterError("kernel_size", kernel_size, f"expected an odd int >= 1, or a list of {levels}entries "
                              f"(one per level of channels), each an odd int or {spatial_dims} of them")
    try:
        entries = [kernel_size] * (num_levels or 1) if isinstance(kernel_size, int) else list(kernel_size)
        kernels = _per_axis(entries, spatial_dims, "kernel_size")
    except (TypeError, ValueError):
        raise expected from None
    if (num_levels is not None and len(kernels) != num_levels) or any(k < 1 or k % 2 != 1 for k in sum(kernels, ())):
        raise expected
    return kernels


def stride_to_level(strides: list[tuple[int, ...]], level: int) -> tuple[int, ...]:
    """Per axis, the product of the first ``level`` strides: how much the map at ``level`` is down-sampled."""
    return tuple(math.prod(s[axis] for s in strides[:level]) for axis in range(len(strides[0]) if strides else 0))


def level_spacing(spacing: Sequence[float] | None, strides: list[tuple[int, ...]], level: int) -> list[float] | None:
    """Physical spacing of the feature grid after ``level`` down-sampling steps (None stays None)."""
    if spacing is None:
        return None
    return [float(sp) * f for sp, f in zip(spacing, stride_to_level(strides, level))]


def level_grid(patch_size: Sequence[int], strides: list[tuple[int, ...]], level: int) -> tuple[int, ...]:
    """Token grid of the feature map after ``level`` down-sampling steps for a ``patch_size`` input, which the
    U-Net pads up to a multiple of its total stride."""
    total, down = stride_to_level(strides, len(strides)), stride_to_level(strides, level)
    return tuple(math.ceil(size / t) * t // d for size, t, d in zip(patch_size, total, down))


def check_bias_memory(attention: SpatialAttention, grid: Sequence[int], max_gb: float | None, slot: str, block: str,
                      level: int) -> None:
    """Refuse a slot whose dense ``N x N`` attention bias would need more than ``max_gb`` GB in float32.

    Args:
        attention: the attention of the slot's block ``block``, on level ``level``'s token grid ``grid``.
        slot: the U-Net's parameter that puts ``block`` there, ``bottleneck`` or ``decoder``.

    Raises:
        ParameterError: naming ``slot``, with the estimate, and the blocks that scale to large grids.
    """
    need = dense_bias_bytes(grid, attention.bias_heads)
    if max_gb is None or need <= max_gb * GB:
        return
    tokens = math.prod(grid)
    raise ParameterError(slot, block, (
        f"its dense attention bias on the {list(grid)} token grid of level {level} ({tokens:,} tokens) needs about "
        f"{need / GB:.1f} GB ({attention.bias_heads} planes of {tokens:,}^2 float32), more than "
        f"attention.max_bias_gb={max_gb:g}. masa_decomposed and focused_linear scale to large grids "
        f"(no N x N bias); or use a smaller patch or more down-sampling, or raise attention.max_bias_gb "
        f"(null or None disables the check)"
    ))


DECODER_CONVS = (1, 2)
"""The values of ``decoder_convs`` medseg's conv stages build."""


def encoder_block_counts(encoder_blocks: int | Sequence[int], num_levels: int) -> list[int]:
    """Blocks (or conv layers) per encoder level (``num_levels`` entries, the full-resolution level first) from
    ``encoder_blocks``: an int for every level, or a list whose first ``num_levels`` entries are taken.

    Raises:
        ParameterError: naming ``encoder_blocks``, a count below 1, or a list shorter than the levels.
    """
    counts = [int(encoder_blocks)] * num_levels if isinstance(encoder_blocks, int) else [int(n) for n in encoder_blocks]
    if len(counts) < num_levels or min(counts, default=1) < 1:
        raise ParameterError("encoder_blocks", encoder_blocks, f"expected an int >= 1 or a list of at least "
                             f"{num_levels} such ints (one per level of channels)")
    return counts[:num_levels]


def _residual_stage(in_channels: int, out_channels: int, stride: StrideSpec, blocks: int, conv: ConvStyle,
                    level: int) -> nn.Module:
    """``blocks`` residual blocks with ``level``'s kernel, the first with ``stride`` and the width change:
    ``(B, in_channels, *S) -> (B, out_channels, *S / stride)``. One block is the ``UnetResBlock`` itself (the default
    U-Net's modules)."""
    first = UnetResBlock(in_channels=in_channels, out_channels=out_channels, stride=stride,
                         **conv.args(out_channels, level))
    if blocks == 1:
        return first
    more = (UnetResBlock(in_channels=out_channels, out_channels=out_channels, stride=1,
                         **conv.args(out_channels, level))
            for _ in range(blocks - 1))
    return nn.Sequential(first, *more)


def _encoder_stages(in_channels: int, channels: Sequence[int], strides: list[tuple[int, ...]], blocks: Sequence[int],
                    conv: ConvStyle) -> tuple[nn.Module, nn.ModuleList]:
    """The stem and the down stages, ``blocks[level]`` residual conv blocks each, with the kernel of the level they
    output.

    ``stem``: ``(B, in_channels, *S) -> (B, channels[0], *S)``; ``down[i]``: ``(B, channels[i], *S_i) ->
    (B, channels[i + 1], *S_i / strides[i])``, where ``S_i`` is the input size down-sampled ``i`` times.
    """
    stem = _residual_stage(in_channels, channels[0], 1, blocks[0], conv, 0)
    down = nn.ModuleList(
        _residual_stage(channels[i], channels[i + 1], strides[i], blocks[i + 1], conv, i + 1)
        for i in range(len(strides))
    )
    return stem, down


class OneConvUpBlock(nn.Module):
    """A decoder stage of nnU-Net's residual-encoder U-Net: transposed conv by the stride, concatenation with the
    skip, one conv -> norm -> LeakyReLU (MONAI ``UnetUpBlock`` has two).

    ``forward(x, skip)``: ``(B, in_channels, *S / stride)`` and ``(B, out_channels, *S)`` -> ``(B, out_channels, *S)``.
    """

    def __init__(self, spatial_dims: int, in_channels: int, out_channels: int, stride: StrideSpec,
                 kernel_size: int | Sequence[int], norm_name: Any, dropout: float) -> None:
        super().__init__()
        self.transp_conv = get_conv_layer(spatial_dims, in_channels, out_channels, kernel_size=stride, stride=stride,
                                          dropout=dropout, bias=False, conv_only=True, is_transposed=True)
        self.conv = get_conv_layer(spatial_dims, 2 * out_channels, out_channels, kernel_size=kernel_size, stride=1,
                                   dropout=dropout, bias=False, conv_only=True)
        self.norm = get_norm_layer(name=norm_name, spatial_dims=spatial_dims, channels=out_channels)
        self.act = get_act_layer(name=("leakyrelu", {"inplace": True, "negative_slope": 0.01}))

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(torch.cat((self.transp_conv(x), skip), dim=1))))


def _decoder_stages(channels: Sequence[int], strides: list[tuple[int, ...]], convs: int,
                    conv: ConvStyle) -> nn.ModuleList:
    """The up stages: ``up[i]`` takes level ``i + 1`` features ``(B, channels[i + 1], *S_{i+1})`` and the skip
    ``(B, channels[i], *S_i)`` to ``(B, channels[i], *S_i)`` (transposed conv by ``strides[i]``, then ``convs``
    convs with level ``i``'s kernel, as nnU-Net's decoder stage takes the kernel of the encoder stage it joins:
    MONAI's ``UnetUpBlock`` for 2, :class:`OneConvUpBlock` for 1).

    Raises:
        ParameterError: naming ``decoder_convs``, a count medseg's conv stages do not build.
    """
    if convs not in DECODER_CONVS:
        raise ParameterError("decoder_convs", convs, f"expected one of {list(DECODER_CONVS)}")
    if convs == 1:
        return nn.ModuleList(
            OneConvUpBlock(in_channels=channels[i + 1], out_channels=channels[i], stride=strides[i],
                           **conv.args(channels[i], i))
            for i in range(len(strides))
        )
    return nn.ModuleList(
        UnetUpBlock(in_channels=channels[i + 1], out_channels=channels[i], stride=strides[i],
                    upsample_kernel_size=strides[i], **conv.args(channels[i], i))
        for i in range(len(strides))
    )


def _out_block(spatial_dims: int, width: int, out_channels: int) -> nn.Module:
    """A segmentation head of medseg's conv stages (MONAI ``UnetOutBlock``: a 1x1 conv with bias)."""
    return UnetOutBlock(spatial_dims, width, out_channels)


register_conv_stages("medseg", ConvStages(
    encoder=_encoder_stages, decoder=_decoder_stages, head=_out_block, initialize=None, max_stride=2,
    block_tensors=5,  # UnetResBlock: both conv outputs, the first activation, the shortcut's conv output, the output
    max_stride_reason="medseg's U-Net pools by 1 or 2 per axis and level (the 1x1 shortcut of its residual blocks)"))


@dataclass(frozen=True)
class _SlotBuilder:
    """Builds the attention slots of one U-Net: what every slot shares (see :class:`SlottedUNet`'s arguments)."""

    spatial_dims: int
    strides: list[tuple[int, ...]]
    attention: Mapping[str, Any]
    checkpointing: bool
    patch_size: Sequence[int] | None

    def build(self, name: str, level: int, width: int, depth: int, slot: str) -> nn.Module:
        """``depth`` transformer blocks ``name`` on level-``level`` features, ``(B, width, *S_level) -> (B, width,
        *S_level)``; ``nn.Identity`` for ``"none"`` or depth 0.

        The blocks get the attention spacing scaled to the level and, with a patch, the level's token grid, whose
        dense bias :func:`check_bias_memory` checks (``slot``, ``bottleneck`` or ``decoder``, names the U-Net's
        parameter in its message).
        """
        if name == "none" or depth == 0:
            return nn.Identity()
        cfg = {**self.attention, "spacing": level_spacing(self.attention.get("spacing"), self.strides, level)}
        grid = None if self.patch_size is None else level_grid(self.patch_size, self.strides, level)
        blocks = [
            build_transformer_block(name, width, self.spatial_dims, checkpointing=self.checkpointing, grid=grid,
                                    **cfg)
            for _ in range(depth)
        ]
        if grid is not None:
            check_bias_memory(blocks[0].attention, grid, self.attention.get("max_bias_gb"), slot, name, level)
        return nn.Sequential(*blocks)


class SlottedUNet(nn.Module):
    """A U-Net whose bottleneck and low-resolution decoder stages hold attention blocks.

    Args:
        spatial_dims: 2 or 3.
        in_channels: input channels (image modalities).
        out_channels: output classes, background included.
        channels: feature width per level, e.g. ``[16, 32, 64, 128]``; ``len(channels) - 1`` down-samplings.
        strides: one per down-sampling, an int or a per-axis tuple (anisotropic pooling).
        kernel_size: the conv kernel, an odd int for every level or one entry per level (:func:`per_level_kernels`);
            a level's kernel serves its encoder stage and the decoder stage that outputs its width.
        encoder_blocks: blocks per level (conv layers for ``nnunet_plain``), an int or a list
            (:func:`encoder_block_counts`).
        decoder_convs: convs per decoder stage: 2 or 1 for medseg's conv stages (:func:`_decoder_stages`), any count
            >= 1 for nnU-Net's.
        conv_stages: the style of the conv stages, a name of :data:`~medseg.models.conv_stages.CONV_STAGES`:
            ``medseg`` (residual MONAI blocks), ``nnunet_plain`` or ``nnunet_resenc`` (nnU-Net's ``PlainConvUNet`` or
            ``ResidualEncoderUNet`` layer for layer, with their initialisation: with empty slots, nnU-Net's function).
        bottleneck: block name for the bottleneck slot, or ``"none"``.
        bottleneck_depth: transformer blocks stacked in the bottleneck.
        decoder: block name for the decoder slots, or ``"none"``.
        decoder_levels: how many of the lowest-resolution decoder stages get a ``decoder`` block.
        attention: what every slot's blocks share (their hyperparameters, as in the ``model.attention`` node);
            ``spacing`` in it is the input-level spacing and is scaled to each slot's resolution.
        deep_supervision: in training mode, also return logits of the lower decoder stages (a head per decoder
            stage, as nnU-Net's).
        checkpointing: activation checkpointing inside the transformer blocks.
        channels_last: for ``spatial_dims=3``, keep weights and activations in the channels-last 3D memory
            format (faster convolutions and their backward); ignored in 2D, where it is slower on the CPU.
        patch_size: the training patch, if known. It gives each slot's token grid (:func:`level_grid`), which
            blocks that size parameters by it receive (``positional_size=0`` in ``attention``) and which
            :func:`check_bias_memory` checks against ``attention["max_bias_gb"]``.

    Shapes: ``(B, in_channels, *spatial) -> (B, out_channels, *spatial)``; with deep supervision in
    training mode, a list of such tensors at full, 1/2, 1/4 ... resolution.

    Raises:
        ParameterError: naming the parameter, for a value the network cannot take (``strides``, ``kernel_size``,
            ``encoder_blocks``, ``decoder_convs``, ``conv_stages``, ``norm``, ``patch_size``), or a slot
            (``bottleneck``, ``decoder``) whose dense attention bias is over ``attention["max_bias_gb"]``.
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        channels: Sequence[int] = (16, 32, 64, 128),
        strides: Sequence[StrideSpec] = (2, 2, 2),
        kernel_size: KernelSpec = 3,
        encoder_blocks: int | Sequence[int] = 1,
        decoder_convs: int = 2,
        conv_stages: str = "medseg",
        norm: str = "instance",
        dropout: float = 0.0,
        deep_supervision: bool = False,
        bottleneck: str = "none",
        bottleneck_depth: int = 2,
        decoder: str = "none",
        decoder_levels: int = 1,
        attention: Mapping[str, Any] | None = None,
        checkpointing: bool = False,
        channels_last: bool = True,
        patch_size: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if len(strides) != len(channels) - 1:
            raise ParameterError("strides", list(strides), f"expected {len(channels) - 1} entries for the "
                                 f"{len(channels)} levels of channels")
        if patch_size is not None and len(patch_size) != spatial_dims:
            raise ParameterError("patch_size", list(patch_size), f"expected one size per axis of the {spatial_dims}D "
                                 "network")
        self.spatial_dims = spatial_dims
        self.strides = per_axis_strides(strides, spatial_dims)
        self.total_stride = stride_to_level(self.strides, len(self.strides))
        self.deep_supervision = deep_supervision
        self.memory_format = torch.channels_last_3d if channels_last and spatial_dims == 3 else torch.contiguous_format
        style = get_conv_stages(conv_stages)
        conv = ConvStyle(spatial_dims, per_level_kernels(kernel_size, len(channels), spatial_dims), norm, dropout)
        slots = _SlotBuilder(spatial_dims, self.strides, dict(attention or {}), checkpointing, patch_size)
        num_levels = len(self.strides)
        self.conv_stages = conv_stages
        self.encoder_blocks = encoder_block_counts(encoder_blocks, len(channels))
        self.decoder_convs = int(decoder_convs)
        self.stem, self.down = style.encoder(in_channels, channels, self.strides, self.encoder_blocks, conv)
        self.bottleneck = slots.build(bottleneck, num_levels, channels[num_levels], bottleneck_depth, "bottleneck")
        # up[i] takes level i+1 features to level i; decoder slot i follows it.
        self.up = style.decoder(channels, self.strides, self.decoder_convs, conv)
        self.decoder_slots = nn.ModuleList(
            slots.build(decoder, i, channels[i], 1 if i >= num_levels - decoder_levels else 0, "decoder")
            for i in range(num_levels)
        )
        self.head = style.head(spatial_dims, channels[0], out_channels)
        self.deep_heads = nn.ModuleList(
            style.head(spatial_dims, channels[i], out_channels) for i in range(1, num_levels) if deep_supervision
        )
        # The conv stages only: an attention slot's weights are linear layers, (C, 1, k...) depthwise kernels (the
        # same bytes in either format) and tables such as MHA's 4-D relative bias in 3D, which torch refuses to
        # convert ("required rank 5 tensor to use channels_last_3d format"); and a slot keeps its own initialisation.
        for stages in (self.stem, self.down, self.up, self.head, self.deep_heads):
            if style.initialize is not None:
                style.initialize(stages)
            stages.to(memory_format=self.memory_format)

    def slot_blocks(self) -> dict[str, TransformerBlock]:
        """The transformer blocks of the attention slots by module name (``bottleneck.0``, ``decoder_slots.3.0``)."""
        return {name: module for name, module in self.named_modules() if isinstance(module, TransformerBlock)}

    def start_slots_as_identity(self, names: Collection[str] | None = None) -> list[str]:
        """The transformer blocks ``names`` of the attention slots (None: all) start as the identity
        (:meth:`~medseg.attention.block.TransformerBlock.start_as_identity`): with all of them, the network computes
        what its conv stages alone compute, as when blocks are inserted into a trained network. Returns their
        names."""
        blocks = {name: block for name, block in self.slot_blocks().items() if names is None or name in names}
        for block in blocks.values():
            block.start_as_identity()
        return list(blocks)

    def _pad(self, x: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """Pad the spatial axes of ``x`` up to a multiple of the total stride; return the original size."""
        size = list(x.shape[2:])
        extra = [(-s) % t for s, t in zip(size, self.total_stride)]
        if any(extra):
            pad = [p for e in reversed(extra) for p in (0, e)]
            x = F.pad(x, pad)
        return x, size

    @staticmethod
    def _crop(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
        return x[(..., *(slice(0, s) for s in size))]

    def forward(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        x, size = self._pad(x.contiguous(memory_format=self.memory_format))
        skips = [self.stem(x)]
        for block in self.down:
            skips.append(block(skips[-1]))
        y = self.bottleneck(skips.pop())
        decoded = []
        for i in reversed(range(len(self.up))):
            y = self.decoder_slots[i](self.up[i](y, skips[i]))
            decoded.append(y)
        logits = self._crop(self.head(y), size)
        if not (self.deep_supervision and self.training):
            return logits
        # decoded[-2], decoded[-3], ...: levels 1, 2, ... (half, quarter ... resolution)
        lower = [head(decoded[-2 - i]) for i, head in enumerate(self.deep_heads)]
        return [logits, *lower]
