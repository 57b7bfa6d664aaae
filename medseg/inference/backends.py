"""The backends that run a network on the sliding windows of a prediction: torch, or OpenVINO on the CPU.

``inference.backend=openvino`` exports the network with ``torch.export`` for one window and has OpenVINO compile it
for this CPU, in fp32 or, with ``inference.precision=bf16``, in bf16 (fast where the CPU has native bf16:
AMX or AVX512-BF16), or, with ``inference.precision=int8``, quantised to int8 by NNCF (:mod:`medseg.inference.int8`)
and compiled in fp32 for the rest. The compiled network is a module like the torch one, so sliding windows,
mirroring and blending stay medseg's. OpenVINO is an optional extra: ``pip install 'medseg[openvino]'``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from medseg.attention import functional
from medseg.errors import ConfigError

if TYPE_CHECKING:
    import openvino

BACKENDS = ("torch", "openvino")
"""The values of ``inference.backend``."""
INT8 = "int8"
"""The ``inference.precision`` of a network quantised to int8, which only ``inference.backend=openvino`` runs."""
OPENVINO_PRECISION = {"auto": "f32", "fp32": "f32", "bf16": "bf16", INT8: "f32"}
"""``inference.precision`` -> OpenVINO's ``INFERENCE_PRECISION_HINT`` (``auto`` is fp32 on the CPU; an int8 network
runs its layers that are not quantised in fp32); the precisions OpenVINO runs."""


def check_backend(backend: str, precision: str, device: torch.device) -> None:
    """Raise :class:`ConfigError` when ``backend`` cannot run on ``device`` in ``precision`` or is not installed."""
    if backend != "openvino" and precision == INT8:
        raise ConfigError(f"inference.precision={INT8} runs on inference.backend=openvino, not "
                          f"inference.backend={backend}: set inference.backend=openvino")
    if backend == "openvino":
        if device.type != "cpu":
            raise ConfigError(f"inference.backend=openvino runs on the CPU, not inference.device={device}: set "
                              f"inference.device=cpu or inference.backend=torch")
        if precision not in OPENVINO_PRECISION:
            raise ConfigError(f"inference.precision={precision} with inference.backend=openvino: OpenVINO runs "
                              f"{', '.join(OPENVINO_PRECISION)}")
        needed = ("openvino", "nncf") if precision == INT8 else ("openvino",)  # nncf quantises to int8
        missing = [package for package in needed if importlib.util.find_spec(package) is None]
        if missing:
            raise ConfigError(f"inference.backend=openvino inference.precision={precision} needs "
                              f"{' and '.join(missing)}, not installed here: pip install 'medseg[openvino]'")


def export_openvino(model: nn.Module, window: Sequence[int]) -> openvino.Model:
    """``model`` (eval mode, on the CPU) exported with ``torch.export`` for one ``(C, *window)`` input window and
    converted to an OpenVINO model (not compiled)."""
    import openvino

    try:
        with torch.no_grad():
            program = torch.export.export(model, (torch.zeros(1, *window),))
    finally:
        functional.clear_cache()  # torch.export traces with fake tensors; none may stay in the attention caches
    return openvino.convert_model(program)


class OpenVinoNetwork(nn.Module):
    """A network compiled by OpenVINO for the CPU: ``(B, C, *window)`` -> ``(B, K, *window)`` float32 logits, any B.

    The network is compiled for one window, a static shape, and run on each window of a batch in turn: a dynamic
    batch axis defeats some of OpenVINO's graph rewrites (CSWin's stripes), and on the CPU a batch of windows is no
    faster per window than one.

    Args:
        network: the OpenVINO model of one window (:func:`export_openvino`, or its int8 quantisation).
        precision: a key of :data:`OPENVINO_PRECISION`.
    """

    def __init__(self, network: openvino.Model, precision: str = "auto") -> None:
        import openvino

        super().__init__()
        self.compiled = openvino.Core().compile_model(network, "CPU",
                                                      {"INFERENCE_PRECISION_HINT": OPENVINO_PRECISION[precision]})

    @classmethod
    def export(cls, model: nn.Module, window: Sequence[int], precision: str = "auto") -> OpenVinoNetwork:
        """``model`` (eval mode, on the CPU) compiled for ``(C, *window)`` windows (2D models: without the slice
        axis) in ``precision``, a key of :data:`OPENVINO_PRECISION` other than int8."""
        return cls(export_openvino(model, window), precision)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        windows = x.detach().as_subclass(torch.Tensor).float().contiguous().numpy()
        return torch.from_numpy(np.concatenate([self.compiled(windows[i:i + 1])[0] for i in range(len(windows))]))



def window_network(model: nn.Module, backend: str, window: Sequence[int], precision: str) -> nn.Module:
    """The module that runs ``model``'s windows ``(B, *window)`` on ``backend``: ``model`` itself for torch. An int8
    network is quantised on a checkpoint's training cases: :func:`medseg.inference.inferer.inference_network`."""
    if precision == INT8:
        raise ValueError("an int8 network is calibrated on its checkpoint's training cases: use inference_network")
    return OpenVinoNetwork.export(model, window, precision) if backend == "openvino" else model
