"""Every registered block (and MHA with each position encoding) as a module, plus the transformer block."""

from __future__ import annotations

import pytest
import torch

from medseg.attention import TransformerBlock, available_blocks, build_attention, build_transformer_block
from medseg.attention.masa import head_gammas

DIM = 24
CASES = [(name, {}) for name in available_blocks() if name != "mha"] + [
    ("mha", {"pe": pe}) for pe in ("sincos", "relative", "none")
]
SHAPES = {2: (5, 7), 3: (3, 5, 7)}

blocks = pytest.mark.parametrize(
    ("name", "cfg"), CASES, ids=[name + "".join(f"-{v}" for v in cfg.values()) for name, cfg in CASES]
)
dims = pytest.mark.parametrize("spatial_dims", [2, 3], ids=["2d", "3d"])


def make(name: str, cfg: dict, spatial_dims: int, batch: int = 2) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    block = build_attention(name, DIM, spatial_dims, num_heads=4, **cfg)
    return block, torch.randn(batch, DIM, *SHAPES[spatial_dims])


@blocks
@dims
def test_shape_and_gradients_reach_every_parameter(name: str, cfg: dict, spatial_dims: int) -> None:
    block, x = make(name, cfg, spatial_dims)
    x.requires_grad_(True)
    out = block(x)
    assert out.shape == x.shape
    out.square().mean().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for pname, param in block.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, pname


@blocks
@dims
def test_batch_independence(name: str, cfg: dict, spatial_dims: int) -> None:
    block, x = make(name, cfg, spatial_dims, batch=3)
    block.eval()
    other = x.clone()
    other[1:] = torch.randn_like(other[1:])
    with torch.no_grad():
        torch.testing.assert_close(block(x)[0], block(other)[0], rtol=1e-6, atol=1e-6)


@blocks
@dims
def test_bf16_autocast(name: str, cfg: dict, spatial_dims: int) -> None:
    block, x = make(name, cfg, spatial_dims)
    x.requires_grad_(True)  # a block without parameters (identity) backpropagates to its input only
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = block(x)
        out.float().square().mean().backward()
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in block.parameters())


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 9, 4), (8, 8, 8)], ids=str)
@pytest.mark.parametrize("name", available_blocks())
def test_any_grid_size(name: str, shape: tuple[int, ...]) -> None:
    block = build_attention(name, DIM, 3, num_heads=4, split_size=3, max_relative_size=2)
    x = torch.randn(1, DIM, *shape)
    assert block(x).shape == x.shape


def test_per_head_gammas_reproduce_rmt() -> None:
    rmt = [1 - 2 ** (-2 - 4 * h / 4) for h in range(4)]
    assert head_gammas(0.75, 4.0, 4) == pytest.approx(rmt)
    assert head_gammas(0.9, 0.0, 4) == 0.9
    block = build_attention("masa", DIM, 3, num_heads=4, gamma=0.75, heads_range=4.0, spacing=[2.0, 1.0, 1.0])
    assert block.gamma == pytest.approx(rmt) and block.spacing == (2.0, 1.0, 1.0)


def test_spacing_changes_masa() -> None:
    x = torch.randn(1, DIM, 3, 4, 5)
    torch.manual_seed(0)
    plain = build_attention("masa", DIM, 3)
    torch.manual_seed(0)
    physical = build_attention("masa", DIM, 3, spacing=[3.0, 1.0, 1.0])
    assert not torch.allclose(plain(x), physical(x))


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("masa", {"num_heads": 5}, "divisor"),
        ("cswin", {"num_heads": 2}, "num_heads=2: cswin needs at least 3"),
        ("mha", {"pe": "rope"}, "sincos"),
        ("masa", {"gamma": 1.5}, r"\[0, 1\]"),
        ("masa", {"spacing": [1.0, 1.0]}, "one entry per spatial axis"),
        ("masa", {"kernel_size": 4}, "odd"),
    ],
)
def test_invalid_hyperparameters(name: str, kwargs: dict, match: str) -> None:
    cfg = {"num_heads": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_attention(name, DIM, 3, **cfg)


def test_wrong_input_layout() -> None:
    block = build_attention("mha", DIM, 3)
    with pytest.raises(ValueError, match="expects"):
        block(torch.randn(1, DIM, 4, 4))


def test_cswin_distributes_heads_evenly() -> None:
    assert build_attention("cswin", DIM, 3, num_heads=4).group_heads == [2, 1, 1]
    assert build_attention("cswin", DIM, 2, num_heads=6).group_heads == [3, 3]


@dims
def test_transformer_block(spatial_dims: int) -> None:
    torch.manual_seed(0)
    block = build_transformer_block(
        "masa", DIM, spatial_dims, num_heads=4, mlp_ratio=2.0, drop_path=0.1, layer_scale=1e-2
    )
    assert isinstance(block, TransformerBlock) and block.ffn[0].out_features == 2 * DIM
    x = torch.randn(2, DIM, *SHAPES[spatial_dims])
    out = block(x)
    out.square().mean().backward()
    assert out.shape == x.shape
    assert all(p.grad is not None for p in block.parameters())
    block.eval()
    torch.testing.assert_close(block(x), block(x))  # drop path is off in eval


def test_checkpointing_matches_plain_block() -> None:
    x = torch.randn(2, DIM, 3, 4, 5)
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        block = build_transformer_block("focused_linear", DIM, 3, checkpointing=checkpointing, num_heads=4)
        block.train()
        out = block(x)
        out.square().mean().backward()
        grads.append((out.detach(), [p.grad.clone() for p in block.parameters()]))
    (out_a, grads_a), (out_b, grads_b) = grads
    torch.testing.assert_close(out_a, out_b)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b)
