"""Print the automatic plan of a dataset: `python scripts/plan.py data=msd data.root=DIR [model.channels=null ...]`.

``data=demo3d`` (the default) generates the demo dataset at ``data.root`` first if it is missing. Dataset and
config errors print one line and exit with status 1.
"""

import hydra
from omegaconf import DictConfig

from medseg.cli import one_line_errors, run
from medseg.config import PlanConfig
from medseg.typed_config import to_typed


@hydra.main(version_base="1.3", config_path="../configs", config_name="plan")
@one_line_errors
def main(cfg: DictConfig) -> None:
    from medseg.planning.report import plan_report  # numpy and nibabel load only when a job runs

    settings = to_typed(PlanConfig, cfg, context=" (e.g. data=msd data.root=/path/to/Task09_Spleen)")
    print(plan_report(settings.data, settings.model, settings.progress, settings.trainer, settings.plan))


if __name__ == "__main__":
    run(main, PlanConfig)
