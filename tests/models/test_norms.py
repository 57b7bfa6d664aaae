"""The conv stages' group norm: ``nn.GroupNorm`` outside autocast, the autocast dtype inside it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from medseg.models import SlottedUNet
from medseg.models.norms import AutocastGroupNorm


def group_norm_reference(x: torch.Tensor, groups: int, weight: torch.Tensor, bias: torch.Tensor,
                         eps: float) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` per sample and group of channels, in float64."""
    b, c = x.shape[:2]
    grouped = x.double().reshape(b, groups, -1)
    mean = grouped.mean(-1, keepdim=True)
    var = grouped.var(-1, unbiased=False, keepdim=True)
    normed = ((grouped - mean) / torch.sqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    return normed * weight.double().reshape(shape) + bias.double().reshape(shape)


def _norm(channels: int, groups: int) -> AutocastGroupNorm:
    torch.manual_seed(0)
    norm = AutocastGroupNorm(groups, channels)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    return norm


@pytest.mark.parametrize(("shape", "groups"), [((2, 6, 5, 7), 3), ((2, 4, 3, 5, 6), 4)], ids=["2d", "3d"])
def test_outside_autocast_it_is_group_norm(shape: tuple[int, ...], groups: int) -> None:
    norm = _norm(shape[1], groups)
    x = torch.randn(shape) * 3 + 1
    out = norm(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), group_norm_reference(x, groups, norm.weight, norm.bias, norm.eps),
                               rtol=1e-5, atol=1e-5)
    plain = nn.GroupNorm(groups, shape[1])
    plain.load_state_dict(norm.state_dict())
    torch.testing.assert_close(out, plain(x))


@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("shape", "groups"), [((2, 6, 5, 7), 3), ((2, 4, 3, 5, 6), 4)], ids=["2d", "3d"])
def test_under_autocast_it_normalises_and_keeps_the_autocast_dtype(shape: tuple[int, ...], groups: int,
                                                                  input_dtype: torch.dtype) -> None:
    # Whatever dtype arrives (a float32 op before it, as CUDA's autocast runs some), the norm computes in bf16 and
    # keeps only bf16 activations for the backward pass: no float32 copy of its input, which would double them.
    norm = _norm(shape[1], groups)
    x = (torch.randn(shape) * 3 + 1).to(input_dtype).requires_grad_()
    saved: list[torch.dtype] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.numel() == x.numel():  # activation-sized; the per-group mean and rstd are float32 and small
            saved.append(tensor.dtype)
        return tensor

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = norm(x)
    assert out.dtype == torch.bfloat16 and saved and set(saved) == {torch.bfloat16}
    low = [t.to(torch.bfloat16) for t in (x.detach(), norm.weight.detach(), norm.bias.detach())]
    expected = group_norm_reference(low[0], groups, low[1], low[2], norm.eps)
    torch.testing.assert_close(out.double(), expected, rtol=2e-2, atol=3e-2)
    out.float().square().sum().backward()
    assert norm.weight.grad.dtype == torch.float32 and torch.isfinite(norm.weight.grad).all()
    assert torch.isfinite(x.grad).all()


def test_the_unet_stages_use_it_and_keep_their_state_dict() -> None:
    model = SlottedUNet(3, 1, 2, channels=(8, 16), strides=(2,), norm="group")
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(isinstance(m, AutocastGroupNorm) for m in norms)
    assert {"stem.norm1.weight", "stem.norm1.bias"} <= set(model.state_dict())


@pytest.mark.gpu
def test_on_cuda_it_stays_bf16_where_group_norm_would_not() -> None:
    norm = _norm(8, 8).cuda()
    plain = nn.GroupNorm(8, 8).cuda()
    plain.load_state_dict(norm.state_dict())
    x = torch.randn(2, 8, 6, 7, 5, device="cuda").to(torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, reference = norm(x), plain(x)
    assert reference.dtype == torch.float32, "CUDA's autocast runs group_norm in float32"
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=3e-2)
