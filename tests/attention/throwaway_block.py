"""A throwaway attention block, written as docs/attention.md's "Your own block" tells a user to write one.

As a pytest plugin (``pytest -p tests.attention.throwaway_block``) it registers the block before any test
module is collected, as a block registered in its own file is by the time anything imports the registry:
the generic tests then collect and run it with no other edit. Registered nowhere else: tests register it
for their own duration (:func:`register`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from medseg.attention import ATTENTION_BLOCKS, SpatialAttention, register_attention
from medseg.attention.common import merge_heads, split_heads
from medseg.config import BLOCK_KEYS, ranged

NAME = "throwaway"


@dataclass
class ThrowawayKeys:
    """The block's own ``model.attention`` keys."""

    temperature: float = ranged(1.0, gt=0)
    """throwaway: the softmax temperature (the logits are divided by it)."""


class ThrowawayAttention(SpatialAttention):
    """Plain softmax attention over every token, per head, at a temperature: ``(B, N, C)`` q, k, v -> ``(B, N, C)``."""

    def __init__(self, dim: int, spatial_dims: int, num_heads: int = 4, temperature: float = 1.0) -> None:
        super().__init__(dim, spatial_dims, num_heads)
        self.temperature = temperature

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))
        return merge_heads(F.scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5 / self.temperature))


def register() -> None:
    """Add the block to the registry under :data:`NAME` (undo with :func:`unregister`)."""
    register_attention(NAME, ThrowawayKeys)(ThrowawayAttention)


def unregister() -> None:
    """Take the block and its keys out of the registry again."""
    ATTENTION_BLOCKS.pop(NAME)
    BLOCK_KEYS.pop(NAME)


def pytest_configure(config: pytest.Config) -> None:
    """Plugin hook: register the block before collection."""
    register()
