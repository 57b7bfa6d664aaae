"""Automatic planning: fingerprint (orientation, intensities, cache), plan rules, config filling, script."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from medseg.config import DataConfig, ModelConfig, PlanCommandConfig, TrainerConfig
from medseg.data.datalist import load_dataset
from medseg.data.transforms import normalization_transform, thick_axis, window
from medseg.errors import DatasetError
from medseg.planning import fingerprint as fingerprint_module
from medseg.planning.fingerprint import SAMPLES_PER_CASE, compute_fingerprint
from medseg.planning.from_config import apply_plan, dataset_fingerprint, plan_from_config, voxel_budget_for
from medseg.planning.plan import BASE_VOXEL_BUDGET, MAX_PATCH_COVERAGE, Plan, make_plan
from medseg.planning.report import format_plan, plan_report
from tests.helpers.realistic import (
    SAGITTAL_SHAPE,
    SAGITTAL_SPACING,
    SyntheticCase,
    ct_case,
    write_ct_dataset,
    write_dataset,
    write_mri_dataset,
    write_sagittal_dataset,
    write_thin_dataset,
    write_two_channel_dataset,
)

REPO = Path(__file__).resolve().parents[2]
CT_SPACINGS = [(0.7, 0.7, 5.0), (0.7, 0.7, 5.0), (0.8, 0.8, 5.0), (0.6, 0.6, 4.0), (0.7, 0.7, 3.0),
               (0.75, 0.75, 5.0)]
"""Per-case CT spacings (RAS, mm): thick, varying slices, so nnU-Net's anisotropy rule applies."""
MRI_SHAPE = (48, 48, 40)

CPU_TRAINER = TrainerConfig(device="cpu")
"""Planning for a CPU: the voxel budget, on any machine."""


def fingerprint_of(root: Path, fmt: str = "msd", **kwargs) -> dict:
    return compute_fingerprint(load_dataset(root, fmt), progress=False, **kwargs)


def check_geometry(plan: Plan, voxel_budget: int, min_feature_size: int = 4, planned_strides: bool = True) -> None:
    """Patch divisible by the total stride per axis, within budget; planned strides pool only at size >= 2 * min."""
    total = np.prod(plan.strides, axis=0)
    assert all(p % t == 0 for p, t in zip(plan.patch_size, total)), (plan.patch_size, total)
    assert np.prod(plan.patch_size) <= voxel_budget
    if not planned_strides:
        return
    size = np.asarray(plan.patch_size, dtype=float)
    for level in plan.strides:
        assert all(s == 1 or n >= 2 * min_feature_size for s, n in zip(level, size)), plan.strides
        size /= level


def foreground_voxels(root: Path) -> tuple[list[np.ndarray], list[int]]:
    """Direct nibabel read of an MSD single-channel dataset: foreground values per case (float64)."""
    values = []
    for image_path in sorted((root / "imagesTr").iterdir()):
        image = np.asanyarray(nib.load(image_path).dataobj).astype(np.float64)
        label = np.asanyarray(nib.load(root / "labelsTr" / image_path.name).dataobj)
        values.append(image[label > 0])
    return values, [v.size for v in values]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("planning")
    n = len(CT_SPACINGS)
    return {
        "ct": write_ct_dataset(base / "ct", "msd", num_cases=n, spacing=CT_SPACINGS, orientation="LPS"),
        "ct_ras": write_ct_dataset(base / "ct_ras", "msd", num_cases=n, spacing=CT_SPACINGS,
                                   orientation="RAS"),
        "ct_pir": write_ct_dataset(base / "ct_pir", "nnunet", num_cases=n, spacing=CT_SPACINGS,
                                   orientation="PIR"),
        "mri": write_mri_dataset(base / "mri", "msd", num_cases=4, shape=MRI_SHAPE),
        "sagittal": write_sagittal_dataset(base / "sag", "msd", num_cases=4),  # thick axis R: 2D slices across 0
        "thin": write_thin_dataset(base / "thin", "nnunet", num_cases=3),
        "mc_msd": write_two_channel_dataset(base / "mc_msd", "msd", num_cases=3),
        "mc_nnunet": write_two_channel_dataset(base / "mc_nnunet", "nnunet", num_cases=3),
    }


@pytest.fixture(scope="module")
def ct_fingerprint(datasets: dict[str, Path]) -> dict:
    return fingerprint_of(datasets["ct"])


def test_anisotropic_ct_plan(ct_fingerprint: dict) -> None:
    spacings = np.asarray(CT_SPACINGS)
    plan = make_plan(ct_fingerprint, spatial_dims=3, num_levels=4)
    # In-plane: the median. Thick axis (5 mm > 3 x 0.7 mm, 20 slices < 64 / 3): the 10th percentile.
    assert plan.target_spacing[:2] == pytest.approx(np.median(spacings[:, :2], axis=0))
    assert plan.target_spacing[2] == pytest.approx(np.percentile(spacings[:, 2], 10))
    assert plan.slice_axis == 2
    assert len(plan.strides) == 4
    assert plan.strides[0] == [2, 2, 1], "the thick axis is not pooled while in-plane is much finer"
    assert any(level[2] == 2 for level in plan.strides), "the thick axis is pooled once spacings meet"
    check_geometry(plan, BASE_VOXEL_BUDGET[3])
    total = np.prod(plan.strides, axis=0)
    assert all(p <= -(-m // t) * t for p, m, t in zip(plan.patch_size, plan.median_shape, total))
    assert plan.normalization["scheme"] == "ct"


def test_patch_shrinks_to_a_small_budget(ct_fingerprint: dict) -> None:
    budget = 24**3
    plan = make_plan(ct_fingerprint, num_levels=3, voxel_budget=budget)
    check_geometry(plan, budget)
    assert np.prod(plan.patch_size) > budget / 4, "shrinking stops near the budget"


def test_isotropic_data_pools_all_axes(datasets: dict[str, Path]) -> None:
    plan = make_plan(fingerprint_of(datasets["mri"]), num_levels=3)
    assert plan.target_spacing == pytest.approx([1.0, 1.0, 1.0])
    assert plan.strides == [[2, 2, 2]] * 3
    coverage = np.prod(plan.patch_size) / np.prod(MRI_SHAPE)
    assert MAX_PATCH_COVERAGE / 2 < coverage <= MAX_PATCH_COVERAGE, "the whole volume fits the budget, half is kept"
    assert plan.normalization == {"scheme": "zscore"}
    check_geometry(plan, BASE_VOXEL_BUDGET[3])


def test_2d_plan_slices_across_the_thick_axis(datasets: dict[str, Path], ct_fingerprint: dict) -> None:
    plan = make_plan(fingerprint_of(datasets["sagittal"]), spatial_dims=2, num_levels=3)
    assert plan.slice_axis == 0
    assert plan.target_spacing[1:] == pytest.approx(SAGITTAL_SPACING[1:]) and len(plan.target_spacing) == 3
    assert plan.median_shape == list(SAGITTAL_SHAPE[1:])
    assert len(plan.patch_size) == 2 and all(len(level) == 2 for level in plan.strides)
    total = np.prod(plan.strides, axis=0)
    assert plan.patch_size == [-(-m // t) * t for m, t in zip(plan.median_shape, total)], "whole slices in 2D"
    check_geometry(plan, BASE_VOXEL_BUDGET[2])
    ct_plan = make_plan(ct_fingerprint, spatial_dims=2, num_levels=3)
    assert ct_plan.slice_axis == 2
    assert ct_plan.target_spacing[:2] == pytest.approx(np.median(np.asarray(CT_SPACINGS)[:, :2], axis=0))


def test_ct_normalization_matches_numpy(datasets: dict[str, Path], ct_fingerprint: dict) -> None:
    values, counts = foreground_voxels(datasets["ct"])
    assert max(counts) <= SAMPLES_PER_CASE, "precondition: every foreground voxel is sampled"
    pooled = np.concatenate(values)
    norm = make_plan(ct_fingerprint).normalization
    assert norm["clip"] == pytest.approx(np.percentile(pooled, [0.5, 99.5]))
    assert norm["mean"] == pytest.approx(pooled.mean())
    assert norm["std"] == pytest.approx(pooled.std())
    assert ct_fingerprint["intensity"][0]["min"] == pooled.min()
    assert ct_fingerprint["intensity"][0]["max"] == pooled.max()


def test_multi_channel_ct_is_normalized_per_channel(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    cases = []
    for i in range(3):  # two CT phases: the second 150 HU brighter and twice the spread
        case = ct_case(f"phase_{i}", rng, (32, 32, 8), (0.8, 0.8, 4.0))
        contrast = np.clip(2 * case.image[0].astype(np.int32) + 150, -1024, 3071).astype(np.int16)
        cases.append(SyntheticCase(case.case, np.stack([case.image[0], contrast]), case.label, case.spacing))
    root = write_dataset(tmp_path / "ct2", cases, ["CT", "CT"], ["background", "organ", "lesion"], fmt="nnunet")
    norm = make_plan(fingerprint_of(root, "nnunet"), num_levels=2).normalization
    assert norm["scheme"] == "ct" and len(norm["clip"]) == len(norm["mean"]) == len(norm["std"]) == 2
    assert norm["mean"][1] > norm["mean"][0] + 100 and norm["std"][1] > 1.5 * norm["std"][0]
    image = np.stack([c.image for c in cases], axis=-1).astype(np.float32)  # (2, X, Y, Z, cases): all at once
    (transform,) = normalization_transform(norm)
    out = transform({"image": torch.from_numpy(image)})["image"].numpy()
    for channel in range(2):
        low, high = norm["clip"][channel]
        expected = (np.clip(image[channel], low, high) - norm["mean"][channel]) / norm["std"][channel]
        assert np.allclose(out[channel], expected, atol=1e-5)
    labels = np.stack([c.label for c in cases], axis=-1) > 0
    assert abs(out[1][labels].mean()) < 0.1 and abs(out[1][labels].std() - 1) < 0.1, "z-scored foreground"
    with pytest.raises(ValueError, match="statistics for 2 channels, the image has 3"):
        transform({"image": torch.zeros(3, 4, 4, 4)})


def test_sampling_is_deterministic_and_close(datasets: dict[str, Path], ct_fingerprint: dict) -> None:
    first = fingerprint_of(datasets["ct"], samples_per_case=300)
    again = fingerprint_of(datasets["ct"], samples_per_case=300)
    assert first["intensity"] == again["intensity"]
    full = ct_fingerprint["intensity"][0]
    assert first["intensity"][0]["mean"] == pytest.approx(full["mean"], abs=0.2 * full["std"])


def test_int16_near_limits_has_no_overflow(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    shape = (24, 24, 8)
    cases = []
    for i in range(3):
        image = (32000 + rng.integers(-700, 700, shape)).astype(np.int16)
        label = np.zeros(shape, np.uint8)
        label[4:20, 4:20, 2:6] = 1
        cases.append(SyntheticCase(f"hot_{i}", image[None], label, (1.0, 1.0, 2.0)))
    root = write_dataset(tmp_path / "hot", cases, ["CT"], ["background", "metal"])
    assert nib.load(root / "imagesTr" / "hot_0.nii.gz").get_data_dtype() == np.int16
    values, _ = foreground_voxels(root)
    pooled = np.concatenate(values)
    stats = fingerprint_of(root)["intensity"][0]
    assert stats["mean"] == pytest.approx(pooled.mean())
    assert stats["std"] == pytest.approx(pooled.std())
    assert stats["max"] == pooled.max() > 32000


def test_orientation_gives_the_same_ras_fingerprint(datasets: dict[str, Path], ct_fingerprint: dict) -> None:
    pir_file = datasets["ct_pir"] / "imagesTr" / "ct_000_0000.nii.gz"
    assert nib.aff2axcodes(nib.load(pir_file).affine) == ("P", "I", "R")
    assert tuple(nib.load(pir_file).header.get_zooms()) == (0.7, 5.0, 0.7), "stored with permuted axes"
    for other in (fingerprint_of(datasets["ct_ras"]), fingerprint_of(datasets["ct_pir"], "nnunet")):
        for ours, theirs, spacing in zip(ct_fingerprint["cases"], other["cases"], CT_SPACINGS):
            assert ours["spacing"] == pytest.approx(spacing)
            assert theirs["spacing"] == pytest.approx(spacing)
            assert ours["shape"] == theirs["shape"] == [64, 64, 20]
            assert ours["class_voxels"] == theirs["class_voxels"]
        assert other["intensity"] == ct_fingerprint["intensity"]
    assert {case["orientation"] for case in ct_fingerprint["cases"]} == {"LPS"}


@pytest.mark.parametrize(("ending", "module"), [(".nrrd", "nrrd"), (".mha", "itk"), (".mhd", "itk")])
def test_other_file_types_give_the_nifti_fingerprint(ending: str, module: str, tmp_path: Path,
                                                     ct_fingerprint: dict) -> None:
    pytest.importorskip(module, reason=f"{ending} needs the formats extra: pip install 'medseg[formats]'")
    n = len(CT_SPACINGS)
    root = write_ct_dataset(tmp_path / "ct", "nnunet", num_cases=n, spacing=CT_SPACINGS, orientation="PIR",
                            file_ending=ending)
    assert (root / "imagesTr" / f"ct_000_0000{ending}").is_file()
    other = fingerprint_of(root, "nnunet")
    for ours, theirs in zip(ct_fingerprint["cases"], other["cases"]):
        assert theirs["spacing"] == pytest.approx(ours["spacing"])
        assert theirs["shape"] == ours["shape"] and theirs["class_voxels"] == ours["class_voxels"]
        assert theirs["orientation"] == "PIR"
    assert other["intensity"] == ct_fingerprint["intensity"], "int16 HU read unchanged"


def test_slice_axis_of_the_transforms_is_the_plans(datasets: dict[str, Path]) -> None:
    plan = make_plan(fingerprint_of(datasets["sagittal"]), spatial_dims=2, num_levels=3)
    planned = DataConfig(root="unused", spacing=plan.target_spacing, patch_size=plan.patch_size)
    assert window(planned, 2).slice_axis == plan.slice_axis == 0
    near_tie = [1.0, 1.0, 1.0 - 1e-6]  # e.g. float32 spacing read back: still the last (S) axis, as planned
    assert thick_axis(near_tie) == 2


def test_apply_plan_completes_in_plane_spacing_in_2d(datasets: dict[str, Path]) -> None:
    plan = make_plan(fingerprint_of(datasets["sagittal"]), spatial_dims=2, num_levels=2, target_spacing=[1.0, 1.2])
    assert plan.target_spacing == pytest.approx([SAGITTAL_SPACING[0], 1.0, 1.2])
    data, _ = apply_plan(DataConfig(root="x", spacing=[1.0, 1.2]), ModelConfig(spatial_dims=2), plan)
    assert data.spacing == plan.target_spacing


def test_two_channels_msd_4d_equals_nnunet_files(datasets: dict[str, Path]) -> None:
    msd, nnunet = fingerprint_of(datasets["mc_msd"]), fingerprint_of(datasets["mc_nnunet"], "nnunet")
    assert len(msd["intensity"]) == 2
    assert msd["intensity"][0]["mean"] != pytest.approx(msd["intensity"][1]["mean"])
    for key in ("intensity", "class_voxels", "median_spacing", "median_shape", "dataset_bytes"):
        assert msd[key] == nnunet[key], key
    assert [c["spacing"] for c in msd["cases"]] == [c["spacing"] for c in nnunet["cases"]]


def test_thin_volume_patch_is_not_bigger_than_needed(datasets: dict[str, Path]) -> None:
    plan = make_plan(fingerprint_of(datasets["thin"], "nnunet"), num_levels=3)
    z_stride = int(np.prod([level[2] for level in plan.strides]))
    assert plan.median_shape[2] == 12
    assert plan.patch_size[2] <= -(-12 // z_stride) * z_stride < 32
    check_geometry(plan, BASE_VOXEL_BUDGET[3])


def test_fingerprint_cache_reused_and_invalidated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_ct_dataset(tmp_path / "ct", num_cases=3, shape=(32, 32, 10))
    cache = tmp_path / "cache" / "fingerprint.json"
    info = load_dataset(root)
    first = compute_fingerprint(info, cache, progress=False)
    assert cache.is_file()
    reads = []
    real_read = fingerprint_module.read_case
    monkeypatch.setattr(fingerprint_module, "read_case", lambda entry: reads.append(entry["case"]) or real_read(entry))
    assert compute_fingerprint(info, cache, progress=False) == first
    assert reads == [], "a fresh cache is reused without reading images"
    label = Path(info.training[0]["label"])
    stat = label.stat()
    os.utime(label, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert compute_fingerprint(info, cache, progress=False)["cases"] == first["cases"]
    assert len(reads) == 3, "a touched file invalidates the cache"
    write_ct_dataset(root, num_cases=3, shape=(32, 32, 10), seed=1)
    changed = compute_fingerprint(info, cache, progress=False)
    assert len(reads) == 6 and changed["intensity"] != first["intensity"]
    cache.write_text("{not json")
    assert compute_fingerprint(info, cache, progress=False) == changed


def test_label_outside_the_classes_is_a_dataset_error(tmp_path: Path) -> None:
    label = np.zeros((16, 16, 4), np.uint8)
    label[2:6, 2:6, 1:3] = 5
    case = SyntheticCase("bad", np.ones((1, 16, 16, 4), np.float32), label, (1.0, 1.0, 1.0))
    root = write_dataset(tmp_path / "bad", [case], ["MRI"], ["background", "organ"])
    with pytest.raises(DatasetError, match=r"label values \(5\) are not in"):
        fingerprint_of(root)


def test_apply_plan_fills_only_null_keys(ct_fingerprint: dict) -> None:
    plan = make_plan(ct_fingerprint, num_levels=3)
    data_cfg = DataConfig(root="x", patch_size=[32, 32, 16])
    model_cfg = ModelConfig(channels=[16, 32, 64, 128])
    data, model = apply_plan(data_cfg, model_cfg, plan)
    assert data == replace(data_cfg, spacing=plan.target_spacing, normalization=plan.normalization)
    assert model == replace(model_cfg, strides=plan.strides)
    assert data_cfg.spacing is None and model_cfg.strides is None, "inputs are not modified"
    user = DataConfig(root="x", spacing=[1.0, 1.0, 1.0], patch_size=[8, 8, 8], normalization="none")
    user_model = ModelConfig(channels=[4, 8, 16], strides=[2, 2])
    assert apply_plan(user, user_model, plan) == (user, user_model)


def test_a_dataset_plans_around_user_values(tmp_path: Path, datasets: dict[str, Path]) -> None:
    info = load_dataset(datasets["ct"])
    model_cfg = ModelConfig(channels=[16, 32, 64, 128], strides=[2, 2, 2])
    data_cfg = DataConfig(root=str(datasets["ct"]), cache_dir=str(tmp_path))
    fingerprint = dataset_fingerprint(info, data_cfg, progress=False)
    assert (tmp_path / "fingerprint.json").is_file()
    plan = plan_from_config(fingerprint, data_cfg, model_cfg, CPU_TRAINER)
    assert plan.strides == [[2, 2, 2]] * 3, "user-set strides are kept"
    check_geometry(plan, voxel_budget_for(model_cfg), planned_strides=False)
    fixed = plan_from_config(fingerprint, replace(data_cfg, spacing=[1.0, 1.0, 2.0], patch_size=[40, 40, 16]),
                             replace(model_cfg, strides=None), CPU_TRAINER)
    assert fixed.target_spacing == [1.0, 1.0, 2.0] and fixed.patch_size == [40, 40, 16]
    check_geometry(fixed, voxel_budget_for(model_cfg))


def test_voxel_budget_scales_with_the_first_width() -> None:
    assert voxel_budget_for(ModelConfig(spatial_dims=3, channels=[32, 64])) == BASE_VOXEL_BUDGET[3]
    assert voxel_budget_for(ModelConfig(spatial_dims=3, channels=[16, 32])) == 2 * BASE_VOXEL_BUDGET[3]
    assert voxel_budget_for(ModelConfig(spatial_dims=2, channels=[64, 128])) == BASE_VOXEL_BUDGET[2] // 2


def test_format_plan_reports_plan_and_fingerprint(ct_fingerprint: dict) -> None:
    text = format_plan(make_plan(ct_fingerprint, num_levels=3), ct_fingerprint)
    for needle in ("target spacing", "patch size", "stride level 3", "normalization: ct", "organ", "LPS"):
        assert needle in text


def test_report_of_the_demo_format_generates_the_dataset(tmp_path: Path) -> None:
    data_cfg = DataConfig(root=str(tmp_path / "demo"), format="demo", num_cases=2)
    text = plan_report(PlanCommandConfig(data=data_cfg, model=ModelConfig(channels=[8, 16, 32]), progress=False))
    assert (tmp_path / "demo" / "dataset.json").is_file() and "2 cases" in text and "patch size" in text
    assert (tmp_path / "demo" / ".medseg_cache" / "fingerprint.json").is_file()


@pytest.mark.full
def test_script_prints_a_plan_and_fails_cleanly(datasets: dict[str, Path], tmp_path: Path) -> None:
    def run(*overrides: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "scripts/plan.py", "progress=false", *overrides], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    good = run("data=msd", f"data.root={datasets['mri']}")
    bad = run("data=msd", f"data.root={tmp_path / 'missing'}")
    out, err = good.communicate(timeout=120)
    assert good.returncode == 0, err
    assert "patch size" in out and "stride level 1" in out
    out, err = bad.communicate(timeout=120)
    assert bad.returncode == 1
    assert err.strip().startswith("error:") and "missing" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
