"""Pure tensor attention ops: no parameters, so the math is testable on its own.

``q, k, v`` are ``(B, heads, N, head_dim)`` unless stated otherwise, with ``N = prod(spatial_shape)`` and
tokens in row-major (C-order) over ``(D, H, W)`` or ``(H, W)``. The softmax scale is ``1 / sqrt(head_dim)``.

A decay ``gamma`` is a float (one decay for all heads) or a ``(heads,)`` tensor / sequence. MaSA's decay
``gamma ** dist`` enters as the additive logit bias ``log(gamma) * dist``, which is exactly the paper's
``softmax(q k^T / sqrt(d)) * gamma ** dist`` with rows renormalised, and runs on fused kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import cache

import torch
import torch.nn.functional as F
from einops import rearrange

from medseg.attention import position
from medseg.attention.common import _depthwise, merge_heads, split_heads, tensor_cache
from medseg.attention.position import axis_scales, grid_coordinates, manhattan_distance, manhattan_row
from medseg.errors import ParameterError
from medseg.runtime.device import autocast_enabled

try:
    from torch.nn.attention.flex_attention import flex_attention
except ImportError:  # torch < 2.5
    flex_attention = None

Gamma = float | Sequence[float] | torch.Tensor

GAMMA_FLOOR = 1e-12
"""Decays are clamped to at least this, so ``gamma -> 0`` gives a large finite negative bias, not ``-inf``."""

LINEAR_EPS = 1e-6
"""Focused linear attention: added to the normaliser ``q_i . mean_j k_j`` (as official FLatten does)."""

KERNEL_EPS = 1e-6
"""Focused linear attention: added after the ReLU kernel so every feature is strictly positive."""

ROW_CHUNK = 4096
"""Keys per chunk where an attention row maps every key through a feature map (focused linear attention), so
its temporaries stay ``ROW_CHUNK x C`` however large the grid."""


def log_gammas(gamma: Gamma, num_heads: int) -> tuple[float, ...]:
    """``log(gamma)`` per head, as a hashable tuple of length 1 (shared decay) or ``num_heads``."""
    if isinstance(gamma, torch.Tensor):
        values = gamma.detach().double().flatten().tolist()
    else:  # plain floats, as modules hold them: no tensor, so exporters trace no data-dependent op
        values = [float(g) for g in (gamma if isinstance(gamma, Sequence) else [gamma])]
    if len(values) not in (1, num_heads):
        raise ValueError(f"gamma needs 1 or num_heads={num_heads} values, got {len(values)}")
    check_gamma(values)
    return tuple(math.log(max(g, GAMMA_FLOOR)) for g in values)


def check_gamma(values: Sequence[float]) -> None:
    """MaSA's decays lie in [0, 1]: 1 is no decay, 0 the limit where each token attends to itself alone (its
    bias is floored at :data:`GAMMA_FLOOR`). The one check of ``gamma``'s range."""
    if not all(0.0 <= g <= 1.0 for g in values):
        raise ParameterError("gamma", list(values), "expected values in [0, 1]")


def _decay_bias(
    spatial_shape: tuple[int, ...],
    scales: tuple[float, ...],
    log_gamma: tuple[float, ...],
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """MaSA's additive bias ``log(gamma_h) * dist``: ``(1, G, N, N)``, ``G = len(log_gamma)`` (1 or heads).

    Built directly in the attention dtype. It is 4-D on purpose: CPU SDPA broadcasts a 4-D mask over batch and
    heads in place, but copies a 3-D one to ``(B, heads, N, N)``.
    """
    work = torch.promote_types(dtype, torch.float32)
    dist = manhattan_distance(spatial_shape, scales, device, work)
    if len(log_gamma) == 1:
        bias = dist.mul_(log_gamma[0]).expand(1, 1, -1, -1)
    else:
        bias = dist * torch.tensor(log_gamma, device=device, dtype=work).view(1, -1, 1, 1)
    return bias.to(dtype)


decay_bias = tensor_cache()(_decay_bias)
""":func:`_decay_bias` for a whole grid, cached per (grid, scales, decays, device, dtype): training at a fixed
patch size builds each slot's bias once. The cache keeps one model's worth (``GRID_CACHE_SIZE`` grids), the least
recently used giving way, whichever model asks (models of the same grids share it); :func:`clear_cache` releases it."""


def _check_tokens(q: torch.Tensor, spatial_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in spatial_shape)
    if q.shape[-2] != math.prod(shape):
        raise ValueError(f"{q.shape[-2]} tokens do not match the grid {shape} ({math.prod(shape)} tokens)")
    return shape


def _use_flex(q: torch.Tensor) -> bool:
    head_dim = q.shape[-1]
    return q.is_cuda and flex_attention is not None and head_dim >= 16 and head_dim & (head_dim - 1) == 0


def masa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spatial_shape: Sequence[int],
    gamma: Gamma,
    *,
    spacing: Sequence[float] | None = None,
) -> torch.Tensor:
    """Manhattan self-attention (RMT): ``softmax(q k^T / sqrt(d) + log(gamma) * dist) v``.

    ``dist`` is the Manhattan distance between token positions, summed over all spatial axes, each axis
    step counting ``spacing_a / min(spacing)`` (1 when ``spacing`` is None).

    On CUDA with FlexAttention available (and a power-of-2 ``head_dim >= 16``, what its compiled kernels
    are tuned for) it runs :func:`masa_flex`, which needs no ``N x N`` tensor at all; elsewhere fused SDPA
    with the cached bias from :func:`decay_bias`. When every ``gamma`` is 1 the bias is 0 and it runs plain
    SDPA without one.

    Returns:
        ``(B, heads, N, head_dim)``.
    """
    shape = _check_tokens(q, spatial_shape)
    log_gamma = log_gammas(gamma, q.shape[1])
    if not any(log_gamma):
        return F.scaled_dot_product_attention(q, k, v)
    if _use_flex(q):
        return masa_flex(q, k, v, shape, gamma, spacing=spacing)
    bias = decay_bias(shape, axis_scales(len(shape), spacing), log_gamma, q.device, q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


@tensor_cache(maxsize=8)
def _manhattan_score_mod(
    spatial_shape: tuple[int, ...],
    scales: tuple[float, ...],
    log_gamma: tuple[float, ...],
    device: torch.device,
) -> Callable:
    strides = [math.prod(spatial_shape[axis + 1 :]) for axis in range(len(spatial_shape))]
    axes = list(zip(spatial_shape, strides, scales))
    decay = torch.tensor(log_gamma, device=device, dtype=torch.float32)

    def score_mod(
        score: torch.Tensor,
        batch: torch.Tensor,
        head: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        dist = sum(((q_idx // stride) % size - (kv_idx // stride) % size).abs() * scale for size, stride, scale in axes)
        return score + decay[head] * dist

    return score_mod


@cache
def _compiled_flex_attention() -> Callable:
    return torch.compile(flex_attention, dynamic=False)


def masa_flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spatial_shape: Sequence[int],
    gamma: Gamma,
    *,
    spacing: Sequence[float] | None = None,
    compile: bool = True,
) -> torch.Tensor:
    """:func:`masa` through FlexAttention: the ``score_mod`` recomputes the distance from token indices.

    The score_mod is cached per (grid, scales, decays, device) and the compiled kernel is built once.
    ``compile=False`` runs FlexAttention's unfused eager reference (forward only; for tests on CPU, where
    FlexAttention has no backward).

    Returns:
        ``(B, heads, N, head_dim)``.
    """
    if flex_attention is None:
        raise RuntimeError("FlexAttention needs torch >= 2.5")
    shape = _check_tokens(q, spatial_shape)
    log_gamma = log_gammas(gamma, q.shape[1])
    if len(log_gamma) == 1:
        log_gamma = log_gamma * q.shape[1]
    score_mod = _manhattan_score_mod(shape, axis_scales(len(shape), spacing), log_gamma, q.device)
    attention = _compiled_flex_attention() if compile else flex_attention
    return attention(q, k, v, score_mod=score_mod)


def _axes(ndim: int) -> list[str]:
    return [f"s{axis}" for axis in range(ndim)]


def masa_decomposed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spatial_shape: Sequence[int],
    gamma: Gamma,
    *,
    spacing: Sequence[float] | None = None,
) -> torch.Tensor:
    """Decomposed MaSA (RMT ``VisionRetentionChunk``, generalised to 3D): axial attention with 1-D decays.

    Along each axis in turn, last to first (W, then H, then D), every line of tokens attends within itself
    with ``softmax(q k^T / sqrt(d) + log(gamma) * |i - j| * scale_axis)``; ``q`` and ``k`` stay fixed and the
    values are replaced by each pass's output. Cost ~ ``N * (D + H + W)``. The ``L x L`` biases are tiny and
    built per call (no cache); when every ``gamma`` is 1 there is none.

    Returns:
        ``(B, heads, N, head_dim)``.
    """
    shape = _check_tokens(q, spatial_shape)
    scales = axis_scales(len(shape), spacing)
    log_gamma = log_gammas(gamma, q.shape[1])
    names = _axes(len(shape))
    grid = f"b h {' '.join(names)} d"
    sizes = dict(zip(names, shape))
    q, k, out = (t.unflatten(2, shape) for t in (q, k, v))
    for axis in reversed(range(len(shape))):
        others = " ".join(n for i, n in enumerate(names) if i != axis)
        lines = f"(b {others}) h {names[axis]} d"
        bias = _decay_bias((shape[axis],), (scales[axis],), log_gamma, q.device, q.dtype) if any(log_gamma) else None
        ql, kl, vl = (rearrange(t, f"{grid} -> {lines}") for t in (q, k, out))
        out = rearrange(F.scaled_dot_product_attention(ql, kl, vl, attn_mask=bias), f"{lines} -> {grid}", **sizes)
    return out.flatten(2, -2)


def stripe_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spatial_shape: Sequence[int],
    axis: int,
    width: int,
) -> torch.Tensor:
    """CSWin stripe attention: each token attends to the tokens of its stripe.

    A stripe runs the full length of ``axis`` and is ``width`` tokens wide along every other axis (stripes
    start at index 0; a width larger than an axis is clamped to it). Axes that are not a multiple of the
    width are zero-padded, and the padded tokens are masked out as keys, so they never receive weight;
    padded queries are cropped away.

    Returns:
        ``(B, heads, N, head_dim)``.
    """
    shape = _check_tokens(q, spatial_shape)
    batch, ndim = q.shape[0], len(shape)

    def partition(t: torch.Tensor) -> torch.Tensor:  # (B, h, N, d) -> (stripes * B, h, tokens per stripe, d)
        stripes = stripe_partition(t.transpose(-1, -2).unflatten(-1, shape), shape, axis, width)
        return stripes.flatten(-ndim).transpose(-1, -2).flatten(0, 1)

    widths = _stripe_widths(shape, axis, width)
    mask = None
    if any(size % w for size, w in zip(shape, widths)):
        valid = stripe_partition(torch.ones(shape, device=q.device), shape, axis, width).flatten(1) > 0  # (S, T)
        mask = valid[:, None, None, None, :].expand(-1, batch, 1, 1, -1).flatten(0, 1)  # (S * B, 1, 1, T)
    out = F.scaled_dot_product_attention(partition(q), partition(k), partition(v), attn_mask=mask)
    out = out.unflatten(0, (-1, batch)).transpose(-1, -2).unflatten(-1, widths)  # (S, B, h, d, *widths)
    return stripe_merge(out, shape, axis, width).flatten(-ndim).transpose(-1, -2)


def _stripe_widths(spatial_shape: tuple[int, ...], axis: int, width: int) -> tuple[int, ...]:
    """A stripe's extent per axis: the whole of ``axis``, ``width`` (clamped to the axis) on the others."""
    return tuple(size if a == axis else min(width, size) for a, size in enumerate(spatial_shape))


def _stripe_pattern(ndim: int) -> tuple[str, str, str]:
    """einops names: the padded grid ``(n0 w0) ...``, the stripe counts ``n0 ...`` and the stripe extent ``w0 ...``."""
    return (
        " ".join(f"(n{a} w{a})" for a in range(ndim)),
        " ".join(f"n{a}" for a in range(ndim)),
        " ".join(f"w{a}" for a in range(ndim)),
    )


def stripe_partition(x: torch.Tensor, spatial_shape: Sequence[int], axis: int, width: int) -> torch.Tensor:
    """Cut a grid into CSWin stripes: ``(*lead, *spatial) -> (S, *lead, *stripe)``.

    Stripes run the full length of ``axis`` and are ``width`` tokens wide on the other axes (clamped to the
    axis), starting at index 0; axes that are not a multiple of the width are zero-padded at the end first.
    ``S`` is the number of stripes; :func:`stripe_merge` is the inverse.
    """
    shape = tuple(int(s) for s in spatial_shape)
    widths = _stripe_widths(shape, axis, width)
    pad = [p for size, w in zip(reversed(shape), reversed(widths)) for p in (0, -size % w)]
    grid, counts, extent = _stripe_pattern(len(shape))
    sizes = {f"w{a}": w for a, w in enumerate(widths)}
    return rearrange(F.pad(x, pad), f"... {grid} -> ({counts}) ... {extent}", **sizes)


def stripe_merge(stripes: torch.Tensor, spatial_shape: Sequence[int], axis: int, width: int) -> torch.Tensor:
    """The inverse of :func:`stripe_partition`: ``(S, *lead, *stripe) -> (*lead, *spatial)``, padding cropped."""
    shape = tuple(int(s) for s in spatial_shape)
    widths = _stripe_widths(shape, axis, width)
    grid, counts, extent = _stripe_pattern(len(shape))
    counts_of = {f"n{a}": math.ceil(size / w) for a, (size, w) in enumerate(zip(shape, widths))}
    merged = rearrange(stripes, f"({counts}) ... {extent} -> ... {grid}", **counts_of)
    return merged[(..., *(slice(0, size) for size in shape))]


def within_stripes(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, spatial_shape: Sequence[int], axis: int, width: int
) -> torch.Tensor:
    """Apply a spatial map to every CSWin stripe on its own: ``(B, C, *spatial) -> (B, C, *spatial)``.

    ``fn`` maps ``(B', C, *stripe) -> (B', C, *stripe)`` (e.g. a 'same' depthwise convolution, which then sees
    zeros beyond the stripe's borders, as official CSWin's LePE does); stripes as in :func:`stripe_partition`.
    """
    stripes = stripe_partition(x, spatial_shape, axis, width)
    out = fn(stripes.flatten(0, 1)).unflatten(0, stripes.shape[:2])
    return stripe_merge(out, spatial_shape, axis, width)


def _focus(x: torch.Tensor, focusing_factor: float, scale: torch.Tensor | None) -> torch.Tensor:
    """FLatten's focused feature map on ``(B, N, C)``: ReLU kernel, scale, then ``x**p / |x**p| * |x|``.

    ``x**p / |x**p|`` does not change when ``x`` is scaled, so each token is divided by its largest entry
    before the power: every ``(x / max)**p`` lies in (0, 1] with one entry 1, and no ``p`` overflows. (Without
    it the norm of ``x**p`` squares ``x**p``: float32 overflows once ``x**(2p)`` passes 3.4e38, e.g. entries of
    10 at ``p = 20``, and the result is NaN.)
    """
    x = F.relu(x) + KERNEL_EPS
    if scale is not None:
        x = x / scale.to(x.dtype)
    norm = x.norm(dim=-1, keepdim=True)
    x = (x / x.amax(dim=-1, keepdim=True).detach()) ** focusing_factor  # the result is exactly scale-free
    return x / x.norm(dim=-1, keepdim=True) * norm


def focused_linear(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_heads: int,
    focusing_factor: float,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Focused linear attention (FLatten).

    ``q, k -> relu(.) + 1e-6``, divided by ``scale``; focusing ``x -> x**p / |x**p| * |x|`` with norms over
    all ``C`` channels per token (before the head split); then per head
    ``out_i = q_i (sum_j k_j v_j^T) / (q_i . sum_j k_j + N * 1e-6)`` (computed with means, as FLatten does).
    The focusing and the sums run in at least float32 with autocast disabled; the result is cast back to
    ``v``'s dtype.

    Args:
        q, k, v: ``(B, N, C)``.
        num_heads: heads; must divide ``C``.
        focusing_factor: the power ``p``.
        scale: positive divisor broadcastable to ``(1, 1, C)``, or None.

    Returns:
        ``(B, N, C)``.
    """
    out_dtype = v.dtype
    work = torch.promote_types(q.dtype, torch.float32)
    device = q.device.type
    with torch.autocast(device, enabled=False) if autocast_enabled(device) else nullcontext():
        q = _focus(q.to(work), focusing_factor, scale)
        k = _focus(k.to(work), focusing_factor, scale)
        q, k, v = (split_heads(t, num_heads) for t in (q, k, v.to(work)))
        context = k.transpose(-1, -2) @ v / k.shape[-2]  # (B, h, d, d): mean_j k_j v_j^T
        normaliser = q @ k.mean(dim=-2, keepdim=True).transpose(-1, -2) + LINEAR_EPS  # (B, h, N, 1)
        out = q @ context / normaliser
    return merge_heads(out).to(out_dtype)


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def row_logits(q: torch.Tensor, k: torch.Tensor, index: int) -> torch.Tensor:
    """Scaled scores of query token ``index`` against every key, ``q_index . k_j / sqrt(d)``: ``(B, heads, N)``.

    In at least float32, as every ``*_row`` function returns.
    """
    work = _work_dtype(q)
    return torch.einsum("...nd,...d->...n", k.to(work), q[..., index, :].to(work)) * q.shape[-1] ** -0.5


def softmax_row(q: torch.Tensor, k: torch.Tensor, index: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Row ``index`` of ``softmax(q k^T / sqrt(d) + bias)``: ``(B, heads, N)``; ``bias`` broadcasts to it
    (e.g. ``(heads, N)`` or ``(N,)``; ``-inf`` masks a key out). Row ``index`` of what SDPA applies to ``v``."""
    logits = row_logits(q, k, index)
    return torch.softmax(logits if bias is None else logits + bias.to(logits.dtype), dim=-1)


def log_decay_row(
    spatial_shape: Sequence[int],
    gamma: Gamma,
    num_heads: int,
    index: int,
    *,
    spacing: Sequence[float] | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Row ``index`` of MaSA's bias ``log(gamma_h) * dist`` (:func:`decay_bias`): ``(G, N)``, ``G`` 1 or heads.

    ``exp`` of it is the decay map ``gamma_h ** dist(index, .)``.
    """
    shape = tuple(int(s) for s in spatial_shape)
    log_gamma = torch.tensor(log_gammas(gamma, num_heads), device=device, dtype=torch.float32)
    return log_gamma[:, None] * manhattan_row(shape, axis_scales(len(shape), spacing), index, device)


def masa_row(
    q: torch.Tensor,
    k: torch.Tensor,
    spatial_shape: Sequence[int],
    gamma: Gamma,
    index: int,
    *,
    spacing: Sequence[float] | None = None,
) -> torch.Tensor:
    """Row ``index`` of the attention :func:`masa` applies: ``softmax(q_i k^T / sqrt(d) + log(gamma) * dist_i)``.

    Returns:
        ``(B, heads, N)``, each row summing to 1; no ``N x N`` tensor.
    """
    _check_tokens(q, spatial_shape)
    return softmax_row(q, k, index, log_decay_row(spatial_shape, gamma, q.shape[1], index, spacing=spacing,
                                                  device=q.device))


def masa_decomposed_row(
    q: torch.Tensor,
    k: torch.Tensor,
    spatial_shape: Sequence[int],
    gamma: Gamma,
    index: int,
    *,
    spacing: Sequence[float] | None = None,
) -> torch.Tensor:
    """Row ``index`` of the linear map ``v -> masa_decomposed(q, k, v)``: ``(B, heads, N)``, summing to 1.

    Each pass along axis ``a`` multiplies the values by ``A_a``, the per-line attention along ``a`` (zero
    between lines); the last axis acts first, so ``out = A_0 A_1 ... A_last v``. The row of the product is the
    one-hot row of ``index`` pushed through ``A_0``, then ``A_1`` ...: ``r <- r A_a``, computed on the lines
    where ``r`` is not zero (one line, then a plane, then the whole grid), one head at a time. Memory
    ``O(B * N * L)`` at most, ``L`` the longest line; no ``N x N`` tensor.
    """
    shape = _check_tokens(q, spatial_shape)
    scales = axis_scales(len(shape), spacing)
    log_gamma = log_gammas(gamma, q.shape[1])
    work = _work_dtype(q)
    q, k = (t.to(work).unflatten(-2, shape) for t in (q, k))  # (B, h, *shape, d)
    row = torch.zeros(q.shape[:-1], device=q.device, dtype=work)
    row.view(*row.shape[:2], -1)[..., index] = 1.0
    for axis in range(len(shape)):
        dim = 1 + axis  # of one head's (B, *shape, ...)
        bias = _decay_bias((shape[axis],), (scales[axis],), log_gamma, q.device, work)[0]  # (G, L, L)
        pushed = torch.zeros_like(row)
        for head in range(q.shape[1]):
            lines = row[:, head].movedim(dim, -1)  # (B, *others, L)
            active = lines.ne(0).any(0).any(-1)  # (*others): the lines holding part of the row
            ql, kl = (t[:, head].movedim(dim, -2)[:, active] for t in (q, k))  # (B, M, L, d)
            logits = ql @ kl.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias[head if len(bias) > 1 else 0]
            out = pushed[:, head].movedim(dim, -1)  # a view: writing it fills `pushed`
            out[:, active] = (lines[:, active].unsqueeze(-2) @ torch.softmax(logits, dim=-1)).squeeze(-2)
        row = pushed
    return row.flatten(2)


def stripe_row(
    q: torch.Tensor, k: torch.Tensor, spatial_shape: Sequence[int], axis: int, width: int, index: int
) -> torch.Tensor:
    """Row ``index`` of the attention :func:`stripe_attention` applies: the softmax over the keys of the query's
    stripe, zero elsewhere.

    Returns:
        ``(B, heads, N)``, each row summing to 1 over the stripe.
    """
    shape = _check_tokens(q, spatial_shape)
    widths = torch.tensor(_stripe_widths(shape, axis, width))
    stripe = grid_coordinates(shape) // widths  # along `axis` every token is in stripe 0
    outside = (stripe != stripe[index]).any(-1)
    return softmax_row(q, k, index, torch.zeros(outside.shape).masked_fill(outside, -math.inf).to(q.device))


def focused_linear_row(
    q: torch.Tensor,
    k: torch.Tensor,
    num_heads: int,
    focusing_factor: float,
    index: int,
    scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row ``index`` of :func:`focused_linear`'s attention: ``phi(q_i) . phi(k_j) / sum_j phi(q_i) . phi(k_j)``.

    The op's normaliser adds ``N * LINEAR_EPS`` to the sum ``S``, so its output for token ``index`` is
    ``gain * (row @ v)`` with ``gain = S / (S + N * 1e-6)``: 1 to float precision unless the query's features are
    near zero (a query the ReLU kernel all but silences, whose output is then near zero too).

    Args:
        q, k: ``(B, N, C)``, as :func:`focused_linear` takes them.

    Returns:
        The row ``(B, heads, N)``, summing to 1, and ``gain`` ``(B, heads)``.
    """
    work = _work_dtype(q)
    with torch.autocast(device_type=q.device.type, enabled=False):
        query = split_heads(_focus(q[:, index : index + 1].to(work), focusing_factor, scale), num_heads)
        scores = torch.cat(
            [
                (split_heads(_focus(keys.to(work), focusing_factor, scale), num_heads) @ query.transpose(-1, -2))
                for keys in k.split(ROW_CHUNK, dim=1)
            ],
            dim=-2,
        ).squeeze(-1)  # (B, h, N)
    total = scores.sum(dim=-1)
    return scores / total[..., None], total / (total + scores.shape[-1] * LINEAR_EPS)


def conv_footprint(weight: torch.Tensor, spatial_shape: Sequence[int], index: int) -> torch.Tensor:
    """Where a depthwise 'same' convolution of the values reads from for output token ``index``: ``(1, N)``.

    Token ``j`` enters output ``index`` through the kernel tap at offset ``j - index``; the footprint is that
    tap's magnitude summed over channels, ``sum_c |weight[c, j - index]|`` (zero outside the kernel and the
    grid), normalised to sum to 1.

    Args:
        weight: ``(C, 1, *kernel)``, odd kernel sides.
    """
    shape = tuple(int(s) for s in spatial_shape)
    magnitude = weight.detach().float().abs().sum(0, keepdim=True)  # (1, 1, *kernel)
    one_hot = torch.zeros(1, 1, math.prod(shape), device=weight.device)
    one_hot[..., index] = 1.0
    reach = _depthwise(one_hot.unflatten(-1, shape), magnitude.flip(tuple(range(2, weight.ndim))), None).flatten(1)
    return reach / reach.sum().clamp_min(torch.finfo(reach.dtype).tiny)


def clear_cache() -> None:
    """Release every cached attention tensor: MaSA biases, FlexAttention score_mods and the position tables."""
    decay_bias.cache_clear()
    _manhattan_score_mod.cache_clear()
    position.clear_caches()
