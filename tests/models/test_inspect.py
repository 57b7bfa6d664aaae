"""Attention rows and maps (:mod:`medseg.models.inspect`) against dense matrices built from the equations."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from medseg.attention import ATTENTION_BLOCKS, available_blocks, build_attention
from medseg.attention.common import DepthwiseConv, SpatialAttention, split_heads
from medseg.attention.position import relative_bias, resize_grid
from medseg.errors import ConfigError
from medseg.models.inspect import (
    attention_maps,
    attention_slots,
    block_kind,
    capture_mix,
    has_attention_rows,
    token_position,
)
from medseg.models.unet import SlottedUNet
from tests.attention import reference
from tests.attention import throwaway_block as throwaway

DIM, HEADS = 36, 6  # head_dim 6: one rotary pair per axis in 3D
SHAPES = {2: (5, 7), 3: (3, 5, 6)}
QUERIES = {2: (1, 5), 3: (2, 1, 4)}
EXTRA = [
    ("masa", {"heads_range": 3.0, "rope": "axial"}),
    ("masa_decomposed", {"heads_range": 3.0, "gamma": 0.7}),
    ("focused_linear", {"positional_size": 0}),
    ("cswin", {"split_size": 3}),
    ("mha", {"pe": "relative"}),
    ("mha", {"pe": "none", "rope": "axial"}),
]
CASES = [(name, {}) for name in available_blocks() if has_attention_rows(ATTENTION_BLOCKS[name])] + EXTRA
dims = pytest.mark.parametrize("spatial_dims", [2, 3], ids=["2d", "3d"])


def make(name: str, cfg: dict, spatial_dims: int, spacing: tuple[float, ...] | None = None) -> SpatialAttention:
    """A block with every parameter random (zero-initialised terms such as FLatten's positional one included)."""
    torch.manual_seed(0)
    extra = {"spacing": spacing or (2.0, *(1.0,) * (spatial_dims - 1))} if name.startswith("masa") else {}
    block = build_attention(name, DIM, spatial_dims, grid=SHAPES[spatial_dims], num_heads=HEADS, **extra, **cfg)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.normal_(0.0, 0.5)
    return block.eval()


def capture(block: SpatialAttention, x: torch.Tensor) -> dict:
    """q, k, v, the grid and the output of the block's ``mix`` in one forward pass of ``x``."""
    seen: dict = {}

    def hook(attention: SpatialAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             shape: tuple[int, ...], out: torch.Tensor) -> None:
        seen.update(q=q, k=k, v=v, shape=shape, out=out)

    with torch.no_grad(), capture_mix([block], hook):
        block(x)
    return seen


def flat(position: tuple[int, ...], shape: tuple[int, ...]) -> int:
    return reference.coordinates(shape).index(tuple(position))


def distances(shape: tuple[int, ...], scales: list[float]) -> torch.Tensor:
    """``(N, N)`` Manhattan distances, axis steps weighted by ``scales``."""
    coords = torch.tensor(reference.coordinates(shape), dtype=torch.float64)
    return ((coords[:, None] - coords[None]).abs() * torch.tensor(scales, dtype=torch.float64)).sum(-1)


def heads64(block: SpatialAttention, t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``(1, N, C)`` -> ``(heads, N, d)`` float64, rotated as the block rotates q and k."""
    t = split_heads(t.double(), block.num_heads)[0]
    return reference.axial_rope(t, shape) if getattr(block, "rope", "none") == "axial" else t


def softmax_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def dense_masa(block: SpatialAttention, q: torch.Tensor, k: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """RMT: ``softmax(q k^T / sqrt(d)) * gamma ** dist``, rows renormalised: ``(heads, N, N)``."""
    gammas = torch.tensor(reference.per_head(list(block.gamma) if isinstance(block.gamma, tuple) else block.gamma,
                                             block.num_heads), dtype=torch.float64)
    decay = gammas[:, None, None] ** distances(shape, reference.scales_of(shape, block.spacing))
    attn = reference.softmax_rows(softmax_scores(q, k)) * decay
    return attn / attn.sum(-1, keepdim=True)


def dense_masa_decomposed(block: SpatialAttention, q: torch.Tensor, k: torch.Tensor,
                          shape: tuple[int, ...]) -> torch.Tensor:
    """The product of the per-axis attention matrices, ``A_D A_H A_W`` (``A_W`` acts on v first): ``(heads, N, N)``."""
    gammas = torch.tensor(reference.per_head(list(block.gamma) if isinstance(block.gamma, tuple) else block.gamma,
                                             block.num_heads), dtype=torch.float64)[:, None, None]
    coords = torch.tensor(reference.coordinates(shape))
    scales = reference.scales_of(shape, block.spacing)
    total = torch.eye(math.prod(shape), dtype=torch.float64)
    for axis in range(len(shape)):  # total = A_0 A_1 ... A_last
        others = [a for a in range(len(shape)) if a != axis]
        same_line = (coords[:, None, others] == coords[None, :, others]).all(-1)
        step = (coords[:, None, axis] - coords[None, :, axis]).abs().double() * scales[axis]
        attn = reference.softmax_rows(softmax_scores(q, k).masked_fill(~same_line, -math.inf)) * gammas**step
        total = total @ (attn / attn.sum(-1, keepdim=True))
    return total


def dense_focused_linear(block: SpatialAttention, q: torch.Tensor, k: torch.Tensor,
                         shape: tuple[int, ...]) -> torch.Tensor:
    """FLatten: ``phi(q_i) . phi(k_j)`` normalised per row, ``phi`` per token from the paper: ``(heads, N, N)``."""
    scale = torch.nn.functional.softplus(block.scale.double()).reshape(-1)
    positional = resize_grid(block.positional.double(), shape).flatten(2)[0].T  # (N, C)

    def phi(x: torch.Tensor) -> torch.Tensor:
        f = (torch.clamp(x, min=0) + 1e-6) / scale
        return f**block.focusing_factor / (f**block.focusing_factor).norm(dim=-1, keepdim=True) * f.norm(dim=-1,
                                                                                                         keepdim=True)

    qf, kf = (split_heads(phi(t)[None], block.num_heads)[0] for t in (q[0].double(), k[0].double() + positional))
    scores = qf @ kf.transpose(-1, -2)
    return scores / scores.sum(-1, keepdim=True)


def dense_cswin(block: SpatialAttention, q: torch.Tensor, k: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Each head group attends within its axis's stripes (``reference.stripe_of``): ``(heads, N, N)``."""
    positions = reference.coordinates(shape)
    groups = []
    for axis, heads in enumerate(block.group_heads):
        stripe = reference.stripe_of(axis, block.split_size)
        same = torch.tensor([[stripe(n) == stripe(m) for m in positions] for n in positions])
        groups.append(same.expand(heads, -1, -1))
    return reference.softmax_rows(softmax_scores(q, k).masked_fill(~torch.cat(groups), -math.inf))


def dense_mha(block: SpatialAttention, q: torch.Tensor, k: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Softmax attention (sincos is in q and k already), plus the relative bias for ``pe=relative``."""
    scores = softmax_scores(q, k)
    if block.pe == "relative":
        scores = scores + relative_bias(block.relative_table.double(), shape)[0]
    return reference.softmax_rows(scores)


DENSE = {"masa": dense_masa, "masa_decomposed": dense_masa_decomposed, "focused_linear": dense_focused_linear,
         "cswin": dense_cswin, "mha": dense_mha}


def row_and_dense(name: str, cfg: dict, spatial_dims: int) -> tuple:
    block = make(name, cfg, spatial_dims)
    shape = SHAPES[spatial_dims]
    with torch.no_grad():
        for conv in (m for m in block.modules() if isinstance(m, DepthwiseConv)):  # no LCE / LePE / DWC term
            conv.weight.zero_()
            conv.bias.zero_()
    seen = capture(block, torch.randn(1, DIM, *shape))
    index = flat(QUERIES[spatial_dims], shape)
    with torch.no_grad():
        row = block.attention_row(seen["q"], seen["k"], shape, index)
    q, k = seen["q"], seen["k"]
    if name != "focused_linear":
        q, k = heads64(block, q, shape), heads64(block, k, shape)
    return block, seen, index, row, DENSE[name](block, q, k, shape)


@pytest.mark.parametrize(("name", "cfg"), CASES, ids=[n + "".join(f"-{v}" for v in c.values()) for n, c in CASES])
@dims
def test_row_is_the_dense_matrix_row_and_gives_the_output(name: str, cfg: dict, spatial_dims: int) -> None:
    if name not in DENSE:  # a block registered by users: it has no rows, and says so
        return check_block_without_rows(name)
    block, seen, index, row, dense = row_and_dense(name, cfg, spatial_dims)
    weights = row.weights[0]
    assert weights.shape == (HEADS, math.prod(SHAPES[spatial_dims])) and weights.dtype == torch.float32
    torch.testing.assert_close(weights.double(), dense[:, index], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(HEADS), rtol=0, atol=1e-5)
    # row @ V is the token's attention output (all conv terms are zero here), before the output projection
    v = split_heads(seen["v"], HEADS)[0]
    out = split_heads(seen["out"], HEADS)[0, :, index]
    gain = torch.ones(HEADS) if row.gain is None else row.gain[0]
    torch.testing.assert_close(gain[:, None] * (weights[:, None] @ v)[:, 0], out, rtol=1e-5, atol=1e-5)


def test_decomposed_dense_product_is_the_slow_reference() -> None:
    """The test's product of per-axis matrices applied to v is the reference chain's output (it is the map)."""
    block = make("masa_decomposed", {"heads_range": 3.0}, 3)
    shape = SHAPES[3]
    q, k, v = (torch.randn(1, HEADS, math.prod(shape), DIM // HEADS, dtype=torch.float64) for _ in range(3))
    dense = dense_masa_decomposed(block, q[0], k[0], shape)
    expected = reference.masa_decomposed(q, k, v, shape, list(block.gamma), block.spacing)[0]
    torch.testing.assert_close(dense @ v[0], expected)


@pytest.mark.parametrize("name", ["masa", "masa_decomposed"])
@dims
def test_masa_decay_and_content(name: str, spatial_dims: int) -> None:
    block, seen, index, row, _ = row_and_dense(name, {"heads_range": 3.0}, spatial_dims)
    shape = SHAPES[spatial_dims]
    query = QUERIES[spatial_dims]
    scales = [s / min(block.spacing) for s in block.spacing]
    hand = torch.tensor([sum(abs(a - b) * s for a, b, s in zip(position, query, scales))
                         for position in reference.coordinates(shape)])
    expected = torch.tensor(block.gamma)[:, None] ** hand
    torch.testing.assert_close(row.decay[0], expected.float())
    if name == "masa":
        product = row.content[0] * row.decay[0]
        torch.testing.assert_close(row.weights[0], product / product.sum(-1, keepdim=True))
        q, k = heads64(block, seen["q"], shape), heads64(block, seen["k"], shape)
        dense = reference.softmax_rows(softmax_scores(q, k))[:, index]
        torch.testing.assert_close(row.content[0].double(), dense, rtol=1e-5, atol=1e-6)
    else:
        assert row.content is None


def decay_map(gamma: float, spacing: tuple[float, ...], shape: tuple[int, ...] = (9, 11)) -> tuple:
    block = build_attention("masa", 8, len(shape), num_heads=2, gamma=gamma, spacing=spacing)
    query = tuple(s // 2 for s in shape)
    tokens = torch.zeros(1, math.prod(shape), 8)
    row = block.attention_row(tokens, tokens, shape, flat(query, shape))
    return row.decay[0, 0].reshape(shape), query


def test_thick_axis_shortens_the_decay() -> None:
    decay, (i, j) = decay_map(0.8, (5.0, 1.0))
    assert decay[i + 1, j] < decay[i, j + 1] < 1
    assert decay[i + 1, j] == pytest.approx(0.8**5) and decay[i, j + 1] == pytest.approx(0.8)
    isotropic, _ = decay_map(0.8, (1.0, 1.0))
    assert isotropic[i + 1, j] == pytest.approx(isotropic[i, j + 1])


def test_smaller_gamma_gives_a_shorter_mean_attention_distance() -> None:
    spacing = (3.0, 1.0)
    means = []
    for gamma in (0.5, 0.7, 0.9):
        decay, query = decay_map(gamma, spacing)
        coords = torch.tensor(reference.coordinates(tuple(decay.shape)), dtype=torch.float32)
        mm = ((coords - torch.tensor(query)).abs() * torch.tensor(spacing)).sum(-1)  # physical distance
        weights = decay.flatten() / decay.sum()
        means.append(float((weights * mm).sum()))
    assert means[0] < means[1] < means[2]


@dims
def test_focused_linear_dwc_footprint(spatial_dims: int) -> None:
    block = make("focused_linear", {"kernel_size": 3}, spatial_dims)
    shape = SHAPES[spatial_dims]
    query = (0, *QUERIES[spatial_dims][1:])  # on the border: taps beyond it read zeros and are dropped
    tokens = torch.randn(1, math.prod(shape), DIM)
    footprint = block.attention_row(tokens, tokens, shape, flat(query, shape)).extras["dwc_footprint"][0, 0]
    weight = block.rank_restoration.conv.weight.detach().abs().sum(0)[0]  # (3, 3[, 3])
    expected = torch.zeros(shape)
    for position in reference.coordinates(shape):
        offset = [p - q for p, q in zip(position, query)]
        if all(abs(o) <= 1 for o in offset):
            expected[position] = weight[tuple(o + 1 for o in offset)]
    torch.testing.assert_close(footprint.reshape(shape), expected / expected.sum())


def small_unet(bottleneck: str = "masa", decoder: str = "focused_linear", **kwargs) -> SlottedUNet:
    torch.manual_seed(0)
    return SlottedUNet(3, 1, 2, channels=(4, 8, 12), strides=((2, 2, 1), 2), bottleneck=bottleneck, decoder=decoder,
                       decoder_levels=2, attention={"num_heads": 2}, **kwargs)


def test_unet_gives_one_map_per_slot_and_block() -> None:
    model = small_unet()
    model.train()
    image, query = torch.randn(1, 1, 9, 11, 5), (8, 6, 3)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    maps = attention_maps(torch.compile(model), image, query, voxel_spacing=(0.5, 0.5, 2.0))
    # padded to multiples of (4, 4, 2): 12 x 12 x 6; level 1 is 6 x 6 x 6, level 2 (bottleneck) 3 x 3 x 3
    expected = [
        ("bottleneck", 0, "masa", (3, 3, 3), (2, 1, 1), (4, 4, 2), (2.0, 2.0, 4.0)),
        ("bottleneck", 1, "masa", (3, 3, 3), (2, 1, 1), (4, 4, 2), (2.0, 2.0, 4.0)),
        ("decoder_slots.1", 0, "focused_linear", (6, 6, 6), (4, 3, 3), (2, 2, 1), (1.0, 1.0, 2.0)),
        ("decoder_slots.0", 0, "focused_linear", (12, 12, 6), (8, 6, 3), (1, 1, 1), (0.5, 0.5, 2.0)),
    ]
    assert [(m.slot, m.block, m.kind, m.grid, m.query, m.stride, m.spacing_mm) for m in maps] == expected
    for m in maps:
        assert m.weights.shape == (2, *m.grid) and m.weights.dtype == torch.float32
        torch.testing.assert_close(m.weights.flatten(1).sum(-1), torch.ones(2))
        assert (m.decay is not None) == (m.kind == "masa") and ("dwc_footprint" in m.extras) == (m.kind != "masa")
    # the model is as it was: weights, train mode everywhere, no hook left
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())
    assert all(module.training for module in model.modules())
    assert not any("mix" in vars(attention) for slot in attention_slots(model) for attention in slot.attentions)


def test_unet_map_is_the_row_of_the_query_token() -> None:
    model = small_unet().eval()
    image, query = torch.randn(1, 1, 9, 11, 5), (5, 2, 4)
    maps = attention_maps(model, image, query)
    rows = []

    def hook(attention: SpatialAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             shape: tuple[int, ...], out: torch.Tensor) -> None:
        position = tuple(p // s for p, s in zip(query, (4, 4, 2) if shape[0] == 3 else (2, 2, 1)))
        rows.append(attention.attention_row(q, k, shape, flat(position, shape)).weights[0].reshape(-1, *shape))

    attentions = [a for slot in attention_slots(model) for a in slot.attentions][:3]  # the bottleneck and level 1
    with torch.no_grad(), capture_mix(attentions, hook):
        model(image)
    assert len(rows) == 3 and maps[0].spacing_mm is None
    for m, row in zip(maps, rows):
        torch.testing.assert_close(m.weights, row)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_maps_on_cuda_equal_the_cpu_maps() -> None:
    model = small_unet().eval()
    image, query = torch.randn(1, 1, 9, 11, 5), (5, 2, 4)
    on_cpu = attention_maps(model, image, query, voxel_spacing=(0.5, 0.5, 2.0))
    on_cuda = attention_maps(model.cuda(), image.cuda(), query, voxel_spacing=(0.5, 0.5, 2.0))
    assert [(m.slot, m.block, m.grid, m.query) for m in on_cuda] == [(m.slot, m.block, m.grid, m.query) for m in on_cpu]
    for gpu, cpu in zip(on_cuda, on_cpu):
        assert gpu.weights.device.type == "cpu"  # maps come back on the CPU whatever the model's device
        torch.testing.assert_close(gpu.weights, cpu.weights, rtol=1e-4, atol=1e-5)


def test_token_position_clips_to_the_grid() -> None:
    assert token_position((7, 0, 9), (4, 4, 2), (2, 3, 4)) == (1, 0, 3)


@pytest.mark.parametrize("query", [(9, 0, 0), (0, -1, 0), (0, 0, 5), (1, 2)], ids=str)
def test_query_outside_the_image_is_a_one_line_error(query: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError, match=r"outside the image of shape \(9, 11, 5\): valid range per axis "
                                          r"0..8, 0..10, 0..4$"):
        attention_maps(small_unet(), torch.randn(1, 1, 9, 11, 5), query)


def test_model_without_attention_is_a_one_line_error() -> None:
    for model in (small_unet("none", "none"), torch.nn.Conv3d(1, 2, 3)):
        with pytest.raises(ConfigError, match=r"has no attention slot: .*SlottedUNet\) with bottleneck or decoder "
                                              r"set to one of ") as error:
            attention_maps(model, torch.randn(1, 1, 8, 8, 4), (0, 0, 0))
        assert "\n" not in str(error.value) and "model." not in str(error.value), "the U-Net's parameters, no keys"
    with pytest.raises(ConfigError, match="voxel_spacing"):
        attention_maps(small_unet(), torch.randn(1, 1, 8, 8, 4), (0, 0, 0), voxel_spacing=(1.0, 1.0))
    with pytest.raises(ConfigError, match=r"one image of shape \(1, C, <3 spatial axes>\), got \(2, 1, 8, 8, 4\)"):
        attention_maps(small_unet(), torch.randn(2, 1, 8, 8, 4), (0, 0, 0))


@pytest.fixture
def throwaway_registered() -> Iterator[str]:
    """The user block of :mod:`tests.attention.throwaway_block`, registered for one test unless it already is."""
    registered_here = throwaway.NAME not in ATTENTION_BLOCKS
    if registered_here:
        throwaway.register()
    yield throwaway.NAME
    if registered_here:
        throwaway.unregister()


def check_block_without_rows(name: str) -> None:
    model = SlottedUNet(2, 1, 2, channels=(4, 8), strides=(2,), bottleneck=name, attention={"num_heads": 2})
    assert block_kind(model.bottleneck[0].attention) == name
    with pytest.raises(ConfigError, match=rf"attention block '{name}' .* has no attention rows") as error:
        attention_maps(model, torch.randn(1, 1, 6, 6), (1, 1))
    assert "\n" not in str(error.value)


def test_block_without_rows_is_a_one_line_error(throwaway_registered: str) -> None:
    check_block_without_rows(throwaway_registered)


def test_identity_block_has_no_map_and_says_why() -> None:
    model = SlottedUNet(2, 1, 2, channels=(4, 8), strides=(2,), bottleneck="identity", decoder="masa",
                        attention={"num_heads": 2})
    with pytest.raises(ConfigError, match=r"^attention block 'identity' \(slot bottleneck\) mixes no tokens .*"
                                          r"blocks with attention maps: \['masa', ") as error:
        attention_maps(model, torch.randn(1, 1, 6, 6), (1, 1))
    assert "\n" not in str(error.value) and "'identity'" not in str(error.value).partition("maps:")[2]
