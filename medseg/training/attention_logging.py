"""Attention maps during training (``trainer.attention_maps=true``): one foreground voxel, one window, each validation.

The query is the foreground voxel nearest the centre of mass of the label of the first validation case (the volume's
centre without foreground); the network runs once on the window around it (:mod:`.window`), and its maps go to
TensorBoard as montages
(``val/attention/<slot>/block<b>``, ``.../decay`` for MaSA) and as each head's mean attention distance
(``val/attention_distance_mm/<slot>/block<b>/head<h>``). The mean over blocks and heads of each slot is returned for
the epoch record, so it lands in ``metrics.json`` and the sweep summary.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from medseg.data.reading import IMAGE, LABEL
from medseg.data.transforms import Window
from medseg.models.inspect import attention_maps, attention_slots
from medseg.training.tensorboard import TensorBoardLogger
from medseg.visualize.measures import mean_attention_distance_mm, slot_distances
from medseg.visualize.montage import attention_figures
from medseg.visualize.window import foreground_voxel, query_window


def log_attention(tb: TensorBoardLogger, model: nn.Module, case: Mapping[str, Any], view: Window, spatial_dims: int,
                  spacing: Sequence[float], device: torch.device, step: int) -> dict[str, float]:
    """Log the attention maps of one foreground voxel of ``case`` to TensorBoard; per slot, its mean distance (mm).

    Args:
        model: the network (:func:`~medseg.models.inspect.attention_maps` runs it in eval mode, unwrapped).
        case: a preprocessed validation case: ``image`` ``(C, X, Y, Z)`` and ``label`` ``(1, X, Y, Z)``.
        view: the network's window. spatial_dims: the network's (2 or 3).
        spacing: mm per RAS axis of the preprocessed volume (the training spacing).
        step: the TensorBoard step (the epoch).

    Returns:
        ``{slot: mean attention distance in mm over its blocks and heads}``; empty for a network without attention
        slots (with a warning).
    """
    if not attention_slots(model):
        warnings.warn("trainer.attention_maps=true, but the network has no attention slot: nothing to log",
                      stacklevel=2)
        return {}
    image, label = torch.as_tensor(case[IMAGE]), torch.as_tensor(case[LABEL])[0].cpu().numpy()
    voxel = foreground_voxel(label) or tuple(n // 2 for n in label.shape)
    window = query_window(voxel, image.shape[1:], view, spatial_dims)
    net_spacing = [float(spacing[axis]) for axis in window.net_axes]
    crop = window.crop(image)
    maps = attention_maps(model, crop[None].to(device), window.net_query, net_spacing)
    for attention in maps:
        tag = f"{attention.slot}/block{attention.block}"
        for name, figure in attention_figures(crop, attention, window, net_spacing).items():
            tb.figure(f"val/attention/{tag}" + ("/decay" if name == "decay" else ""), figure, step)
        distances = mean_attention_distance_mm(attention)
        tb.values({f"val/attention_distance_mm/{tag}/head{h}": float(d) for h, d in enumerate(distances)}, step)
    return slot_distances(maps)
