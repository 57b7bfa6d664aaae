"""Train a segmentation model: `python scripts/train.py [key=value ...]` (Hydra; `--help`, `--cfg job`, `-m`)."""

import sys

import hydra
from omegaconf import DictConfig

from medseg.cli import one_line_errors, run
from medseg.config import TrainConfig
from medseg.runtime.launch import hydra_rank_overrides


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
@one_line_errors
def main(cfg: DictConfig) -> float:
    from medseg.training.run import train_cli  # torch and MONAI load only when a job runs

    return train_cli(cfg)


if __name__ == "__main__":
    sys.argv += hydra_rank_overrides()  # torchrun ranks > 0 write no run directory of their own
    run(main, TrainConfig)
