"""The slotted U-Net: every block in every slot, every norm, 2D and 3D, any input size, deep supervision."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from medseg.attention import available_blocks
from medseg.errors import ConfigError, ParameterError
from medseg.models import NORMS, SlottedUNet, build_model
from medseg.models.norms import GROUP_NORM_GROUPS
from medseg.models.unet import level_spacing, per_axis_strides, per_level_kernels
from medseg.training.checks import check_config

from ..helpers.configs import compose_config

ATTENTION = {"num_heads": 4, "split_size": 2, "kernel_size": 3}

NORM_LAYERS = (nn.GroupNorm, nn.BatchNorm2d, nn.BatchNorm3d, nn.InstanceNorm2d, nn.InstanceNorm3d)
BATCH_NORMS = {2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
EXPECTED_NORM: dict[str, Callable[[nn.Module, int], bool]] = {
    "instance": lambda layer, dims: isinstance(layer, nn.GroupNorm) and layer.num_groups == layer.num_channels
    and layer.affine,
    "group": lambda layer, dims: isinstance(layer, nn.GroupNorm)
    and layer.num_groups == math.gcd(GROUP_NORM_GROUPS, layer.num_channels),
    "batch": lambda layer, dims: isinstance(layer, BATCH_NORMS[dims]),
}
"""``model.norm`` -> whether a norm layer of a ``dims``-D U-Net is that norm: instance norm is one group per
channel (with affine parameters), group norm ``gcd(8, width)`` groups, batch norm torch's BatchNorm."""


@pytest.mark.parametrize("block", ["none", *available_blocks()])
@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_every_block_keeps_shape_on_sizes_not_multiple_of_stride(block: str, spatial_dims: int) -> None:
    torch.manual_seed(0)
    model = SlottedUNet(spatial_dims, in_channels=2, out_channels=3, channels=(8, 16, 32), strides=(2, 2),
                        bottleneck=block, bottleneck_depth=1, decoder=block, decoder_levels=2, attention=ATTENTION)
    size = (13, 10, 7)[:spatial_dims] if spatial_dims == 3 else (13, 10)
    x = torch.randn(2, 2, *size)
    out = model(x)
    assert out.shape == (2, 3, *size)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_slots_hold_the_requested_blocks() -> None:
    model = SlottedUNet(3, 1, 2, channels=(8, 16, 32, 64), strides=(2, 2, 2), bottleneck="masa",
                        bottleneck_depth=3, decoder="cswin", decoder_levels=2, attention=ATTENTION)
    assert len(model.bottleneck) == 3
    filled = [not isinstance(slot, torch.nn.Identity) for slot in model.decoder_slots]
    assert filled == [False, True, True]  # the two lowest-resolution decoder stages (levels 1 and 2)
    plain = SlottedUNet(3, 1, 2, channels=(8, 16), strides=(2,))
    assert isinstance(plain.bottleneck, torch.nn.Identity)


def test_anisotropic_strides_and_spacing_per_level() -> None:
    strides = per_axis_strides([[2, 2, 1], 2], 3)
    assert strides == [(2, 2, 1), (2, 2, 2)]
    assert level_spacing([0.7, 0.7, 5.0], strides, 0) == [0.7, 0.7, 5.0]
    assert level_spacing([0.7, 0.7, 5.0], strides, 2) == pytest.approx([2.8, 2.8, 10.0])
    model = SlottedUNet(3, 1, 2, channels=(8, 16, 32), strides=[[2, 2, 1], [2, 2, 2]], bottleneck="masa",
                        attention={**ATTENTION, "spacing": [0.7, 0.7, 5.0]})
    assert model(torch.randn(1, 1, 16, 12, 5)).shape == (1, 2, 16, 12, 5)


def test_deep_supervision_outputs_in_training_only() -> None:
    model = SlottedUNet(3, 1, 3, channels=(8, 16, 32, 64), strides=(2, 2, 2), deep_supervision=True)
    outs = model(torch.randn(1, 1, 16, 16, 16))
    assert [tuple(o.shape[2:]) for o in outs] == [(16, 16, 16), (8, 8, 8), (4, 4, 4)]
    model.eval()
    assert model(torch.randn(1, 1, 16, 16, 16)).shape == (1, 3, 16, 16, 16)


def test_channels_last_gives_the_same_outputs_and_gradients() -> None:
    torch.manual_seed(0)
    kwargs = {"channels": (8, 16, 32), "strides": (2, 2), "bottleneck": "masa", "attention": ATTENTION}
    plain = SlottedUNet(3, 1, 3, channels_last=False, **kwargs)
    fast = SlottedUNet(3, 1, 3, channels_last=True, **kwargs)
    fast.load_state_dict(plain.state_dict())
    assert fast.stem.conv1.conv.weight.is_contiguous(memory_format=torch.channels_last_3d)
    x = torch.randn(2, 1, 11, 8, 6)
    out_plain, out_fast = plain(x), fast(x)
    torch.testing.assert_close(out_fast, out_plain, rtol=1e-4, atol=1e-5)
    out_plain.square().sum().backward()
    out_fast.square().sum().backward()
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5 * p.grad.abs().max().item(), msg=name)


def test_instance_norm_normalises_each_channel_of_each_sample() -> None:
    """``norm=instance`` (built as one group per channel) equals torch's InstanceNorm with affine."""
    model = SlottedUNet(3, 1, 2, channels=(8, 16), strides=(2,))
    norm = model.stem.norm1
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    reference = torch.nn.InstanceNorm3d(8, affine=True)
    reference.load_state_dict(norm.state_dict())
    x = torch.randn(2, 8, 5, 6, 7) * 3 + 1
    torch.testing.assert_close(norm(x), reference(x), rtol=1e-5, atol=1e-5)


def test_build_model_monai_reference_networks() -> None:
    cfg = {"name": "monai_unet", "spatial_dims": 3, "channels": [8, 16, 32], "strides": [2, 2]}
    assert build_model(cfg, 1, 3, [16, 16, 16])(torch.randn(1, 1, 16, 16, 16)).shape == (1, 3, 16, 16, 16)
    with pytest.raises(ValueError, match="divisible by 32"):
        build_model({**cfg, "name": "monai_swinunetr"}, 1, 3, [48, 48, 32])
    with pytest.raises(ValueError, match="model.name"):
        build_model({**cfg, "name": "resnet"}, 1, 3, [16, 16, 16])


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_every_norm_the_schema_accepts_builds_and_trains(norm: str, spatial_dims: int, tmp_path: Path) -> None:
    """Every value of ``model.norm`` passes the schema, builds, runs forward and backward, and is that norm."""
    assert norm in EXPECTED_NORM, f"model.norm={norm}: add the layer it must build to EXPECTED_NORM"
    channels = [6, 12, 16]  # gcd(8, width) = 2, 4, 8: narrow levels get fewer groups
    cfg = check_config(compose_config([f"model.norm={norm}", f"model.spatial_dims={spatial_dims}",
                                          f"model.channels={channels}", "model.strides=[2,2]",
                                          f"output_dir={tmp_path}"]))
    patch = [16, 12, 8][:spatial_dims]
    torch.manual_seed(0)
    model = build_model(cfg.model, 1, 3, patch)
    layers = [m for m in model.modules() if isinstance(m, NORM_LAYERS)]
    widths = {layer.num_channels if isinstance(layer, nn.GroupNorm) else layer.num_features for layer in layers}
    assert widths == set(channels), "every level holds norm layers"
    for layer in layers:
        assert EXPECTED_NORM[norm](layer, spatial_dims), f"model.norm={norm} built {layer}"
    x = torch.randn(2, 1, *patch)
    out = model(x)
    assert out.shape == (2, 3, *patch)
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


STATE_DICT_AT_71FC19F = [
    ('stem.conv1.conv.weight', (8, 1, 3, 3, 3)),
    ('stem.conv2.conv.weight', (8, 8, 3, 3, 3)),
    ('stem.norm1.weight', (8,)),
    ('stem.norm1.bias', (8,)),
    ('stem.norm2.weight', (8,)),
    ('stem.norm2.bias', (8,)),
    ('stem.conv3.conv.weight', (8, 1, 1, 1, 1)),
    ('stem.norm3.weight', (8,)),
    ('stem.norm3.bias', (8,)),
    ('down.0.conv1.conv.weight', (16, 8, 3, 3, 3)),
    ('down.0.conv2.conv.weight', (16, 16, 3, 3, 3)),
    ('down.0.norm1.weight', (16,)),
    ('down.0.norm1.bias', (16,)),
    ('down.0.norm2.weight', (16,)),
    ('down.0.norm2.bias', (16,)),
    ('down.0.conv3.conv.weight', (16, 8, 1, 1, 1)),
    ('down.0.norm3.weight', (16,)),
    ('down.0.norm3.bias', (16,)),
    ('down.1.conv1.conv.weight', (32, 16, 3, 3, 3)),
    ('down.1.conv2.conv.weight', (32, 32, 3, 3, 3)),
    ('down.1.norm1.weight', (32,)),
    ('down.1.norm1.bias', (32,)),
    ('down.1.norm2.weight', (32,)),
    ('down.1.norm2.bias', (32,)),
    ('down.1.conv3.conv.weight', (32, 16, 1, 1, 1)),
    ('down.1.norm3.weight', (32,)),
    ('down.1.norm3.bias', (32,)),
    ('bottleneck.0.cpe.weight', (32, 1, 3, 3, 3)),
    ('bottleneck.0.cpe.bias', (32,)),
    ('bottleneck.0.attention_norm.weight', (32,)),
    ('bottleneck.0.attention_norm.bias', (32,)),
    ('bottleneck.0.attention.qkv.weight', (96, 32)),
    ('bottleneck.0.attention.qkv.bias', (96,)),
    ('bottleneck.0.attention.proj.weight', (32, 32)),
    ('bottleneck.0.attention.proj.bias', (32,)),
    ('bottleneck.0.attention.lce.conv.weight', (32, 1, 5, 5, 5)),
    ('bottleneck.0.attention.lce.conv.bias', (32,)),
    ('bottleneck.0.ffn_norm.weight', (32,)),
    ('bottleneck.0.ffn_norm.bias', (32,)),
    ('bottleneck.0.ffn.0.weight', (128, 32)),
    ('bottleneck.0.ffn.0.bias', (128,)),
    ('bottleneck.0.ffn.2.weight', (32, 128)),
    ('bottleneck.0.ffn.2.bias', (32,)),
    ('up.0.transp_conv.conv.weight', (16, 8, 2, 2, 2)),
    ('up.0.conv_block.conv1.conv.weight', (8, 16, 3, 3, 3)),
    ('up.0.conv_block.conv2.conv.weight', (8, 8, 3, 3, 3)),
    ('up.0.conv_block.norm1.weight', (8,)),
    ('up.0.conv_block.norm1.bias', (8,)),
    ('up.0.conv_block.norm2.weight', (8,)),
    ('up.0.conv_block.norm2.bias', (8,)),
    ('up.1.transp_conv.conv.weight', (32, 16, 2, 2, 1)),
    ('up.1.conv_block.conv1.conv.weight', (16, 32, 3, 3, 3)),
    ('up.1.conv_block.conv2.conv.weight', (16, 16, 3, 3, 3)),
    ('up.1.conv_block.norm1.weight', (16,)),
    ('up.1.conv_block.norm1.bias', (16,)),
    ('up.1.conv_block.norm2.weight', (16,)),
    ('up.1.conv_block.norm2.bias', (16,)),
    ('decoder_slots.1.0.cpe.weight', (16, 1, 3, 3, 3)),
    ('decoder_slots.1.0.cpe.bias', (16,)),
    ('decoder_slots.1.0.attention_norm.weight', (16,)),
    ('decoder_slots.1.0.attention_norm.bias', (16,)),
    ('decoder_slots.1.0.attention.qkv.weight', (48, 16)),
    ('decoder_slots.1.0.attention.qkv.bias', (48,)),
    ('decoder_slots.1.0.attention.proj.weight', (16, 16)),
    ('decoder_slots.1.0.attention.proj.bias', (16,)),
    ('decoder_slots.1.0.attention.lce.conv.weight', (16, 1, 5, 5, 5)),
    ('decoder_slots.1.0.attention.lce.conv.bias', (16,)),
    ('decoder_slots.1.0.ffn_norm.weight', (16,)),
    ('decoder_slots.1.0.ffn_norm.bias', (16,)),
    ('decoder_slots.1.0.ffn.0.weight', (64, 16)),
    ('decoder_slots.1.0.ffn.0.bias', (64,)),
    ('decoder_slots.1.0.ffn.2.weight', (16, 64)),
    ('decoder_slots.1.0.ffn.2.bias', (16,)),
    ('head.conv.conv.weight', (2, 8, 1, 1, 1)),
    ('head.conv.conv.bias', (2,)),
    ('deep_heads.0.conv.conv.weight', (2, 16, 1, 1, 1)),
    ('deep_heads.0.conv.conv.bias', (2,)),
]
"""``(name, shape)`` of every ``state_dict`` entry of the U-Net :func:`test_state_dict_keys_and_shapes_stay_loadable`
builds, in order. Produced once, before ``SlottedUNet.__init__`` was split into methods, by running that test's
constructor call at commit 71fc19f and printing ``[(k, tuple(v.shape)) for k, v in model.state_dict().items()]``."""


def test_state_dict_keys_and_shapes_stay_loadable() -> None:
    """Checkpoints of earlier versions load: every parameter keeps its name, order and shape (stem, anisotropic
    down and up stages, a MaSA bottleneck, a MaSA decoder slot, the head and a deep-supervision head)."""
    model = SlottedUNet(3, in_channels=1, out_channels=2, channels=(8, 16, 32), strides=(2, (2, 2, 1)),
                        bottleneck="masa", bottleneck_depth=1, decoder="masa", decoder_levels=1,
                        attention={"num_heads": 2}, deep_supervision=True)
    assert [(key, tuple(value.shape)) for key, value in model.state_dict().items()] == STATE_DICT_AT_71FC19F


def _kernels(stage: nn.Module) -> set[tuple[int, ...]]:
    """The kernels of a stage's convs, its 1x1x1 residual shortcuts and transposed convs left out."""
    return {tuple(conv.kernel_size) for conv in stage.modules()
            if isinstance(conv, nn.Conv3d) and tuple(conv.kernel_size) != (1, 1, 1)}


@pytest.mark.parametrize(("encoder_blocks", "decoder_convs"), [(1, 2), (2, 1)])
def test_each_level_s_kernel_serves_its_encoder_and_decoder_stages(encoder_blocks: int, decoder_convs: int) -> None:
    """nnU-Net's [1, 3, 3] kernels of its first two stages along its thick axis first, [3, 3, 1] in RAS order with
    the slices along S: levels 0 and 1 (stem, first down stage, the decoder stages that output their widths) have
    3 x 3 x 1 kernels, level 2 (the bottleneck's encoder stage) 3 x 3 x 3; the output keeps the input's size."""
    model = SlottedUNet(3, 1, 2, channels=(4, 8, 16), strides=[[2, 2, 1], 2], kernel_size=[[3, 3, 1], [3, 3, 1], 3],
                        encoder_blocks=encoder_blocks, decoder_convs=decoder_convs)
    assert _kernels(model.stem) == _kernels(model.down[0]) == {(3, 3, 1)}
    assert _kernels(model.down[1]) == {(3, 3, 3)}
    assert _kernels(model.up[0]) == _kernels(model.up[1]) == {(3, 3, 1)}
    assert model(torch.randn(1, 1, 13, 10, 5)).shape == (1, 2, 13, 10, 5)


def test_an_int_kernel_and_the_list_of_it_build_the_same_network() -> None:
    """``kernel_size=3``, ``[3, 3, 3]`` and ``[[3, 3, 3]] * 3``: the same state-dict keys and shapes, those of
    checkpoints of earlier versions (:data:`STATE_DICT_AT_71FC19F`)."""
    shapes = [
        [(key, tuple(value.shape)) for key, value in SlottedUNet(
            3, in_channels=1, out_channels=2, channels=(8, 16, 32), strides=(2, (2, 2, 1)), kernel_size=kernel,
            bottleneck="masa", bottleneck_depth=1, decoder="masa", decoder_levels=1, attention={"num_heads": 2},
            deep_supervision=True).state_dict().items()]
        for kernel in (3, [3, 3, 3], [[3, 3, 3]] * 3)
    ]
    assert shapes[0] == shapes[1] == shapes[2] == STATE_DICT_AT_71FC19F


@pytest.mark.parametrize(("kernel_size", "message"), [
    ([3, 3], r"^kernel_size=\[3, 3\]: expected an odd int >= 1, or a list of 3 entries \(one per level of "
             r"channels\), each an odd int or 3 of them$"),
    ([3, [3, 2, 1], 3], r"^kernel_size=\[3, \[3, 2, 1\], 3\]: expected an odd int"),
    (4, r"^kernel_size=4: expected an odd int"),
    ([3, [3, 3], 3], r"^kernel_size=\[3, \[3, 3\], 3\]: expected an odd int"),
])
def test_a_kernel_size_that_fits_no_level_is_refused(kernel_size: object, message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        SlottedUNet(3, 1, 2, channels=(4, 8, 16), strides=[2, 2], kernel_size=kernel_size)


@pytest.mark.parametrize(("values", "message"), [
    ({"strides": [2]}, r"strides=\[2\]: expected 2 entries for the 3 levels of channels$"),
    ({"strides": [2, [2, 2]]}, r"strides=\[2, \[2, 2\]\]: entry \[2, 2\] has 2 axes, expected 3$"),
    ({"kernel_size": [3, 3]}, r"kernel_size=\[3, 3\]: expected an odd int >= 1, or a list of 3 entries"),
    ({"encoder_blocks": [1, 3]}, r"encoder_blocks=\[1, 3\]: expected an int >= 1 or a list of at least 3 "),
    ({"decoder_convs": 3}, r"decoder_convs=3: expected one of \[1, 2\]$"),
    ({"bottleneck": "masa", "attention": {"max_bias_gb": 1e-6}}, r"bottleneck=masa: its dense attention bias on "
                                                                   r"the \[4, 4, 4\] token grid of level 2 "),
])
def test_the_network_names_its_parameter_and_a_config_build_names_the_key(values: dict, message: str) -> None:
    """Built in Python, the U-Net refuses a value naming its own parameter; built from a ``model`` config
    (:func:`build_model`, as every command builds it), the same value is refused naming ``model.<key>``."""
    base = {"channels": [4, 8, 16], "strides": [2, 2], "bottleneck_depth": 1}
    with pytest.raises(ParameterError, match=f"^{message}") as direct:
        SlottedUNet(3, 1, 2, patch_size=(16, 16, 16), **{**base, **values})
    assert "model." not in str(direct.value)
    with pytest.raises(ConfigError, match=rf"^model\.{message}") as keyed:
        build_model({**base, **values}, 1, 2, [16, 16, 16])
    assert not isinstance(keyed.value, ParameterError) and isinstance(keyed.value.__cause__, ParameterError)


@pytest.mark.parametrize("parameter", ["norm", "conv_stages"])
def test_an_unknown_norm_or_conv_stages_is_refused_naming_the_parameter(parameter: str) -> None:
    """Before, a U-Net built in Python with an unknown norm failed with a ``KeyError`` and an unknown conv-stage style
    named the config key; a config names ``model.<key>``."""
    with pytest.raises(ParameterError, match=rf"^{parameter}='nope': not valid\. Valid values: "):
        SlottedUNet(3, 1, 2, channels=(4, 8), strides=(2,), **{parameter: "nope"})
    with pytest.raises(ConfigError, match=rf"^model\.{parameter}='nope' is not valid\. Valid values: "):
        build_model({"channels": [4, 8], "strides": [2], parameter: "nope"}, 1, 2, [8, 8, 8])


def test_a_kernel_list_is_checked_at_start_up_against_the_levels_of_model_channels(tmp_path: Path) -> None:
    assert per_level_kernels([[3, 3, 1], 5], None, 3) == [(3, 3, 1), (5, 5, 5)], "planned channels: entries only"
    model = ["model.channels=[4,8,16]", "model.strides=[2,2]", f"output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=r"^model\.kernel_size=\[3, 3\]: expected .* a list of 3 entries"):
        check_config(compose_config([*model, "model.kernel_size=[3,3]"]))
    with pytest.raises(ConfigError, match=r"^model\.kernel_size=\[\[3, 3, 2\], 3, 3\]: expected each entry odd, >= 1$"):
        check_config(compose_config([*model, "model.kernel_size=[[3,3,2],3,3]"]))
    cfg = check_config(compose_config([*model, "model.kernel_size=[[3,3,1],3,3]"]))
    assert cfg.model.kernel_size == [[3, 3, 1], 3, 3]
