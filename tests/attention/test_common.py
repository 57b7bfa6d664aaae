"""Shared helpers: token layout round trips and the depthwise conv with its CPU backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from medseg.attention.common import DepthwiseConv, merge_heads, split_heads, to_spatial, to_tokens


def test_token_layout_round_trips() -> None:
    x = torch.randn(2, 6, 3, 4, 5)
    tokens = to_tokens(x)
    assert tokens.shape == (2, 60, 6)
    torch.testing.assert_close(tokens[:, 1 * 20 + 2 * 5 + 3], x[:, :, 1, 2, 3])  # row-major over (D, H, W)
    torch.testing.assert_close(to_spatial(tokens, (3, 4, 5)), x)
    heads = split_heads(tokens, 3)
    assert heads.shape == (2, 3, 60, 2)
    torch.testing.assert_close(merge_heads(heads), tokens)


@pytest.mark.parametrize(("spatial_dims", "kernel_size"), [(2, 3), (3, 3), (3, 5)])
def test_depthwise_conv_backward_matches_native(spatial_dims: int, kernel_size: int) -> None:
    torch.manual_seed(0)
    conv = DepthwiseConv(4, spatial_dims, kernel_size).double()
    tiny = torch.randn(1, 4, *(2, 3, 4)[:spatial_dims], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(conv, (tiny,))
    x = torch.randn(2, 4, *(5, 6, 7)[:spatial_dims], dtype=torch.float64, requires_grad=True)
    out = conv(x)
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, (x, conv.weight, conv.bias), grad)
    native_out = getattr(F, f"conv{spatial_dims}d")(x, conv.weight, conv.bias, padding=kernel_size // 2, groups=4)
    torch.testing.assert_close(out, native_out)
    native = torch.autograd.grad(native_out, (x, conv.weight, conv.bias), grad)
    for a, b in zip(ours, native):
        torch.testing.assert_close(a, b)


def test_depthwise_conv_under_bf16_autocast() -> None:
    conv = DepthwiseConv(8, 3, 5)
    x = torch.randn(2, 8, 4, 5, 6, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = conv(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad.dtype == torch.float32 and conv.weight.grad.dtype == torch.float32
    assert torch.isfinite(x.grad).all() and torch.isfinite(conv.weight.grad).all()


def test_depthwise_conv_rejects_even_kernels() -> None:
    with pytest.raises(ValueError, match="odd"):
        DepthwiseConv(4, 3, 4)
