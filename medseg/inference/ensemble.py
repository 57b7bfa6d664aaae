"""Ensembles: several checkpoints predict each case, and their probabilities (softmax classes, or sigmoid regions) are
averaged on its own grid, slab by slab (the models predict the same slab in turn, :meth:`Ensemble.infer`).

``ckpt`` names the models: a checkpoint file, a training run folder (its ``checkpoints/best.pt``), a multirun
folder (the ``checkpoints/best.pt`` of every run whose ``metrics.json`` says completed: the folds of a
cross-validation), or a list of any of these. Each model preprocesses the case its own way (spacing,
normalisation) and its probabilities are taken back to the input's grid before they are averaged, so checkpoints
with different planned spacings, and 2D with 3D models, combine correctly. Models with the same preprocessing share
the preprocessed case.

The models must predict the same outputs from the same channels: same classes (indices, names, label values, ignore
label) and regions, same channel names.
A multirun folder must hold the folds (and seeds) of one configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from monai.transforms import Compose

from medseg.config import DataConfig, InferenceConfig
from medseg.data.labels import LabelSpec
from medseg.data.transforms import IMAGE
from medseg.errors import CheckpointError
from medseg.inference.cases import Case
from medseg.inference.inferer import FileSlabs, Inferer, Prediction, collect, original_affine
from medseg.inference.modality import ModalityCheck
from medseg.inference.model import EvalModel, load_model
from medseg.inference.resample_back import Grids
from medseg.runs.folders import Sweep, setting_keys, swept_keys
from medseg.runs.layout import RunLayout

log = logging.getLogger("medseg")


def run_checkpoints(folder: Path) -> list[Path]:
    """The checkpoints a folder stands for: a multirun's finished runs' ``best.pt``, or a run folder's own.

    Raises:
        CheckpointError: neither kind of folder; a multirun whose runs differ in more than ``data.fold`` and
            ``trainer.seed``; or one without a finished run.
    """
    try:
        runs = Sweep.read(folder).runs
    except FileNotFoundError:
        best = RunLayout(folder).best_checkpoint
        if best.is_file():  # a single training run (outputs/train/<date>/<time>)
            return [best]
        raise CheckpointError(f"ckpt={folder}: a folder that is neither a training run (checkpoints/best.pt) nor a "
                              f"multirun (run folders with .hydra/overrides.yaml)") from None
    differing = setting_keys(swept_keys(runs))
    if differing:
        values = {key: sorted({str(run.overrides.get(key)) for run in runs}) for key in differing}
        raise CheckpointError(
            f"ckpt={folder} mixes configurations: its runs differ in {values}, not only in data.fold or trainer.seed; "
            f"ensemble the folds of one configuration: ckpt=[{folder}/<run>/checkpoints/best.pt,...]")
    finished = [run for run in runs if run.finished]
    if not finished:
        raise CheckpointError(
            f"ckpt={folder}: no finished fold (no run with a completed metrics.json and checkpoints/best.pt); "
            f"wait for its training to end, or see why the runs failed in their metrics.json")
    skipped = [run.name for run in runs if not run.finished]
    if skipped:
        log.warning("ckpt=%s: leaving out the unfinished run(s) %s", folder, ", ".join(skipped))
    return [run.best_checkpoint for run in finished]


def checkpoint_files(ckpt: str | Path | Sequence[str | Path]) -> list[Path]:
    """The checkpoint files of a ``ckpt`` setting (see the module docstring), in the order given."""
    items = [ckpt] if isinstance(ckpt, str | Path) else list(ckpt)
    files: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        files += run_checkpoints(path) if path.is_dir() else [path]
    return files


def check_compatible(nets: Sequence[EvalModel]) -> None:
    """Refuse an ensemble whose models differ in their classes or channels, naming both checkpoints.

    Raises:
        CheckpointError: the first mismatch.
    """
    first = nets[0]
    for net in nets[1:]:
        for what, mine, theirs in (("classes", first.label_spec.as_dict(), net.label_spec.as_dict()),
                                   ("channels", first.channel_names, net.channel_names)):
            if mine != theirs:
                raise CheckpointError(
                    f"checkpoints {first.checkpoint} and {net.checkpoint} cannot be ensembled: their {what} differ "
                    f"({mine} and {theirs}); ensemble only models trained on the same labels and channels")


class Ensemble:
    """One or more models predicting whole cases in their original geometry, probabilities averaged."""

    def __init__(self, nets: Sequence[EvalModel], inference: InferenceConfig) -> None:
        check_compatible(nets)
        self.nets = list(nets)
        self.inference = inference
        self.modality = ModalityCheck()  # one per run: each kind of mismatch warned once
        chains: dict[str, Compose] = {}  # models with the same preprocessing share a case's preprocessing
        self.inferers = []
        for net in self.nets:
            inferer = Inferer(net, inference, chains.get(net.preprocessing_key))
            chains.setdefault(net.preprocessing_key, inferer.transform)
            self.inferers.append(inferer)

    @classmethod
    def load(cls, ckpt: str | Path | Sequence[str | Path], inference: InferenceConfig) -> Ensemble:
        """The models of a ``ckpt`` setting (:func:`checkpoint_files`).

        Raises:
            CheckpointError: a missing or foreign checkpoint, a folder without finished runs or mixing
                configurations, or models that cannot be ensembled.
        """
        return cls([load_model(path) for path in checkpoint_files(ckpt)], inference)

    def __len__(self) -> int:
        return len(self.nets)

    @property
    def checkpoints(self) -> list[Path]:
        return [net.checkpoint for net in self.nets if net.checkpoint is not None]

    @property
    def labels(self) -> dict[int, str]:
        """Class index -> name, background (0) included."""
        return self.nets[0].labels

    @property
    def label_spec(self) -> LabelSpec:
        """The models' classes, ignore label and regions (:mod:`medseg.data.labels`)."""
        return self.nets[0].label_spec

    @property
    def in_channels(self) -> int:
        return self.nets[0].in_channels

    @property
    def trained_on(self) -> DataConfig | None:
        """A single model's training data config (its validation fold); None for an ensemble."""
        return self.nets[0].data if len(self.nets) == 1 else None

    def infer(self, case: Case, on_model: Callable[[], object] = lambda: None, keep_probabilities: bool = False,
              on_slab: Callable[[int, int, np.ndarray], object] | None = None) -> Prediction:
        """The mean of the models' probabilities on the case's grid, decided slab by slab
        (:func:`~medseg.inference.inferer.collect`: ``keep_probabilities`` keeps them whole, ``on_slab`` sees each
        averaged slab); ``on_model()`` after each model.

        The models predict in step, one slab each in turn, so the probabilities held are a slab's (and a window's
        depth) for each model. The sliding windows of a single model show a progress bar when
        ``inference.progress`` is set. A case not of the models' training modality is warned of (:mod:`.modality`).

        Raises:
            DatasetError: an unreadable image, or a channel count other than the models'.
        """
        windows = self.inference.progress and len(self.nets) == 1
        preprocessed: dict[str, dict] = {}
        streams = []
        for inferer in self.inferers:
            key = inferer.net.preprocessing_key
            if key not in preprocessed:
                preprocessed[key] = inferer.preprocess(case)
                self.modality.check(inferer.net, case, preprocessed[key][IMAGE].meta)
            streams.append(inferer.file_slabs(preprocessed[key], progress=windows))
        data = next(iter(preprocessed.values()))
        prediction = collect(self._mean(streams), Grids.of(data[IMAGE]).file_shape, original_affine(data),
                             self.label_spec, keep_probabilities, on_slab)
        for _ in self.inferers:
            on_model()
        return prediction

    @staticmethod
    def _mean(streams: Sequence[FileSlabs]) -> FileSlabs:
        """The slab-wise mean of the models' probability slabs (they cut the same slices)."""
        for slabs in zip(*streams, strict=True):
            total = slabs[0][2]
            for _, _, maps in slabs[1:]:
                total += maps
            yield slabs[0][0], slabs[0][1], total / len(slabs) if len(slabs) > 1 else total
