"""Options that give the official RMT, FLatten and CSWin behaviour, against references written from their equations."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from medseg.attention import build_attention, build_transformer_block, functional
from medseg.attention.block import FeedForward
from medseg.attention.common import DepthwiseConv, merge_heads, split_heads, to_spatial, to_tokens
from medseg.attention.cswin import _warn_uneven_split
from medseg.attention.position import axial_rope
from medseg.config import TrainConfig
from medseg.models import build_model
from medseg.training.checks import check_config
from tests.helpers.configs import compose_config

from . import reference

TOL = {"rtol": 1e-6, "atol": 1e-6}
SHAPES = {2: (5, 7), 3: (3, 4, 5)}
dims = pytest.mark.parametrize("spatial_dims", [2, 3], ids=["2d", "3d"])


def tokens(shape: tuple[int, ...], channels: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, math.prod(shape), channels, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


# ------------------------------------------------------------------------------------------ RMT's FFN (ffn)


@dims
def test_dwconv_ffn_is_rmts_feed_forward_network(spatial_dims: int) -> None:
    torch.manual_seed(0)
    shape = SHAPES[spatial_dims]
    ffn = FeedForward(6, 10, spatial_dims, "dwconv").double()
    x = tokens(shape, 6)
    conv = ffn.conv.conv
    expected = reference.rmt_ffn(x, ffn[0], ffn[2], conv.weight, conv.bias, shape)
    torch.testing.assert_close(ffn(x, shape), expected, **TOL)


def test_mlp_ffn_keeps_its_state_dict_keys_and_dwconv_only_adds_the_conv() -> None:
    mlp, dwconv = FeedForward(6, 10, 3, "mlp"), FeedForward(6, 10, 3, "dwconv")
    missing, unexpected = dwconv.load_state_dict(mlp.state_dict(), strict=False)
    assert set(mlp.state_dict()) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert unexpected == [] and set(missing) == {"conv.conv.weight", "conv.conv.bias"}
    x = torch.randn(2, 60, 6)
    torch.nn.init.zeros_(dwconv.conv.conv.weight)
    torch.nn.init.zeros_(dwconv.conv.conv.bias)  # a zero conv leaves RMT's FFN a plain MLP
    torch.testing.assert_close(dwconv(x, (3, 4, 5)), mlp(x, (3, 4, 5)))


def test_transformer_block_with_rmts_ffn_trains() -> None:
    block = build_transformer_block("masa", 24, 3, num_heads=4, ffn="dwconv")
    x = torch.randn(2, 24, 3, 4, 5)
    block(x).square().mean().backward()
    assert block.ffn.conv.conv.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"model.attention.ffn='conv'.*mlp"):
        build_transformer_block("masa", 24, 3, ffn="conv")


# ------------------------------------------------------------------------------------- CSWin's LePE (lepe)


@pytest.mark.parametrize(
    ("shape", "axis", "width"),
    [((5, 7), 0, 2), ((5, 7), 1, 3), ((3, 4, 5), 0, 2), ((3, 4, 5), 2, 3), ((4, 6, 5), 1, 2)],
    ids=str,
)
def test_within_stripes_convolves_each_stripe_zero_padded(shape: tuple[int, ...], axis: int, width: int) -> None:
    torch.manual_seed(0)
    conv = DepthwiseConv(4, len(shape), 3).double()
    x = tokens(shape, 4)
    out = to_tokens(functional.within_stripes(conv, to_spatial(x, shape), shape, axis, width))
    expected = reference.depthwise_conv(x, conv.weight, conv.bias, shape, reference.stripe_of(axis, width))
    torch.testing.assert_close(out, expected, **TOL)


@pytest.mark.parametrize(("shape", "axis", "width"), [((5, 7), 1, 3), ((3, 4, 5), 0, 2)], ids=str)
def test_stripe_partition_round_trips(shape: tuple[int, ...], axis: int, width: int) -> None:
    x = torch.randn(2, 3, *shape)
    stripes = functional.stripe_partition(x, shape, axis, width)
    assert stripes.shape[1:3] == (2, 3)
    torch.testing.assert_close(functional.stripe_merge(stripes, shape, axis, width), x)


@dims
def test_cswin_stripe_lepe_is_one_conv_per_head_group_inside_its_stripes(spatial_dims: int) -> None:
    shape = SHAPES[spatial_dims]
    torch.manual_seed(0)
    block = build_attention("cswin", 24, spatial_dims, num_heads=6, split_size=2, lepe="stripe").double()
    assert [conv.weight.shape[0] for conv in block.lepe] == [h * block.head_dim for h in block.group_heads]
    q, k, v = (tokens(shape, 24, seed=s) for s in range(3))
    groups = list(zip(*(split_heads(t, 6).split(block.group_heads, dim=1) for t in (q, k, v))))
    parts = []
    for axis, ((qg, kg, vg), conv) in enumerate(zip(groups, block.lepe)):
        attended = merge_heads(reference.stripe_attention(qg, kg, vg, shape, axis, 2))
        lepe = reference.depthwise_conv(merge_heads(vg), conv.weight, conv.bias, shape, reference.stripe_of(axis, 2))
        parts.append(attended + lepe)
    torch.testing.assert_close(block.mix(q, k, v, shape), torch.cat(parts, dim=-1), **TOL)


def test_stripe_lepe_as_wide_as_the_map_is_the_map_conv() -> None:
    shape = (3, 4, 5)
    torch.manual_seed(0)
    stripe = build_attention("cswin", 24, 3, num_heads=3, split_size=8, lepe="stripe").double()
    whole = build_attention("cswin", 24, 3, num_heads=3, split_size=8, lepe="map").double()
    with torch.no_grad():
        for axis, conv in enumerate(stripe.lepe):
            channels = slice(axis * 8, (axis + 1) * 8)
            whole.lepe.conv.weight[channels] = conv.weight
            whole.lepe.conv.bias[channels] = conv.bias
    v = tokens(shape, 24)
    torch.testing.assert_close(stripe._lepe(v, shape), whole._lepe(v, shape), **TOL)
    narrow = build_attention("cswin", 24, 3, num_heads=3, split_size=2, lepe="stripe").double()
    narrow.load_state_dict(stripe.state_dict())
    assert (narrow._lepe(v, shape) - stripe._lepe(v, shape)).abs().max() > 1e-3  # the stripe borders matter


def test_uneven_cswin_head_split_warns_once_naming_it() -> None:
    _warn_uneven_split.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            build_attention("cswin", 24, 3, num_heads=4)
        build_attention("cswin", 24, 3, num_heads=6)  # even: no warning
        build_attention("cswin", 24, 2, num_heads=4)
    messages = [str(w.message) for w in caught if "cswin" in str(w.message)]
    assert len(messages) == 1 and "num_heads=4" in messages[0] and "[2, 1, 1]" in messages[0]


# --------------------------------------------------------------------------------- axial rotary encoding (rope)


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 5), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("head_dim", [6, 8, 9])
def test_axial_rope_matches_pairwise_rotations(shape: tuple[int, ...], head_dim: int) -> None:
    x = torch.randn(2, 3, math.prod(shape), head_dim, dtype=torch.float64)
    out = axial_rope(x, shape)
    torch.testing.assert_close(out, reference.axial_rope(x, shape), **TOL)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), **TOL)  # a rotation


@pytest.mark.parametrize(("shape", "offset"), [((4, 5), (3, 2)), ((3, 4, 5), (2, 1, 3))], ids=str)
@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_rope_attention_rows_do_not_change_when_the_input_shifts(
    shape: tuple[int, ...], offset: tuple[int, ...], gamma: float
) -> None:
    """q and k placed at ``offset`` inside a larger grid: the logits among them, and with MaSA's decay the
    attention rows, are those of the unshifted grid."""
    q, k, v = (torch.randn(1, 2, math.prod(shape), 8, dtype=torch.float64) for _ in range(3))
    large = tuple(s + o + 2 for s, o in zip(shape, offset))
    inside = torch.zeros(large, dtype=torch.bool)
    inside[tuple(slice(o, o + s) for o, s in zip(offset, shape))] = True
    window = inside.flatten().nonzero().squeeze(1)

    def embed(t: torch.Tensor) -> torch.Tensor:
        big = torch.randn(1, 2, math.prod(large), 8, dtype=torch.float64)
        big[:, :, window] = t
        return big

    shifted_q, shifted_k = (axial_rope(embed(t), large)[:, :, window] for t in (q, k))
    plain_q, plain_k = axial_rope(q, shape), axial_rope(k, shape)
    torch.testing.assert_close(shifted_q @ shifted_k.transpose(-1, -2), plain_q @ plain_k.transpose(-1, -2), **TOL)
    rows = functional.masa(shifted_q, shifted_k, v, shape, gamma)
    torch.testing.assert_close(rows, functional.masa(plain_q, plain_k, v, shape, gamma), **TOL)
    assert (plain_q - q).abs().max() > 1e-2  # the encoding does rotate


@pytest.mark.parametrize(("name", "cfg"), [("masa", {}), ("masa_decomposed", {}), ("mha", {"pe": "none"})])
@dims
def test_rope_blocks_rotate_q_and_k(name: str, cfg: dict, spatial_dims: int) -> None:
    shape = SHAPES[spatial_dims]
    torch.manual_seed(0)
    rotated = build_attention(name, 24, spatial_dims, num_heads=2, rope="axial", **cfg).double()
    torch.manual_seed(0)
    plain = build_attention(name, 24, spatial_dims, num_heads=2, **cfg).double()
    q, k, v = (tokens(shape, 24, seed=s) for s in range(3))
    qr, kr = (merge_heads(axial_rope(split_heads(t, 2), shape)) for t in (q, k))
    torch.testing.assert_close(rotated.mix(q, k, v, shape), plain.mix(qr, kr, v, shape), **TOL)


def test_rope_needs_a_channel_pair_per_axis() -> None:
    with pytest.raises(ValueError, match=r"model.attention.rope=axial.*>= 6"):
        build_attention("masa", 8, 3, num_heads=4, rope="axial")  # head_dim 2 < 6
    with pytest.raises(ValueError, match="model.attention.rope='spiral'"):
        build_attention("mha", 24, 3, rope="spiral")


# -------------------------------------------------------------------------- FLatten's positional term


def test_flatten_positional_term_is_zero_initialised_on_its_grid() -> None:
    sized = build_attention("focused_linear", 24, 3, positional_size=6)
    assert sized.positional.shape == (1, 24, 6, 6, 6) and not sized.positional.any()
    exact = build_attention("focused_linear", 24, 3, positional_size=0, grid=(3, 4, 5))
    assert exact.positional.shape == (1, 24, 3, 4, 5) and not exact.positional.any()
    with pytest.raises(ValueError, match="positional_size=0"):
        build_attention("focused_linear", 24, 3, positional_size=0)


def test_flatten_positional_term_per_token_is_added_to_k_unchanged() -> None:
    shape = (5, 7)
    torch.manual_seed(0)
    block = build_attention("focused_linear", 24, 2, num_heads=4, positional_size=0, grid=shape).double()
    positional = torch.randn_like(block.positional)
    q, k, v = (tokens(shape, 24, seed=s) for s in range(3))
    with torch.no_grad():
        expected = block.mix(q, k + to_tokens(positional), v, shape)  # the term is still zero here
        block.positional.copy_(positional)
        torch.testing.assert_close(block.mix(q, k, v, shape), expected, **TOL)


# ------------------------------------------------------------------------------------- config keys and presets


@pytest.mark.parametrize(
    ("block", "override", "valid"),
    [("masa", "model.attention.ffn=conv", "mlp, dwconv"), ("cswin", "model.attention.lepe=window", "map, stripe"),
     ("masa", "model.attention.rope=spiral", "none, axial")],
)
def test_choice_keys_name_themselves_and_their_values(block: str, override: str, valid: str) -> None:
    """A slot's block checks the keys it reads when the config is checked, before any data is read."""
    key = override.split("=")[0]
    with pytest.raises(ValueError, match=rf"{key.replace('.', '[.]')}=.*Valid values: {valid}"):
        check_config(compose_config(["output_dir=unused", f"model.bottleneck={block}", override]))


def preset_model(name: str) -> tuple[torch.nn.Module, TrainConfig]:
    cfg = check_config(compose_config(["output_dir=unused", f"experiment={name}"]))
    return build_model(cfg.model, 1, 2, cfg.data.patch_size), cfg


def bottleneck_grid(model: torch.nn.Module, patch: list[int]) -> tuple[int, ...]:
    seen = []
    handle = model.bottleneck.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape[2:])))
    with torch.no_grad():
        model.eval()(torch.zeros(1, 1, *patch))
    handle.remove()
    return seen[0]


def test_rmt_official_preset_uses_rmts_ffn_decays_and_rotation() -> None:
    model, _ = preset_model("rmt_official")
    for block in model.bottleneck:
        assert block.ffn.conv is not None and block.attention.rope == "axial"
        assert block.attention.gamma == pytest.approx([1 - 2 ** (-2 - 4 * h / 4) for h in range(4)])


def test_flatten_default_preset_stores_one_positional_value_per_bottleneck_token() -> None:
    model, cfg = preset_model("flatten_default")
    grid = bottleneck_grid(model, cfg.data.patch_size)
    for block in model.bottleneck:
        assert tuple(block.attention.positional.shape[2:]) == grid and not block.attention.positional.any()


def test_cswin_official_preset_convolves_inside_stripes() -> None:
    model, _ = preset_model("cswin_official")
    assert all(block.attention.lepe_mode == "stripe" for block in model.bottleneck)
