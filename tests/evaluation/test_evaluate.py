"""Evaluation: original geometry kept, metrics equal to an independent computation, predict-only, 2D models,
an oracle model, bad inputs (other cases still evaluated), and ``scripts/evaluate.py`` end to end.

The demo volumes are LPS with 0.8 x 0.8 x 2 mm voxels; the checkpoints resample to 1.0 x 1.0 x 1.5 mm
so that inverting orientation and spacing is really exercised.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from torch import nn

from medseg.config import DataConfig
from medseg.data.datalist import channel_file_name, load_dataset, parse_channel_file, split_cases, splits_path
from medseg.data.reading import read_file
from medseg.errors import CheckpointError, ConfigError, PredictionError
from medseg.evaluation.evaluate import evaluate
from medseg.inference.cases import find_cases, group_channels
from medseg.inference.inferer import mirror_axes
from medseg.inference.output import check_output
from tests.helpers.checkpoints import CHECKPOINT_SPACING, save_test_checkpoint
from tests.helpers.configs import run_script
from tests.helpers.files import read_csv
from tests.helpers.realistic import write_ct_dataset
from tests.helpers.references import reference_dice, reference_hd95, reference_nsd
from tests.helpers.volumes import assert_same_geometry, nnunet_folder


@pytest.fixture(scope="module")
def ckpt_3d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_test_checkpoint(tmp_path_factory.mktemp("ckpt") / "best3d.pt")


# ----------------------------------------------------------------------------------------------- tests


def msd_copy_with_validation(demo: Path, dest: Path, cases: int) -> Path:
    """A copy of the MSD demo folder whose dataset.json also lists its first ``cases`` cases as validation."""
    shutil.copytree(demo, dest)
    meta = json.loads((dest / "dataset.json").read_text())
    meta["validation"] = meta["training"][:cases]
    (dest / "dataset.json").write_text(json.dumps(meta))
    return dest


def test_geometry_kept_and_metrics_match_direct_computation(tiny_demo_root: Path, ckpt_3d: Path,
                                                            tmp_path: Path) -> None:
    demo = msd_copy_with_validation(tiny_demo_root, tmp_path / "demo", cases=4)
    out = tmp_path / "out"
    result = evaluate({"ckpt": str(ckpt_3d), "input": str(demo / "dataset.json"), "split": "validation",
                       "output": str(out), "inference": {"progress": False}})
    assert result.exit_code == 0 and not result.failed
    rows = read_csv(out / "metrics.csv")
    assert len(rows) == 4 * 2 and {r["class_name"] for r in rows} == {"dim sphere", "bright sphere"}
    for index in range(4):
        name = f"demo_{index:03d}"
        pred = assert_same_geometry(out / f"{name}.nii.gz", demo / "imagesTr" / f"{name}.nii.gz")
        label_nii = nib.load(demo / "labelsTr" / f"{name}.nii.gz")
        label, spacing = np.asarray(label_nii.dataobj), label_nii.header.get_zooms()[:3]
        for row in (r for r in rows if r["case"] == name):
            p, r = pred == int(row["class_index"]), label == int(row["class_index"])
            assert float(row["dice"]) == pytest.approx(reference_dice(p, r))
            assert float(row["pred_ml"]) == pytest.approx(p.sum() * np.prod(spacing) / 1000)
            assert float(row["ref_ml"]) == pytest.approx(r.sum() * np.prod(spacing) / 1000)
            expected_hd = reference_hd95(p, r, spacing)
            if math.isfinite(expected_hd):
                assert float(row["hd95_mm"]) == pytest.approx(expected_hd, rel=1e-5)
            else:
                assert row["hd95_mm"] == str(expected_hd) and row["flags"]
            assert float(row["nsd"]) == pytest.approx(reference_nsd(p, r, spacing, 1.0), rel=1e-6)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_cases"] == summary["num_scored"] == 4 and summary["failed"] == []
    dims = [float(r["dice"]) for r in rows if r["class_name"] == "dim sphere"]
    assert summary["classes"]["dim sphere"]["dice"] == pytest.approx(np.mean(dims))


@pytest.mark.parametrize(("spacing", "orientation"), [
    pytest.param((0.8, 0.8, 2.0), None, id="native"),
    pytest.param((0.8, 0.8, 2.0), "PIR", id="native-permuted-axes"),
    pytest.param(CHECKPOINT_SPACING, None, id="resampled"),
])
def test_oracle_model_scores_perfectly(tiny_demo_root: Path, tmp_path: Path, oracle: None, spacing,
                                       orientation: str | None) -> None:
    """A model that returns the label: Dice 1 / HD95 0 without resampling, and close to it with it
    (a wrong orientation or spacing inversion would misplace the prediction, Dice near 0). The demo is
    stored LPS; ``PIR`` files permute the axes too, which the written label maps must undo."""
    ckpt = save_test_checkpoint(tmp_path / "oracle.pt", spacing=spacing, normalization="none", state={},
                                channel_names=("c0", "c1", "c2"))
    folder = nnunet_folder(tiny_demo_root, tmp_path / "data", one_hot_images=True, cases=3, orientation=orientation)
    result = evaluate({"ckpt": str(ckpt), "input": str(folder), "output": str(tmp_path / "out"),
                       "inference": {"progress": False, "tta": True}})
    assert result.exit_code == 0 and len(result.rows) == 3 * 2
    for index in range(3):
        name = f"demo_{index:03d}"
        pred = assert_same_geometry(tmp_path / "out" / f"{name}.nii.gz", folder / "imagesTs" / f"{name}_0000.nii.gz")
        if spacing == (0.8, 0.8, 2.0):
            label = np.asarray(nib.load(folder / "labelsTs" / f"{name}.nii.gz").dataobj)
            np.testing.assert_array_equal(pred, label)
    scored = [r for r in result.rows if r["flags"] != "both_empty"]
    assert scored
    if spacing == (0.8, 0.8, 2.0):
        assert all(r["dice"] == 1.0 and r["hd95_mm"] == 0.0 and r["nsd"] == 1.0 for r in scored)
    else:
        # small spheres (about 50-200 voxels) lose their rims to the two resamplings, nothing more
        assert np.mean([r["dice"] for r in scored]) > 0.75
        assert np.median([r["hd95_mm"] for r in scored]) <= 2.0  # one native slice


def test_predict_only_folder_with_probabilities(tiny_demo_root: Path, ckpt_3d: Path, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    for name in ("demo_000.nii.gz", "demo_001.nii.gz"):
        shutil.copy(tiny_demo_root / "imagesTr" / name, images / name)
    out = tmp_path / "out"
    result = evaluate({"ckpt": str(ckpt_3d), "input": str(images), "output": str(out), "inference": {"progress": False},
                       "save_probabilities": True})
    assert result.exit_code == 0 and result.rows == []
    assert not (out / "metrics.csv").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_predicted"] == 2 and summary["num_scored"] == 0
    pred = assert_same_geometry(out / "demo_000.nii.gz", images / "demo_000.nii.gz")
    probs = np.load(out / "demo_000.npz")["probabilities"]
    assert probs.dtype == np.float16 and probs.shape == (3, *pred.shape)
    np.testing.assert_allclose(probs.astype(np.float32).sum(0), 1.0, atol=5e-3)
    assert (probs.argmax(0) == pred).mean() > 0.99


def test_the_output_is_checked_writable_before_any_prediction(tiny_demo_root: Path, ckpt_3d: Path,
                                                              tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=rf"^output: {tmp_path / 'notes.txt'} is a file, not a folder"):
        evaluate({"ckpt": str(ckpt_3d), "input": str(tiny_demo_root / "imagesTr"),
                  "output": str(tmp_path / "notes.txt" / "out"), "inference": {"progress": False}})


def test_an_evaluation_removes_what_a_killed_one_half_wrote_in_its_output(tiny_demo_root: Path, ckpt_3d: Path,
                                                                         tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(tiny_demo_root / "imagesTr" / "demo_000.nii.gz", images)
    out = tmp_path / "out"
    out.mkdir()
    half_written = [out / ".demo_001.nii.gz.k3j_9x2q.tmp.nii.gz", out / ".summary.json.abcd1234.tmp"]
    for path in [*half_written, out / "notes.tmp"]:
        path.write_bytes(b"partial")
    evaluate({"ckpt": str(ckpt_3d), "input": str(images), "output": str(out), "inference": {"progress": False}})
    assert sorted(p.name for p in out.iterdir()) == ["demo_000.nii.gz", "notes.tmp", "summary.json"]


def test_nrrd_images_are_predicted_onto_their_grid(ckpt_3d: Path, tmp_path: Path) -> None:
    pytest.importorskip("nrrd", reason=".nrrd needs the formats extra: pip install 'medseg[formats]'")
    root = write_ct_dataset(tmp_path / "ct", "nnunet", num_cases=1, shape=(40, 36, 12), orientation="PIR",
                            file_ending=".nrrd")
    result = evaluate({"ckpt": str(ckpt_3d), "input": str(root), "split": "training", "output": str(tmp_path / "out"),
                       "inference": {"progress": False}})
    assert result.exit_code == 0 and len(result.rows) == 2, result.failed
    image, affine = read_file(root / "imagesTr" / "ct_000_0000.nrrd")
    pred = nib.load(tmp_path / "out" / "ct_000.nii.gz")
    assert pred.shape == image.shape == (36, 12, 40), "stored PIR"
    np.testing.assert_allclose(pred.affine, affine, atol=1e-6)
    assert (int(pred.header["qform_code"]), int(pred.header["sform_code"])) == (1, 1)


def test_2d_checkpoint_on_3d_volumes(tiny_demo_root: Path, tmp_path: Path) -> None:
    ckpt = save_test_checkpoint(tmp_path / "best2d.pt", spatial_dims=2)
    folder = nnunet_folder(tiny_demo_root, tmp_path / "data", cases=1)
    result = evaluate({"ckpt": str(ckpt), "input": str(folder), "output": str(tmp_path / "out"),
                       "inference": {"progress": False}})
    assert result.exit_code == 0 and len(result.rows) == 2
    assert_same_geometry(tmp_path / "out" / "demo_000.nii.gz", folder / "imagesTs" / "demo_000_0000.nii.gz")


def test_bad_cases_are_reported_and_others_still_evaluated(tiny_demo_root: Path, ckpt_3d: Path,
                                                           tmp_path: Path) -> None:
    folder = nnunet_folder(tiny_demo_root, tmp_path / "data", cases=8)
    # demo_001: a two-channel image; demo_002: a label two voxels shorter than its image; demo_004: a torn image;
    # demo_005: a NaN voxel; demo_006: a label value 0.5; demo_007: label values 7 and 9, which the model lacks
    two_channel = folder / "imagesTs" / "demo_001_0000.nii.gz"
    image = nib.load(two_channel)
    data = np.asarray(image.dataobj)
    nib.save(nib.Nifti1Image(np.stack([data, data], axis=-1), image.affine), two_channel)
    label = nib.load(folder / "labelsTs" / "demo_002.nii.gz")
    nib.save(nib.Nifti1Image(np.asarray(label.dataobj)[:-2], label.affine), folder / "labelsTs" / "demo_002.nii.gz")
    torn = folder / "imagesTs" / "demo_004_0000.nii.gz"
    torn.write_bytes(torn.read_bytes()[:500])
    nan = nib.load(folder / "imagesTs" / "demo_005_0000.nii.gz")
    voxels = np.asarray(nan.dataobj).astype(np.float32)
    voxels[3, 4, 5] = np.nan
    nib.save(nib.Nifti1Image(voxels, nan.affine), folder / "imagesTs" / "demo_005_0000.nii.gz")
    for case, values in (("demo_006", [0.5]), ("demo_007", [7, 9])):
        label = nib.load(folder / "labelsTs" / f"{case}.nii.gz")
        voxels = np.asarray(label.dataobj).astype(np.float32)
        voxels[0, 0, : len(values)] = values
        nib.save(nib.Nifti1Image(voxels, label.affine), folder / "labelsTs" / f"{case}.nii.gz")
    out = tmp_path / "out"
    result = evaluate({"ckpt": str(ckpt_3d), "input": str(folder), "output": str(out),
                       "inference": {"progress": False}})
    assert result.exit_code == 1
    reasons = {f["case"]: f["reason"] for f in result.failed}
    assert set(reasons) == {"demo_001", "demo_002", "demo_004", "demo_005", "demo_006", "demo_007"}
    assert reasons["demo_005"] == (f"{folder / 'imagesTs' / 'demo_005_0000.nii.gz'}: contains 1 NaN voxels (of "
                                   f"{np.prod(nan.shape)}); every voxel must be a finite number")
    assert reasons["demo_006"].startswith(f"{folder / 'labelsTs' / 'demo_006.nii.gz'}: non-integer label values (0.5)")
    assert reasons["demo_007"].startswith(f"{folder / 'labelsTs' / 'demo_007.nii.gz'}: label values (7, 9) are not in "
                                          f"the model's labels (0 background, 1 dim sphere, 2 bright sphere)")
    assert not any((out / f"demo_00{i}.nii.gz").exists() for i in (5, 6, 7)), "a refused case writes nothing"
    assert "demo_001_0000.nii.gz" in reasons["demo_001"] and "2 channel(s)" in reasons["demo_001"]
    assert "demo_002.nii.gz" in reasons["demo_002"] and "label shape (30, 32, 16)" in reasons["demo_002"]
    assert reasons["demo_004"].startswith(f"{torn}: cannot read file (") and "Traceback" not in reasons["demo_004"]
    assert {r["case"] for r in result.rows} == {"demo_000", "demo_003"}
    summary = json.loads((out / "summary.json").read_text())
    assert {f["case"] for f in summary["failed"]} == set(reasons) and summary["num_scored"] == 2


@pytest.mark.full
def test_bad_checkpoints_and_empty_input(ckpt_3d: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="not found"):
        evaluate({"ckpt": str(tmp_path / "nope.pt"), "input": str(empty), "inference": {"progress": False}})
    foreign = tmp_path / "foreign.pt"
    torch.save(nn.Linear(2, 2).state_dict(), foreign)
    with pytest.raises(CheckpointError, match="not written by medseg"):
        evaluate({"ckpt": str(foreign), "input": str(empty), "inference": {"progress": False}})
    with pytest.raises(PredictionError, match="no images found"):
        evaluate({"ckpt": str(ckpt_3d), "input": str(empty), "output": str(tmp_path / "o"),
                  "inference": {"progress": False}})
    with pytest.raises(ConfigError, match="input is required"):
        evaluate({"ckpt": str(ckpt_3d)})
    result = run_script("evaluate.py", [f"ckpt={foreign}", f"input={empty}"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("error: checkpoint") and "foreign.pt" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_tta_mirrors_in_plane_axes_only_for_2d_models() -> None:
    assert mirror_axes(3, slice_axis=2) == (0, 1, 2)
    assert mirror_axes(2, slice_axis=2) == (0, 1) and mirror_axes(2, slice_axis=0) == (1, 2)


def test_case_discovery(tmp_path: Path) -> None:
    names = ["a_0000.nii.gz", "a_0001.nii.gz", "b_0000.nii.gz", "b_0001.nii.gz"]
    cases = group_channels([tmp_path / n for n in names])
    assert [c.case for c in cases] == ["a", "b"] and len(cases[0].image_files) == 2
    # numbered files that do not start at channel _0000 are separate cases, not channels
    numbered = [tmp_path / f"scan_{i:04d}.nii.gz" for i in range(1, 4)]
    assert [c.case for c in group_channels(numbered)] == ["scan_0001", "scan_0002", "scan_0003"]
    (tmp_path / "x.nii.gz").write_bytes(b"")
    with pytest.raises(PredictionError, match="not found"):
        find_cases(tmp_path / "missing", "test", 1)
    with pytest.raises(PredictionError, match="would overwrite"):
        check_output(find_cases(tmp_path, "test", 1), tmp_path)


def test_nnunet_channel_files_are_grouped_whatever_the_model_and_must_fit_its_channels(tmp_path: Path) -> None:
    folder = tmp_path / "imagesTr"  # an nnU-Net imagesTr of a two-channel dataset
    folder.mkdir()
    for name in ("a_0000", "a_0001", "b_0000", "b_0001"):
        (folder / f"{name}.nii.gz").write_bytes(b"")
    assert [len(c.image_files) for c in find_cases(folder, "test", 2)] == [2, 2]
    with pytest.raises(PredictionError, match=r"^input=.*imagesTr: case a has 2 channel files \(a_0000\.nii\.gz, "
                                              r"a_0001\.nii\.gz\) and 1 more cases likewise, but the model takes 1 "
                                              r"channel\(s\)"):
        find_cases(folder, "test", 1)


def test_a_folder_with_imagests_and_a_dataset_json_beside_needs_no_training_cases(tiny_demo_root: Path,
                                                                                   tmp_path: Path) -> None:
    folder = nnunet_folder(tiny_demo_root, tmp_path / "nnunet", cases=2)  # imagesTs/ + labelsTs/, no imagesTr/
    (folder / "dataset.json").write_text(json.dumps({"channel_names": {"0": "MRI"}, "labels": {"background": 0},
                                                     "file_ending": ".nii.gz"}))
    cases = find_cases(folder, "test", 1)
    assert [(c.case, Path(c.label).name) for c in cases] == [("demo_000", "demo_000.nii.gz"),
                                                             ("demo_001", "demo_001.nii.gz")]
    msd = nnunet_folder(tiny_demo_root, tmp_path / "msd", cases=2)  # an MSD dataset.json without a test list
    (msd / "dataset.json").write_text(json.dumps({"labels": {"0": "background"}, "modality": {"0": "MRI"},
                                                  "training": [{"image": "./imagesTr/x.nii.gz"}]}))
    assert [(c.case, Path(c.label).name) for c in find_cases(msd, "test", 1)] == [("demo_000", "demo_000.nii.gz"),
                                                                                  ("demo_001", "demo_001.nii.gz")]


def test_nnunet_names_are_parsed_as_they_are_built() -> None:
    assert channel_file_name("liver_7", 12, ".nrrd") == "liver_7_0012.nrrd"
    assert parse_channel_file(Path("/d/imagesTs") / "liver_7_0012.nrrd") == ("liver_7", 12)
    assert parse_channel_file("liver_7_0012.nrrd", ".nrrd") == ("liver_7", 12)
    assert parse_channel_file("liver_7_0012.nii", ".nii.gz") is None, "another file ending"
    assert parse_channel_file("liver_7.nii.gz") is None and parse_channel_file("liver_012.nii.gz") is None


def test_validation_split_is_the_fold_the_checkpoint_was_trained_with(tiny_demo_root: Path, tmp_path: Path) -> None:
    trained_on = DataConfig(root=str(tiny_demo_root), fold=1, num_folds=3, split_seed=7)
    _, expected = split_cases(load_dataset(tiny_demo_root, "msd"), 1, 3, 7)
    cases = find_cases(tiny_demo_root, "validation", 1, trained_on)
    assert [c.case for c in cases] == [e["case"] for e in expected] and len(cases) == 3
    assert all(c.label is not None for c in cases)
    # a split stored by a training run under the cache dir wins (users may edit it, as in nnU-Net)
    trained_on.cache_dir = str(tmp_path)
    ids = sorted(e["case"] for e in load_dataset(tiny_demo_root, "msd").training)
    stored = [{"train": ids[i + 1:] + ids[:i], "val": [ids[i]]} for i in range(3)]
    splits_path(tmp_path, trained_on).write_text(json.dumps(stored))
    assert [c.case for c in find_cases(tiny_demo_root, "validation", 1, trained_on)] == [ids[1]]
    # and a splits file the run trained on (data.splits, nnU-Net's splits_final.json) wins over both
    given = [{"train": ids[:i] + ids[i + 2:], "val": ids[i:i + 2]} for i in range(3)]
    (tmp_path / "splits_final.json").write_text(json.dumps(given))
    trained_on.splits = str(tmp_path / "splits_final.json")
    assert [c.case for c in find_cases(tiny_demo_root, "validation", 1, trained_on)] == ids[1:3]


def test_validation_split_of_a_checkpoint_trained_on_every_case_is_refused(tiny_demo_root: Path,
                                                                             tmp_path: Path) -> None:
    trained_on = DataConfig(root=str(tiny_demo_root), fold="all")
    with pytest.raises(PredictionError, match=r"^split=validation: the checkpoint was trained with data\.fold=all, "
                                              r"on every case of .*dataset\.json, so it has no validation cases"):
        find_cases(tiny_demo_root, "validation", 1, trained_on)
    listed = msd_copy_with_validation(tiny_demo_root, tmp_path / "demo", cases=2)
    cases = find_cases(listed, "validation", 1, trained_on)
    assert len(cases) == 2, "a dataset's own validation list is scored as listed, whatever the fold"


@pytest.mark.full
def test_script_end_to_end(tiny_demo_root: Path, ckpt_3d: Path, tmp_path: Path) -> None:
    folder = nnunet_folder(tiny_demo_root, tmp_path / "data", cases=1)
    result = run_script("evaluate.py", [f"ckpt={ckpt_3d}", f"input={folder}", "output=preds",
                                        "inference.progress=false"], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "foreground mean" in result.stdout and "dim sphere" in result.stdout
    out = tmp_path / "preds"
    assert {p.name for p in out.iterdir()} == {"demo_000.nii.gz", "metrics.csv", "summary.json"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "preds"]  # no Hydra folders or logs
