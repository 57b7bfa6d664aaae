"""Whole-volume inference with the windows stitched on another device (``sw_device``): same probabilities."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from medseg.inference.sliding_window import SlidingWindow, infer_volume
from medseg.models import SlottedUNet

CPU = torch.device("cpu")
SLICE_AXIS = 2
ROI = {3: [16, 16, 8], 2: [16, 16, 1]}
"""The sliding window per model dimension; a 2D model's is one voxel thick along ``SLICE_AXIS``."""


def model_and_volume(spatial_dims: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """A small U-Net in eval mode and a volume larger than one window on every axis."""
    torch.manual_seed(0)
    model = SlottedUNet(spatial_dims, 1, 3, channels=(4, 8), strides=(2,)).eval()
    return model, torch.randn(1, 1, 21, 18, 11)


def predict(model: torch.nn.Module, image: torch.Tensor, spatial_dims: int, **devices: Any) -> torch.Tensor:
    return infer_volume(model, image, SlidingWindow(ROI[spatial_dims], spatial_dims, SLICE_AXIS, **devices))


@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_sw_device_on_the_cpu(spatial_dims: int) -> None:
    model, image = model_and_volume(spatial_dims)
    plain = predict(model, image, spatial_dims)
    stitched = predict(model, image, spatial_dims, device=CPU, sw_device=CPU)
    assert stitched.device == CPU and stitched.shape == (1, 3, *image.shape[2:])
    torch.testing.assert_close(stitched, plain, rtol=0, atol=0)
    torch.testing.assert_close(stitched.sum(1), torch.ones_like(stitched[:, 0]))  # probabilities


@pytest.mark.gpu
@pytest.mark.parametrize("image_on", ["cpu", "cuda"])
@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_model_on_cuda_stitched_on_the_cpu(spatial_dims: int, image_on: str) -> None:
    model, image = model_and_volume(spatial_dims)
    cuda = torch.device("cuda")
    model = model.to(cuda)
    on_gpu = predict(model, image.to(cuda), spatial_dims, device=cuda)
    stitched = predict(model, image.to(image_on), spatial_dims, device=cuda, sw_device=CPU)
    assert on_gpu.device.type == "cuda" and stitched.device == CPU
    torch.testing.assert_close(stitched, on_gpu.cpu(), rtol=1e-5, atol=1e-5)  # blending order differs
