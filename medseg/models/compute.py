"""The compute of a network: FLOPs of one forward pass, counted by ``torch.utils.flop_counter.FlopCounterMode``.

The network runs on the **meta device**: tensors there have shapes but no data, so the count costs neither the
memory nor the time of a real forward pass, and gives the same figure on every machine.

What is counted is FlopCounterMode's convention: matrix products and convolutions, a multiply-add counting 2.

* a convolution ``2 * C_in / groups * C_out * prod(kernel) * output voxels`` per sample (a transposed one:
  ``... * input voxels``); its bias is not counted;
* a linear layer ``2 * in * out`` per token (``addmm``; its bias not counted), a batched product ``2 * m * k * n``
  per matrix (``bmm``);
* attention: on the meta device ``scaled_dot_product_attention`` runs its math path, two batched products,
  ``4 * B * heads * N_q * N_k * head_dim``: what torch counts for its fused CUDA kernels and for FlexAttention;
* norms, activations, softmax, additions, pooling and interpolation count 0.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from medseg.config import ModelConfig
from medseg.models.registry import build_model

log = logging.getLogger("medseg")

META = torch.device("meta")


def forward_flops(model: nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one forward pass of ``model`` (on the meta device) on an input of ``input_shape``.

    Args:
        model: a network whose parameters and buffers are on the meta device (built under
            ``with torch.device("meta")``), in the mode to count (``train()`` counts a training forward:
            deep supervision's heads included).
        input_shape: ``(B, C, *spatial)``.

    Returns:
        The FLOPs (module docstring) of the whole batch, without gradients.
    """
    x = torch.empty(tuple(input_shape), device=META)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def patch_forward_flops(cfg: ModelConfig, in_channels: int, out_channels: int,
                        patch_size: Sequence[int]) -> int | None:
    """FLOPs of one training forward of the network ``cfg`` describes on one patch: batch 1, ``patch_size``
    ``(*spatial)``, in train mode.

    The network is built anew on the meta device, with the RNG state left as it was. None (and a warning that
    says why) for a network that cannot run there, such as one that reads a tensor's values in its forward
    pass (MONAI's SwinUNETR does).
    """
    try:
        with torch.random.fork_rng(devices=[]), META:
            model = build_model(cfg, in_channels, out_channels, patch_size)
        return forward_flops(model.train(), (1, in_channels, *patch_size))
    except (RuntimeError, NotImplementedError) as err:
        log.warning("FLOPs of model.name=%s not counted: it does not run on the meta device (%s)",
                    cfg.name, str(err).splitlines()[0])
        return None
