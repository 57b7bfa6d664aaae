"""Train a segmentation model: `python scripts/train.py [key=value ...]` (Hydra; `--help`, `--cfg job`, `-m`)."""

import hydra
from omegaconf import DictConfig

from medseg.engine.run import train_cli


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> float:
    return train_cli(cfg)


if __name__ == "__main__":
    main()
