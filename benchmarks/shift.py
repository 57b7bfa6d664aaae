"""``benchmark.py shift``: a cross-validated sweep's folds on their own validation cases as another scanner would
show them, as settings that ``compare.py`` pairs.

``python scripts/benchmark.py shift SWEEP [--noise 15] [--contrast 0.8] [--center 40] [--blur 0.7] [--out DIR]``

The sweep's dataset (``data.root`` of its runs; an MSD or nnU-Net folder of CT or MR images) is copied with every
training image shifted (labels unchanged): blurred in-plane by a Gaussian of ``--blur`` voxels, its contrast about
``--center`` (the image's units: a soft-tissue HU on CT; default the image's mean) scaled by ``--contrast``, Gaussian
noise of ``--noise`` added, with a fixed seed.
Each finished run of the sweep then predicts the shifted copies of its own fold's validation cases (its
``splits.json``) with its ``best.pt``, as ``medseg predict`` does (mirroring as the checkpoint validated), and the
label maps of every fold of a setting land in ``DIR/<setting>/``: out-of-fold predictions of the shifted cases, on the
same cases and grids as the sweep's. The report prints the ``compare.py`` command that pairs them
(``extra=<setting>_shift=DIR/<setting>``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

from medseg.config import InferenceConfig, PredictConfig
from medseg.data.datalist import load_dataset
from medseg.errors import ConfigError
from medseg.inference.predict import predict
from medseg.runs.checkpoint import load_checkpoint
from medseg.runs.folders import Sweep, cross_validations

DEFAULT_OUT_NAME = "shift"
"""The folder inside the sweep for the shifted dataset and the predictions, unless ``--out`` says otherwise."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py shift``'s arguments."""
    parser.add_argument("sweep", type=Path, help="a multirun folder of a cross-validated sweep (data.fold=0,1,...)")
    parser.add_argument("--noise", type=float, default=15.0, help="standard deviation of the added Gaussian noise")
    parser.add_argument("--contrast", type=float, default=0.8, help="the contrast about --center, scaled by")
    parser.add_argument("--center", type=float, default=None, help="the value the contrast turns about (default: the "
                        "image's mean)")
    parser.add_argument("--blur", type=float, default=0.7, help="in-plane Gaussian blur, sigma in voxels (0: none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the noise")
    parser.add_argument("--out", type=Path, default=None, help=f"default SWEEP/{DEFAULT_OUT_NAME}")


def shifted_image(image: np.ndarray, noise: float, contrast: float, blur: float, rng: np.random.Generator,
                  center: float | None = None) -> np.ndarray:
    """``image`` ``(X, Y, Z)`` as another scanner shows it: blurred in the (X, Y) plane by ``blur`` voxels, its
    contrast about ``center`` (None: its mean) scaled by ``contrast``, Gaussian noise of ``noise`` added; float64."""
    out = ndimage.gaussian_filter(image.astype(np.float64), (blur, blur, 0)) if blur > 0 else image.astype(np.float64)
    pivot = out.mean() if center is None else center
    out = (out - pivot) * contrast + pivot
    return out + rng.normal(0.0, noise, out.shape)


def write_shifted_dataset(root: Path, fmt: str, out: Path, args: argparse.Namespace) -> Path:
    """A copy of the dataset at ``root`` in ``out`` with every training image shifted (:func:`shifted_image`) and
    stored in its file's dtype; ``dataset.json`` and the labels copied as they are."""
    info = load_dataset(root, fmt)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / "dataset.json", out / "dataset.json")
    rng = np.random.default_rng(args.seed)
    for case in info.training:
        for image in [case["image"]] if isinstance(case["image"], str) else case["image"]:
            source = nib.load(image)
            data = shifted_image(np.asarray(source.dataobj), args.noise, args.contrast, args.blur, rng, args.center)
            dtype = source.get_data_dtype()
            if np.issubdtype(dtype, np.integer):
                data = np.clip(np.rint(data), np.iinfo(dtype).min, np.iinfo(dtype).max)
            target = out / Path(image).resolve().relative_to(root.resolve())
            target.parent.mkdir(parents=True, exist_ok=True)
            nib.save(nib.Nifti1Image(data.astype(dtype), source.affine, source.header), target)
        target = out / Path(case["label"]).resolve().relative_to(root.resolve())
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(case["label"], target)
    return out


def predict_folds(sweep: Sweep, shifted: Path, fmt: str, out: Path) -> dict[str, Path]:
    """Each setting's folds predict the shifted copies (the dataset at ``shifted``) of their validation cases into
    ``out/<setting>``; the folder of each setting, by its name in the ``extra=`` of compare.py."""
    images = {case["case"]: case["image"] for case in load_dataset(shifted, fmt).training}
    folders = {}
    for label, runs in cross_validations([run for run in sweep.runs if run.finished]).items():
        name = re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_") or "setting"
        folder = out / name
        for run in runs:
            inputs = out / "inputs" / name / run.name
            inputs.mkdir(parents=True, exist_ok=True)
            for case in json.loads((run.path / "splits.json").read_text())["val"]:
                for image in [images[case]] if isinstance(images[case], str) else images[case]:
                    link = inputs / Path(image).name
                    if not link.exists():
                        link.symlink_to(Path(image).resolve())
            predict(PredictConfig(ckpt=str(run.path / "checkpoints" / "best.pt"), input=str(inputs),
                                  output=str(folder), inference=InferenceConfig(progress=False)))
        folders[f"{name}_shift"] = folder
    return folders


def run(args: argparse.Namespace) -> int:
    """Shift the sweep's dataset, predict every fold's validation cases, print the compare.py command."""
    sweep = Sweep.read(args.sweep)
    finished = [run for run in sweep.runs if run.finished]
    if not finished:
        raise ConfigError(f"{args.sweep}: no finished run to predict with")
    data = load_checkpoint(finished[0].path / "checkpoints" / "best.pt")["config"]["data"]
    out = (args.out or args.sweep / DEFAULT_OUT_NAME).resolve()
    shifted = write_shifted_dataset(Path(data["root"]), data["format"], out / "dataset", args)
    folders = predict_folds(sweep, shifted, data["format"], out)
    extras = " ".join(f"extra={name}={folder}" for name, folder in folders.items())
    first = next(iter(folders))
    center = "the mean" if args.center is None else f"{args.center:g}"
    print(f"shifted: noise {args.noise:g}, contrast {args.contrast:g} about {center}, blur {args.blur:g} voxels; "
          f"dataset {shifted}\n"
          f"python scripts/compare.py {args.sweep} {extras} reference={first}")
    return 0
