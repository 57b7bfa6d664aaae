"""Train a segmentation model: `python scripts/train.py [key=value ...]` (Hydra; `--help`, `--cfg job`, `-m`)."""

import sys

import hydra
from omegaconf import DictConfig

from medseg.engine.distributed import hydra_rank_overrides
from medseg.engine.run import train_cli


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> float:
    return train_cli(cfg)


if __name__ == "__main__":
    sys.argv += hydra_rank_overrides()  # torchrun ranks > 0 write no run directory of their own
    main()
