"""Verify a dataset before training: `python scripts/check_data.py data=msd data.root=/path/to/Task09_Spleen`.

Checks every case (missing or corrupt files, shapes, affines, channels, label values, NaN/Inf) and
prints one report of all problems. Exit code 0 when the dataset has no errors, 1 otherwise.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from medseg.data.verify import check_data_cli


@hydra.main(version_base="1.3", config_path="../configs", config_name="check_data")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: verify ``cfg.data`` and exit with the report's status."""
    code = check_data_cli(cfg.data, progress=bool(cfg.progress))
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
