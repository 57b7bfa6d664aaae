"""The Python API: ``predict`` on an LPS, anisotropic array gives evaluate's labels for the same file, in the
array's own voxel order (also permuted), from a path, a nibabel image, a DICOM series folder or a loaded model; the
snippet of docs/evaluation.md runs; ``import medseg`` stays light."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from medseg import load_model, predict
from medseg.errors import ConfigError, DatasetError
from medseg.evaluation.evaluate import evaluate
from tests.helpers.checkpoints import save_test_checkpoint
from tests.helpers.configs import REPO

DOC_CKPT = "outputs/train/2025-01-31/14-02-07/checkpoints/best.pt"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny 3D checkpoint that resamples to 1.0 x 1.0 x 1.5 mm (the demo is 0.8 x 0.8 x 2.0 mm)."""
    return save_test_checkpoint(tmp_path_factory.mktemp("api") / "best.pt", seed=3)


@pytest.fixture(scope="module")
def evaluated(ckpt: Path, tiny_demo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``evaluate()``'s label maps of two demo cases."""
    images, out = tmp_path_factory.mktemp("images"), tmp_path_factory.mktemp("evaluated")
    for name in ("demo_000.nii.gz", "demo_001.nii.gz"):
        shutil.copy(tiny_demo_root / "imagesTr" / name, images / name)
    evaluate({"ckpt": str(ckpt), "input": str(images), "output": str(out), "inference": {"progress": False}})
    return out


def test_an_lps_anisotropic_array_is_predicted_as_evaluate_predicts_its_file(ckpt: Path, evaluated: Path,
                                                                             tiny_demo_root: Path) -> None:
    path = tiny_demo_root / "imagesTr" / "demo_001.nii.gz"
    scan = nib.load(path)
    assert nib.aff2axcodes(scan.affine) == ("L", "P", "S") and scan.header.get_zooms() == (0.8, 0.8, 2.0)
    expected = np.asarray(nib.load(evaluated / "demo_001.nii.gz").dataobj)
    array = np.asarray(scan.dataobj)
    labels, probabilities = predict(array, ckpt=str(ckpt), affine=scan.affine, return_probabilities=True)
    np.testing.assert_array_equal(labels, expected)
    assert labels.dtype == np.uint8 and probabilities.shape == (3, *array.shape)
    np.testing.assert_allclose(probabilities.sum(0), 1.0, atol=1e-5)
    np.testing.assert_array_equal(probabilities.argmax(0), labels)
    # the same voxels with the axes permuted (z, x, y) and the affine's columns to match: labels in that order
    permuted = predict(array.transpose(2, 0, 1), ckpt=str(ckpt), affine=scan.affine[:, [2, 0, 1, 3]])
    np.testing.assert_array_equal(permuted, expected.transpose(2, 0, 1))
    net = load_model(ckpt)
    np.testing.assert_array_equal(predict(scan, ckpt=net), expected)
    np.testing.assert_array_equal(predict(path, ckpt=net), expected)


def test_oracle_labels_come_back_on_the_arrays_voxels(tiny_demo_root: Path, tmp_path: Path, oracle: None) -> None:
    """A model whose input is the one-hot label (native spacing): the label map is the label itself, voxel for
    voxel, whatever the array's axis order."""
    native = save_test_checkpoint(tmp_path / "oracle.pt", spacing=(0.8, 0.8, 2.0), normalization="none", state={},
                                  channel_names=("c0", "c1", "c2"))
    label = nib.load(tiny_demo_root / "labelsTr" / "demo_002.nii.gz")
    truth = np.asarray(label.dataobj)
    one_hot = np.stack([truth == c for c in range(3)], axis=-1).astype(np.float32)  # (X, Y, Z, C), channels last
    np.testing.assert_array_equal(predict(one_hot, ckpt=native, affine=label.affine), truth)
    flipped = label.affine @ np.array([[-1, 0, 0, truth.shape[0] - 1], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    np.testing.assert_array_equal(predict(one_hot[::-1], ckpt=native, affine=flipped), truth[::-1])


def test_bad_arguments(ckpt: Path, tiny_demo_root: Path) -> None:
    path = tiny_demo_root / "imagesTr" / "demo_000.nii.gz"
    array = np.zeros((8, 8, 8), np.float32)
    with pytest.raises(ConfigError, match="give the array's affine="):
        predict(array, ckpt=ckpt)
    with pytest.raises(ConfigError, match="affine= is for arrays only"):
        predict(path, ckpt=ckpt, affine=np.eye(4))
    with pytest.raises(DatasetError, match="the image in memory: the image has 2 channel"):
        predict(np.zeros((8, 8, 8, 2), np.float32), ckpt=ckpt, affine=np.eye(4))


def test_arrays_without_usable_voxels_or_affine_are_one_line_errors(ckpt: Path) -> None:
    cube = np.zeros((8, 8, 8), np.float32)
    nan = cube.copy()
    nan[1, 2, 3] = np.nan
    for array, affine, reason in [
        (np.zeros((0, 8, 8), np.float32), np.eye(4), r"no voxels \(shape \(0, 8, 8\)\)"),
        (cube > 0, np.eye(4), "voxels of type bool; expected numbers"),
        (cube, np.diag([1.0, 1.0, 0.0, 1.0]), "affine is singular"),
        (cube, np.diag([1.0, np.inf, 1.0, 1.0]), "affine is not finite"),
        (nan, np.eye(4), "contains 1 NaN voxels"),
    ]:
        with pytest.raises(DatasetError, match=f"^predict\\(array\\): .*{reason}") as err:
            predict(array, ckpt=ckpt, affine=affine)
        assert "\n" not in str(err.value)


def test_a_dicom_series_folder_is_predicted_as_the_nifti_it_was_written_from(ckpt: Path, tmp_path: Path) -> None:
    """The oblique, rescaled series of :func:`tests.helpers.dicom.write_ct_case`: the labels and probabilities of its
    folder are those of its NIfTI, on the same voxels."""
    pytest.importorskip("pydicom")
    from tests.helpers.dicom import write_ct_case

    case = write_ct_case(tmp_path, "case", "oblique")
    net = load_model(ckpt)
    labels, probabilities = predict(str(case.series.folder), ckpt=net, return_probabilities=True)
    expected, expected_probabilities = predict(str(case.nifti), ckpt=net, return_probabilities=True)
    assert labels.shape == nib.load(case.nifti).shape and len(np.unique(labels)) > 1
    np.testing.assert_array_equal(labels, expected)
    np.testing.assert_allclose(probabilities, expected_probabilities, atol=1e-5)


def test_the_documented_snippet_runs(ckpt: Path, evaluated: Path, tiny_demo_root: Path) -> None:
    page = (REPO / "docs" / "evaluation.md").read_text()
    section = page.split("## Python API", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert DOC_CKPT in snippet and "data/demo3d/" in snippet
    namespace: dict = {}
    exec(snippet.replace(DOC_CKPT, str(ckpt)).replace("data/demo3d/", f"{tiny_demo_root}/"), namespace)
    np.testing.assert_array_equal(namespace["labels"], np.asarray(nib.load(evaluated / "demo_000.nii.gz").dataobj))


def test_import_medseg_is_light() -> None:
    """``predict`` and ``load_model`` load torch on first use only (the scripts' ``--help`` imports medseg)."""
    import medseg
    import medseg.api

    assert medseg.predict is medseg.api.predict and medseg.load_model is medseg.api.load_model
    code = "import sys, medseg; print(sorted({'torch', 'monai', 'numpy'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
