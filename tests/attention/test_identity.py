"""The ``identity`` ablation block: the transformer block of every attention block, without the attention."""

from __future__ import annotations

import torch

from medseg.attention import build_attention, build_transformer_block
from medseg.attention.block import TransformerBlock
from medseg.models import SlottedUNet

DIM = 16


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_the_mixer_returns_its_input() -> None:
    x = torch.randn(2, DIM, 3, 4, 5)
    block = build_attention("identity", DIM, 3, num_heads=4)
    assert parameter_count(block) == 0
    torch.testing.assert_close(block(x), x, rtol=0, atol=0)


def test_same_block_as_mha_without_its_projections() -> None:
    """Every part of the transformer block (position conv, norms, FFN, layer scale) is there; what is missing is
    MHA's qkv and proj linears, 3 C^2 + 3 C and C^2 + C parameters."""
    cfg = {"num_heads": 4, "pe": "none", "layer_scale": 1e-2, "drop_path": 0.1, "ffn": "dwconv"}
    identity = build_transformer_block("identity", DIM, 3, **cfg)
    mha = build_transformer_block("mha", DIM, 3, **cfg)
    assert isinstance(identity, TransformerBlock)
    assert [name for name, _ in identity.named_children()] == [name for name, _ in mha.named_children()]
    assert parameter_count(mha) - parameter_count(identity) == 4 * DIM * DIM + 4 * DIM


def test_a_token_sees_only_its_position_conv_neighbourhood() -> None:
    """Changing a token two voxels away (outside the 3^3 position conv) leaves the identity block's output at the
    query unchanged; an attention block's changes."""
    torch.manual_seed(0)
    x = torch.randn(1, DIM, 5, 5, 5)
    far = x.clone()
    far[..., 4, 4, 4] += 5.0
    for name, mixes in (("identity", False), ("mha", True)):
        block = build_transformer_block(name, DIM, 3, num_heads=4).eval()
        with torch.no_grad():
            changed = not torch.allclose(block(x)[..., 0, 0, 0], block(far)[..., 0, 0, 0])
        assert changed == mixes, name


def test_unet_with_identity_bottleneck_trains_every_parameter() -> None:
    torch.manual_seed(0)
    model = SlottedUNet(3, 1, 2, channels=(4, 8), strides=(2,), bottleneck="identity", decoder="identity",
                        attention={"num_heads": 2})
    plain = SlottedUNet(3, 1, 2, channels=(4, 8), strides=(2,))
    x = torch.randn(1, 1, 6, 6, 4)
    out = model(x)
    out.sum().backward()
    assert out.shape == (1, 2, 6, 6, 4)
    assert all(p.grad is not None for p in model.parameters())
    assert parameter_count(model) > parameter_count(plain)  # the blocks' convs, norms and FFNs
