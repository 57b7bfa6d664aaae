"""The plain network inside its training wrappers (DDP, ``torch.compile``)."""

from __future__ import annotations

from torch import nn


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP and ``torch.compile`` wrappers (whose state_dict keys are clean)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model
