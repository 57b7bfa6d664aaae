"""Print the automatic plan of a dataset: `python scripts/plan.py data=msd data.root=DIR [model=...]`.

``data.format=demo`` (the default data config) generates the demo dataset at ``data.root`` first if
it is missing. Dataset and config errors print one line and exit with status 1.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from medseg.data.datalist import DatasetError
from medseg.data.planning import PlanError, plan_report


@hydra.main(version_base="1.3", config_path="../configs", config_name="plan")
def main(cfg: DictConfig) -> None:
    try:
        print(plan_report(OmegaConf.to_container(cfg.data, resolve=True, throw_on_missing=True),
                          OmegaConf.to_container(cfg.model, resolve=True, throw_on_missing=True),
                          progress=bool(cfg.progress)))
    except (DatasetError, PlanError, MissingMandatoryValue) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
