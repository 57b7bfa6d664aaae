"""A trained nnU-Net v2 model read from its folder, as the weights a run starts from (``trainer.init_from``).

nnU-Net leaves a trained model as ``nnUNet_results/<dataset>/<trainer>__<plans>__<configuration>/`` holding
``plans.json``, ``dataset.json`` and one ``fold_<k>/`` per fold with ``checkpoint_final.pth`` (and
``checkpoint_best.pth``; ``validation/`` with the fold's out-of-fold predictions once it was validated).
``trainer.init_from`` takes that folder (the run's ``data.fold`` picks the fold), a ``fold_<k>`` folder or one
checkpoint file in it (:func:`nnunet_model_folder` tells them from medseg's checkpoints).

The checkpoint is read with ``weights_only=True``: nnU-Net's hold tensors, plain types, a ``torch.device`` and
numpy scalars (its logged Dice), which are allowed by name (:data:`NUMPY_SCALARS`); nothing else is unpickled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medseg.data.labels import LabelSpec, nnunet_labels
from medseg.errors import CheckpointError, DatasetError
from medseg.planning.nnunet_plans import load_plans
from medseg.runs.checkpoint import first_nonfinite, read_torch_file

CHECKPOINTS = ("checkpoint_final.pth", "checkpoint_best.pth")
"""The checkpoints of a fold, in the order medseg takes them (nnU-Net predicts with the final one)."""
FOLD_FOLDER = re.compile(r"^fold_(\d+|all)$")
MODEL_FILES = ("plans.json", "dataset.json")
"""What a trained-model folder holds beside its folds."""
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
"""Key prefixes of a state dict saved from a DDP- or ``torch.compile``-wrapped network."""
_SCALAR = (getattr(np, "_core", None) or np.core).multiarray.scalar
NUMPY_SCALARS = (_SCALAR, (_SCALAR, "numpy.core.multiarray.scalar"), np.dtype,
                 *(type(np.dtype(kind)) for kind in (np.float32, np.float64, np.int32, np.int64, np.bool_)))
"""The numpy classes an nnU-Net checkpoint pickles (the scalars of its training log; numpy 1 named the scalar's
module ``numpy.core``, numpy 2 ``numpy._core``), allowed by name."""


def nnunet_model_folder(path: str | Path) -> Path | None:
    """The trained-model folder ``path`` is in, or None when ``path`` is not in nnU-Net's layout: the folder itself
    (holding ``plans.json`` and ``dataset.json``), one of its ``fold_<k>`` folders, or a ``.pth`` file in one."""
    path = Path(path).expanduser()
    for folder in (path, path.parent, path.parent.parent):
        if all((folder / name).is_file() for name in MODEL_FILES):
            return folder if folder == path or FOLD_FOLDER.match((path if folder == path.parent else
                                                                  path.parent).name) else None
    return None


def fold_checkpoint(path: Path, folder: Path, fold: int | str) -> Path:
    """The checkpoint file of ``path`` (see :func:`nnunet_model_folder`); for the trained-model folder, that of its
    ``fold_<fold>``.

    Raises:
        CheckpointError: no such fold, or a fold folder without a checkpoint, naming what is there.
    """
    if path.is_file():
        return path
    fold_folder = folder / f"fold_{fold}" if path == folder else path
    if not fold_folder.is_dir():
        folds = sorted(p.name for p in folder.iterdir() if p.is_dir() and FOLD_FOLDER.match(p.name))
        raise CheckpointError(f"trainer.init_from={path}: nnU-Net's model has no {fold_folder.name} for data.fold="
                              f"{fold} (it has {', '.join(folds) or 'no fold'}); start fold k from fold k's model")
    found = next((fold_folder / name for name in CHECKPOINTS if (fold_folder / name).is_file()), None)
    if found is None:
        raise CheckpointError(f"trainer.init_from={path}: {fold_folder} holds no {' or '.join(CHECKPOINTS)} (did its "
                              "training finish?)")
    return found


def _unwrapped(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` with the key prefixes of wrapped networks (:data:`WRAPPER_PREFIXES`) removed."""
    out = {}
    for key, tensor in weights.items():
        for prefix in WRAPPER_PREFIXES:
            key = key.removeprefix(prefix)
        out[key] = tensor
    return out


@dataclass(frozen=True)
class NnunetModel:
    """One fold of a trained nnU-Net v2 model: its weights and what they mean."""

    checkpoint: Path
    folder: Path
    """The trained-model folder (``plans.json``, ``dataset.json``, ``fold_<k>/``)."""
    plans: dict[str, Any]
    dataset: dict[str, Any]
    """Its ``dataset.json``."""
    configuration: str
    """The plans' configuration the checkpoint was trained with (``3d_fullres``, ``2d``, ...)."""
    fold: str
    trainer: str
    labels: LabelSpec
    """Its outputs' classes (or regions), in the order of its head's channels."""
    channels: list[str]
    """Its input channels' names, in order."""
    weights: dict[str, torch.Tensor]
    """Its network's state dict."""

    @property
    def plans_file(self) -> Path:
        return self.folder / "plans.json"

    def describe(self) -> str:
        return f"nnU-Net's {self.trainer} {self.configuration} fold {self.fold} ({self.checkpoint})"

    def validation_cases(self) -> list[str] | None:
        """The cases its fold held out (:func:`held_out_cases`); None without a ``validation/`` folder."""
        return held_out_cases(self.checkpoint.parent, str(self.dataset.get("file_ending", ".nii.gz")))

    def folds_held_out(self) -> list[list[str]] | None:
        """The cases each of its folds ``0..n-1`` held out, as nnU-Net's ``splits_final.json`` lists them; None unless
        every fold folder up to the last has a ``validation/`` folder."""
        ending = str(self.dataset.get("file_ending", ".nii.gz"))
        numbers = sorted(int(match[1]) for path in self.folder.iterdir()
                         if (match := FOLD_FOLDER.match(path.name)) and match[1] != "all")
        if not numbers or numbers != list(range(len(numbers))):
            return None
        folds = []
        for number in numbers:
            cases = held_out_cases(self.folder / f"fold_{number}", ending)
            if cases is None:
                return None
            folds.append(cases)
        return folds


def held_out_cases(fold_folder: Path, ending: str) -> list[str] | None:
    """The cases a fold of nnU-Net held out: those its ``validation/`` folder predicted (``<case><ending>``, as nnU-Net
    writes them when the fold's training ends); None without that folder."""
    validation = fold_folder / "validation"
    if not validation.is_dir():
        return None
    return sorted(p.name.removesuffix(ending) for p in validation.iterdir() if p.name.endswith(ending))


def read_nnunet_model(path: str | Path, fold: int | str) -> NnunetModel:
    """The nnU-Net model at ``path`` (its folder, a fold folder or a checkpoint file; for the folder, fold ``fold``).

    Raises:
        CheckpointError: not in nnU-Net's layout, no such fold or checkpoint, a file torch cannot read or that holds
            other pickled objects (refused unrun), without ``network_weights`` and ``init_args``, or with NaN weights.
        DatasetError: its ``dataset.json`` has no valid labels or channels.
    """
    path = Path(path).expanduser()
    folder = nnunet_model_folder(path)
    if folder is None:
        raise CheckpointError(f"trainer.init_from={path} is not in nnU-Net's layout (a trained-model folder holding "
                              f"{' and '.join(MODEL_FILES)}, a fold_<k> folder in it, or a checkpoint file there)")
    checkpoint = fold_checkpoint(path, folder, fold)
    state = read_torch_file(checkpoint, "cpu", "an nnU-Net checkpoint", safe=NUMPY_SCALARS)
    if not isinstance(state, dict) or not {"network_weights", "init_args"} <= set(state):
        raise CheckpointError(f"checkpoint {checkpoint} is not an nnU-Net v2 checkpoint: it lacks network_weights "
                              "or init_args")
    bad = first_nonfinite(state["network_weights"])
    if bad is not None:
        raise CheckpointError(f"checkpoint {checkpoint} holds NaN or infinite values in {bad}: it is corrupt")
    dataset_file = folder / "dataset.json"
    dataset = load_plans(dataset_file, f"trainer.init_from={path}")
    if not isinstance(dataset.get("channel_names"), dict) or not isinstance(dataset.get("labels"), dict):
        raise DatasetError(f"{dataset_file}: expected nnU-Net v2's 'channel_names' and 'labels'")
    init_args = state["init_args"]
    return NnunetModel(
        checkpoint=checkpoint, folder=folder, plans=load_plans(folder / "plans.json", f"trainer.init_from={path}"),
        dataset=dataset,
        configuration=str(init_args.get("configuration", "")), fold=str(init_args.get("fold", "")),
        trainer=str(state.get("trainer_name", "nnUNetTrainer")),
        labels=nnunet_labels(dataset["labels"], dataset.get("regions_class_order"), dataset_file),
        channels=[str(dataset["channel_names"][k]) for k in sorted(dataset["channel_names"], key=int)],
        weights=_unwrapped(state["network_weights"]))
