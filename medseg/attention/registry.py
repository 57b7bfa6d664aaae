"""Name -> attention class registry, the blocks of other packages, and the builders the U-Net slots call.

Every block registers one way: :func:`register_attention` on its class, with the dataclass of its own
``model.attention`` keys (medseg's blocks' are :mod:`medseg.config`'s, so ``--help`` needs no torch). medseg's blocks
register when :mod:`medseg.attention` is imported; another package's when :func:`load_blocks` imports the module that
defines them: a module that an entry point of the group :data:`~medseg.config.BLOCK_ENTRY_POINTS` names (an installed
package), or one that ``model.block_modules`` lists. The registry imports no block (timm's way): the blocks import it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from functools import cache
from importlib.metadata import entry_points
from typing import Any, TypeVar

import torch
from omegaconf import OmegaConf

from medseg.attention.block import TransformerBlock
from medseg.attention.common import SpatialAttention
from medseg.config import BLOCK_ENTRY_POINTS, BLOCK_KEYS, add_block_keys, attention_schema
from medseg.errors import ConfigError, check_choice, keyed, one_line

ATTENTION_BLOCKS: dict[str, type[SpatialAttention]] = {}
"""Every block a config string can name, in registration order. ``none`` is not a block: the U-Net leaves such a slot
empty (a pure CNN); ``identity`` is the transformer block without attention (the ablation)."""

RESERVED_NAMES = ("none",)

MODEL_KEYS = {"spatial_dims": "model.spatial_dims"}
"""A block's parameters that are keys of ``model`` rather than of ``model.attention``."""

Block = TypeVar("Block", bound=type[SpatialAttention])


def register_attention(name: str, keys: type | None = None) -> Callable[[Block], Block]:
    """Class decorator adding an attention block to the registry under ``name``.

    The class must subclass :class:`~medseg.attention.common.SpatialAttention` and take ``(dim, spatial_dims,
    **params)``. ``keys`` is the dataclass of its own hyperparameters (None: the one :data:`medseg.config.BLOCK_KEYS`
    holds under ``name``, as it does for medseg's blocks; none for a block without any): each field a parameter of its
    ``__init__``, with a default, documented by the docstring under it (``--help`` and docs/configuration.md show
    it) and range-checked by :func:`medseg.config.ranged`. They join the ``model.attention`` node beside the keys
    every block takes (:class:`~medseg.config.AttentionConfig`: ``num_heads`` is passed where ``__init__`` names it).

    Raises:
        ValueError: ``name`` is taken; ``keys`` is no dataclass, lacks a default, declares a key another block
            declares otherwise, or a key ``__init__`` does not take.
        TypeError: the class is no ``SpatialAttention``.
    """

    def register(cls: Block) -> Block:
        if name in ATTENTION_BLOCKS or name in RESERVED_NAMES:
            raise ValueError(f"attention block name {name!r} is already taken")
        if not issubclass(cls, SpatialAttention):
            raise TypeError(f"{cls.__name__} must subclass SpatialAttention")
        own = keys or BLOCK_KEYS.get(name)
        if own is not None:
            untaken = [item.name for item in fields(own) if item.name not in inspect.signature(cls).parameters]
            if untaken:
                raise ValueError(f"attention block {name!r}: {cls.__name__} takes no parameter {untaken}")
            add_block_keys(name, own)
        ATTENTION_BLOCKS[name] = cls
        return cls

    return register


@cache
def _load_entry_points() -> None:
    """Import the module of every installed entry point of :data:`~medseg.config.BLOCK_ENTRY_POINTS`, once per
    process."""
    for point in entry_points(group=BLOCK_ENTRY_POINTS):
        try:
            point.load()
        except Exception as err:  # a broken plugin: name it instead of a traceback from inside it
            raise ConfigError(f"the attention blocks of entry point {point.name} = {point.value} "
                              f"({BLOCK_ENTRY_POINTS}) could not be loaded: {one_line(err)}") from err


def load_blocks(modules: Sequence[str] = ()) -> None:
    """Register the blocks of installed packages (:data:`~medseg.config.BLOCK_ENTRY_POINTS`) and of ``modules``
    (``model.block_modules``): each module is imported (once; Python caches it) and registers its blocks.

    Raises:
        ConfigError: a module that cannot be imported, or an entry point that cannot be loaded.
    """
    _load_entry_points()
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"model.block_modules: cannot import {module!r} ({one_line(err)}); expected a module "
                              "on the Python path that registers blocks with medseg.attention.register_attention")\
                from err


def available_blocks() -> list[str]:
    """Names accepted by :func:`build_attention`, in registration order."""
    return list(ATTENTION_BLOCKS)


def _plain(value: Any) -> Any:
    """OmegaConf containers (e.g. a ``ListConfig`` spacing) -> plain Python containers."""
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _checked_keys(attention_cfg: Mapping[str, Any]) -> dict[str, Any]:
    valid = [f.name for f in fields(attention_schema())]
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
    with keyed("model.attention", MODEL_KEYS):
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
    with keyed("model.attention", MODEL_KEYS):
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
