"""A trained nnU-Net's weights in medseg's U-Net built with the same conv stages (``model.conv_stages=nnunet_plain``
for its ``PlainConvUNet``, ``nnunet_resenc`` for its ``ResidualEncoderUNet``).

The mapping goes by structure: both networks are cut into the same parts in the order the forward pass runs them,
the encoder (medseg's stem and down stages; nnU-Net's ``encoder.*``), each decoder stage from the lowest resolution up
(medseg's ``up[i]``; nnU-Net's ``decoder.transpconvs.<s>`` then ``decoder.stages.<s>``) and the heads (medseg's
``head`` and ``deep_heads``; nnU-Net's ``decoder.seg_layers``, the full-resolution one last), and within a part the
entries are paired in the order their modules register them (``state_dict`` order, which nnU-Net's checkpoints keep),
each pair checked for its kind (``weight``, ``bias``, ...) and shape. nnU-Net's state dicts hold every conv layer
twice (``...conv`` and ``...all_modules.<i>``) and the encoder twice (``decoder.encoder.*``): the copies are left out.
Attention slots are medseg's own and keep their weights.

nnU-Net's arrays list their axes in its order; medseg's in RAS order (:func:`medseg.planning.nnunet_plans.ras_axes`
gives the RAS axis of each of nnU-Net's axes), so each kernel's spatial axes are permuted into RAS order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from medseg.errors import CheckpointError
from medseg.models.conv_stages import get_conv_stages
from medseg.models.nnunet_stages import NNUNET_NETWORKS
from medseg.models.unet import SlottedUNet

Entries = list[tuple[str, torch.Tensor]]
"""``(key, tensor)`` pairs of a state dict, in its order."""

ALIASES = re.compile(r"^decoder\.encoder\.|\.all_modules\.")
"""Keys of the copies in nnU-Net's state dicts: the decoder's reference to the encoder, and each conv layer's
``all_modules`` sequence (the same modules as its ``conv``, ``norm``, ...)."""
DECODER_PART = re.compile(r"^decoder\.(transpconvs|stages|seg_layers)\.(\d+)\.")
"""nnU-Net's decoder stage ``<s>`` (the lowest resolution first): its transposed conv, conv layers and head."""


@dataclass
class NnunetParts:
    """An nnU-Net state dict cut into the parts of its forward pass (copies left out)."""

    network: str = "PlainConvUNet"
    """Its class: ``ResidualEncoderUNet`` where the encoder has a stem (``encoder.stem.*``)."""
    encoder: Entries = field(default_factory=list)
    """``encoder.*``: the stem (ResEnc) and the stages, the full-resolution one first."""
    decoder: dict[tuple[str, int], Entries] = field(default_factory=dict)
    """``(transpconvs | stages | seg_layers, s)`` -> the entries of that module of decoder stage ``s``."""


def nnunet_parts(state_dict: Mapping[str, torch.Tensor]) -> NnunetParts:
    """Cut the state dict of an nnU-Net ``PlainConvUNet`` or ``ResidualEncoderUNet`` into :class:`NnunetParts`.

    Raises:
        CheckpointError: a key neither network has.
    """
    parts = NnunetParts()
    for key, tensor in state_dict.items():
        if ALIASES.search(key):
            continue
        decoder = DECODER_PART.match(key)
        if key.startswith("encoder."):
            parts.encoder.append((key, tensor))
            if key.startswith("encoder.stem."):
                parts.network = "ResidualEncoderUNet"
        elif decoder is not None:
            parts.decoder.setdefault((decoder[1], int(decoder[2])), []).append((key, tensor))
        else:
            raise CheckpointError(f"nnU-Net weights: key {key} is not one of PlainConvUNet's or "
                                  "ResidualEncoderUNet's (encoder.*, decoder.*)")
    return parts


def _entries(state: Mapping[str, torch.Tensor], prefixes: Sequence[str]) -> Entries:
    """The entries of medseg's state dict ``state`` under each of ``prefixes`` (module names ending in "."), in
    turn."""
    return [(key, state[key]) for prefix in prefixes for key in state if key.startswith(prefix)]


def _permuted(tensor: torch.Tensor, spatial_dims: int, order: Sequence[int]) -> torch.Tensor:
    """A kernel ``(C_out, C_in, *k)`` (or a transposed conv's ``(C_in, C_out, *k)``) with its spatial axes taken in
    ``order``; other tensors as they are."""
    if tensor.ndim != 2 + spatial_dims:
        return tensor
    return tensor.permute(0, 1, *(2 + axis for axis in order))


def _describe(entry: tuple[str, torch.Tensor] | None) -> str:
    return "nothing" if entry is None else f"{entry[0]} {tuple(entry[1].shape)}"


def _misfit(ours: tuple[str, torch.Tensor] | None, theirs: tuple[str, torch.Tensor] | None) -> CheckpointError:
    return CheckpointError(f"nnU-Net weights do not fit this network: nnU-Net's {_describe(theirs)} against medseg's "
                           f"{_describe(ours)} (are model.conv_stages, channels, strides, kernel_size, encoder_blocks "
                           "and decoder_convs nnU-Net's plan's, in RAS order?)")


def _paired(medseg: Entries, nnunet: Entries, spatial_dims: int, order: Sequence[int]) -> dict[str, torch.Tensor]:
    """medseg's key -> nnU-Net's tensor, its spatial axes in ``order``, for the entries of one part paired in order.

    Raises:
        CheckpointError: a pair of another kind (``weight``, ``bias``, ...) or shape, or an entry left without a
            partner, in one line naming both sides' key and shape (nnU-Net's before the permutation).
    """
    mapped = {}
    for (key, ours), (their_key, theirs) in zip(medseg, nnunet):
        tensor = _permuted(theirs, spatial_dims, order)
        if key.rsplit(".", 1)[-1] != their_key.rsplit(".", 1)[-1] or tensor.shape != ours.shape:
            raise _misfit((key, ours), (their_key, theirs))
        mapped[key] = tensor
    if len(medseg) != len(nnunet):
        index = len(mapped)
        raise _misfit(medseg[index] if index < len(medseg) else None, nnunet[index] if index < len(nnunet) else None)
    return mapped


def _axis_order(axes: Sequence[int] | None, spatial_dims: int) -> list[int]:
    """For each of medseg's axes, the nnU-Net axis it is: ``axes`` gives the RAS axis of each nnU-Net axis (or of
    each in-plane one in 2D), medseg's run in increasing RAS order.

    Raises:
        ValueError: not ``spatial_dims`` distinct axes.
    """
    if axes is None:
        return list(range(spatial_dims))
    if len(axes) != spatial_dims or len(set(axes)) != spatial_dims:
        raise ValueError(f"axes={list(axes)}: expected {spatial_dims} distinct RAS axes, one per nnU-Net axis")
    return sorted(range(spatial_dims), key=lambda axis: axes[axis])


def nnunet_state_dict(model: SlottedUNet, state_dict: Mapping[str, torch.Tensor],
                      axes: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """nnU-Net's weights as entries of ``model``'s state dict: every entry of its conv stages and heads, none of its
    attention slots.

    Args:
        model: built with the ``conv_stages`` of nnU-Net's network and its plan's values (in RAS order).
        state_dict: nnU-Net's ``network.state_dict()``, or the ``"network_weights"`` of its checkpoint
            (``checkpoint_final.pth``), in its own order.
        axes: the RAS axis each nnU-Net array axis runs along (:func:`medseg.planning.nnunet_plans.ras_axes`; in
            2D the two in-plane ones); None: the same axes.

    Raises:
        CheckpointError: a key neither nnU-Net network has, another network class than ``model``'s conv stages, or a
            part whose layers do not pair by kind and shape, in one line naming both sides.
        ValueError: ``axes`` that are not one distinct axis per spatial axis.
    """
    order = _axis_order(axes, model.spatial_dims)
    parts = nnunet_parts(state_dict)
    if get_conv_stages(model.conv_stages) is not get_conv_stages(NNUNET_NETWORKS[parts.network]):
        raise CheckpointError(f"nnU-Net weights of a {parts.network} need model.conv_stages="
                              f"{NNUNET_NETWORKS[parts.network]}, this network's are {model.conv_stages}")
    state, levels = model.state_dict(), len(model.up)
    pairs = [(_entries(state, ("stem.", "down.")), parts.encoder)]
    for stage in range(levels):  # nnU-Net's decoder stage s joins medseg's level levels - 1 - s
        pairs.append((_entries(state, (f"up.{levels - 1 - stage}.",)),
                      [*parts.decoder.get(("transpconvs", stage), []), *parts.decoder.get(("stages", stage), [])]))
    for level in range(1 + len(model.deep_heads)):  # medseg's head of level l is nnU-Net's seg_layers[levels - 1 - l]
        prefix = "head." if level == 0 else f"deep_heads.{level - 1}."
        pairs.append((_entries(state, (prefix,)), parts.decoder.get(("seg_layers", levels - 1 - level), [])))
    mapped: dict[str, torch.Tensor] = {}
    for ours, theirs in pairs:
        mapped.update(_paired(ours, theirs, model.spatial_dims, order))
    return mapped


def load_nnunet_weights(model: SlottedUNet, state_dict: Mapping[str, torch.Tensor],
                        axes: Sequence[int] | None = None) -> None:
    """Copy nnU-Net's weights into ``model``'s conv stages and heads (:func:`nnunet_state_dict`); its attention slots
    keep theirs. Without deep supervision, nnU-Net's lower heads (which its function then does not use) are left out.

    Raises:
        CheckpointError: see :func:`nnunet_state_dict`.
    """
    model.load_state_dict(nnunet_state_dict(model, state_dict, axes), strict=False)
