"""Where a training run and a multirun keep their files: every path of a run folder and of a sweep folder, spelled
here once, for the writers (the trainer, the run, cross-validation) and the readers (:mod:`.folders`, ensembles,
reports) alike.

A run folder (``outputs/train/<date>/<time>/``, or one run of a multirun)::

    .hydra/config.yaml  .hydra/overrides.yaml   what Hydra composed and the overrides it applied
    checkpoints/best.pt checkpoints/last.pt     the best model by validation Dice; the latest state (resume)
    metrics.json                                the run's results (or why it failed)
    splits.json                                 the fold's training and validation cases
    tensorboard/                                TensorBoard logs
    .medseg.lock                                held while a training owns the folder (:mod:`.lock`)

A sweep folder (``multirun/<date>/<time>/``) holds one run folder per Hydra job and ``crossval/``
(``crossval/<setting>/`` for each setting of a wider sweep): the out-of-fold scores that ``scripts/crossval.py``
writes (:class:`CrossvalLayout`), and ``external/<name>/``: another tool's out-of-fold predictions scored by
``scripts/compare.py ... nnunet=RESULTS`` or ``extra=NAME=DIR`` (the same ``metrics.csv`` and ``summary.json``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
"""A run folder's overrides, relative to it: the file that marks a folder of a sweep as a run."""

CROSSVAL_FOLDER = "crossval"
"""The folder of a sweep that ``scripts/crossval.py`` writes its results into."""
EXTERNAL_FOLDER = "external"
"""The folder of a sweep that ``scripts/compare.py`` scores other tools' out-of-fold predictions into."""


class RunLayout:
    """The paths of one run folder (see the module docstring); :class:`~.folders.Run` is one, read back."""

    path: Path
    """The run folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def checkpoints(self) -> Path:
        """The checkpoint folder, ``checkpoints/``."""
        return self.path / "checkpoints"

    @property
    def best_checkpoint(self) -> Path:
        """The best model by validation Dice, ``checkpoints/best.pt``."""
        return self.checkpoints / "best.pt"

    @property
    def last_checkpoint(self) -> Path:
        """The latest state, which a resume starts from, ``checkpoints/last.pt``."""
        return self.checkpoints / "last.pt"

    @property
    def metrics_file(self) -> Path:
        """The run's results, or why it failed: ``metrics.json``."""
        return self.path / "metrics.json"

    @property
    def splits_file(self) -> Path:
        """The fold's training and validation case ids, ``splits.json``."""
        return self.path / "splits.json"

    @property
    def tensorboard(self) -> Path:
        """The TensorBoard log folder, ``tensorboard/``."""
        return self.path / "tensorboard"

    @property
    def lock_file(self) -> Path:
        """Held while a training owns the folder, ``.medseg.lock``."""
        return self.path / ".medseg.lock"

    @property
    def hydra_config(self) -> Path:
        """The config Hydra composed for the run, ``.hydra/config.yaml``."""
        return self.path / ".hydra" / "config.yaml"

    @property
    def overrides_file(self) -> Path:
        """The overrides Hydra applied, ``.hydra/overrides.yaml`` (:data:`OVERRIDES_FILE`)."""
        return self.path / OVERRIDES_FILE


def file_label(label: str) -> str:
    """A setting's label (``model.bottleneck=masa trainer.seed=1``) as a file name: every run of characters other
    than word characters and ``.,=+-`` replaced by ``_`` (``model.bottleneck=masa_trainer.seed=1``)."""
    return re.sub(r"[^\w.,=+-]+", "_", label)


def crossval_dir(sweep_dir: str | Path, label: str = "") -> Path:
    """Where ``scripts/crossval.py`` writes a cross-validation: ``DIR/crossval``, or ``DIR/crossval/<setting>`` for
    one setting (``label``) of a sweep of several."""
    folder = Path(sweep_dir) / CROSSVAL_FOLDER
    return folder / file_label(label) if label else folder


def external_dir(sweep_dir: str | Path, name: str) -> Path:
    """Where ``scripts/compare.py`` scores another tool's out-of-fold predictions: ``DIR/external/<name>``."""
    return Path(sweep_dir) / EXTERNAL_FOLDER / name


@dataclass(frozen=True)
class CrossvalLayout:
    """The files of one cross-validation's folder (:func:`crossval_dir`)."""

    folder: Path

    @property
    def predictions(self) -> Path:
        """The out-of-fold label maps (and masks), ``predictions/``."""
        return self.folder / "predictions"

    @property
    def scores(self) -> Path:
        """A row per case and output, ``metrics.csv``."""
        return self.folder / "metrics.csv"

    @property
    def summary(self) -> Path:
        """The means, the folds and the settings, ``summary.json``."""
        return self.folder / "summary.json"

    @property
    def report(self) -> Path:
        """The tables for people, ``summary.md``."""
        return self.folder / "summary.md"
