"""Cross-validate a multirun of folds: `python scripts/crossval.py DIR` (DIR from `train.py -m data.fold=0,1,2,3,4`).

Each finished fold predicts its own validation cases in their original geometry; the out-of-fold predictions of
all cases are scored together (DIR/crossval/summary.json, metrics.csv, summary.md) and the postprocessing is
decided on them (DIR/crossval/postprocessing.json). Exit code 0, or 1 when a case or the multirun is unusable.
"""

import sys

import hydra
from omegaconf import DictConfig

from medseg.cli import one_line_errors, run
from medseg.config import CrossvalConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="crossval")
@one_line_errors
def main(cfg: DictConfig) -> None:
    """Hydra entry point: cross-validate and exit with the status."""
    from medseg.evaluation.crossval import crossval_cli  # torch and MONAI load only when a job runs

    code = crossval_cli(cfg)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    if len(sys.argv) > 1 and "=" not in sys.argv[1] and not sys.argv[1].startswith("-"):
        sys.argv[1] = f"dir={sys.argv[1]}"  # the multirun folder may come first, without its key
    run(main, CrossvalConfig)
