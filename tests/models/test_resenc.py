"""The residual-encoder U-Net (``model.encoder_blocks``, ``model.decoder_convs``) and the default U-Net it leaves."""

from __future__ import annotations

import hashlib

import pytest
import torch
from monai.networks.blocks import UnetResBlock
from torch import nn

from medseg.errors import ParameterError
from medseg.models import SlottedUNet
from medseg.models.unet import OneConvUpBlock

from ..helpers.configs import compose_config

# The default U-Net (SlottedUNet(dims, 1, 3)) at main's commit 1628149, before model.encoder_blocks existed: its
# parameter count, number of state_dict entries and sha256 of "key:shape" lines (see state_dict_digest), measured there.
DEFAULT_UNET = {2: (493619, 59, "87da2487f2179ecd"), 3: (1412435, 59, "6c2286c236dbdb56")}


def state_dict_digest(model: nn.Module) -> str:
    lines = "\n".join(f"{key}:{tuple(value.shape)}" for key, value in model.state_dict().items())
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


def res_blocks(stage: nn.Module) -> int:
    return sum(isinstance(module, UnetResBlock) for module in stage.modules())


def convs(stage: nn.Module) -> int:
    return sum(isinstance(module, nn.modules.conv._ConvNd) for module in stage.modules())


@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_default_unet_is_unchanged(spatial_dims: int) -> None:
    for model in (SlottedUNet(spatial_dims, 1, 3), SlottedUNet(spatial_dims, 1, 3, encoder_blocks=1, decoder_convs=2)):
        params = sum(p.numel() for p in model.parameters())
        assert (params, len(model.state_dict()), state_dict_digest(model)) == DEFAULT_UNET[spatial_dims]


def test_blocks_per_level_and_one_conv_decoder() -> None:
    model = SlottedUNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), encoder_blocks=[1, 3, 4, 6, 6],
                        decoder_convs=1)
    assert model.encoder_blocks == [1, 3, 4]  # a longer list is cut to the levels
    assert [res_blocks(model.stem), *map(res_blocks, model.down)] == [1, 3, 4]
    assert all(isinstance(up, OneConvUpBlock) and convs(up) == 2 for up in model.up)  # transposed conv + one conv
    assert all(convs(up) == 3 for up in SlottedUNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2)).up)
    every = SlottedUNet(2, 1, 2, channels=(4, 8), strides=(2,), encoder_blocks=2)
    assert [res_blocks(every.stem), res_blocks(every.down[0])] == [2, 2]


def test_resenc_unet_with_an_attention_bottleneck_trains() -> None:
    torch.manual_seed(0)
    model = SlottedUNet(3, 1, 2, channels=(4, 8, 16), strides=((2, 2, 1), 2), encoder_blocks=[1, 3, 4],
                        decoder_convs=1, bottleneck="masa", decoder="identity", decoder_levels=1,
                        deep_supervision=True, attention={"num_heads": 2})
    x = torch.randn(1, 1, 8, 8, 6)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == [(1, 2, 8, 8, 6), (1, 2, 4, 4, 6)]
    sum(o.sum() for o in outs).backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"encoder_blocks": [1, 3]}, r"^encoder_blocks=\[1, 3\]: expected an int >= 1 or a list of at least 3"),
    ({"encoder_blocks": 0}, "^encoder_blocks=0: "),
    ({"decoder_convs": 3}, r"^decoder_convs=3: expected one of \[1, 2\]$"),
    ({"decoder_convs": 0, "conv_stages": "nnunet_plain"}, r"^decoder_convs=0: expected an int >= 1$"),
])
def test_invalid_blocks_are_one_line_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ParameterError, match=match):
        SlottedUNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), **kwargs)


@pytest.mark.parametrize(("preset", "reference_gb"), [("resenc_m", 8.0), ("resenc_l", 24.0)])
def test_presets_set_nnunet_s_resenc_network(preset: str, reference_gb: float) -> None:
    cfg = compose_config([f"experiment={preset}", "model.bottleneck=masa"])
    assert list(cfg.model.encoder_blocks) == [1, 3, 4, *[6] * 10] and cfg.model.decoder_convs == 1
    assert cfg.model.channels is None and cfg.model.strides is None and cfg.model.bottleneck == "masa"
    assert cfg.plan.reference_gb == reference_gb and cfg.trainer.batch_size == 1
