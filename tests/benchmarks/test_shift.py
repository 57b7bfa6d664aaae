"""``benchmark.py shift`` on a fold sweep of the tiny demo: the dataset shifted by the formula, labels untouched, and
every fold's best.pt predicting the shifted copies of its own validation cases, as out-of-fold label maps."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

from benchmarks.cli import main
from benchmarks.shift import shifted_image
from medseg.data.datalist import load_dataset
from tests.helpers.sweeps import make_fold_sweep


def test_the_shift_is_blur_then_contrast_then_noise() -> None:
    image = np.random.default_rng(1).normal(100, 20, (12, 10, 4))
    out = shifted_image(image, noise=5.0, contrast=0.5, blur=1.0, rng=np.random.default_rng(7))
    blurred = ndimage.gaussian_filter(image, (1.0, 1.0, 0))
    noise = np.random.default_rng(7).normal(0.0, 5.0, image.shape)
    np.testing.assert_allclose(out, (blurred - blurred.mean()) * 0.5 + blurred.mean() + noise)
    about = shifted_image(image, noise=0.0, contrast=0.5, blur=0.0, rng=np.random.default_rng(7), center=40.0)
    np.testing.assert_allclose(about, (image - 40.0) * 0.5 + 40.0)


def test_every_fold_predicts_the_shifted_copies_of_its_validation_cases(tmp_path: Path, tiny_demo_root: Path) -> None:
    sweep = make_fold_sweep(tmp_path / "sweep", tiny_demo_root, overrides=["model.bottleneck=none"])
    make_fold_sweep(sweep, tiny_demo_root, overrides=["model.bottleneck=masa"], first_job=2)
    out = tmp_path / "shift"
    assert main(["shift", str(sweep), "--noise", "0.5", "--contrast", "0.8", "--blur", "0", "--out", str(out)]) == 0
    original, shifted = load_dataset(tiny_demo_root, "msd"), load_dataset(out / "dataset", "msd")
    for before, after in zip(original.training, shifted.training):
        assert before["case"] == after["case"]
        raw, moved = (np.asarray(nib.load(case["image"]).dataobj, dtype=np.float64) for case in (before, after))
        assert np.abs(moved - raw).mean() > 0 and np.allclose(moved.mean(), raw.mean(), atol=0.1)
        assert np.array_equal(nib.load(before["label"]).get_fdata(), nib.load(after["label"]).get_fdata())
    cases = {case["case"] for case in original.training}
    validated = {case for job in sweep.glob("[0-9]") for case in json.loads((job / "splits.json").read_text())["val"]}
    assert validated == cases
    for setting in ("model_bottleneck_none", "model_bottleneck_masa"):
        assert {path.name.removesuffix(".nii.gz") for path in (out / setting).glob("*.nii.gz")} == cases
        for case in original.training:
            prediction = nib.load(out / setting / f"{case['case']}.nii.gz")
            assert prediction.shape == nib.load(case["label"]).shape
