"""The export formats: how a network is written as ONNX or TorchScript, run again, and checked against torch.

A network is exported on the CPU in eval mode for windows like an example batch ``(B, C, *patch)``: the patch is
fixed, the batch size is not. Every attention block exports its SDPA path (FlexAttention is CUDA-only).
"""

from __future__ import annotations

import importlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from medseg.attention import ATTENTION_BLOCKS, functional
from medseg.errors import ConfigError, MedsegError

INPUT, OUTPUT = "image", "logits"
"""The exported network's input and output names."""
TOLERANCE = 1e-3
"""Largest difference of a class probability between the exported and the torch network that an export accepts."""
EXPORTER_LOGGERS = ("torch.onnx", "torch.export", "onnxscript", "onnx_ir")
"""Loggers whose info lines (skipped torchvision operators, each graph rewrite) an export silences."""


class ExportError(MedsegError):
    """The network cannot be exported, or its export does not compute what the torch network computes."""


class OnnxNetwork(nn.Module):
    """An ONNX file run by onnxruntime on the CPU, as a module: ``(B, C, *patch)`` -> ``(B, K, *patch)`` logits on
    the input's device."""

    def __init__(self, path: Path) -> None:
        import onnxruntime

        super().__init__()
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        array = x.detach().as_subclass(torch.Tensor).float().cpu().numpy()
        return torch.from_numpy(self.session.run([OUTPUT], {INPUT: array})[0]).to(x.device)


def _write_onnx(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    """torch's dynamo exporter (``torch.export`` + onnxscript), with a dynamic batch axis."""
    program = torch.onnx.export(model, (example,), dynamo=True, input_names=[INPUT], output_names=[OUTPUT],
                                dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False)
    program.save(str(path), external_data=False)


class EachWindow(nn.Module):
    """A network traced for one window, applied to each window of a batch: TorchScript for any batch size."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.net(w.unsqueeze(0)) for w in x.unbind(0)])


def _write_torchscript(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    """``torch.jit.trace`` of the ``torch.export`` graph of one window, scripted to loop over a batch.

    Tracing the module itself fails: medseg's CPU depthwise convolution is an ``autograd.Function`` (for its fast
    backward), which TorchScript cannot save, and the blocks' reshapes would fix the batch size. The exported graph
    holds aten operations only.
    """
    one = example[:1]
    traced = torch.jit.trace(torch.export.export(model, (one,)).module(), one, check_trace=False)
    torch.jit.save(torch.jit.script(EachWindow(traced)), str(path))


@dataclass(frozen=True)
class ExportFormat:
    """One value of ``format``: its file, the modules its exporter and runtime need, how to write and run it."""

    file: str
    modules: tuple[str, ...]
    write: Callable[[nn.Module, torch.Tensor, Path], None]
    """``write(model, example windows (B, C, *patch), path)``."""
    load: Callable[[Path, torch.device | str], nn.Module]
    """``load(path, device)``: the written network as a module."""


EXPORT_FORMATS: dict[str, ExportFormat] = {
    "onnx": ExportFormat("model.onnx", ("onnx", "onnxscript", "onnxruntime"), _write_onnx,
                         lambda path, device: OnnxNetwork(path)),
    "torchscript": ExportFormat("model.pt", (), _write_torchscript,
                                lambda path, device: torch.jit.load(str(path), map_location=device)),
}
"""The values of ``format``."""


def require_runtime(name: str) -> None:
    """Raise :class:`ConfigError` naming ``pip install 'medseg[export]'`` when format ``name`` lacks a module."""
    missing = []
    for module in EXPORT_FORMATS[name].modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigError(f"format={name} needs {', '.join(missing)}, not installed here: pip install 'medseg[export]'")


def attention_blocks(model: nn.Module) -> list[str]:
    """The registered attention blocks ``model`` holds, by name."""
    kinds = {type(module) for module in model.modules()}
    return [name for name, cls in ATTENTION_BLOCKS.items() if cls in kinds]


@contextmanager
def _quiet_exporters() -> Iterator[None]:
    """Without the exporters' warnings (tracer warnings), info logs (:data:`EXPORTER_LOGGERS`) and prints
    (``torch.export`` prints the partial graph of a failed export to stderr; the error says what failed)."""
    loggers = [logging.getLogger(name) for name in EXPORTER_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def write_network(model: nn.Module, example: torch.Tensor, name: str, path: Path) -> None:
    """Export ``model`` (in eval mode, on the CPU) to ``path`` in format ``name`` for windows like ``example``.

    Raises:
        ExportError: the exporter failed; the message names the model's attention blocks and the exporter's error.
    """
    try:
        with _quiet_exporters(), torch.no_grad():
            EXPORT_FORMATS[name].write(model, example, path)
    except Exception as err:  # any exporter failure, named in one line (the cause stays chained)
        blocks = attention_blocks(model)
        held = f" with the attention block(s) {', '.join(blocks)}" if blocks else ""
        root = err
        while root.__cause__ is not None:  # the ONNX exporter wraps torch.export's error in its own
            root = root.__cause__
        reason = next((line for line in str(root).splitlines() if line.strip()), "")[:300]
        raise ExportError(f"cannot export the network{held} to {name}: {type(root).__name__}: {reason}") from err
    finally:
        functional.clear_cache()  # the exporters trace with fake tensors; none may stay in the attention caches


def check_export(model: nn.Module, exported: nn.Module, example: torch.Tensor) -> float:
    """The largest probability difference between ``exported`` and ``model`` on random windows like ``example``,
    one more than its batch (the exported batch axis is dynamic).

    Raises:
        ExportError: the difference exceeds :data:`TOLERANCE`.
    """
    windows = torch.randn(example.shape[0] + 1, *example.shape[1:], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        difference = (torch.softmax(exported(windows), 1) - torch.softmax(model(windows), 1)).abs().max().item()
    if not difference <= TOLERANCE:
        raise ExportError(f"the exported network's probabilities differ from the torch network's by {difference:.3g} "
                          f"(> {TOLERANCE:g}) on random windows")
    return difference
