"""Numeric traps and memory: cached tensors after inference mode, large focusing factors, the dense-bias budget."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from medseg.attention import build_attention, build_transformer_block, functional
from medseg.attention.common import GRID_CACHE_SIZE, dense_bias_bytes
from medseg.errors import ConfigError, ParameterError
from medseg.models import SlottedUNet, build_model
from medseg.models.unet import level_grid, per_axis_strides

from . import reference

CACHED = [("masa", {}), ("masa_decomposed", {}), ("mha", {"pe": "relative"}), ("mha", {"pe": "sincos"}),
          ("masa", {"rope": "axial"}), ("mha", {"pe": "none", "rope": "axial"}), ("masa", {"heads_range": 2.0})]


@pytest.mark.parametrize(("name", "cfg"), CACHED, ids=[n + "".join(f"-{v}" for v in c.values()) for n, c in CACHED])
@pytest.mark.parametrize("shape", [(5, 7), (3, 5, 7)], ids=str)
def test_training_step_after_inference_mode_at_the_same_grid(name: str, cfg: dict, shape: tuple[int, ...]) -> None:
    functional.clear_cache()  # the first call for this grid happens under inference mode
    torch.manual_seed(0)
    block = build_transformer_block(name, 24, len(shape), num_heads=4, **cfg)
    x = torch.randn(2, 24, *shape)
    with torch.inference_mode():
        block.eval()
        expected = block(x)
    block.train()
    out = block(x)
    out.square().mean().backward()
    torch.testing.assert_close(out.detach(), expected)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in block.parameters())


def test_unet_trains_after_a_prediction_in_inference_mode() -> None:
    model = build_model({"bottleneck": "masa", "decoder": "mha", "strides": [2, 2], "channels": [8, 16, 32],
                         "attention": {"pe": "relative"}}, 1, 2, [12, 8, 8])
    x = torch.randn(1, 1, 12, 8, 8)
    with torch.inference_mode():
        model.eval()(x)
    model.train()(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("p", [16.0, 40.0, 64.0])
@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 5)], ids=str)
def test_large_focusing_factor_stays_finite_and_exact(p: float, shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(3)
    n, channels, heads = math.prod(shape), 12, 3
    q, k, v = (3 * torch.randn(2, n, channels, generator=generator, dtype=torch.float64) for _ in range(3))
    expected = reference.focused_linear(q, k, v, heads, p)  # float64, written from the equation
    out = functional.focused_linear(*(t.float() for t in (q, k, v)), heads, p)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    torch.testing.assert_close(functional.focused_linear(q, k, v, heads, p), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("p", [0.5, 8.0, 64.0, 128.0])
def test_focused_linear_block_trains_at_any_focusing_factor(p: float) -> None:
    """What an Optuna search over ``focusing_factor`` runs: a training step, also under bf16 autocast."""
    torch.manual_seed(0)
    block = build_transformer_block("focused_linear", 24, 3, num_heads=4, focusing_factor=p)
    x = 5 * torch.randn(2, 24, 3, 4, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = block(x).float().square().mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(param.grad).all() for param in block.parameters())


# ---------------------------------------------------------------------------------------- the dense bias


@pytest.mark.parametrize("op", [functional.masa, functional.masa_decomposed], ids=["masa", "decomposed"])
def test_gamma_one_is_plain_attention_without_a_bias(op) -> None:
    shape = (3, 4, 5)
    q, k, v = (torch.randn(2, 3, 60, 4, dtype=torch.float64) for _ in range(3))
    functional.clear_cache()
    out = op(q, k, v, shape, 1.0)
    assert functional.decay_bias.cache_info().currsize == 0
    if op is functional.masa:
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(out, reference.masa_decomposed(q, k, v, shape, 1.0) if op is not functional.masa
                               else reference.masa(q, k, v, shape, 1.0), rtol=1e-6, atol=1e-6)


def test_bias_cache_keeps_one_models_grids_and_building_a_model_leaves_it() -> None:
    """The cache is bounded and shared: a model built beside a live one keeps the live one's biases."""
    functional.clear_cache()
    q = torch.randn(1, 1, 1, 4)
    for side in range(2, 4 + 2 * GRID_CACHE_SIZE):
        grid = (side, 1)
        functional.masa(q.expand(1, 1, side, 4), q.expand(1, 1, side, 4), q.expand(1, 1, side, 4), grid, 0.9)
    assert functional.decay_bias.cache_info().currsize == GRID_CACHE_SIZE
    SlottedUNet(3, 1, 2, channels=(4, 8), strides=(2,), bottleneck="masa")
    assert functional.decay_bias.cache_info().currsize == GRID_CACHE_SIZE
    functional.clear_cache()
    assert functional.decay_bias.cache_info().currsize == 0


@pytest.mark.parametrize(
    ("name", "cfg", "planes"),
    [("masa", {}, 1), ("masa", {"heads_range": 2.0}, 4), ("masa", {"gamma": 1.0}, 0), ("masa_decomposed", {}, 0),
     ("mha", {"pe": "relative"}, 8), ("mha", {"pe": "sincos"}, 0), ("focused_linear", {}, 0), ("cswin", {}, 0)],
)
def test_bias_planes_of_each_block(name: str, cfg: dict, planes: int) -> None:
    assert build_attention(name, 24, 3, num_heads=4, **cfg).bias_heads == planes


def test_level_grid_is_the_feature_map_the_slots_see() -> None:
    patch, strides = (13, 10, 7), [[2, 2, 1], 2]
    model = SlottedUNet(3, 1, 2, channels=(4, 8, 16), strides=strides, bottleneck="masa", decoder="masa",
                        decoder_levels=2, patch_size=patch)
    seen = {}

    def record(key: str):
        def hook(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
            seen[key] = tuple(out.shape[2:])

        return hook

    model.bottleneck.register_forward_hook(record("bottleneck"))
    model.decoder_slots[1].register_forward_hook(record("level1"))
    model(torch.randn(1, 1, *patch))
    per_axis = per_axis_strides(strides, 3)
    assert level_grid(patch, per_axis, 2) == seen["bottleneck"] == (4, 3, 4)
    assert level_grid(patch, per_axis, 1) == seen["level1"] == (8, 6, 8)


def test_a_bias_over_the_budget_fails_at_model_build() -> None:
    kwargs = {"channels": (4, 8, 16), "strides": (2, 2), "patch_size": (32, 32, 16), "bottleneck_depth": 1}
    tokens = 8 * 8 * 4  # the bottleneck grid of a 32x32x16 patch after two stride-2 steps
    one_plane_gb = tokens**2 * 4 / 2**30
    SlottedUNet(3, 1, 2, bottleneck="masa", attention={"max_bias_gb": 1.01 * one_plane_gb}, **kwargs)
    with pytest.raises(ParameterError, match="^bottleneck=masa: ") as error:
        SlottedUNet(3, 1, 2, bottleneck="masa", attention={"max_bias_gb": 0.99 * one_plane_gb}, **kwargs)
    message = str(error.value)
    assert f"{tokens:,} tokens" in message and "masa_decomposed" in message and "focused_linear" in message
    assert "attention.max_bias_gb" in message and "model." not in message, "the network names its own parameters"
    per_head = {"max_bias_gb": 2 * one_plane_gb, "heads_range": 2.0, "num_heads": 4}  # 4 planes
    with pytest.raises(ParameterError, match="^bottleneck=masa: "):
        SlottedUNet(3, 1, 2, bottleneck="masa", attention=per_head, **kwargs)
    with pytest.raises(ParameterError, match=r"^decoder=mha: .* token grid of level 1 "):
        SlottedUNet(3, 1, 2, decoder="mha", attention={"pe": "relative", "max_bias_gb": one_plane_gb}, **kwargs)
    for name, cfg in [("masa_decomposed", {}), ("focused_linear", {}), ("masa", {"gamma": 1.0}),
                      ("masa", {"max_bias_gb": None})]:
        SlottedUNet(3, 1, 2, bottleneck=name, attention={"max_bias_gb": 1e-9, **cfg}, **kwargs)


def test_default_budget_refuses_a_32_cubed_masa_bottleneck() -> None:
    """32^3 = 32,768 tokens: a 4 GB float32 bias, over the 2 GB default; 16^3 needs 64 MB."""
    cfg = {"bottleneck": "masa", "channels": [4, 8, 16], "strides": [2, 2]}
    assert dense_bias_bytes((32, 32, 32), 1) == 4 * 2**30
    with pytest.raises(ConfigError, match=r"^model\.bottleneck=masa: .* needs about 4\.0 GB") as error:
        build_model(cfg, 1, 2, [128, 128, 128])
    assert not isinstance(error.value, ParameterError), "built from a config, the error names the config key"
    build_model({**cfg, "bottleneck": "masa_decomposed"}, 1, 2, [128, 128, 128])
    build_model(cfg, 1, 2, [64, 64, 64])
