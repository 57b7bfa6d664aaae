"""What an attention map says, in numbers: how far a head looks (mm), how spread its weights are, its decay.

Every function takes one :class:`~medseg.models.inspect.AttentionMap` (one query token, one slot and block):
``weights`` ``(heads, *grid)``, each head's weights summing to 1 over the token grid, ``query`` the query token,
``spacing_mm`` the physical size of one token per axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from medseg.attention.position import grid_coordinates
from medseg.errors import ConfigError

if TYPE_CHECKING:
    from medseg.models.inspect import AttentionMap


def distance_mm(grid: Sequence[int], query: Sequence[int], spacing_mm: Sequence[float]) -> torch.Tensor:
    """``(*grid)`` float64: the Euclidean distance in mm from token ``query`` to every token of ``grid`` (tokens
    ``spacing_mm`` apart per axis)."""
    coords = grid_coordinates(grid).double()
    offset = (coords - torch.tensor(query, dtype=torch.float64)) * torch.tensor(spacing_mm, dtype=torch.float64)
    return offset.square().sum(-1).sqrt().reshape(tuple(grid))


def mean_attention_distance_mm(attention: AttentionMap) -> torch.Tensor:
    """``(heads,)`` float64: each head's attention-weighted mean Euclidean distance (mm) from the query token.

    ``sum_m w_h(m) * ||(m - query) * spacing_mm||``, the "mean attention distance" of ViT analyses in physical units,
    so that maps of different slots, strides and voxel spacings compare.

    Raises:
        ConfigError: the map has no ``spacing_mm`` (it was made without the input's voxel spacing).
    """
    if attention.spacing_mm is None:
        raise ConfigError(f"{attention.slot} block {attention.block}: the attention map has no token spacing in mm; "
                          f"pass voxel_spacing to attention_maps")
    dist = distance_mm(attention.grid, attention.query, attention.spacing_mm)
    weights = attention.weights.detach().cpu().double().flatten(1)
    return weights @ dist.flatten()


def row_entropy(attention: AttentionMap) -> torch.Tensor:
    """``(heads,)`` float64: the Shannon entropy of each head's weights over the tokens, in nats (natural log).

    0 when a head attends to one token; ``log(N)`` when it spreads evenly over all ``N`` tokens.
    """
    weights = attention.weights.detach().cpu().double().flatten(1)
    return -torch.special.xlogy(weights, weights).sum(-1)


def decay_gamma(attention: AttentionMap) -> torch.Tensor | None:
    """``(heads,)`` float64: each head's MaSA decay ``gamma_h``, read off its ``decay`` map; None without one.

    The decay is ``gamma_h ** dist`` with ``dist`` in units of the finest axis's token size, so the query's
    neighbour one token away along that axis holds ``gamma_h`` itself, and every other neighbour at most that: the
    largest decay among the query's one-step neighbours. None too on a grid of a single token (no neighbour).
    """
    if attention.decay is None:
        return None
    decay = attention.decay.detach().cpu().double()
    neighbours = []
    for axis, size in enumerate(attention.grid):
        for step in (-1, 1):
            index = attention.query[axis] + step
            if 0 <= index < size:
                position = list(attention.query)
                position[axis] = index
                neighbours.append(decay[(slice(None), *position)])
    return torch.stack(neighbours, -1).amax(-1) if neighbours else None


def map_summary(attention: AttentionMap) -> dict[str, Any]:
    """One map as JSON: slot, block, kind, grid, query token, token spacing, and per head the mean attention
    distance (mm), the entropy (nats) and, for MaSA, ``gamma``."""
    distance, entropy, gamma = mean_attention_distance_mm(attention), row_entropy(attention), decay_gamma(attention)
    heads = []
    for head in range(len(distance)):
        row = {"head": head, "mean_distance_mm": round(float(distance[head]), 4),
               "entropy_nats": round(float(entropy[head]), 4)}
        if gamma is not None:
            row["gamma"] = round(float(gamma[head]), 6)
        heads.append(row)
    return {
        "slot": attention.slot,
        "block": attention.block,
        "kind": attention.kind,
        "grid": list(attention.grid),
        "query_token": list(attention.query),
        "token_spacing_mm": [round(float(s), 4) for s in attention.spacing_mm or ()],
        "max_entropy_nats": round(math.log(math.prod(attention.grid)), 4),
        "heads": heads,
    }


def slot_distances(maps: Sequence[AttentionMap]) -> dict[str, float]:
    """Per slot, the mean attention distance (mm) averaged over its blocks and heads."""
    per_slot: dict[str, list[torch.Tensor]] = {}
    for attention in maps:
        per_slot.setdefault(attention.slot, []).append(mean_attention_distance_mm(attention))
    return {slot: float(torch.cat(values).mean()) for slot, values in per_slot.items()}
