"""The repository's paths, the real configs composed with Hydra, the tiny and micro run overrides, and the scripts
run as users run them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from medseg import hydra_config

REPO = Path(__file__).resolve().parents[2]

# A demo run small enough for CI: 8 volumes of 32x32x16, a 3-level U-Net, 2 epochs.
TINY_OVERRIDES = [
    "data.num_cases=8", "data.patch_size=[32,32,16]", "data.samples_per_volume=1",
    "model.channels=[8,16,32]", "model.strides=[2,2]", "model.attention.num_heads=4",
    "trainer.max_epochs=2", "trainer.val_every=1", "trainer.batch_size=2", "trainer.progress=false",
    "trainer.log_images=true",
]

# Smaller still, for runs that are repeated within one test (resume equality, fault injection).
MICRO_OVERRIDES = [
    "data.num_cases=8", "data.patch_size=[16,16,16]", "data.samples_per_volume=1", "data.num_workers=0",
    "model.channels=[4,8]", "model.strides=[2]", "trainer.val_every=1", "trainer.batch_size=2",
    "trainer.progress=false", "trainer.log_images=false",
]


def compose_config(overrides: Sequence[str] = (), config_name: str = "train",
                   return_hydra_config: bool = False) -> DictConfig:
    """The real configs composed with Hydra's compose API, the schemas registered first
    (:func:`medseg.hydra_config.compose_config`; ``hydra:`` interpolations are available only with
    ``return_hydra_config``)."""
    return hydra_config.compose_config(config_name, overrides, return_hydra_config=return_hydra_config)


def run_script(script: str, args: Sequence[str], cwd: Path, timeout: float = 600,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``scripts/<script>`` with this interpreter; output captured as text."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run([sys.executable, str(REPO / "scripts" / script), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
