"""Verify a dataset before training: `python scripts/check_data.py data=msd data.root=/path/to/Task09_Spleen`.

Checks every case (missing or corrupt files, shapes, affines, channels, label values, NaN/Inf) and
prints one report of all problems. Exit code 0 when the dataset has no errors, 1 otherwise.
"""

import sys

import hydra
from omegaconf import DictConfig

from medseg.cli import one_line_errors, run
from medseg.config import CheckDataConfig
from medseg.typed_config import to_typed


@hydra.main(version_base="1.3", config_path="../configs", config_name="check_data")
@one_line_errors
def main(cfg: DictConfig) -> None:
    """Hydra entry point: verify ``cfg.data`` and exit with the report's status."""
    from medseg.data.verify import check_data_cli  # numpy and nibabel load only when a job runs

    settings = to_typed(CheckDataConfig, cfg, context=" (e.g. data=msd data.root=/path/to/Task09_Spleen)")
    code = check_data_cli(settings.data, progress=settings.progress)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    run(main, CheckDataConfig)
