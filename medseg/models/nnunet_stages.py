"""nnU-Net v2's conv stages (``model.conv_stages=nnunet_plain`` and ``nnunet_resenc``), layer for layer as
``dynamic_network_architectures`` builds them for nnU-Net's plans.

* ``nnunet_plain``, its ``PlainConvUNet``: ``encoder_blocks[level]`` conv layers per encoder stage, the first strided;
* ``nnunet_resenc``, its ``ResidualEncoderUNet``: a stem conv layer, then ``encoder_blocks[level]`` ResNet-D basic
  blocks per stage (the first strided, its shortcut average-pooled and projected where the size or width changes).

A conv layer is conv (bias, "same" padding) -> channel dropout (``model.dropout`` > 0) -> norm (``model.norm``) ->
LeakyReLU (slope 1e-2). Both decode alike: a transposed conv by the stride (kernel = stride, bias), the skip
concatenated, ``decoder_convs`` conv layers with the kernel of the level they output; a 1x1 conv (bias) per
supervised level gives the logits. Every conv and transposed conv starts He-initialised for LeakyReLU
(``kaiming_normal_``, a = 1e-2, bias 0); each residual block's last norm starts at zero (weight and bias), so that
the block starts as its shortcut. The modules register their layers in nnU-Net's order, which
:mod:`medseg.models.nnunet_weights` walks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from medseg.errors import ParameterError
from medseg.models.conv_stages import ConvStages, ConvStyle, Strides, register_conv_stages

NNUNET_NETWORKS = {"PlainConvUNet": "nnunet_plain", "ResidualEncoderUNet": "nnunet_resenc"}
"""nnU-Net's network classes medseg builds layer for layer: class -> its ``model.conv_stages``."""
NNUNET_FROM_PLAN = "nnunet"
"""``model.conv_stages=nnunet``: nnU-Net's network, the class of an nnU-Net plan (``plan.file``) with its convs or
blocks per stage, and without one ``PlainConvUNet`` (the same stages as ``nnunet_plain``): recipe=nnunet's choice."""
NEGATIVE_SLOPE = 1e-2
"""nnU-Net's LeakyReLU slope, and the ``a`` of its He initialisation."""
CONVS = {2: nn.Conv2d, 3: nn.Conv3d}
TRANSPOSED_CONVS = {2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
CHANNEL_DROPOUTS = {2: nn.Dropout2d, 3: nn.Dropout3d}
AVERAGE_POOLS = {2: nn.AvgPool2d, 3: nn.AvgPool3d}


class ConvLayer(nn.Module):
    """nnU-Net's conv layer (``ConvDropoutNormReLU``): conv -> dropout -> norm -> LeakyReLU, "same" padding.

    ``(B, in_channels, *S) -> (B, out_channels, *ceil(S / stride))``.

    Args:
        style: the U-Net's dimensionality, norm and dropout.
        kernel: per axis, odd.
        stride: per axis.
        bias: the conv's bias (nnU-Net's ``conv_bias``; its residual shortcut's 1x1 conv has none).
        dropout: whether the layer has the style's dropout (a basic block's second conv and shortcut have none).
        activation: whether the layer ends in LeakyReLU (a basic block's second conv and shortcut do not).
    """

    def __init__(self, style: ConvStyle, in_channels: int, out_channels: int, kernel: Sequence[int],
                 stride: Sequence[int], bias: bool = True, dropout: bool = True, activation: bool = True) -> None:
        super().__init__()
        self.conv = CONVS[style.spatial_dims](in_channels, out_channels, tuple(kernel), tuple(stride),
                                              padding=tuple((k - 1) // 2 for k in kernel), bias=bias)
        rate = style.dropout if dropout else 0.0
        self.dropout = CHANNEL_DROPOUTS[style.spatial_dims](rate) if rate > 0 else nn.Identity()
        self.norm = style.norm_layer(out_channels)
        self.act = nn.LeakyReLU(NEGATIVE_SLOPE, inplace=True) if activation else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.dropout(self.conv(x))))


def _ones(spatial_dims: int) -> tuple[int, ...]:
    return (1,) * spatial_dims


Block = Callable[[ConvStyle, int, int, Sequence[int], Sequence[int]], nn.Module]
"""``block(style, in_channels, out_channels, kernel, stride)``: :class:`ConvLayer` or :class:`BasicBlockD`."""


def _stack(block: Block, style: ConvStyle, in_channels: int, out_channels: int, stride: Sequence[int], count: int,
           level: int) -> nn.Sequential:
    """nnU-Net's ``StackedConvBlocks`` (``block`` :class:`ConvLayer`) or ``StackedResidualBlocks``
    (:class:`BasicBlockD`): ``count`` blocks with ``level``'s kernel, the first with ``stride`` and the width change:
    ``(B, in_channels, *S) -> (B, out_channels, *S / stride)``."""
    kernel, ones = style.kernels[level], _ones(style.spatial_dims)
    return nn.Sequential(block(style, in_channels, out_channels, kernel, stride),
                         *(block(style, out_channels, out_channels, kernel, ones) for _ in range(count - 1)))


class BasicBlockD(nn.Module):
    """nnU-Net's ResNet-D basic block: ``act(conv2(conv1(x)) + shortcut(x))``, conv2 without dropout and
    activation; the shortcut average-pools by the stride and projects (1x1 conv without bias, norm) where the size or
    width changes, else is the identity.

    ``(B, in_channels, *S) -> (B, out_channels, *S / stride)``.
    """

    def __init__(self, style: ConvStyle, in_channels: int, out_channels: int, kernel: Sequence[int],
                 stride: Sequence[int]) -> None:
        super().__init__()
        ones = _ones(style.spatial_dims)
        self.conv1 = ConvLayer(style, in_channels, out_channels, kernel, stride)
        self.conv2 = ConvLayer(style, out_channels, out_channels, kernel, ones, dropout=False, activation=False)
        shortcut: list[nn.Module] = []
        if tuple(stride) != ones:
            shortcut.append(AVERAGE_POOLS[style.spatial_dims](tuple(stride), tuple(stride)))
        if in_channels != out_channels:
            shortcut.append(ConvLayer(style, in_channels, out_channels, ones, ones, bias=False, dropout=False,
                                      activation=False))
        self.skip = nn.Sequential(*shortcut) if shortcut else nn.Identity()
        self.act = nn.LeakyReLU(NEGATIVE_SLOPE, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv2(self.conv1(x)) + self.skip(x))


def plain_encoder(in_channels: int, channels: Sequence[int], strides: Strides, blocks: Sequence[int],
                  style: ConvStyle) -> tuple[nn.Module, nn.ModuleList]:
    """``PlainConvEncoder``'s stages: level 0's stack (stride 1) as the stem, the others as the down stages
    (:data:`~medseg.models.conv_stages.EncoderBuilder`), ``blocks[level]`` conv layers each."""
    stem = _stack(ConvLayer, style, in_channels, channels[0], _ones(style.spatial_dims), blocks[0], 0)
    down = nn.ModuleList(_stack(ConvLayer, style, channels[i], channels[i + 1], strides[i], blocks[i + 1], i + 1)
                         for i in range(len(strides)))
    return stem, down


def residual_encoder(in_channels: int, channels: Sequence[int], strides: Strides, blocks: Sequence[int],
                     style: ConvStyle) -> tuple[nn.Module, nn.ModuleList]:
    """``ResidualEncoder``'s stem conv layer and stages: the stem is the stem layer and level 0's blocks (stride 1),
    the down stages the others (:data:`~medseg.models.conv_stages.EncoderBuilder`), ``blocks[level]`` basic blocks
    each."""
    ones = _ones(style.spatial_dims)
    stem = nn.Sequential(ConvLayer(style, in_channels, channels[0], style.kernels[0], ones),
                         _stack(BasicBlockD, style, channels[0], channels[0], ones, blocks[0], 0))
    down = nn.ModuleList(_stack(BasicBlockD, style, channels[i], channels[i + 1], strides[i], blocks[i + 1], i + 1)
                         for i in range(len(strides)))
    return stem, down


class UpStage(nn.Module):
    """A stage of nnU-Net's ``UNetDecoder``: transposed conv by the stride (kernel = stride, bias), the skip
    concatenated after it, ``convs`` conv layers with the kernel of ``level``.

    ``forward(x, skip)``: ``(B, in_channels, *S / stride)`` and ``(B, out_channels, *S)`` -> ``(B, out_channels, *S)``.
    """

    def __init__(self, style: ConvStyle, in_channels: int, out_channels: int, stride: Sequence[int], convs: int,
                 level: int) -> None:
        super().__init__()
        self.transp_conv = TRANSPOSED_CONVS[style.spatial_dims](in_channels, out_channels, tuple(stride),
                                                                tuple(stride), bias=True)
        self.convs = _stack(ConvLayer, style, 2 * out_channels, out_channels, _ones(style.spatial_dims), convs, level)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.convs(torch.cat((self.transp_conv(x), skip), dim=1))


def decoder(channels: Sequence[int], strides: Strides, convs: int, style: ConvStyle) -> nn.ModuleList:
    """``UNetDecoder``'s stages (:data:`~medseg.models.conv_stages.DecoderBuilder`): ``up[i]`` joins level ``i``.

    Raises:
        ParameterError: naming ``decoder_convs``, ``convs`` below 1.
    """
    if convs < 1:
        raise ParameterError("decoder_convs", convs, "expected an int >= 1")
    return nn.ModuleList(UpStage(style, channels[i + 1], channels[i], strides[i], convs, i)
                         for i in range(len(strides)))


def head(spatial_dims: int, width: int, out_channels: int) -> nn.Module:
    """nnU-Net's segmentation layer: a 1x1 conv with bias, ``(B, width, *S) -> (B, out_channels, *S)``."""
    return CONVS[spatial_dims](width, out_channels, 1, bias=True)


def he_initialize(module: nn.Module) -> None:
    """nnU-Net's ``InitWeights_He(1e-2)`` on every conv and transposed conv in ``module``: weights
    ``kaiming_normal_`` for LeakyReLU with slope 1e-2 (std ``sqrt(2 / ((1 + a^2) * fan_in))``), biases zero."""
    for layer in module.modules():
        if isinstance(layer, (*CONVS.values(), *TRANSPOSED_CONVS.values())):
            nn.init.kaiming_normal_(layer.weight, a=NEGATIVE_SLOPE)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def residual_initialize(module: nn.Module) -> None:
    """:func:`he_initialize`, and nnU-Net's ``init_last_bn_before_add_to_0``: each basic block's last norm (weight
    and bias) zero."""
    he_initialize(module)
    for block in module.modules():
        if isinstance(block, BasicBlockD):
            nn.init.zeros_(block.conv2.norm.weight)
            nn.init.zeros_(block.conv2.norm.bias)


PLAIN = ConvStages(encoder=plain_encoder, decoder=decoder, head=head, initialize=he_initialize, max_stride=None,
                   block_tensors=2)  # a conv layer: the conv's output (the norm's input), the in-place activation's

register_conv_stages(NNUNET_NETWORKS["PlainConvUNet"], PLAIN)
register_conv_stages(NNUNET_FROM_PLAN, PLAIN)
register_conv_stages(NNUNET_NETWORKS["ResidualEncoderUNet"], ConvStages(
    encoder=residual_encoder, decoder=decoder, head=head, initialize=residual_initialize, max_stride=None,
    block_tensors=5))  # BasicBlockD: both conv outputs, the first activation, the shortcut's conv output, the output
