"""Slow reference implementations written straight from the papers' equations (explicit loops / matrices).

They take and return the same layouts as :mod:`medseg.attention.functional` and are meant for float64.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch

Gamma = float | list[float]
Spacing = tuple[float, ...] | None


def coordinates(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Token positions in row-major order."""
    return list(itertools.product(*(range(s) for s in shape)))


def scales_of(shape: tuple[int, ...], spacing: Spacing) -> list[float]:
    if spacing is None:
        return [1.0] * len(shape)
    return [s / min(spacing) for s in spacing]


def softmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """Plain row softmax of a matrix, written out."""
    e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def per_head(gamma: Gamma, heads: int) -> list[float]:
    return list(gamma) if isinstance(gamma, list) else [gamma] * heads


def masa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shape: tuple[int, ...],
    gamma: Gamma,
    spacing: Spacing = None,
) -> torch.Tensor:
    """RMT eq.: ``(softmax(q k^T / sqrt(d)) * D) v`` with rows renormalised, ``D_nm = gamma ** manhattan``."""
    b, h, n, d = q.shape
    pos = coordinates(shape)
    scales = scales_of(shape, spacing)
    dist = torch.tensor(
        [[sum(abs(a - c) * s for a, c, s in zip(pn, pm, scales)) for pm in pos] for pn in pos], dtype=q.dtype
    )
    out = torch.empty_like(v)
    for bi in range(b):
        for hi, g in enumerate(per_head(gamma, h)):
            attn = softmax_rows(q[bi, hi] @ k[bi, hi].T / math.sqrt(d)) * g**dist
            attn = attn / attn.sum(dim=-1, keepdim=True)
            out[bi, hi] = attn @ v[bi, hi]
    return out


def masa_decomposed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shape: tuple[int, ...],
    gamma: Gamma,
    spacing: Spacing = None,
) -> torch.Tensor:
    """Axial MaSA: for each axis, last to first, every line of tokens attends within itself with a 1-D decay
    ``gamma ** (|i - j| * scale)``; q, k fixed, v replaced by each pass's output."""
    b, h, n, d = q.shape
    pos = coordinates(shape)
    index = {p: i for i, p in enumerate(pos)}
    scales = scales_of(shape, spacing)
    g = torch.tensor(per_head(gamma, h), dtype=q.dtype).view(1, h, 1, 1)
    current = v.clone()
    for axis in reversed(range(len(shape))):
        nxt = torch.empty_like(current)
        length = shape[axis]
        decay = torch.tensor([[abs(i - j) * scales[axis] for j in range(length)] for i in range(length)], dtype=q.dtype)
        for rest in {p[:axis] + p[axis + 1 :] for p in pos}:  # one line of tokens along `axis`
            tokens = [index[rest[:axis] + (i,) + rest[axis:]] for i in range(length)]
            ql, kl, vl = q[:, :, tokens], k[:, :, tokens], current[:, :, tokens]  # (b, h, L, d)
            attn = softmax_rows(ql @ kl.transpose(-1, -2) / math.sqrt(d)) * g**decay
            attn = attn / attn.sum(dim=-1, keepdim=True)
            nxt[:, :, tokens] = attn @ vl
        current = nxt
    return current


def masa_decomposed_rmt_2d(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: tuple[int, int], gamma: Gamma
) -> torch.Tensor:
    """Official RMT ``VisionRetentionChunk`` ordering, 2D: attention along W (within rows), then along H.

    Written with RMT's tensor layout: ``(b, n, h, w, d)``, additive masks ``|i - j| * log(gamma)``.
    """
    b, heads, n, d = q.shape
    hh, ww = shape
    gammas = torch.tensor(per_head(gamma, heads), dtype=q.dtype)
    decay = torch.log(gammas)

    def mask(length: int) -> torch.Tensor:
        index = torch.arange(length, dtype=q.dtype)
        return (index[:, None] - index[None, :]).abs() * decay[:, None, None]  # (n l l)

    qr = q.reshape(b, heads, hh, ww, d)
    kr = k.reshape(b, heads, hh, ww, d) * d**-0.5
    vr = v.reshape(b, heads, hh, ww, d).permute(0, 2, 1, 3, 4)  # (b h n w d)
    qk_w = qr.transpose(1, 2) @ kr.transpose(1, 2).transpose(-1, -2)  # (b h n w w)
    vr = torch.softmax(qk_w + mask(ww), -1) @ vr  # (b h n w d)
    qk_h = qr.permute(0, 3, 1, 2, 4) @ kr.permute(0, 3, 1, 2, 4).transpose(-1, -2)  # (b w n h h)
    out = torch.softmax(qk_h + mask(hh), -1) @ vr.permute(0, 3, 2, 1, 4)  # (b w n h d)
    return out.permute(0, 2, 3, 1, 4).reshape(b, heads, n, d)


def focused_linear(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    p: float,
    scale: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """FLatten eq., token by token: ``phi_p(x) = f(x)**p / |f(x)**p| * |f(x)|``, ``f(x) = (relu(x)+1e-6)/s``;
    ``out_i = sum_j (q_i . k_j) v_j / (sum_j q_i . k_j + N * eps)`` per head."""
    b, n, c = q.shape
    d = c // heads

    def phi(x: torch.Tensor) -> torch.Tensor:
        x = torch.clamp(x, min=0) + 1e-6
        if scale is not None:
            x = x / scale.reshape(-1)
        return x**p / torch.sqrt((x ** (2 * p)).sum()) * torch.sqrt((x**2).sum())

    out = torch.empty_like(v)
    for bi in range(b):
        qf = torch.stack([phi(q[bi, i]) for i in range(n)])
        kf = torch.stack([phi(k[bi, j]) for j in range(n)])
        for hi in range(heads):
            cols = slice(hi * d, (hi + 1) * d)
            for i in range(n):
                weights = torch.stack([qf[i, cols] @ kf[j, cols] for j in range(n)])
                out[bi, i, cols] = (weights[:, None] * v[bi, :, cols]).sum(0) / (weights.sum() + n * eps)
    return out


def stripe_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: tuple[int, ...], axis: int, width: int
) -> torch.Tensor:
    """CSWin on the unpadded map: token ``n`` attends to every token ``m`` with ``m_a // w == n_a // w`` on
    every axis ``a != axis`` (stripes of width ``w``, the last one possibly narrower)."""
    b, h, n, d = q.shape
    pos = coordinates(shape)
    out = torch.empty_like(v)
    for i, pn in enumerate(pos):
        members = [
            j
            for j, pm in enumerate(pos)
            if all(pm[a] // width == pn[a] // width for a in range(len(shape)) if a != axis)
        ]
        for bi in range(b):
            for hi in range(h):
                attn = softmax_rows((q[bi, hi, i] @ k[bi, hi, members].T / math.sqrt(d))[None])[0]
                out[bi, hi, i] = attn @ v[bi, hi, members]
    return out


def depthwise_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    shape: tuple[int, ...],
    region: Callable[[tuple[int, ...]], object] = lambda position: None,
) -> torch.Tensor:
    """Depthwise 'same' convolution of tokens ``(B, N, C)``, summed offset by offset: token ``n`` gets
    ``bias + sum_o w[o] * x[n + o]`` over the kernel offsets ``o`` whose ``n + o`` lies in the grid and in the same
    ``region`` as ``n`` (zeros elsewhere: the map's border, or a CSWin stripe's)."""
    pos = coordinates(shape)
    index = {p: i for i, p in enumerate(pos)}
    kernel = weight.shape[2:]
    out = bias.expand_as(x).clone()
    for i, pn in enumerate(pos):
        for offset in itertools.product(*(range(-(k // 2), k // 2 + 1) for k in kernel)):
            pm = tuple(a + o for a, o in zip(pn, offset))
            if pm in index and region(pm) == region(pn):
                w = weight[(slice(None), 0, *(o + k // 2 for o, k in zip(offset, kernel)))]
                out[:, i] += w * x[:, index[pm]]
    return out


def stripe_of(axis: int, width: int) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    """The CSWin stripe a position lies in: its index ``// width`` on every axis but ``axis``."""
    return lambda position: tuple(p // width for a, p in enumerate(position) if a != axis)


def rmt_ffn(
    x: torch.Tensor, fc1: torch.nn.Linear, fc2: torch.nn.Linear, weight: torch.Tensor, bias: torch.Tensor,
    shape: tuple[int, ...],
) -> torch.Tensor:
    """RMT's ``FeedForwardNetwork`` (subconv): ``h = gelu(fc1(x))``; ``fc2(h + DWConv3(h))``."""
    hidden = torch.nn.functional.gelu(x @ fc1.weight.T + fc1.bias)
    return (hidden + depthwise_conv(hidden, weight, bias, shape)) @ fc2.weight.T + fc2.bias


def axial_rope(x: torch.Tensor, shape: tuple[int, ...], base: float = 10000.0) -> torch.Tensor:
    """Axial rotary encoding of ``(..., N, d)``, token by token and pair by pair with explicit 2x2 rotations.

    The ``d // 2`` channel pairs ``(2j, 2j + 1)`` go to the axes in order, ``ceil`` shares first (e.g. 4 pairs in
    3D: 2, 1, 1); pair ``i`` of an axis with ``P`` pairs turns by ``n_axis * base ** (-i / (P - 1))`` (1 if P = 1).
    """
    ndim, pairs = len(shape), x.shape[-1] // 2
    per_axis = [pairs // ndim + (a < pairs % ndim) for a in range(ndim)]
    owner = [(a, i, p) for a, p in enumerate(per_axis) for i in range(p)]  # pair j -> (axis, i, P)
    out = x.clone()
    for n, position in enumerate(coordinates(shape)):
        for j, (axis, i, count) in enumerate(owner):
            frequency = base ** (-i / (count - 1)) if count > 1 else 1.0
            angle = position[axis] * frequency
            rotation = torch.tensor(
                [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=x.dtype
            )
            out[..., n, 2 * j : 2 * j + 2] = x[..., n, 2 * j : 2 * j + 2] @ rotation.T
    return out
