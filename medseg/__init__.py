"""medseg: medical image segmentation with attention-slotted U-Nets.

``from medseg import predict, load_model`` gives the Python API (:mod:`medseg.api`); it loads torch and MONAI only
when first used, so importing medseg (the command-line scripts' ``--help``) stays fast.
"""

from typing import Any

from medseg.version import __version__

__all__ = ["__version__", "load_model", "predict", "predict_exported"]
_API = ("load_model", "predict", "predict_exported")


def __getattr__(name: str) -> Any:
    """``medseg.predict``, ``medseg.predict_exported`` and ``medseg.load_model``, imported on first use."""
    if name in _API:
        from medseg import api

        return getattr(api, name)
    raise AttributeError(f"module 'medseg' has no attribute {name!r}")
