"""Devices and numeric precision: which device, which autocast dtype, and how much memory a run peaked at."""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path

import torch

from medseg.errors import ConfigError

PRECISIONS: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None,
                                               "auto": None}
"""The values of ``trainer.precision`` -> the autocast dtype (None: fp32). ``auto`` is resolved by
:func:`amp_dtype`: bf16 on CUDA, fp32 on the CPU."""


def resolve_device(name: str, key: str = "trainer.device") -> torch.device:
    """The device ``name`` names (``auto``: CUDA when available, else the CPU).

    Raises:
        ConfigError: CUDA is asked for but not available, or ``name`` is no device; the message names ``key``.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"{key}={name}: not a device ({err})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{key}={name}: CUDA is not available on this machine")
    return device


def amp_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype for ``trainer.precision``: ``auto`` is bf16 on CUDA and fp32 (None) on the CPU."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return PRECISIONS[precision]


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``dtype`` on ``device``, or a no-op when ``dtype`` is None (fp32)."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (``"cuda"``, ``"cpu"``, ...); False on a device autocast does not
    know, such as the meta device, where :mod:`medseg.models.compute` runs a network to count its FLOPs."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new window for :func:`peak_memory_mb` (a Hydra multirun trains its jobs in one process).

    On the CPU this resets the process's peak resident memory to its current value (Linux ``clear_refs``);
    where that is unavailable, the peak stays the process's lifetime peak.
    """
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated on CUDA; peak resident memory of the process on the CPU (MiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        status = Path("/proc/self/status").read_text()
        return int(status.split("VmHWM:", 1)[1].split()[0]) / 1024
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
