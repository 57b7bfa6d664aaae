"""The networks: medseg's slotted U-Net (:mod:`.unet`), its norms (:mod:`.norms`), the model registry that
``model.name`` selects from and :func:`build_model` (:mod:`.registry`), FLOPs (:mod:`.compute`) and attention rows
(:mod:`.inspect`)."""

from medseg.models.norms import NORMS
from medseg.models.registry import MODELS, build_model, check_model, check_patch
from medseg.models.unet import SlottedUNet, per_axis_strides, per_level_kernels
from medseg.models.unwrap import unwrap_model

__all__ = ["MODELS", "NORMS", "SlottedUNet", "build_model", "check_model", "check_patch", "per_axis_strides",
           "per_level_kernels", "unwrap_model"]
