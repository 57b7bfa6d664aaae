"""Planning for a memory budget, and the planned depth and widths of the network (``model.channels=null``)."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from medseg.config import DataConfig, ModelConfig, PlanCommandConfig, PlanningConfig, TrainConfig, TrainerConfig
from medseg.errors import ConfigError
from medseg.models import build_model
from medseg.models.nnunet_stages import BasicBlockD
from medseg.planning.from_config import (
    GB,
    apply_plan,
    memory_budget,
    plan_from_config,
    unset_keys,
    voxel_budget_for,
)
from medseg.planning.plan import make_plan, planned_channels
from medseg.planning.report import plan_report
from medseg.runs.checkpoint import save_checkpoint
from medseg.training.checks import check_config
from medseg.training.planning import plan_of_checkpoint
from tests.helpers.configs import compose_config
from tests.helpers.realistic import write_ct_dataset

CPU_TRAINER = TrainerConfig(device="cpu")
DEMO_NET = ModelConfig(channels=[16, 32, 64, 128])
"""A network of set widths (the demo's): planning keeps its depth."""
NNUNET_TRAINING = TrainerConfig(device="cpu", batch_size=1, precision="bf16")
"""nnU-Net's 3D training step: 2 patches (1 volume x data.samples_per_volume 2) under bf16 autocast."""


def fingerprint(spacing: tuple[float, float, float], shapes: list[tuple[int, int, int]], is_ct: bool) -> dict:
    """A dataset fingerprint with what planning reads: per-case spacing and shape (RAS), channels, classes, stats."""
    stats = {"mean": 60.0, "std": 15.0, "min": -50.0, "max": 200.0, "percentile_00_5": 0.0, "percentile_99_5": 100.0}
    return {"channel_names": ["CT" if is_ct else "T1"], "labels": {"0": "background", "1": "organ"}, "is_ct": is_ct,
            "cases": [{"spacing": list(spacing), "shape": list(shape)} for shape in shapes],
            "intensity": [stats], "class_voxels": [10**6, 10**4]}


CT = fingerprint((0.7, 0.7, 5.0), [(512, 512, z) for z in (56, 60, 60, 64, 62)], is_ct=True)
MRI = fingerprint((1.0, 1.0, 1.0), [(176, 208, 176), (172, 204, 180), (180, 212, 172), (176, 208, 176),
                                    (168, 200, 176)], is_ct=False)

# nnU-Net v2 2.8.1's 3d_fullres plans for datasets of the same geometry: 5 cases written by tests/helpers/realistic.py
# (write_ct_dataset / write_mri_dataset, nnU-Net layout, RAS files, these spacings and shapes), then
# `nnUNetv2_extract_fingerprint -d ID -np 2 && nnUNetv2_plan_experiment -d ID` (ExperimentPlanner, 8 GB reference,
# batch size 2). nnUNetPlans.json lists axes as (S, A, R) and a first stage of stride 1: here in RAS order, without it.
NNUNET = {
    "ct": {"fingerprint": CT, "spacing": [0.7, 0.7, 5.0], "patch": [256, 256, 28],
           "strides": [[2, 2, 1], [2, 2, 1], [2, 2, 2], [2, 2, 2], [2, 2, 1], [2, 2, 1]],
           "features": [32, 64, 128, 256, 320, 320, 320], "thick_axis_pools_apart": 1},
    "mri": {"fingerprint": MRI, "spacing": [1.0, 1.0, 1.0], "patch": [128, 128, 128],
            "strides": [[2, 2, 2]] * 5, "features": [32, 64, 128, 256, 320, 320], "thick_axis_pools_apart": 0},
}
"""``thick_axis_pools_apart``: CT's plan keeps 32 slices where nnU-Net's keeps 28 (its estimate of 256 x 256 x 32 is
7.0 GB), and pooling until about 4 voxels pools those 32 once more (3 levels against 2)."""
CT_BUDGET_OF_NNUNET_PLAN = 6.5
"""GB between medseg's estimates of nnU-Net's CT plan (6.2) and of 256 x 256 x 32 (7.0): the budget at which the
same rules give nnU-Net's CT plan exactly; a CUDA peak 15 % above the CPU-fitted estimate would make it 8 GB."""


@pytest.mark.parametrize("name", list(NNUNET))
def test_planned_network_and_patch_follow_nnunet(name: str) -> None:
    expected = NNUNET[name]
    plan = plan_from_config(expected["fingerprint"], DataConfig(root="x"), ModelConfig(channels=None),
                            NNUNET_TRAINING, PlanningConfig(memory_gb=8))
    assert plan.target_spacing == pytest.approx(expected["spacing"])
    ratio = np.prod(plan.patch_size) / np.prod(expected["patch"])
    assert 0.5 <= ratio <= 2, (plan.patch_size, expected["patch"])
    assert plan.channels == expected["features"] and len(plan.strides) == len(expected["strides"]), "the same depth"
    in_plane = [axis for axis in range(3) if axis != plan.slice_axis]
    assert np.array(plan.strides)[:, in_plane].tolist() == np.array(expected["strides"])[:, in_plane].tolist()
    pools, nnunet_pools = (np.log2(np.prod(s, axis=0)).astype(int) for s in (plan.strides, expected["strides"]))
    assert pools[plan.slice_axis] - nnunet_pools[plan.slice_axis] == expected["thick_axis_pools_apart"]
    assert 0.5 * 8 * GB < plan.memory.total <= 8 * GB, "the patch is as large as the budget allows"


# nnU-Net v2 2.8.1's residual-encoder plans (3d_fullres) for the same CT geometry, made by
#   python -c "from tests.helpers.realistic import write_ct_dataset; write_ct_dataset('$nnUNet_raw/Dataset901_ResEncCT',
#       'nnunet', num_cases=5, shape=[(512, 512, z) for z in (56, 60, 60, 64, 62)], spacing=(0.7, 0.7, 5.0),
#       orientation='RAS')"
#   nnUNetv2_extract_fingerprint -d 901 -np 2
#   nnUNetv2_plan_experiment -d 901 -pl nnUNetPlannerResEncM; nnUNetv2_plan_experiment -d 901 -pl nnUNetPlannerResEncL
# and read from nnUNetResEncUNet{M,L}Plans.json (arch_kwargs: n_blocks_per_stage, features_per_stage, strides,
# n_conv_per_stage_decoder; patch_size, batch_size 2 in both), in RAS order and without the stride-1 first stage.
NNUNET_RESENC = {
    "resenc_m": {"patch": [224, 224, 28], "blocks": [1, 3, 4, 6, 6, 6], "features": [32, 64, 128, 256, 320, 320],
                 "strides": [[2, 2, 1], [2, 2, 1], [2, 2, 2], [2, 2, 2], [2, 2, 1]], "decoder_convs": 1},
    "resenc_l": {"patch": [320, 320, 40], "blocks": [1, 3, 4, 6, 6, 6, 6],
                 "features": [32, 64, 128, 256, 320, 320, 320],
                 "strides": [[2, 2, 1], [2, 2, 1], [2, 2, 2], [2, 2, 2], [2, 2, 2], [2, 2, 1]], "decoder_convs": 1},
}
RESENC_PATCH_MATCHES = {"resenc_m": True, "resenc_l": False}
"""Whether medseg's patch is nnU-Net's exactly: for M (8 GB) it is; for L (24 GB) medseg's estimate leaves room for
320 x 384 x 40 where nnU-Net's reference value stops at 320 x 320 x 40 (1.2 times the voxels)."""


@pytest.mark.parametrize("preset", list(NNUNET_RESENC))
def test_resenc_presets_plan_nnunet_s_resenc_network(preset: str) -> None:
    """The blocks per stage, widths, strides and decoder convs of a planned preset are nnU-Net's ResEnc planner's, on
    the preset's memory target; so is M's patch (see RESENC_PATCH_MATCHES)."""
    expected = NNUNET_RESENC[preset]
    cfg = check_config(compose_config([f"experiment={preset}", "output_dir=x"]))
    trainer = replace(NNUNET_TRAINING, batch_size=cfg.trainer.batch_size)
    target = PlanningConfig(memory_gb=cfg.plan.reference_gb)  # the preset's memory target, as on a large GPU
    plan = plan_from_config(CT, DataConfig(root="x"), cfg.model, trainer, target)
    data, model = apply_plan(DataConfig(root="x"), cfg.model, plan)
    with torch.device("meta"):
        net = build_model(model, 1, 3, data.patch_size)
    stages = [net.stem, *net.down]
    assert net.conv_stages == "nnunet_resenc", "nnU-Net's ResidualEncoderUNet"
    assert [sum(isinstance(m, BasicBlockD) for m in stage.modules()) for stage in stages] == expected["blocks"]
    assert plan.channels == expected["features"] and plan.strides == expected["strides"]
    assert net.decoder_convs == expected["decoder_convs"] and plan.memory.batch == 2, "nnU-Net's 2 patches per step"
    assert (plan.patch_size == expected["patch"]) == RESENC_PATCH_MATCHES[preset], plan.patch_size
    assert 0.5 <= np.prod(plan.patch_size) / np.prod(expected["patch"]) <= 2
    assert plan.memory.total <= cfg.plan.reference_gb * GB


def test_between_the_two_estimates_the_ct_plan_is_nnunet_s() -> None:
    expected = NNUNET["ct"]
    plan = plan_from_config(CT, DataConfig(root="x"), ModelConfig(channels=None), NNUNET_TRAINING,
                            PlanningConfig(memory_gb=CT_BUDGET_OF_NNUNET_PLAN))
    assert (plan.patch_size, plan.strides, plan.channels) == (expected["patch"], expected["strides"],
                                                              expected["features"])


def test_shrinking_steps_by_the_smaller_patch_s_stride_as_nnunet_does() -> None:
    # 256 pools 6 times (total stride 64); 256 - 64 = 192 pools 5 times (32), so 256 - 32 = 224 is the next size,
    # whose 7 voxels after five pools are not pooled again. Stepping by 64 would skip it and stop at 192**3.
    cube = fingerprint((1.0, 1.0, 1.0), [(256, 256, 256)] * 3, is_ct=False)
    plan = make_plan(cube, num_levels=None, voxel_budget=10**9)  # only the half-volume limit applies
    assert 224 in plan.patch_size and 192**3 < np.prod(plan.patch_size) <= 256**3 // 2, plan.patch_size
    assert plan.strides == [[2, 2, 2]] * 5


def test_patch_follows_the_budget_and_the_batch() -> None:
    def plan(memory_gb: float, batch_size: int = 1) -> tuple[int, int]:
        planned = plan_from_config(CT, DataConfig(root="x"), DEMO_NET, TrainerConfig(device="cpu",
                                   batch_size=batch_size), PlanningConfig(memory_gb=memory_gb))
        assert planned.memory.total <= memory_gb * GB and planned.memory.batch == 2 * batch_size
        return int(np.prod(planned.patch_size)), len(planned.strides)

    small, large, batched = plan(1), plan(4), plan(4, batch_size=2)
    assert small[0] < batched[0] < large[0], (small, batched, large)
    assert small[1] == large[1] == 3, "model.channels set: its depth is kept"


def test_cpu_default_keeps_the_voxel_budget() -> None:
    model = DEMO_NET
    plan = plan_from_config(CT, DataConfig(root="x"), model, CPU_TRAINER)
    assert plan.patch_size == [120, 128, 14] and plan.strides == [[2, 2, 1], [2, 2, 1], [2, 2, 2]]
    same = make_plan(CT, num_levels=3, voxel_budget=voxel_budget_for(model))
    assert (plan.patch_size, plan.strides) == (same.patch_size, same.strides)
    assert "voxel budget 221,184" in plan.budget and plan.memory is not None
    planned = plan_from_config(MRI, DataConfig(root="x"), ModelConfig(channels=None), CPU_TRAINER)
    assert np.prod(planned.patch_size) <= voxel_budget_for(ModelConfig(channels=None)) == 48**3
    assert planned.channels == planned_channels(len(planned.strides) + 1, 3) == [32, 64, 128, 256]


def test_memory_budget_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert memory_budget(PlanningConfig(), torch.device("cpu"))[0] is None
    assert memory_budget(PlanningConfig(memory_gb=2.5), torch.device("cpu"))[0] == int(2.5 * GB)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for gpu_gb, budget_gb in ((80, 8), (6, 6)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, gb=gpu_gb: SimpleNamespace(
            total_memory=gb * GB))
        limit, source = memory_budget(PlanningConfig(), torch.device("cuda"))
        assert limit == budget_gb * GB and f"{gpu_gb}.0 GiB" in source
    assert memory_budget(PlanningConfig(memory_gb=12), torch.device("cuda"))[0] == 12 * GB
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * GB))
    assert memory_budget(PlanningConfig(reference_gb=24), torch.device("cuda"))[0] == 24 * GB  # experiment=resenc_l


@pytest.mark.parametrize("value", [0, -1.5])
def test_a_budget_that_is_not_positive_is_one_line(value: float) -> None:
    with pytest.raises(ConfigError, match=rf"^plan\.memory_gb={float(value)}: expected > 0$") as error:
        check_config({"data": {"root": "x"}, "plan": {"memory_gb": value}})  # the key's range
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"^plan\.memory_gb="):
        plan_from_config(CT, DataConfig(root="x"), DEMO_NET, CPU_TRAINER, PlanningConfig(memory_gb=value))


def test_null_channels_are_planned_filled_and_stored(tmp_path: Path) -> None:
    cfg = check_config({"data": {"root": "x"}, "model": {"channels": None, "decoder_levels": 2}})
    assert "model.channels" in unset_keys(cfg.data, cfg.model)
    plan = plan_from_config(CT, cfg.data, cfg.model, CPU_TRAINER)
    _, model = apply_plan(cfg.data, cfg.model, plan)
    assert model.channels == plan.channels and len(model.channels) == len(model.strides) + 1
    with pytest.raises(ConfigError, match=r"model\.decoder_levels=3: expected 0\.\.2"):
        check_config({"data": {"root": "x"}, "model": {"channels": None, "strides": [2, 2], "decoder_levels": 3}})
    resolved = TrainConfig(model=model, data=DataConfig(root="x", spacing=[1.0, 1.0, 1.0], patch_size=[32, 32, 16],
                                                        normalization="zscore"))
    checkpoint = save_checkpoint(tmp_path / "last.pt", {"config": asdict(resolved)})
    again = plan_of_checkpoint(cfg, checkpoint)
    assert again.model.channels == plan.channels and again.model.strides == plan.strides


def test_report_prints_the_estimate_and_the_channels(tmp_path: Path) -> None:
    root = write_ct_dataset(tmp_path / "ct", num_cases=3, shape=(64, 64, 20))
    text = plan_report(PlanCommandConfig(data=DataConfig(root=str(root)), model=ModelConfig(channels=None),
                                         progress=False, trainer=CPU_TRAINER, plan=PlanningConfig(memory_gb=1)))
    assert "channels: [32, 64" in text and "training memory (estimate): " in text and "2 patches x" in text
    assert "planned for: cpu, fp32, 1.0 GiB of training memory (plan.memory_gb=1)" in text
    assert "fit to 1.0 GiB of training memory" in text and "plan.memory_gb=1" in text
    assert "model.channels" not in text.split("kept from the config")[-1], "planned, not kept"
