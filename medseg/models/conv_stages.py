"""The registry of conv-stage styles (``model.conv_stages``): name -> the builders of a U-Net's conv parts.

:class:`~medseg.models.unet.SlottedUNet` builds its stem, down stages, up stages and segmentation heads with the
builders of one style, and puts its attention slots between them whatever the style. Registries live with what
they register (timm's way): this module imports no style; each style's module registers itself with
:func:`register_conv_stages` (``medseg`` in :mod:`medseg.models.unet`, ``nnunet_plain`` and ``nnunet_resenc`` in
:mod:`medseg.models.nnunet_stages`), and :mod:`medseg.models` imports them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from monai.networks.layers.utils import get_norm_layer
from torch import nn

from medseg.errors import check_parameter
from medseg.models.norms import NORMS

Strides = list[tuple[int, ...]]
"""One tuple of ``spatial_dims`` ints per down-sampling (:func:`medseg.models.unet.per_axis_strides`)."""


@dataclass(frozen=True)
class ConvStyle:
    """What every conv stage of one U-Net shares: its dimensionality, the kernel of each level
    (:func:`medseg.models.unet.per_level_kernels`), norm (a ``NORMS`` name) and dropout.

    Raises:
        ParameterError: naming ``norm``, a name ``NORMS`` does not hold.
    """

    spatial_dims: int
    kernels: list[tuple[int, ...]]
    norm: str
    dropout: float

    def __post_init__(self) -> None:
        check_parameter("norm", self.norm, NORMS)

    def args(self, width: int, level: int) -> dict[str, Any]:
        """Arguments of a MONAI conv block of ``level`` whose norms see ``width`` channels."""
        return {"spatial_dims": self.spatial_dims, "kernel_size": self.kernels[level],
                "norm_name": NORMS[self.norm](width), "dropout": self.dropout}

    def norm_layer(self, width: int) -> nn.Module:
        """The ``model.norm`` layer of ``width`` channels: ``(B, width, *S) -> (B, width, *S)``."""
        return get_norm_layer(name=NORMS[self.norm](width), spatial_dims=self.spatial_dims, channels=width)


EncoderBuilder = Callable[[int, Sequence[int], Strides, Sequence[int], ConvStyle], tuple[nn.Module, nn.ModuleList]]
"""``(in_channels, channels, strides, blocks, style) -> (stem, down)``: ``stem`` takes ``(B, in_channels, *S)`` to
level 0's ``(B, channels[0], *S)``, ``down[i]`` level ``i``'s ``(B, channels[i], *S_i)`` to level ``i + 1``'s
``(B, channels[i + 1], *S_i / strides[i])``; ``blocks[level]`` blocks (or conv layers) at each level."""
DecoderBuilder = Callable[[Sequence[int], Strides, int, ConvStyle], nn.ModuleList]
"""``(channels, strides, convs, style) -> up``: ``up[i](x, skip)`` takes level ``i + 1``'s ``(B, channels[i + 1],
*S_{i+1})`` and the skip ``(B, channels[i], *S_i)`` to ``(B, channels[i], *S_i)`` with ``convs`` convs."""
HeadBuilder = Callable[[int, int, int], nn.Module]
"""``(spatial_dims, width, out_channels) -> head``: ``(B, width, *S) -> (B, out_channels, *S)`` logits."""


@dataclass(frozen=True)
class ConvStages:
    """One style of conv stages: the builders of a U-Net's conv parts and how they are initialised."""

    encoder: EncoderBuilder
    decoder: DecoderBuilder
    head: HeadBuilder
    initialize: Callable[[nn.Module], None] | None
    """Re-initialises a built conv part in place; None keeps the layers' own initialisation."""
    max_stride: int | None
    """The largest stride per axis and level the stages pool by; None: any."""
    block_tensors: int
    """Feature maps one block of an encoder stage (``model.encoder_blocks`` counts them) keeps for the backward
    pass, in units of its width x its grid: what the planner's memory estimate counts
    (:func:`medseg.planning.memory.estimate_training_memory`)."""
    max_stride_reason: str = ""
    """The refusal of a larger stride, in words (why ``max_stride`` bounds it)."""


CONV_STAGES: dict[str, ConvStages] = {}
"""The values of ``model.conv_stages``: name -> its :class:`ConvStages`."""


def register_conv_stages(name: str, stages: ConvStages) -> None:
    """Add a style of conv stages to :data:`CONV_STAGES` under ``name``.

    Raises:
        ValueError: the name is taken.
    """
    if name in CONV_STAGES:
        raise ValueError(f"conv-stage style name {name!r} is already taken")
    CONV_STAGES[name] = stages


def available_conv_stages() -> list[str]:
    """The registered names, sorted (as timm lists its models): the same list whatever the modules' import order."""
    return sorted(CONV_STAGES)


def get_conv_stages(name: str) -> ConvStages:
    """The registered style ``name`` (a U-Net's ``conv_stages``, set by ``model.conv_stages``).

    Raises:
        ParameterError: naming ``conv_stages``, no such style; the message lists the registered ones.
    """
    check_parameter("conv_stages", name, available_conv_stages())
    return CONV_STAGES[name]
