"""The functional ops against slow references written from the papers' equations (float64, 1e-6)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from medseg.attention import functional
from medseg.attention.position import axis_scales

from . import reference

TOL = {"rtol": 1e-6, "atol": 1e-6}
SHAPES = [(5, 7), (3, 4, 5), (5, 6, 7)]
HEADS = 3
PER_HEAD = [0.9, 0.75, 0.5]
SPACINGS = {(5, 7): (2.0, 0.5), (3, 4, 5): (3.0, 1.0, 1.5), (5, 6, 7): (2.5, 1.0, 0.7)}


def qkv(
    shape: tuple[int, ...], dtype: torch.dtype = torch.float64, batch: int = 2, head_dim: int = 4
) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    n = math.prod(shape)
    return [torch.randn(batch, HEADS, n, head_dim, generator=generator, dtype=dtype) for _ in range(3)]


GAMMAS = {"scalar": 0.8, "per_head": PER_HEAD}
gammas = pytest.mark.parametrize("gamma", GAMMAS.values(), ids=GAMMAS.keys())
spacings = pytest.mark.parametrize("with_spacing", [False, True], ids=["voxels", "spacing"])


def as_gamma(gamma: float | list[float]) -> float | torch.Tensor:
    return torch.tensor(gamma) if isinstance(gamma, list) else gamma


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@gammas
@spacings
def test_masa_matches_paper_form(shape: tuple[int, ...], gamma: float | list[float], with_spacing: bool) -> None:
    spacing = SPACINGS[shape] if with_spacing else None
    q, k, v = qkv(shape)
    out = functional.masa(q, k, v, shape, as_gamma(gamma), spacing=spacing)
    torch.testing.assert_close(out, reference.masa(q, k, v, shape, gamma, spacing), **TOL)


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 5)], ids=str)
def test_masa_float32_fused_kernel(shape: tuple[int, ...]) -> None:
    q, k, v = qkv(shape)
    out = functional.masa(*(t.float() for t in (q, k, v)), shape, as_gamma(PER_HEAD))
    torch.testing.assert_close(out.double(), reference.masa(q, k, v, shape, PER_HEAD), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@gammas
@spacings
def test_masa_decomposed_matches_axial_form(
    shape: tuple[int, ...], gamma: float | list[float], with_spacing: bool
) -> None:
    spacing = SPACINGS[shape] if with_spacing else None
    q, k, v = qkv(shape)
    out = functional.masa_decomposed(q, k, v, shape, as_gamma(gamma), spacing=spacing)
    torch.testing.assert_close(out, reference.masa_decomposed(q, k, v, shape, gamma, spacing), **TOL)


@gammas
def test_masa_decomposed_matches_official_rmt_order_2d(gamma: float | list[float]) -> None:
    shape = (5, 7)
    q, k, v = qkv(shape)
    out = functional.masa_decomposed(q, k, v, shape, as_gamma(gamma))
    torch.testing.assert_close(out, reference.masa_decomposed_rmt_2d(q, k, v, shape, gamma), **TOL)


def test_masa_decomposed_order_matters() -> None:
    """W-then-H differs from H-then-W, so the order test above is not vacuous."""
    shape = (5, 7)
    q, k, v = qkv(shape)
    out = functional.masa_decomposed(q, k, v, shape, 0.8)
    transposed = [t.unflatten(2, shape).transpose(2, 3).flatten(2, 3) for t in (q, k, v)]
    swapped = functional.masa_decomposed(*transposed, (7, 5), 0.8).unflatten(2, (7, 5)).transpose(2, 3).flatten(2, 3)
    assert (out - swapped).abs().max() > 1e-3


@pytest.mark.parametrize("op", [functional.masa, functional.masa_decomposed], ids=["masa", "decomposed"])
@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 5)], ids=str)
def test_gamma_one_and_zero_qk_is_uniform(op: Callable, shape: tuple[int, ...]) -> None:
    q, k, v = qkv(shape)
    out = op(torch.zeros_like(q), torch.zeros_like(k), v, shape, 1.0)
    torch.testing.assert_close(out, v.mean(dim=2, keepdim=True).expand_as(v), **TOL)


@pytest.mark.parametrize("op", [functional.masa, functional.masa_decomposed], ids=["masa", "decomposed"])
def test_tiny_gamma_attends_to_self(op: Callable) -> None:
    shape = (3, 4, 5)
    q, k, v = qkv(shape)
    out = op(0.1 * q, 0.1 * k, v, shape, 1e-4)
    torch.testing.assert_close(out, v, rtol=0, atol=1e-2)


@pytest.mark.parametrize("gamma", [0.0, 1.0], ids=["zero", "one"])
def test_extreme_gammas_are_finite_in_low_precision(gamma: float) -> None:
    shape = (3, 4, 5)
    q, k, v = qkv(shape, dtype=torch.bfloat16)
    assert torch.isfinite(functional.masa(q, k, v, shape, gamma)).all()
    assert torch.isfinite(functional.masa_decomposed(q, k, v, shape, gamma)).all()


def test_gamma_validation() -> None:
    q, k, v = qkv((3, 4))
    with pytest.raises(ValueError, match="num_heads"):
        functional.masa(q, k, v, (3, 4), torch.tensor([0.9, 0.8]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        functional.masa(q, k, v, (3, 4), 1.5)
    with pytest.raises(ValueError, match="tokens"):
        functional.masa(q, k, v, (3, 5), 0.9)


def test_decay_bias_is_cached_in_the_attention_dtype() -> None:
    functional.clear_cache()
    args = ((3, 4, 5), (1.0, 1.0, 1.0), (math.log(0.9),), torch.device("cpu"))
    first = functional.decay_bias(*args, torch.bfloat16)
    assert first.dtype == torch.bfloat16 and first.shape == (1, 1, 60, 60)
    assert functional.decay_bias(*args, torch.bfloat16) is first
    assert functional.decay_bias.cache_info().hits == 1


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 5)], ids=str)
@pytest.mark.parametrize("p", [2.0, 3.0])
@pytest.mark.parametrize("with_scale", [False, True])
def test_focused_linear_matches_paper_form(shape: tuple[int, ...], p: float, with_scale: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    n, channels, heads = math.prod(shape), 12, 3
    q, k, v = (torch.randn(2, n, channels, generator=generator, dtype=torch.float64) for _ in range(3))
    scale = torch.rand(1, 1, channels, generator=generator, dtype=torch.float64) + 0.5 if with_scale else None
    out = functional.focused_linear(q, k, v, heads, p, scale=scale)
    assert out.shape == (2, n, channels) and out.dtype == torch.float64
    torch.testing.assert_close(out, reference.focused_linear(q, k, v, heads, p, scale), **TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_focused_linear_is_stable_in_low_precision(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(2)
    q, k, v = (30 * torch.randn(2, 512, 32, generator=generator) for _ in range(3))
    expected = functional.focused_linear(q, k, v, 4, 4.0)
    low = functional.focused_linear(*(t.to(dtype) for t in (q, k, v)), 4, 4.0)
    assert low.dtype == dtype and torch.isfinite(low).all()
    torch.testing.assert_close(low.float(), expected, rtol=0.05, atol=0.05 * expected.abs().max().item())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(functional.focused_linear(q, k, v, 4, 4.0)).all()


@pytest.mark.parametrize(
    ("shape", "axis", "width"),
    [((5, 7), 0, 2), ((5, 7), 1, 2), ((5, 7), 1, 3), ((3, 4, 5), 0, 2), ((3, 4, 5), 1, 3), ((3, 4, 5), 2, 2)],
    ids=str,
)
def test_stripe_attention_padding_does_not_leak(shape: tuple[int, ...], axis: int, width: int) -> None:
    q, k, v = qkv(shape)
    out = functional.stripe_attention(q, k, v, shape, axis, width)
    torch.testing.assert_close(out, reference.stripe_attention(q, k, v, shape, axis, width), **TOL)


def test_stripe_as_wide_as_the_map_is_global_attention() -> None:
    shape = (3, 4, 5)
    q, k, v = qkv(shape)
    out = functional.stripe_attention(q, k, v, shape, 0, 8)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, expected, **TOL)


flex = pytest.mark.skipif(functional.flex_attention is None, reason="FlexAttention unavailable")


def flex_case(device: str, dtype: torch.dtype) -> tuple:
    shape = (3, 4, 5)
    q, k, v = (t.to(device, dtype) for t in qkv(shape, dtype=torch.float32, head_dim=16))
    gamma = torch.tensor(PER_HEAD)
    bias = functional.decay_bias(
        shape, axis_scales(3, SPACINGS[shape]), functional.log_gammas(gamma, HEADS), q.device, q.dtype
    )
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return q, k, v, shape, gamma, expected


@flex
def test_flex_score_mod_matches_sdpa_bias_cpu() -> None:
    q, k, v, shape, gamma, expected = flex_case("cpu", torch.float32)
    out = functional.masa_flex(q, k, v, shape, gamma, spacing=SPACINGS[shape], compile=False)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@flex
@pytest.mark.slow
def test_flex_score_mod_compiled_cpu() -> None:
    """The compiled FlexAttention kernel (what CUDA runs) matches the SDPA bias; compiling takes ~40 s on 2 cores."""
    q, k, v, shape, gamma, expected = flex_case("cpu", torch.float32)
    out = functional.masa_flex(q, k, v, shape, gamma, spacing=SPACINGS[shape])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@flex
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flex_matches_sdpa_bias_cuda() -> None:
    q, k, v, shape, gamma, expected = flex_case("cuda", torch.float32)
    out = functional.masa(q, k, v, shape, gamma, spacing=SPACINGS[shape])  # dispatches to FlexAttention
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)

    q, k, v, shape, gamma, expected = flex_case("cuda", torch.bfloat16)
    q.requires_grad_(True)
    out = functional.masa(q, k, v, shape, gamma, spacing=SPACINGS[shape])
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), rtol=0.03, atol=0.03)
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
