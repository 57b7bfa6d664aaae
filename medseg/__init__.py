"""medseg: medical image segmentation with attention-slotted U-Nets.

``from medseg import predict, load_model`` gives the Python API (:mod:`medseg.api`); it loads torch and MONAI only
when first used, so importing medseg (the command-line scripts' ``--help``) stays fast.
"""

from typing import Any

__version__ = "0.1.0"
_API = ("load_model", "predict")


def __getattr__(name: str) -> Any:
    """``medseg.predict`` and ``medseg.load_model``, imported on first use."""
    if name in _API:
        from medseg import api

        return getattr(api, name)
    raise AttributeError(f"module 'medseg' has no attribute {name!r}")
