"""The conv stages' norms (``model.norm``), and the group norm that stays in the autocast dtype.

``model.norm=instance`` and ``group`` are group norms: instance norm is a group norm with one group per
channel, whose kernels keep channels-last tensors as they are (``nn.InstanceNorm`` copies them to contiguous).
CUDA's autocast lists ``group_norm`` among its float32 ops, which ``nn.InstanceNorm`` (batch norm underneath, as
nnU-Net uses it) is not. A plain ``nn.GroupNorm`` under bf16 autocast would therefore keep a float32 copy of each
norm's input for the backward pass and give a float32 output, which the activation keeps and the next
convolution copies back to bf16: about twice the activation memory of the same stage in nnU-Net.
:class:`AutocastGroupNorm` normalises in the autocast dtype instead, as autocast runs instance norm; its mean and
variance are still accumulated in float32 by the kernel. Outside autocast it is ``nn.GroupNorm``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from monai.networks.layers.factories import Norm
from torch import nn

from medseg.runtime.device import autocast_enabled

NormSpec = str | tuple[str, dict[str, Any]]

GROUP_NORM_GROUPS = 8
"""``model.norm=group``: groups per norm layer (fewer on a level narrower than that, down to one per channel)."""
AUTOCAST_GROUP = "autocast_group"
"""The name :class:`AutocastGroupNorm` has in MONAI's ``Norm`` factory (``norm_name`` of MONAI's blocks)."""


class AutocastGroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` that under autocast normalises in the autocast dtype (bf16/fp16), not in float32.

    The weight and bias are cast to that dtype for the call, as autocast casts a convolution's; their gradients
    reach the float32 parameters through the cast. Parameters and state dict are those of ``nn.GroupNorm``.

    Shapes: ``(B, C, *spatial) -> (B, C, *spatial)``; the output has the autocast dtype under autocast.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if not autocast_enabled(device):
            return super().forward(x)
        dtype = torch.get_autocast_dtype(device)
        weight = None if self.weight is None else self.weight.to(dtype)
        bias = None if self.bias is None else self.bias.to(dtype)
        with torch.autocast(device, enabled=False):
            return F.group_norm(x.to(dtype), self.num_groups, weight, bias, self.eps)


if AUTOCAST_GROUP.upper() not in Norm.names:
    Norm.add_factory_callable(AUTOCAST_GROUP, lambda _spatial_dims: AutocastGroupNorm,
                              "group norm that stays in the autocast dtype (medseg)")


def _instance_norm(width: int) -> NormSpec:
    return (AUTOCAST_GROUP, {"num_groups": width, "affine": True})


NORMS: dict[str, Callable[[int], NormSpec]] = {
    "instance": _instance_norm,
    "batch": lambda width: "batch",
    "group": lambda width: (AUTOCAST_GROUP, {"num_groups": math.gcd(GROUP_NORM_GROUPS, width)}),
}
"""The values of ``model.norm``: name -> the MONAI ``norm_name`` of a level ``width`` channels wide."""
