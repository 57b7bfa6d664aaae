"""PNG montages of attention maps: the network's input window with each head's heat-map on top, the query marked.

One figure per slot and block: one row per head; in 3D three orthogonal slices through the query voxel (axial,
coronal, sagittal of the RAS window), in 2D the slice itself. MaSA's decay maps get a figure of their own. Figures
are matplotlib ``Figure`` objects on the Agg canvas (no pyplot state), for PNG files and TensorBoard alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from medseg.io import atomic_write
from medseg.visualize.measures import decay_gamma, mean_attention_distance_mm
from medseg.visualize.window import QueryWindow, to_voxels, token_stride

if TYPE_CHECKING:
    from pathlib import Path

    from matplotlib.figure import Figure

    from medseg.models.inspect import AttentionMap

PLANES = {2: "axial", 1: "coronal", 0: "sagittal"}
"""RAS volume axis held fixed -> the name of the slice, in the order the columns show them."""
PANEL_INCHES = 2.2
"""Side of one panel."""
HEAT_ALPHA = 0.75
"""Opacity of the heat-map where it is largest (it fades to transparent where the weight is 0)."""


def _planes(axes: Sequence[int]) -> list[tuple[int | None, list[int], str]]:
    """The slices a window shows: ``(window axis held at the query or None, the two window axes shown (horizontal,
    vertical), the slice's name)``; ``axes`` are the RAS volume axes of the window's axes."""
    if len(axes) == 2:
        fixed = next(a for a in range(3) if a not in axes)
        return [(None, [0, 1], PLANES[fixed])]
    held = [(axes.index(fixed), name) for fixed, name in PLANES.items()]
    return [(index, [a for a in range(3) if a != index], name) for index, name in held]


def _section(volume: torch.Tensor, fixed: int | None, index: int) -> torch.Tensor:
    return (volume if fixed is None else volume.select(fixed, index)).float().cpu()


def montage(image: torch.Tensor, rows: Sequence[tuple[str, torch.Tensor]], query: Sequence[int], axes: Sequence[int],
            voxel_spacing: Sequence[float], title: str, cmap: str = "inferno") -> Figure:
    """A figure with one row per ``(label, values)`` of ``rows``: slices of ``image`` with ``values`` on top.

    Args:
        image: ``(*window)`` one channel of the network's input window (2 or 3 axes).
        rows: labels and ``(*window)`` values on the same voxels (e.g. one head's attention weights), each row scaled
            to its own maximum.
        query: the query voxel of the window, marked with a cross.
        axes: the RAS volume axis of each window axis, which names the slices.
        voxel_spacing: mm per window axis, so the slices keep their physical proportions.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    planes = _planes(axes)
    figure = Figure(figsize=(PANEL_INCHES * len(planes), PANEL_INCHES * len(rows) + 0.4), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.subplots(len(rows), len(planes), squeeze=False)
    for row, (label, values) in enumerate(rows):
        peak = float(values.max()) or 1.0
        for column, (fixed, (u, v), name) in enumerate(planes):
            ax: Any = grid[row][column]
            index = 0 if fixed is None else query[fixed]
            background, heat = _section(image, fixed, index), _section(values, fixed, index) / peak
            shown = [a for a in range(len(axes)) if a != fixed]  # the window axes left in the section
            background, heat = (t.permute(shown.index(v), shown.index(u)) for t in (background, heat))
            aspect = voxel_spacing[v] / voxel_spacing[u]
            ax.imshow(background.numpy(), cmap="gray", origin="lower", aspect=aspect)
            ax.imshow(heat.numpy(), cmap=cmap, origin="lower", aspect=aspect, vmin=0.0, vmax=1.0,
                      alpha=(HEAT_ALPHA * heat.clamp(0, 1)).numpy())
            ax.plot(query[u], query[v], marker="+", color="cyan", markersize=9, markeredgewidth=1.5)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(name, fontsize="small")
            if column == 0:
                ax.set_ylabel(label, fontsize="small")
    figure.suptitle(title, fontsize="medium")
    return figure


def attention_figures(image: torch.Tensor, attention: AttentionMap, window: QueryWindow,
                      voxel_spacing: Sequence[float]) -> dict[str, Figure]:
    """The montages of one map: ``weights`` (a row per head, with its mean attention distance) and, for MaSA,
    ``decay`` (a row per head, with its gamma).

    Args:
        image: ``(C, *window)`` the network's input window (the first channel is shown).
        attention: the map of one slot and block for the query of ``window``.
        window: where the window lies (its query, its RAS axes).
        voxel_spacing: mm per window axis.
    """
    stride = token_stride(attention)
    size = image.shape[1:]
    title = f"{attention.slot} block {attention.block} ({attention.kind})"
    distances = mean_attention_distance_mm(attention)
    weights = to_voxels(attention.weights.detach().cpu(), stride, size)
    rows = [(f"head {h}\n{float(d):.1f} mm", weights[h]) for h, d in enumerate(distances)]
    figures = {"weights": montage(image[0], rows, window.net_query, window.net_axes, voxel_spacing, title)}
    gamma = decay_gamma(attention)
    if attention.decay is not None:
        decay = to_voxels(attention.decay.detach().cpu(), stride, size)
        rows = [(f"head {h}" + ("" if gamma is None else f"\nγ={float(gamma[h]):.3f}"), decay[h])
                for h in range(len(decay))]
        figures["decay"] = montage(image[0], rows, window.net_query, window.net_axes, voxel_spacing,
                                   f"{title}: decay", cmap="viridis")
    return figures


def write_png(path: Path, figure: Figure, dpi: int = 100) -> Path:
    """Atomically write ``figure`` as a PNG."""
    return atomic_write(path, lambda handle: figure.savefig(handle, format="png", dpi=dpi))
