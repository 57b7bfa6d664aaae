"""FLOPs of a forward pass (medseg.models.compute) against hand counts.

FlopCounterMode's convention, which the hand counts follow: a convolution is ``2 * C_in * C_out * prod(kernel)``
per output voxel (a transposed one per input voxel), its bias is not counted, and norms, activations and
additions count 0.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

from medseg.attention import available_blocks
from medseg.config import ModelConfig, attention_config
from medseg.models import MODELS
from medseg.models.compute import META, forward_flops, patch_forward_flops


def conv_flops(c_in: int, c_out: int, kernel: int, voxels: int, spatial_dims: int = 3) -> int:
    """A convolution's multiply-adds times 2, over ``voxels`` output voxels (input voxels when transposed)."""
    return 2 * c_in * c_out * kernel**spatial_dims * voxels


def test_a_plain_conv_net_counts_every_convolution_over_its_output_voxels() -> None:
    with META:
        net = nn.Sequential(
            nn.Conv3d(2, 4, 3, padding=1), nn.ReLU(),
            nn.Conv3d(4, 6, 3, stride=2, padding=1), nn.InstanceNorm3d(6),  # (7, 5, 4) -> (4, 3, 2)
            nn.ConvTranspose3d(6, 3, 2, stride=2),  # per input voxel: (4, 3, 2)
        )
    batch, full, half = 2, 7 * 5 * 4, 4 * 3 * 2
    expected = batch * (conv_flops(2, 4, 3, full) + conv_flops(4, 6, 3, half) + conv_flops(6, 3, 2, half))
    assert forward_flops(net, (batch, 2, 7, 5, 4)) == expected


def test_a_tiny_unet_is_the_sum_of_its_convolutions() -> None:
    """The pure-CNN U-Net (channels 4, 8; one stride-2 step) at 8^3: each MONAI block's convolutions by hand."""
    cfg = ModelConfig(channels=[4, 8], strides=[2], bottleneck="none")
    full, low = 8**3, 4**3
    stem = conv_flops(1, 4, 3, full) + conv_flops(4, 4, 3, full) + conv_flops(1, 4, 1, full)  # + 1x1 residual
    down = conv_flops(4, 8, 3, low) + conv_flops(8, 8, 3, low) + conv_flops(4, 8, 1, low)  # stride 2, residual
    up = conv_flops(8, 4, 2, low) + conv_flops(8, 4, 3, full) + conv_flops(4, 4, 3, full)  # transposed, skip concat
    head = conv_flops(4, 3, 1, full)
    assert patch_forward_flops(cfg, 1, 3, [8, 8, 8]) == stem + down + up + head


@pytest.mark.parametrize("block", ["masa", "mha"])
def test_a_bottleneck_attention_block_adds_at_least_its_attention_products(block: str) -> None:
    """Over ``none``, each of the 2 bottleneck blocks adds ``q k^T`` and ``(.) v``: ``2 * 2 * N^2 * C`` FLOPs on
    ``N`` tokens of ``C`` channels. On 512 tokens of 8 channels they outweigh the block's linear layers and
    convolutions many times over, so a count that missed SDPA would fail."""
    patch, tokens, width = [16, 16, 16], 8**3, 8
    flops = {name: patch_forward_flops(ModelConfig(channels=[4, width], strides=[2], bottleneck=name), 1, 2, patch)
             for name in ("none", block)}
    attention = 2 * (4 * tokens**2 * width)
    assert flops[block] - flops["none"] >= attention
    assert flops[block] - flops["none"] < 2 * attention  # the rest of the blocks is small beside it


@pytest.mark.parametrize("block", available_blocks())
def test_every_block_runs_on_the_meta_device_and_adds_flops(block: str) -> None:
    """Each registered block in the bottleneck and the lowest decoder level is counted (its norms and autocast
    guards run on the meta device) and costs more than the pure CNN."""
    def flops(name: str) -> int | None:
        cfg = ModelConfig(channels=[6, 12], strides=[2], bottleneck=name, decoder=name,
                          attention=attention_config(num_heads=3, split_size=2))
        return patch_forward_flops(cfg, 1, 2, [8, 8, 8])

    cnn, attention = flops("none"), flops(block)
    assert cnn is not None and attention is not None and attention > cnn


def test_counting_leaves_the_random_state_as_it_was() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    patch_forward_flops(ModelConfig(channels=[4, 8], strides=[2]), 1, 2, [8, 8, 8])
    assert torch.equal(torch.rand(3), expected)


class _ReadsValues(nn.Module):
    """A network whose forward pass reads a tensor's value, which the meta device does not have."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * math.sqrt(float(x.abs().max()))


def test_a_network_that_cannot_run_on_the_meta_device_is_not_counted(monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(MODELS, "reads_values", lambda cfg, cin, cout, patch: _ReadsValues())
    with caplog.at_level(logging.WARNING, logger="medseg"):
        flops = patch_forward_flops(ModelConfig(name="reads_values", strides=[2]), 1, 2, [8, 8, 8])
    assert flops is None
    assert "FLOPs of model.name=reads_values not counted" in caplog.text
