"""Name -> attention class registry, and the builders the U-Net slots call."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

import torch
from omegaconf import OmegaConf

from medseg.attention.block import TransformerBlock
from medseg.attention.common import SpatialAttention
from medseg.attention.cswin import CSWinAttention
from medseg.attention.focused_linear import FocusedLinearAttention
from medseg.attention.identity import IdentityMixer
from medseg.attention.masa import MaSA, MaSADecomposed
from medseg.attention.mha import MultiHeadAttention
from medseg.config import AttentionConfig
from medseg.errors import ConfigError, check_choice

ATTENTION_BLOCKS: dict[str, type[SpatialAttention]] = {
    "masa": MaSA,
    "masa_decomposed": MaSADecomposed,
    "focused_linear": FocusedLinearAttention,
    "cswin": CSWinAttention,
    "mha": MultiHeadAttention,
    "identity": IdentityMixer,
}
"""Every block a config string can name. ``none`` is not a block: the U-Net leaves such a slot empty (a pure CNN);
``identity`` is the transformer block without attention (the ablation)."""

RESERVED_NAMES = ("none",)

Block = TypeVar("Block", bound=type[SpatialAttention])


def register_attention(name: str) -> Callable[[Block], Block]:
    """Class decorator adding an attention block to the registry under ``name``.

    The class must subclass :class:`~medseg.attention.common.SpatialAttention` and take
    ``(dim, spatial_dims, **keys)`` where every key is a field of
    :class:`medseg.config.AttentionConfig`.
    """

    def register(cls: Block) -> Block:
        if name in ATTENTION_BLOCKS or name in RESERVED_NAMES:
            raise ValueError(f"attention block name {name!r} is already taken")
        if not issubclass(cls, SpatialAttention):
            raise TypeError(f"{cls.__name__} must subclass SpatialAttention")
        ATTENTION_BLOCKS[name] = cls
        return cls

    return register


def available_blocks() -> list[str]:
    """Names accepted by :func:`build_attention`, in registration order."""
    return list(ATTENTION_BLOCKS)


def _plain(value: Any) -> Any:
    """OmegaConf containers (e.g. a ``ListConfig`` spacing) -> plain Python containers."""
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _checked_keys(attention_cfg: Mapping[str, Any]) -> dict[str, Any]:
    valid = [f.name for f in fields(AttentionConfig)]
    unknown = sorted(set(attention_cfg) - set(valid))
    if unknown:
        raise ConfigError(f"unknown model.attention key(s) {unknown}; valid keys: {valid}")
    return {key: _plain(value) for key, value in attention_cfg.items()}


def _accepted(fn: Callable, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``cfg`` that ``fn`` takes as keyword parameters (the rest are other blocks' keys)."""
    parameters = inspect.signature(fn).parameters
    return {key: value for key, value in cfg.items() if key in parameters}


def build_attention(
    name: str, dim: int, spatial_dims: int, grid: Sequence[int] | None = None, **attention_cfg: Any
) -> SpatialAttention:
    """Build a registered attention block: ``(B, dim, *spatial) -> (B, dim, *spatial)``.

    Args:
        name: a name from :func:`available_blocks`.
        dim: channel width.
        spatial_dims: 2 or 3.
        grid: the token grid the block sees in training, where known (the U-Net passes each slot's); blocks
            whose ``__init__`` takes ``grid`` get it.
        **attention_cfg: ``model.attention`` keys; the block takes the ones it uses and ignores the rest.

    Raises:
        ConfigError: unknown ``name`` or unknown key (the message lists the valid ones); a ``ValueError``.
    """
    if name not in ATTENTION_BLOCKS:
        raise ConfigError(f"unknown attention block {name!r}; valid blocks: {available_blocks()}")
    cls = ATTENTION_BLOCKS[name]
    return cls(dim, spatial_dims, **_accepted(cls, {**_checked_keys(attention_cfg), "grid": grid}))


def build_transformer_block(
    name: str,
    dim: int,
    spatial_dims: int,
    checkpointing: bool = False,
    grid: Sequence[int] | None = None,
    **attention_cfg: Any,
) -> TransformerBlock:
    """A :class:`TransformerBlock` around ``build_attention(name, ...)``.

    ``mlp_ratio``, ``drop_path``, ``layer_scale`` and ``ffn`` come from ``attention_cfg`` like the attention keys.
    """
    cfg = _checked_keys(attention_cfg)
    attention = build_attention(name, dim, spatial_dims, grid=grid, **cfg)
    return TransformerBlock(attention, checkpointing=checkpointing, **_accepted(TransformerBlock, cfg))


def block_choices() -> list[str]:
    """Valid values of a U-Net slot (``model.bottleneck``, ``model.decoder``): ``none`` and the registered blocks."""
    return ["none", *available_blocks()]


def check_slot(key: str, name: str) -> None:
    """A U-Net slot's block name (``model.bottleneck`` or ``model.decoder``): one of :func:`block_choices`."""
    check_choice(key, name, block_choices())


def check_blocks(slots: Mapping[str, str], spatial_dims: int, **attention_cfg: Any) -> None:
    """Every check that building the slots' blocks makes, before any network exists: each named block (``none`` is
    an empty slot) is built once on the meta device at a width its heads divide, so a value it refuses fails with
    its own message at start-up. Widths and grids are checked again by the U-Net that has them.

    Args:
        slots: config key -> block name, e.g. ``{"model.bottleneck": "masa", "model.decoder": "none"}``.
        spatial_dims: 2 or 3.
        **attention_cfg: ``model.attention``.

    Raises:
        ConfigError: an unknown block name, ``model.attention`` key or value.
    """
    heads = max(int(attention_cfg.get("num_heads", 1)), 1)
    grid = (1,) * spatial_dims
    for key, name in slots.items():
        check_slot(key, name)
        if name != "none":
            with torch.device("meta"):
                build_transformer_block(name, heads * 2 * spatial_dims, spatial_dims, grid=grid, **attention_cfg)
