"""Training memory of the slotted U-Net for a patch and a batch, estimated without running it.

A training step (:class:`~medseg.training.trainer.TrainStep`) peaks when the forward pass and the loss are done,
holding:

* the tensors autograd keeps for the backward pass of every conv stage, counted in feature maps of the stage's
  width on its level's grid: per block of an encoder stage, the ``block_tensors`` of its conv-stage style
  (:class:`~medseg.models.conv_stages.ConvStages`: 5 for a residual block, MONAI's ``UnetResBlock`` or nnU-Net's
  ``BasicBlockD``: both conv outputs, the first activation, the residual branch's conv output, the block's output,
  the last one's also the skip connection; 2 for a conv layer of nnU-Net's ``PlainConvUNet``; ``model.encoder_blocks``
  of them) and per decoder stage
  :data:`DECODER_CONCAT_TENSORS` (the concatenation of the up-sampled and the skip features, two widths) and
  :data:`DECODER_CONV_TENSORS` per conv (its output and activation; ``model.decoder_convs`` of them);
* those of every transformer block in an attention slot, in token maps ``(N, C)``: :data:`BLOCK_TENSORS`, plus
  the FFN's hidden layer (``mlp_ratio`` wide) :data:`HIDDEN_TENSORS` times, twice that with ``ffn=dwconv``;
  :data:`CHECKPOINTED_BLOCK_TENSORS` under activation checkpointing. A slot whose block holds a dense ``N x N``
  attention bias (``bias_heads``: MaSA's decay, MHA's learned relative bias and its gradient) holds it once for
  the whole batch (:func:`~medseg.attention.common.dense_bias_bytes`);
* the input and, at full resolution, the logits and the loss's tensors (:data:`LOSS_TENSORS` maps of the classes;
  at every supervised level under deep supervision);
* the weights, their gradients (the previous step's, freed only after the loss) and the optimizer's state
  (:func:`optimizer_states`), and under autocast the low-precision copies of the weights.

The activations get :data:`ACTIVATION_FACTOR` on top of this count, for what the count leaves out (temporaries,
norm statistics, the backward pass's first gradients); the factor and the bytes per element under autocast are
fitted to measured peaks (`benchmarks/models.py` in the clone, which counts every tensor alive at the high-water
mark). The network is built on the ``meta`` device (no memory) for its parameters and attention slots.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cache, lru_cache

import torch
from torch import nn

from medseg.attention.block import TransformerBlock
from medseg.attention.common import FLOAT32_BYTES, dense_bias_bytes
from medseg.attention.registry import ATTENTION_BLOCKS
from medseg.config import ModelConfig, TrainerConfig, attention_config
from medseg.errors import ConfigError
from medseg.models import SlottedUNet, build_model
from medseg.models.conv_stages import get_conv_stages
from medseg.models.unet import level_grid
from medseg.optim import OPTIMIZERS

DECODER_CONCAT_TENSORS = 2
"""Feature maps of a decoder stage's concatenation (up-sampled and skip features), in units of its width x its grid."""
DECODER_CONV_TENSORS = 2
"""Feature maps each conv of a decoder stage keeps (its output and activation), in units of its width x its grid."""
BLOCK_TENSORS = 12
"""Token maps ``(N, C)`` a transformer block keeps besides its FFN's hidden layer: the position-encoded input, both
norms' outputs, q, k and v and their head-split copies, the attention output, the local-context term, the two
residual sums."""
HIDDEN_TENSORS = 2
"""Hidden-layer maps ``(N, mlp_ratio * C)`` of the FFN (the linear layer's output and its GELU); doubled by
``ffn=dwconv`` (the depthwise conv's output and the sum)."""
CHECKPOINTED_BLOCK_TENSORS = 4
"""Token maps a transformer block keeps under ``model.checkpointing`` (its input and residual sums)."""
LOSS_TENSORS = 4
"""Maps of ``out_channels`` the logits and the loss keep at a supervised level (logits, probabilities, one-hot
label, the cross-entropy's log-probabilities)."""
ACTIVATION_FACTOR = 1.1
"""Measured peak activation bytes per counted activation byte, in float32 (fitted: 1.10)."""
PARAMETER_TEMPORARIES = 0.45
"""Parameter-sized copies alive at the peak besides the weights, gradients and optimizer state, such as the
convolution kernels' reordered weights (fitted: 0.44)."""
AUTOCAST_ELEMENT_BYTES = 2.2
"""Bytes per counted activation element under bf16/fp16 autocast: the conv stages keep 2-byte activations, their
norms included (:class:`~medseg.models.norms.AutocastGroupNorm`). Fitted to measured peaks on an x86 CPU with
native bf16 (oneDNN's bf16 kernels, ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``), whose autocast runs the conv
stages in the same dtypes as CUDA's (3D and 2D U-Nets, with and without a MaSA bottleneck), and rounded up for what
CUDA's autocast keeps in float32 besides (the attention blocks' layer norms, the loss's softmax). The fit holds for
such CPUs only: one without native bf16 converts through float32 buffers and peaks far above the estimate, and a GPU
is a case of its own (cuDNN's kernels and workspaces), which the GPU check's ``planner`` part measures. What holds on
every machine is the ratio of the bytes autograd keeps, bf16 to fp32, which autocast decides and this constant
bounds (2.2 of fp32's 4 bytes). The figures: docs/data.md, "What is planned, and how to override it"."""
AUTOCAST_WEIGHTS = 0.5
"""Autocast's cached low-precision copies of the weights, in float32 copies."""
# The fitted constants come from CPU measurements (10 networks in fp32 and 5 in bf16, 2D and 3D, 3 to 5 levels,
# with and without attention slots, batch 2 to 8); their GPU calibration waits for a GPU (cuDNN workspaces are not
# in them).
META_CACHE_SIZE = 64
"""Networks built on the meta device and kept: a planner estimates many patches for a handful of networks."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated peak bytes of one training step (forward, loss, backward, optimizer update)."""

    per_sample: int
    """Activations of one patch: conv stages, attention slots, input, logits and loss."""
    batch: int
    """Patches per step."""
    shared: int
    """Dense attention biases, held once for the batch."""
    states: int
    """Weights, gradients and optimizer state (and autocast's weight copies)."""

    @property
    def total(self) -> int:
        """Bytes of the whole step: ``states + shared + batch * per_sample``."""
        return self.states + self.shared + self.batch * self.per_sample


@cache
def optimizer_states(name: str) -> int:
    """Parameter-sized tensors ``trainer.optimizer=name`` keeps per parameter (AdamW 2, SGD with momentum 1),
    counted on a one-element parameter after one step."""
    param = nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    optimizer = OPTIMIZERS[name]([param], TrainerConfig(optimizer=name))
    optimizer.step()
    return sum(1 for value in optimizer.state[param].values()
               if isinstance(value, torch.Tensor) and value.shape == param.shape)


@lru_cache(maxsize=META_CACHE_SIZE)
def _meta_network(model_json: str, in_channels: int, out_channels: int,
                  patch_size: tuple[int, ...] | None) -> SlottedUNet:
    """The slotted U-Net of a model config (JSON of its fields) on the meta device."""
    fields = json.loads(model_json)
    model = ModelConfig(**{**fields, "attention": attention_config(**fields["attention"])})
    with torch.device("meta"):
        net = build_model(model, in_channels, out_channels, patch_size)
    assert isinstance(net, SlottedUNet)
    return net


def _network(model: ModelConfig, in_channels: int, out_channels: int, patch_size: Sequence[int]) -> SlottedUNet:
    """:func:`_meta_network` of the slotted U-Net with ``model``'s widths and slots, built for ``patch_size`` only
    when a slot's block is sized by its token grid (its ``__init__`` takes ``grid``): one network serves every patch
    otherwise. The bias-size check is left to the real build; another ``model.name`` has no slots."""
    slots = {} if model.name == "unet" else {"bottleneck": "none", "decoder": "none"}
    unet = replace(model, name="unet", attention=replace(model.attention, max_bias_gb=None), **slots)
    sized = any("grid" in inspect.signature(ATTENTION_BLOCKS[name]).parameters
                for name in (unet.bottleneck, unet.decoder) if name in ATTENTION_BLOCKS)
    patch = tuple(int(n) for n in patch_size) if sized else None
    return _meta_network(json.dumps(asdict(unet)), in_channels, out_channels, patch)


def _slots(net: SlottedUNet) -> Iterator[tuple[int, list[TransformerBlock]]]:
    """``(level, blocks)`` of every attention slot that holds blocks: the bottleneck and the decoder slots."""
    slots = [(len(net.strides), net.bottleneck), *enumerate(net.decoder_slots)]
    for level, slot in slots:
        blocks = [block for block in slot.modules() if isinstance(block, TransformerBlock)]
        if blocks:
            yield level, blocks


def _block_tensors(block: TransformerBlock) -> float:
    """Token maps ``(N, C)`` a transformer block keeps for the backward pass."""
    if block.checkpointing:
        return CHECKPOINTED_BLOCK_TENSORS
    hidden = block.ffn[0].out_features / block.attention.dim
    return BLOCK_TENSORS + HIDDEN_TENSORS * hidden * (2 if block.ffn.conv is not None else 1)


def estimate_training_memory(
    model: ModelConfig,
    patch_size: Sequence[int],
    in_channels: int,
    out_channels: int,
    batch: int,
    amp: torch.dtype | None = None,
    optimizer: str = "adamw",
) -> MemoryEstimate:
    """Estimated peak memory of a training step of ``model`` on ``batch`` patches of ``patch_size`` voxels.

    Args:
        model: the network; ``channels`` and ``strides`` resolved. Networks other than ``model.name=unet`` are
            estimated as the slotted U-Net of the same widths and strides, without attention slots.
        patch_size: the training patch (one size per spatial axis); padded to the total stride as the U-Net pads.
        in_channels, out_channels: image channels and network outputs (classes).
        batch: patches per step (``trainer.batch_size x data.samples_per_volume``).
        amp: the autocast dtype (:func:`medseg.runtime.device.amp_dtype`); None for float32.
        optimizer: ``trainer.optimizer``.
    """
    if model.channels is None or model.strides is None:
        raise ConfigError("model.channels and model.strides must be resolved (set or planned) to estimate memory")
    net = _network(model, in_channels, out_channels, patch_size)
    voxels = [math.prod(level_grid(patch_size, net.strides, level)) for level in range(len(net.strides) + 1)]
    widths = list(model.channels)
    block_tensors = get_conv_stages(net.conv_stages).block_tensors
    elements = sum(block_tensors * blocks * w * n for blocks, w, n in zip(net.encoder_blocks, widths, voxels))
    decoder_tensors = DECODER_CONCAT_TENSORS + DECODER_CONV_TENSORS * net.decoder_convs
    elements += sum(decoder_tensors * w * n for w, n in zip(widths[:-1], voxels[:-1]))
    supervised = voxels[:-1] if model.deep_supervision else voxels[:1]
    elements += in_channels * voxels[0] + LOSS_TENSORS * out_channels * sum(supervised)
    shared = 0
    for level, blocks in _slots(net):
        elements += sum(_block_tensors(block) * block.attention.dim for block in blocks) * voxels[level]
        shared += dense_bias_bytes(level_grid(patch_size, net.strides, level), blocks[0].attention.bias_heads)
    element_bytes = FLOAT32_BYTES if amp is None else AUTOCAST_ELEMENT_BYTES
    params = sum(p.numel() for p in net.parameters())
    weight_copies = 2 + optimizer_states(optimizer) + PARAMETER_TEMPORARIES + (0 if amp is None else AUTOCAST_WEIGHTS)
    return MemoryEstimate(per_sample=int(ACTIVATION_FACTOR * element_bytes * elements), batch=int(batch),
                          shared=shared, states=int(weight_copies * FLOAT32_BYTES * params))
