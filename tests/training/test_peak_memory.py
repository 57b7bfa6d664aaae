"""Peak memory per run: a multirun trains its jobs one after another in one process."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from medseg.training.trainer import peak_memory_mb, reset_peak_memory

CPU = torch.device("cpu")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak is reset through Linux /proc")
def test_reset_starts_a_new_peak_window() -> None:
    reset_peak_memory(CPU)  # earlier tests in this process may have peaked higher
    before = peak_memory_mb(CPU)
    block = np.ones(400 * 2**20 // 8)  # 400 MiB, touched
    held = peak_memory_mb(CPU)
    assert held >= before + 350
    del block
    reset_peak_memory(CPU)
    assert peak_memory_mb(CPU) < held - 350
