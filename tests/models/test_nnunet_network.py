"""nnU-Net's own networks as medseg's conv stages (``model.conv_stages=nnunet_plain`` / ``nnunet_resenc``): the same
function as ``dynamic_network_architectures``' ``PlainConvUNet`` and ``ResidualEncoderUNet`` once their weights are
mapped (:mod:`medseg.models.nnunet_weights`), nnU-Net's initialisation and parameter counts, and the default U-Net
left as it was."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
import torch
from torch import nn

from medseg.config import ModelConfig, attention_config
from medseg.errors import CheckpointError, ConfigError
from medseg.models import SlottedUNet, build_model
from medseg.models.nnunet_stages import NEGATIVE_SLOPE, BasicBlockD
from medseg.models.nnunet_weights import load_nnunet_weights
from medseg.planning.nnunet_plans import nnunet_values, ras_axes, read_configuration
from tests.models.test_resenc import DEFAULT_UNET, state_dict_digest
from tests.planning.test_nnunet_plan_file import CT_RESENC_M

STYLES = {"PlainConvUNet": "nnunet_plain", "ResidualEncoderUNet": "nnunet_resenc"}


@dataclass
class Plan:
    """nnU-Net's ``arch_kwargs`` of a small network (every per-axis list in nnU-Net's axis order)."""

    network: str
    kernels: list[list[int]]
    strides: list[list[int]]
    features: list[int]
    blocks: list[int]
    decoder_convs: int
    in_channels: int = 2
    classes: int = 3
    axes: list[int] = field(default_factory=list)
    """The RAS axis of each nnU-Net axis (medseg's network takes them in increasing order); [] = the same axes."""

    @property
    def dims(self) -> int:
        return len(self.kernels[0])

    def order(self) -> list[int]:
        """For each of medseg's axes, the nnU-Net axis it is."""
        return sorted(range(self.dims), key=lambda a: (self.axes or list(range(self.dims)))[a])

    def in_ras(self, values: Sequence[int]) -> list[int]:
        return [values[a] for a in self.order()]

    def ras_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """A ``(B, C, *spatial)`` tensor of nnU-Net's axes in medseg's."""
        return x.permute(0, 1, *(2 + a for a in self.order()))


PLAIN_3D = Plan("PlainConvUNet", kernels=[[3, 3, 1], [3, 3, 3], [1, 3, 3]], strides=[[1, 1, 1], [2, 2, 1], [2, 2, 2]],
                features=[5, 7, 11], blocks=[1, 3, 2], decoder_convs=2)
RESENC_3D = Plan("ResidualEncoderUNet", kernels=[[3, 3, 1], [3, 3, 3], [3, 1, 3]],
                 strides=[[1, 1, 1], [2, 2, 1], [2, 2, 2]], features=[5, 7, 11], blocks=[1, 2, 3], decoder_convs=1)
PLAIN_2D = Plan("PlainConvUNet", kernels=[[3, 3], [3, 1], [3, 3], [3, 3]], strides=[[1, 1], [2, 2], [3, 2], [2, 1]],
                features=[3, 6, 9, 13], blocks=[2, 2, 1, 2], decoder_convs=1, in_channels=1)
RESENC_2D = Plan("ResidualEncoderUNet", kernels=[[3, 3], [3, 3], [5, 3]], strides=[[1, 1], [2, 3], [2, 2]],
                 features=[4, 6, 9], blocks=[2, 1, 2], decoder_convs=2, in_channels=1)
PLANS = {"plain_3d": PLAIN_3D, "resenc_3d": RESENC_3D, "plain_2d": PLAIN_2D, "resenc_2d": RESENC_2D}


def nnunet_network(plan: Plan, deep_supervision: bool = False) -> nn.Module:
    """nnU-Net's network of ``plan`` as nnU-Net builds it (its plans' conv bias, instance norm, LeakyReLU) and
    initialises it (``network.apply(network.initialize)``)."""
    unet = pytest.importorskip("dynamic_network_architectures.architectures.unet")
    conv, norm = {2: (nn.Conv2d, nn.InstanceNorm2d), 3: (nn.Conv3d, nn.InstanceNorm3d)}[plan.dims]
    blocks = {"PlainConvUNet": "n_conv_per_stage", "ResidualEncoderUNet": "n_blocks_per_stage"}[plan.network]
    network = getattr(unet, plan.network)(
        input_channels=plan.in_channels, n_stages=len(plan.features), features_per_stage=plan.features, conv_op=conv,
        kernel_sizes=plan.kernels, strides=plan.strides, num_classes=plan.classes,
        n_conv_per_stage_decoder=[plan.decoder_convs] * (len(plan.features) - 1), conv_bias=True, norm_op=norm,
        norm_op_kwargs={"eps": 1e-5, "affine": True}, dropout_op=None, nonlin=nn.LeakyReLU,
        nonlin_kwargs={"inplace": True}, deep_supervision=deep_supervision, **{blocks: plan.blocks})
    network.apply(network.initialize)
    return network


def medseg_network(plan: Plan, deep_supervision: bool = False, **model: object) -> SlottedUNet:
    """medseg's U-Net of the same values (in RAS order), through ``build_model``."""
    cfg = ModelConfig(spatial_dims=plan.dims, channels=plan.features, conv_stages=STYLES[plan.network],
                      strides=[plan.in_ras(s) for s in plan.strides[1:]],
                      kernel_size=[plan.in_ras(k) for k in plan.kernels], encoder_blocks=plan.blocks,
                      decoder_convs=plan.decoder_convs, deep_supervision=deep_supervision, **model)
    return build_model(cfg, plan.in_channels, plan.classes, None)


def nnunet_input(plan: Plan) -> torch.Tensor:
    """A batch of 2 in nnU-Net's axes, non-cubic: along axis ``a`` its total stride times ``2 + a``."""
    return torch.randn(2, plan.in_channels, *(math.prod(s[a] for s in plan.strides) * (2 + a)
                                              for a in range(plan.dims)))


def outputs(result: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def assert_same_function(plan: Plan, nnunet: nn.Module, medseg: SlottedUNet, train: bool = False) -> None:
    """Both networks, in train or eval mode, give the same outputs (nnU-Net's in medseg's axes)."""
    torch.manual_seed(1)
    x = nnunet_input(plan)
    nnunet.train(train), medseg.train(train)
    with torch.no_grad():
        expected, got = outputs(nnunet(x)), outputs(medseg(plan.ras_tensor(x)))
    assert len(got) == len(expected)
    for theirs, ours in zip(expected, got):
        torch.testing.assert_close(ours, plan.ras_tensor(theirs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", PLANS)
def test_medseg_computes_nnunet_s_network_with_its_weights(name: str) -> None:
    plan = PLANS[name]
    nnunet = nnunet_network(plan)
    medseg = medseg_network(plan)
    assert sum(p.numel() for p in medseg.parameters()) + sum(
        p.numel() for p in nnunet.decoder.seg_layers[:-1].parameters()) == sum(p.numel() for p in nnunet.parameters())
    load_nnunet_weights(medseg, nnunet.state_dict())
    assert_same_function(plan, nnunet, medseg)
    assert_same_function(plan, nnunet, medseg, train=True)


@pytest.mark.parametrize("name", ["plain_3d", "resenc_3d"])
def test_deep_supervision_gives_nnunet_s_outputs_full_resolution_first(name: str) -> None:
    plan = PLANS[name]
    nnunet, medseg = nnunet_network(plan, deep_supervision=True), medseg_network(plan, deep_supervision=True)
    load_nnunet_weights(medseg, nnunet.state_dict())
    assert_same_function(plan, nnunet, medseg, train=True)
    assert len(outputs(medseg.train()(plan.ras_tensor(nnunet_input(plan))))) == len(plan.features) - 1


@pytest.mark.parametrize("name", ["plain_3d", "resenc_3d", "resenc_2d"])
def test_kernels_are_permuted_from_nnunet_s_axes_to_ras(name: str) -> None:
    """nnU-Net's axes (S, R, A) in 3D, or its two in-plane axes swapped in 2D: medseg's network in RAS order
    computes nnU-Net's function on the permuted input."""
    plan = replace(PLANS[name], axes=[2, 0, 1] if PLANS[name].dims == 3 else [1, 0])
    nnunet, medseg = nnunet_network(plan), medseg_network(plan)
    with pytest.raises(CheckpointError):  # anisotropic kernels: the identity does not fit
        load_nnunet_weights(medseg, nnunet.state_dict())
    load_nnunet_weights(medseg, nnunet.state_dict(), axes=plan.axes)
    assert_same_function(plan, nnunet, medseg)


def conv_entries(model: SlottedUNet) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in model.state_dict().items()
            if not key.startswith(("bottleneck.", "decoder_slots."))}


def test_conv_weights_map_around_attention_slots() -> None:
    """With attention in the bottleneck and the lowest decoder stage, nnU-Net's weights fill every conv entry and the
    slots keep their own."""
    plan = RESENC_3D
    nnunet = nnunet_network(plan)
    plain = medseg_network(plan)
    load_nnunet_weights(plain, nnunet.state_dict())
    slotted = medseg_network(plan, bottleneck="masa", bottleneck_depth=1, decoder="masa",
                             attention=attention_config(num_heads=1))
    slots = {key: value.clone() for key, value in slotted.state_dict().items() if key not in conv_entries(slotted)}
    assert any(key.startswith("bottleneck.") for key in slots) and any("decoder_slots.1." in key for key in slots)
    load_nnunet_weights(slotted, nnunet.state_dict())
    state = slotted.state_dict()
    assert conv_entries(slotted).keys() == conv_entries(plain).keys()
    for key, value in conv_entries(plain).items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0)
    for key, value in slots.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0)
    assert slotted.eval()(plan.ras_tensor(nnunet_input(plan))).shape[1] == plan.classes


# Without nnU-Net installed


def test_the_default_conv_stages_are_medseg_s_unchanged() -> None:
    """``model.conv_stages=medseg`` builds the U-Net whose parameters and state-dict keys were pinned before the
    conv stages could be chosen (test_resenc's ``DEFAULT_UNET``)."""
    for dims in (2, 3):
        model = build_model(ModelConfig(spatial_dims=dims, channels=[16, 32, 64, 128], strides=[2, 2, 2],
                                        conv_stages="medseg"), 1, 3, None)
        assert (sum(p.numel() for p in model.parameters()), len(model.state_dict()),
                state_dict_digest(model)) == DEFAULT_UNET[dims]


def conv_params(c_in: int, c_out: int, kernel: Sequence[int], bias: bool = True) -> int:
    return c_in * c_out * math.prod(kernel) + (c_out if bias else 0)


def layer_params(c_in: int, c_out: int, kernel: Sequence[int], bias: bool = True) -> int:
    """A conv layer: conv and its affine norm."""
    return conv_params(c_in, c_out, kernel, bias) + 2 * c_out


def expected_params(plan: Plan) -> int:
    """The parameters of nnU-Net's network of ``plan`` without its lower heads, from the architecture: encoder
    stages (conv layers; or basic blocks of two conv layers and a 1x1 projection without bias where the width
    changes, after a stem layer), decoder stages (transposed conv with kernel = stride, conv layers) and one head."""
    f, k = plan.features, plan.kernels
    count = 0
    c_in = plan.in_channels
    if plan.network == "ResidualEncoderUNet":
        count += layer_params(c_in, f[0], k[0])
        c_in = f[0]
    for level, blocks in enumerate(plan.blocks):
        if plan.network == "PlainConvUNet":
            count += layer_params(c_in, f[level], k[level]) + (blocks - 1) * layer_params(f[level], f[level], k[level])
        else:
            projection = layer_params(c_in, f[level], [1], bias=False) if c_in != f[level] else 0
            count += layer_params(c_in, f[level], k[level]) + projection
            count += layer_params(f[level], f[level], k[level]) + (blocks - 1) * 2 * layer_params(
                f[level], f[level], k[level])
        c_in = f[level]
    for level in range(len(f) - 1):
        count += conv_params(f[level + 1], f[level], plan.strides[level + 1])
        count += layer_params(2 * f[level], f[level], k[level])
        count += (plan.decoder_convs - 1) * layer_params(f[level], f[level], k[level])
    return count + conv_params(f[0], plan.classes, [1])


@pytest.mark.parametrize("name", PLANS)
def test_parameter_counts_follow_nnunet_s_architecture(name: str) -> None:
    plan = PLANS[name]
    assert sum(p.numel() for p in medseg_network(plan).parameters()) == expected_params(plan)


def test_nnunet_s_initialisation() -> None:
    """He (a = 1e-2, fan in) on every conv and transposed conv, biases zero; the last norm of each basic block zero,
    every other norm the identity."""
    torch.manual_seed(0)
    plan = Plan("ResidualEncoderUNet", kernels=[[3, 3, 3]] * 3, strides=[[1, 1, 1], [2, 2, 2], [2, 2, 2]],
                features=[24, 48, 64], blocks=[1, 2, 2], decoder_convs=2)
    model = medseg_network(plan, deep_supervision=True)
    convs = [m for m in model.modules() if isinstance(m, (nn.Conv3d, nn.ConvTranspose3d))]
    assert len(convs) == 1 + 5 * 2 + 2 + 2 * 3 + 2  # stem, 2 per block, 1x1 projections, up stages, heads
    for conv in convs:
        fan_in = conv.weight[0].numel()  # a transposed conv's too: its weight is (C_in, C_out, *k)
        expected = math.sqrt(2 / ((1 + NEGATIVE_SLOPE**2) * fan_in))
        if conv.weight.numel() >= 2000:
            assert conv.weight.std().item() == pytest.approx(expected, rel=0.1)
        assert conv.bias is None or not conv.bias.any()
    blocks = [m for m in model.modules() if isinstance(m, BasicBlockD)]
    assert len(blocks) == 5
    last = {id(block.conv2.norm) for block in blocks}
    for norm in (m for m in model.modules() if isinstance(m, nn.GroupNorm)):
        value = 0.0 if id(norm) in last else 1.0
        assert torch.equal(norm.weight, torch.full_like(norm.weight, value)) and not norm.bias.any()
    plain = medseg_network(PLAIN_3D)
    assert all(norm.weight.eq(1).all() for norm in plain.modules() if isinstance(norm, nn.GroupNorm))


def test_nnunet_stages_pool_by_any_stride_and_build_any_decoder_convs() -> None:
    plan = replace(PLAIN_3D, strides=[[1, 1, 1], [3, 2, 1], [2, 2, 3]], decoder_convs=3)
    model = SlottedUNet(3, 2, 3, channels=plan.features, strides=plan.strides[1:], kernel_size=plan.kernels,
                        encoder_blocks=plan.blocks, decoder_convs=3, conv_stages="nnunet_plain")
    assert [len(up.convs) for up in model.up] == [3, 3]
    assert model(torch.randn(1, 2, 12, 8, 6)).shape == (1, 3, 12, 8, 6)
    assert sum(p.numel() for p in model.parameters()) == expected_params(plan)
    refusal = (r"^model\.strides=\[\[3, 2, 1\], \[2, 2, 3\]\]: medseg's U-Net pools by 1 or 2 .*, got 3 "
               r"\(model\.conv_stages nnunet, nnunet_plain, nnunet_resenc pool ")
    with pytest.raises(ConfigError, match=refusal):
        build_model(ModelConfig(channels=[4, 8, 8], strides=plan.strides[1:]), 1, 2, None)
    with pytest.raises(ConfigError, match=r"^model\.conv_stages='nnunet_unet' is not valid\. Valid values: medseg, "
                                          r"nnunet, nnunet_plain, nnunet_resenc$"):
        build_model(ModelConfig(channels=[4, 8], strides=[2], conv_stages="nnunet_unet"), 1, 2, None)
    without_plan = build_model(ModelConfig(channels=[4, 8], strides=[2], conv_stages="nnunet"), 1, 2, None)
    plain = build_model(ModelConfig(channels=[4, 8], strides=[2], conv_stages="nnunet_plain"), 1, 2, None)
    assert [(k, v.shape) for k, v in without_plan.state_dict().items()] == [
        (k, v.shape) for k, v in plain.state_dict().items()], "conv_stages=nnunet without a plan: PlainConvUNet"


def nnunet_like_state_dict(model: SlottedUNet) -> dict[str, torch.Tensor]:
    """The state dict nnU-Net's PlainConvUNet of one conv layer per stage would have for ``model``'s shapes, its
    copies included (each conv layer's ``all_modules`` and the decoder's ``encoder``), in nnU-Net's order."""
    state = model.state_dict()
    levels = len(model.up)

    def layer(prefix: str, ours: str) -> dict[str, torch.Tensor]:
        own = {f"{prefix}.conv.{p}": state[f"{ours}.conv.{p}"] for p in ("weight", "bias")}
        own |= {f"{prefix}.norm.{p}": state[f"{ours}.norm.{p}"] for p in ("weight", "bias")}
        return own | {key.replace(".conv.", ".all_modules.0.").replace(".norm.", ".all_modules.1."): value
                      for key, value in own.items()}

    encoder = layer("encoder.stages.0.0.convs.0", "stem.0")
    for i in range(levels):
        encoder |= layer(f"encoder.stages.{i + 1}.0.convs.0", f"down.{i}.0")
    result = encoder | {f"decoder.{key}": value for key, value in encoder.items()}
    for s in range(levels):
        result |= layer(f"decoder.stages.{s}.convs.0", f"up.{levels - 1 - s}.convs.0")
    for s in range(levels):
        result |= {f"decoder.transpconvs.{s}.{p}": state[f"up.{levels - 1 - s}.transp_conv.{p}"]
                   for p in ("weight", "bias")}
    for s in range(levels):
        result |= {f"decoder.seg_layers.{s}.{p}": torch.randn_like(state[f"head.{p}"]) for p in ("weight", "bias")}
    return result


def test_a_mismatch_is_refused_in_one_line_naming_both_sides() -> None:
    torch.manual_seed(0)
    model = SlottedUNet(2, 1, 2, channels=(3, 5), strides=(2,), encoder_blocks=1, decoder_convs=1,
                        conv_stages="nnunet_plain")
    state = nnunet_like_state_dict(model)
    load_nnunet_weights(model, state)  # the duplicates are left out, the rest maps one to one
    torch.testing.assert_close(model.head.weight, state["decoder.seg_layers.0.weight"], rtol=0, atol=0)
    wider = dict(state)
    wider["encoder.stages.1.0.convs.0.conv.weight"] = torch.zeros(6, 3, 3, 3)
    with pytest.raises(CheckpointError, match=re.escape(
            "nnU-Net weights do not fit this network: nnU-Net's encoder.stages.1.0.convs.0.conv.weight (6, 3, 3, 3) "
            "against medseg's down.0.0.conv.weight (5, 3, 3, 3) (are model.conv_stages")) as error:
        load_nnunet_weights(model, wider)
    assert "\n" not in str(error.value)
    shorter = {key: value for key, value in state.items() if not key.startswith("decoder.transpconvs.0.")}
    with pytest.raises(CheckpointError, match=r"nnU-Net's decoder\.stages\.0\.convs\.0\.conv\.weight \(3, 6, 3, 3\) "
                                              r"against medseg's up\.0\.transp_conv\.weight \(5, 3, 2, 2\)"):
        load_nnunet_weights(model, shorter)
    with pytest.raises(CheckpointError, match=r"key stem\.0\.conv\.weight is not one of PlainConvUNet's"):
        load_nnunet_weights(model, model.state_dict())
    for conv_stages in ("medseg", "nnunet_resenc"):
        other = SlottedUNet(2, 1, 2, channels=(3, 5), strides=(2,), conv_stages=conv_stages)
        with pytest.raises(CheckpointError, match=rf"^nnU-Net weights of a PlainConvUNet need model\.conv_stages="
                                                  rf"nnunet_plain, this network's are {conv_stages}$"):
            load_nnunet_weights(other, state)


FINGERPRINT = {"cases": [{"case": "ct_000", "orientation": "PSL"}], "median_spacing": [0.7, 0.7, 5.0],
               "channel_names": {"0": "CT"}}
"""What nnunet_values reads of the fingerprint of CT_RESENC_M's dataset: files stored (P, S, L), nnU-Net's axes
(S, L, P)."""


def small_plans(network: str) -> tuple[dict, Plan]:
    """CT_RESENC_M with small widths and other block counts, as nnU-Net's ``network``; and its :class:`Plan`."""
    plans = copy.deepcopy(CT_RESENC_M)
    config = plans["configurations"]["3d_fullres"]
    config["architecture"]["network_class_name"] = f"dynamic_network_architectures.architectures.unet.{network}"
    arch = config["architecture"]["arch_kwargs"]
    del arch["n_blocks_per_stage"]
    blocks, decoder_convs = [1, 2, 1, 2, 1], 1 if network == "ResidualEncoderUNet" else 2
    arch.update({"features_per_stage": [4, 5, 6, 7, 8], "n_conv_per_stage_decoder": [decoder_convs] * 4,
                 "n_blocks_per_stage" if network == "ResidualEncoderUNet" else "n_conv_per_stage": blocks})
    return plans, Plan(network, kernels=arch["kernel_sizes"], strides=arch["strides"],
                       features=arch["features_per_stage"], blocks=blocks, decoder_convs=decoder_convs, in_channels=1,
                       classes=2, axes=ras_axes(plans, FINGERPRINT, "w"))


def planned_network(plans: dict) -> SlottedUNet:
    """medseg's U-Net of the model values nnunet_values takes from ``plans``, which hold no notes."""
    values, notes = nnunet_values(plans, read_configuration(plans, "3d_fullres", 3, "w"), FINGERPRINT, "w")
    assert notes == [], "medseg builds this network as nnU-Net does"
    model = {key.split(".")[1]: value for key, value in values.items() if key.startswith("model.")}
    return build_model(ModelConfig(**model), 1, 2, values["data.patch_size"])


@pytest.mark.parametrize("network", STYLES)
def test_nnunet_s_plan_gives_the_values_of_its_network(network: str) -> None:
    plans, plan = small_plans(network)
    model = planned_network(plans)
    assert (model.conv_stages, model.encoder_blocks, model.decoder_convs) == (STYLES[network], plan.blocks,
                                                                              plan.decoder_convs)
    assert sum(p.numel() for p in model.parameters()) == expected_params(plan)


@pytest.mark.parametrize("network", STYLES)
def test_nnunet_s_plan_builds_nnunet_s_network(network: str) -> None:
    """The network of a plan's values, with nnU-Net's weights mapped by the plan's axes, computes nnU-Net's function
    in RAS order."""
    plans, plan = small_plans(network)
    nnunet, medseg = nnunet_network(plan), planned_network(plans)
    load_nnunet_weights(medseg, nnunet.state_dict(), axes=plan.axes)
    assert_same_function(plan, nnunet, medseg)
