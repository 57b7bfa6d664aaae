"""Names and keys: the registry's contract with the config."""

from __future__ import annotations

from dataclasses import asdict, fields

import pytest
import torch
from omegaconf import OmegaConf

from medseg.attention import (
    ATTENTION_BLOCKS,
    SpatialAttention,
    available_blocks,
    build_attention,
    build_transformer_block,
    register_attention,
)
from medseg.attention.common import merge_heads, split_heads
from medseg.config import AttentionConfig


def test_available_blocks() -> None:
    assert available_blocks() == ["masa", "masa_decomposed", "focused_linear", "cswin", "mha"]
    assert "none" not in available_blocks()


def test_unknown_name_lists_valid_blocks() -> None:
    with pytest.raises(ValueError, match="unknown attention block 'swin'") as error:
        build_attention("swin", 32, 3)
    assert all(name in str(error.value) for name in available_blocks())
    with pytest.raises(ValueError, match="masa_decomposed"):
        build_transformer_block("none", 32, 3)


def test_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown model.attention key\(s\) \['gama'\]") as error:
        build_attention("masa", 32, 3, gama=0.8)
    assert all(key.name in str(error.value) for key in fields(AttentionConfig))
    with pytest.raises(ValueError, match="gama"):
        build_transformer_block("masa", 32, 3, gama=0.8)


@pytest.mark.parametrize("name", available_blocks())
def test_every_config_key_is_accepted_and_unused_ones_ignored(name: str) -> None:
    cfg = asdict(AttentionConfig())
    cfg.update(spacing=[1.5, 1.0, 1.0], layer_scale=1e-5, drop_path=0.1)
    block = build_transformer_block(name, 32, 3, **cfg)
    x = torch.randn(1, 32, 3, 4, 5)
    assert block(x).shape == x.shape


def test_omegaconf_values() -> None:
    cfg = OmegaConf.create({"num_heads": 4, "gamma": 0.8, "heads_range": 2, "spacing": [2, 1, 1], "kernel_size": 3})
    block = build_transformer_block("masa_decomposed", 32, 3, **cfg)
    assert block.attention.spacing == (2.0, 1.0, 1.0)
    assert len(block.attention.gamma) == 4
    x = torch.randn(1, 32, 3, 4, 5)
    assert block(x).shape == x.shape


def test_register_a_new_block() -> None:
    @register_attention("plain_test_block")
    class Plain(SpatialAttention):
        def mix(
            self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]
        ) -> torch.Tensor:
            heads = (split_heads(t, self.num_heads) for t in (q, k, v))
            return merge_heads(torch.nn.functional.scaled_dot_product_attention(*heads))

    try:
        assert "plain_test_block" in available_blocks()
        block = build_transformer_block("plain_test_block", 32, 2, num_heads=2, gamma=0.5)
        assert block(torch.randn(1, 32, 5, 7)).shape == (1, 32, 5, 7)
        with pytest.raises(ValueError, match="already taken"):
            register_attention("plain_test_block")(Plain)
    finally:
        ATTENTION_BLOCKS.pop("plain_test_block")
    with pytest.raises(ValueError, match="already taken"):
        register_attention("none")(Plain)
