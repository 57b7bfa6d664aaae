"""The networks: medseg's slotted U-Net (:mod:`.unet`), its norms (:mod:`.norms`), the styles of its conv stages
(:mod:`.conv_stages`: medseg's own in :mod:`.unet`, nnU-Net's in :mod:`.nnunet_stages`, whose trained weights
:mod:`.nnunet_weights` loads), the model registry that ``model.name`` selects from and :func:`build_model`
(:mod:`.registry`), FLOPs (:mod:`.compute`) and attention rows (:mod:`.inspect`).

Importing the package imports every style's module, which registers it (timm's way).
"""

from medseg.models import nnunet_stages
from medseg.models.conv_stages import CONV_STAGES
from medseg.models.nnunet_weights import load_nnunet_weights
from medseg.models.norms import NORMS
from medseg.models.registry import MODELS, build_model, check_model, check_patch
from medseg.models.unet import SlottedUNet, per_axis_strides, per_level_kernels
from medseg.models.unwrap import unwrap_model

__all__ = ["CONV_STAGES", "MODELS", "NORMS", "SlottedUNet", "build_model", "check_model", "check_patch",
           "load_nnunet_weights", "nnunet_stages", "per_axis_strides", "per_level_kernels", "unwrap_model"]
