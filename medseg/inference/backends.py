"""The backends that run a network on the sliding windows of a prediction: torch, or OpenVINO on the CPU.

``inference.backend=openvino`` exports the network with ``torch.export`` for one window and has OpenVINO compile it
for this CPU, in fp32 or, with ``inference.precision=bf16``, in bf16 (fast where the CPU has native bf16:
AMX or AVX512-BF16). The compiled network is a module like the torch one, so sliding windows, mirroring and blending
stay medseg's. OpenVINO is an optional extra: ``pip install 'medseg[openvino]'``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from medseg.attention import functional
from medseg.errors import ConfigError

BACKENDS = ("torch", "openvino")
"""The values of ``inference.backend``."""
OPENVINO_PRECISION = {"auto": "f32", "fp32": "f32", "bf16": "bf16"}
"""``inference.precision`` -> OpenVINO's ``INFERENCE_PRECISION_HINT`` (``auto`` is fp32 on the CPU); the precisions
OpenVINO runs."""


def check_backend(backend: str, precision: str, device: torch.device) -> None:
    """Raise :class:`ConfigError` when ``backend`` cannot run on ``device`` in ``precision`` or is not installed."""
    if backend == "openvino":
        if device.type != "cpu":
            raise ConfigError(f"inference.backend=openvino runs on the CPU, not inference.device={device}: set "
                              f"inference.device=cpu or inference.backend=torch")
        if precision not in OPENVINO_PRECISION:
            raise ConfigError(f"inference.precision={precision} with inference.backend=openvino: OpenVINO runs "
                              f"{', '.join(OPENVINO_PRECISION)}")
        if importlib.util.find_spec("openvino") is None:
            raise ConfigError("inference.backend=openvino needs openvino, not installed here: "
                              "pip install 'medseg[openvino]'")


class OpenVinoNetwork(nn.Module):
    """``model`` compiled by OpenVINO for the CPU: ``(B, C, *window)`` -> ``(B, K, *window)`` float32 logits, any B.

    The network is compiled for one window, a static shape, and run on each window of a batch in turn: a dynamic
    batch axis defeats some of OpenVINO's graph rewrites (CSWin's stripes), and on the CPU a batch of windows is no
    faster per window than one.

    Args:
        model: the network in eval mode, on the CPU.
        window: ``(C, *window)``, one input window (2D models: without the slice axis).
        precision: a key of :data:`OPENVINO_PRECISION`.
    """

    def __init__(self, model: nn.Module, window: Sequence[int], precision: str = "auto") -> None:
        import openvino

        super().__init__()
        try:
            with torch.no_grad():
                program = torch.export.export(model, (torch.zeros(1, *window),))
        finally:
            functional.clear_cache()  # torch.export traces with fake tensors; none may stay in the attention caches
        hint = OPENVINO_PRECISION[precision]
        self.compiled = openvino.Core().compile_model(openvino.convert_model(program), "CPU",
                                                      {"INFERENCE_PRECISION_HINT": hint})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        windows = x.detach().as_subclass(torch.Tensor).float().contiguous().numpy()
        return torch.from_numpy(np.concatenate([self.compiled(windows[i:i + 1])[0] for i in range(len(windows))]))


def window_network(model: nn.Module, backend: str, window: Sequence[int], precision: str) -> nn.Module:
    """The module that runs ``model``'s windows ``(B, *window)`` on ``backend``: ``model`` itself for torch."""
    return OpenVinoNetwork(model, window, precision) if backend == "openvino" else model
