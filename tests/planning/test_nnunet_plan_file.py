"""Training on nnU-Net's plan (``plan.file=nnUNetPlans.json``) and on its folds (``data.splits``), and plan files
checked as the command line is: their keys, and their values through the same schema and ranges."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from torch import nn

from medseg.config import DataConfig, ModelConfig, PlanningConfig, TrainConfig
from medseg.data.datalist import load_dataset
from medseg.errors import ConfigError
from medseg.models.compute import META, forward_flops, patch_forward_flops
from medseg.planning.fingerprint import compute_fingerprint
from medseg.planning.nnunet_plans import ras_axes, read_configuration
from medseg.planning.plan_file import read_plan_file, write_plan_file
from medseg.runs.checkpoint import load_checkpoint
from medseg.training.checks import check_config
from medseg.training.planning import with_plan_file
from tests.helpers.configs import run_script
from tests.helpers.realistic import write_ct_dataset, write_sagittal_dataset
from tests.planning.test_plan_device import NAMED_CT, no_gpu, write_and_read  # noqa: F401

# What nnU-Net 2.8.1 wrote (nnUNetv2_plan_experiment -d 902 -pl nnUNetPlannerResEncM), the entries medseg reads, for
# write_ct_dataset(..., "nnunet", num_cases=4, shape=(64, 56, 20), orientation="PSL"): RAS (R, A, S) 64 x 56 x 20
# voxels of 0.7 x 0.7 x 5 mm stored with voxel axes (P, S, L), so that SimpleITK's array axes are (L, S, P) and
# transpose_forward [1, 0, 2] puts nnU-Net's axes in the order (S, L, P).
CT_RESENC_M = {
    "dataset_name": "Dataset902_CT", "plans_name": "nnUNetResEncUNetMPlans",
    "original_median_spacing_after_transp": [5.0, 0.699999988079071, 0.699999988079071],
    "image_reader_writer": "SimpleITKIO", "transpose_forward": [1, 0, 2],
    "experiment_planner_used": "nnUNetPlannerResEncM",
    "foreground_intensity_properties_per_channel": {"0": {
        "max": 100.0, "mean": 56.806758880615234, "median": 59.0, "min": -22.0, "percentile_00_5": -4.0,
        "percentile_99_5": 85.0, "std": 15.843493461608887}},
    "configurations": {"3d_fullres": {
        "batch_size": 4, "patch_size": [20, 64, 56], "spacing": [5.0, 0.699999988079071, 0.699999988079071],
        "normalization_schemes": ["CTNormalization"], "use_mask_for_norm": [False],
        "architecture": {
            "network_class_name": "dynamic_network_architectures.architectures.unet.ResidualEncoderUNet",
            "arch_kwargs": {
                "n_stages": 5, "features_per_stage": [32, 64, 128, 256, 320],
                "kernel_sizes": [[1, 3, 3], [1, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3]],
                "strides": [[1, 1, 1], [1, 2, 2], [1, 2, 2], [2, 2, 2], [2, 2, 1]],
                "n_blocks_per_stage": [1, 3, 4, 6, 6],
                "n_conv_per_stage_decoder": [1, 1, 1, 1], "norm_op": "torch.nn.modules.instancenorm.InstanceNorm3d",
                "dropout_op": None, "nonlin": "torch.nn.LeakyReLU"}}}},
}
# nnU-Net 2.8.1's default plans (nnUNetv2_plan_experiment -d 901), its 2d configuration, for
# write_sagittal_dataset(..., "nnunet", orientation="LPS"): RAS 12 x 48 x 40 voxels of 4 x 0.8 x 0.8 mm stored with
# voxel axes (L, P, S), SimpleITK's array axes (S, P, L), transpose_forward [2, 0, 1]: nnU-Net's axes (L, S, P).
SAGITTAL_2D = {
    "dataset_name": "Dataset901_Sag", "plans_name": "nnUNetPlans",
    "original_median_spacing_after_transp": [4.0, 0.800000011920929, 0.800000011920929],
    "image_reader_writer": "SimpleITKIO", "transpose_forward": [2, 0, 1],
    "experiment_planner_used": "ExperimentPlanner",
    "foreground_intensity_properties_per_channel": {"0": {
        "max": 2603.32177734375, "mean": 1552.7486572265625, "median": 1711.32861328125, "min": 368.3548889160156,
        "percentile_00_5": 383.7116394042969, "percentile_99_5": 2522.282958984375, "std": 712.4276733398438}},
    "configurations": {"2d": {
        "batch_size": 2, "patch_size": [40, 48], "spacing": [0.800000011920929, 0.800000011920929],
        "normalization_schemes": ["ZScoreNormalization"], "use_mask_for_norm": [False],
        "architecture": {
            "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
            "arch_kwargs": {
                "n_stages": 4, "features_per_stage": [32, 64, 128, 256], "kernel_sizes": [[3, 3]] * 4,
                "strides": [[1, 1], [2, 2], [2, 2], [2, 2]], "n_conv_per_stage": [2, 2, 2, 2],
                "n_conv_per_stage_decoder": [2, 2, 2], "norm_op": "torch.nn.modules.instancenorm.InstanceNorm2d",
                "dropout_op": None, "nonlin": "torch.nn.LeakyReLU"}}}},
}


def _ct(tmp_path: Path, orientation: str = "PSL") -> tuple[Path, dict]:
    root = write_ct_dataset(tmp_path / "Dataset902_CT", "nnunet", num_cases=4, shape=(64, 56, 20),
                            orientation=orientation)
    return root, compute_fingerprint(load_dataset(root, "nnunet"), progress=False)


def _plans(tmp_path: Path, plans: dict, name: str = "nnUNetResEncUNetMPlans.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(plans))
    return path


def test_nnunet_s_3d_plan_is_read_in_ras_order_with_its_resenc_network(tmp_path: Path) -> None:
    """nnU-Net's (S, L, P) axes become medseg's (R, A, S): the patch is the RAS volume's 64 x 56 x 20, the last
    pooling [2, 2, 1] (S, L, P) pools R and S but not A, the first stages' [1, 3, 3] (S, L, P) kernels are
    [3, 3, 1] (R, A, S); the clip and statistics are nnU-Net's foreground ones."""
    _, fingerprint = _ct(tmp_path)
    assert fingerprint["median_shape"] == [64, 56, 20], "medseg's RAS order, independent of the files' axes"
    plan = read_plan_file(_plans(tmp_path, CT_RESENC_M), fingerprint, 3)
    assert plan.values == {
        "data.spacing": pytest.approx([0.7, 0.7, 5.0]), "data.patch_size": [64, 56, 20],
        "data.normalization": {"scheme": "ct", "clip": [-4.0, 85.0], "mean": 56.806758880615234,
                               "std": 15.843493461608887},
        "model.strides": [[2, 2, 1], [2, 2, 1], [2, 2, 2], [2, 1, 2]], "model.channels": [32, 64, 128, 256, 320],
        "model.kernel_size": [[3, 3, 1], [3, 3, 1], [3, 3, 3], [3, 3, 3], [3, 3, 3]],
        "model.conv_stages": "nnunet_resenc", "model.encoder_blocks": [1, 3, 4, 6, 6], "model.decoder_convs": 1}
    assert plan.notes == (), "medseg builds this network as nnU-Net does"
    assert (plan.target.device, plan.target.precision, plan.target.memory_bytes) == ("cuda", "fp16", 8 * 2**30)
    cfg = with_plan_file(TrainConfig(data=DataConfig(root="x"), plan=PlanningConfig(file="p")), plan)
    model = cfg.model
    assert (model.conv_stages, model.encoder_blocks, model.decoder_convs, cfg.data.patch_size) == (
        "nnunet_resenc", [1, 3, 4, 6, 6], 1, [64, 56, 20])
    assert model.kernel_size == plan.values["model.kernel_size"]
    kept = with_plan_file(TrainConfig(data=DataConfig(root="x"), model=ModelConfig(kernel_size=5, channels=[8] * 5),
                                      plan=PlanningConfig(file="p")), plan)
    assert (kept.model.kernel_size, kept.model.channels) == (5, [8] * 5), "keys set in the config win"
    recipe = ModelConfig(conv_stages="nnunet", encoder_blocks=2, decoder_convs=2)  # recipe=nnunet's network keys
    planned = with_plan_file(TrainConfig(data=DataConfig(root="x"), model=recipe, plan=PlanningConfig(file="p")), plan)
    assert (planned.model.conv_stages, planned.model.encoder_blocks, planned.model.decoder_convs) == (
        "nnunet_resenc", [1, 3, 4, 6, 6], 1), "conv_stages=nnunet takes the plan's whole network"


def test_nnunet_s_2d_plan_slices_across_its_thick_axis(tmp_path: Path) -> None:
    """nnU-Net's 2d configuration lists its in-plane axes (S, P); medseg's in-plane patch is in RAS order (A, S), the
    slice axis R keeps the median spacing (nnU-Net does not resample it) and stays the thickest."""
    root = write_sagittal_dataset(tmp_path / "Dataset901_Sag", "nnunet", orientation="LPS")
    fingerprint = compute_fingerprint(load_dataset(root, "nnunet"), progress=False)
    plan = read_plan_file(_plans(tmp_path, SAGITTAL_2D, "nnUNetPlans.json"), fingerprint, 2)
    values = plan.values
    assert values["data.spacing"] == pytest.approx([4.0, 0.8, 0.8]) and values["data.patch_size"] == [48, 40]
    assert values["model.strides"] == [[2, 2]] * 3 and values["data.normalization"] == {"scheme": "zscore"}
    assert values["model.kernel_size"] == 3, "isotropic kernels equal in every stage stay one int"
    assert (values["model.conv_stages"], values["model.encoder_blocks"], values["model.decoder_convs"]) == (
        "nnunet_plain", [2, 2, 2, 2], 2), "nnU-Net's PlainConvUNet, its conv layers per stage"
    assert plan.notes == (), "medseg builds this network as nnU-Net does"
    flat = copy.deepcopy(SAGITTAL_2D)
    flat["configurations"]["2d"]["architecture"]["arch_kwargs"]["kernel_sizes"] = [[1, 3]] + [[3, 3]] * 3
    kernels = read_plan_file(_plans(tmp_path, flat, "flat.json"), fingerprint, 2).values["model.kernel_size"]
    assert kernels == [[3, 1], [3, 3], [3, 3], [3, 3]], "nnU-Net's in-plane (S, P) are RAS (A, S)"
    with pytest.raises(ConfigError, match=r"nnUNetPlans\.json plan\.nnunet_configuration=3d_fullres: no 3d_fullres "
                                          r"configuration; the file has 2d$"):
        read_plan_file(tmp_path / "nnUNetPlans.json", fingerprint, 3)
    with pytest.raises(ConfigError, match=r"2d is a 2D configuration, model\.spatial_dims=3$"):
        read_plan_file(tmp_path / "nnUNetPlans.json", fingerprint, 3, "2d")


def _changed(edit) -> dict:
    plans = copy.deepcopy(CT_RESENC_M)
    edit(plans, plans["configurations"]["3d_fullres"])
    return plans


def _plain(plans: dict, config: dict) -> None:
    """CT_RESENC_M's widths, strides and kernels in nnU-Net's PlainConvUNet (two convs per stage)."""
    config["architecture"]["network_class_name"] = "dynamic_network_architectures.architectures.unet.PlainConvUNet"
    arch = config["architecture"]["arch_kwargs"]
    del arch["n_blocks_per_stage"]
    arch.update(n_conv_per_stage=[2] * 5, n_conv_per_stage_decoder=[2] * 4)


def test_the_network_of_nnunet_s_plan_costs_the_flops_of_nnunet_s(tmp_path: Path) -> None:
    """Built from the plan, medseg's U-Net is nnU-Net's PlainConvUNet of the same plan (model.conv_stages=
    nnunet_plain) and costs what it costs per window, as torch.utils.flop_counter counts both. With 3x3x3 kernels in
    every stage instead of nnU-Net's 1x3x3 in the first two it would cost about 1.5x."""
    unet = pytest.importorskip("dynamic_network_architectures.architectures.unet")
    _, fingerprint = _ct(tmp_path)
    plans = _changed(_plain)
    values = read_plan_file(_plans(tmp_path, plans), fingerprint, 3).values
    model = ModelConfig(**{key.split(".")[1]: values[key] for key in values if key.startswith("model.")})
    medseg_flops = patch_forward_flops(model, 1, 2, values["data.patch_size"])
    config = plans["configurations"]["3d_fullres"]
    arch = config["architecture"]["arch_kwargs"]
    with META:
        network = unet.PlainConvUNet(
            1, arch["n_stages"], arch["features_per_stage"], nn.Conv3d, arch["kernel_sizes"], arch["strides"],
            arch["n_conv_per_stage"], 2, arch["n_conv_per_stage_decoder"], conv_bias=True, norm_op=nn.InstanceNorm3d,
            norm_op_kwargs={"eps": 1e-5, "affine": True}, nonlin=nn.LeakyReLU, nonlin_kwargs={"inplace": True})
    nnunet_flops = forward_flops(network.eval(), (1, 1, *config["patch_size"]))
    assert medseg_flops == nnunet_flops


@pytest.mark.parametrize(("plans", "message"), [
    (_changed(lambda p, c: c["architecture"].update(network_class_name="x.PrimusM")),
     r"network PrimusM: medseg builds PlainConvUNet and ResidualEncoderUNet$"),
    (_changed(lambda p, c: c.update(normalization_schemes=["RescaleTo01Normalization"])),
     r"normalization RescaleTo01Normalization: medseg has CTNormalization, ZScoreNormalization, NoNormalization$"),
    (_changed(lambda p, c: c["architecture"]["arch_kwargs"].update(n_conv_per_stage_decoder=[2, 2, 1, 1])),
     r"n_conv_per_stage_decoder=\[2, 2, 1, 1\]: medseg builds the same number of convs in every decoder stage$"),
    (_changed(lambda p, c: p["configurations"].update({"3d_cascade_fullres": {
        "inherits_from": "3d_fullres", "previous_stage": "3d_lowres"}})),
     r"3d_cascade_fullres is the cascade's second stage .* medseg has no cascade"),
    (_changed(lambda p, c: p.update(original_median_spacing_after_transp=[3.0, 0.7, 0.7])),
     r"nnU-Net's median spacing \[0\.7, 0\.7, 3\.0\] mm \(RAS\) is not this dataset's \[0\.7, 0\.7, 5\.0\]: planned "
     r"for other data$"),
    (_changed(lambda p, c: p.update(image_reader_writer="NaturalImage2DIO")),
     r"nnU-Net read these images with NaturalImage2DIO; medseg maps the axes of SimpleITKIO, NibabelIO, "),
    (_changed(lambda p, c: p.pop("foreground_intensity_properties_per_channel")),
     r"no 'foreground_intensity_properties_per_channel' \(medseg reads it for CT normalisation\); expected an "
     r"nnU-Net v2 plans file"),
    (_changed(lambda p, c: p.update(foreground_intensity_properties_per_channel={})),
     r"'foreground_intensity_properties_per_channel' has no channel 0"),
    (_changed(lambda p, c: p.pop("original_median_spacing_after_transp")),
     r"no 'original_median_spacing_after_transp' \(medseg reads it for checking the plan against this dataset\)"),
    (_changed(lambda p, c: c["architecture"]["arch_kwargs"].update(kernel_sizes=[[3, 3]] + [[3, 3, 3]] * 4)),
     r"3d_fullres's kernel_sizes\[0\]=\[3, 3\]: expected 3 entries \(one per axis of a 3D configuration\)$"),
    (_changed(lambda p, c: c["architecture"]["arch_kwargs"].update(kernel_sizes=[[3, 3, 3]] * 4)),
     r"3d_fullres's kernel_sizes has 4 entries for 5 stages; expected one per stage$"),
])
def test_what_medseg_cannot_train_from_nnunet_s_plan_is_refused_in_one_line(tmp_path: Path, plans: dict,
                                                                            message: str) -> None:
    _, fingerprint = _ct(tmp_path)
    configuration = "3d_cascade_fullres" if "3d_cascade_fullres" in plans["configurations"] else None
    with pytest.raises(ConfigError, match=rf"^plan\.file={tmp_path}/\S+\.json.*: {message}") as error:
        read_plan_file(_plans(tmp_path, plans), fingerprint, 3, configuration)
    assert "\n" not in str(error.value)


def test_a_configuration_without_nnunet_s_plans_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^plan\.nnunet_configuration=2d names a configuration of nnU-Net's plans: "
                                          r"set plan\.file=<nnUNetPlans\.json>$"):
        check_config(TrainConfig(data=DataConfig(root="x"), plan=PlanningConfig(nnunet_configuration="2d")))


def test_nnunet_s_axes_follow_its_reader_and_configurations_inherit(tmp_path: Path) -> None:
    """nibabel's reorienting reader gives nnU-Net RAS arrays, reversed (S, A, R), whatever the files' orientation; a
    configuration that inherits from 3d_fullres is 3d_fullres with its own entries on top."""
    _, fingerprint = _ct(tmp_path)
    assert ras_axes(CT_RESENC_M, fingerprint, "w") == [2, 0, 1], "SimpleITK's arrays of (P, S, L) files: (S, L, P)"
    assert ras_axes({**CT_RESENC_M, "image_reader_writer": "NibabelIOWithReorient"}, fingerprint, "w") == [1, 2, 0]
    plans = copy.deepcopy(CT_RESENC_M)
    plans["configurations"]["3d_fullres_bs8"] = {"inherits_from": "3d_fullres", "batch_size": 8}
    config = read_configuration(plans, "3d_fullres_bs8", 3, "w")
    assert (config.batch_size, config.patch_size, config.encoder_blocks) == (8, [20, 64, 56], [1, 3, 4, 6, 6])


def test_cases_stored_in_orientations_that_map_nnunet_s_axes_differently_are_refused(tmp_path: Path) -> None:
    _, fingerprint = _ct(tmp_path)
    fingerprint["cases"][2]["orientation"] = "LPS"  # (S, P, L) arrays: nnU-Net's axes would be another RAS order
    with pytest.raises(ConfigError, match=r"cases ct_000 \(PSL\) and ct_002 \(LPS\) are stored in orientations that "
                                          r"give nnU-Net's axes other RAS axes"):
        read_plan_file(_plans(tmp_path, CT_RESENC_M), fingerprint, 3)


def test_plan_py_never_overwrites_nnunet_s_plans(tmp_path: Path, no_gpu: None) -> None:  # noqa: F811
    values, plan = write_and_read(tmp_path, NAMED_CT, PlanningConfig(device="cuda"))
    nnunet = _plans(tmp_path, CT_RESENC_M)
    with pytest.raises(ConfigError, match=r"nnUNetResEncUNetMPlans\.json: nnU-Net's plans file, which "
                                          r"scripts/plan\.py would overwrite"):
        write_plan_file(nnunet, plan, values, NAMED_CT)
    assert json.loads(nnunet.read_text()) == CT_RESENC_M


def _edited_plan_file(tmp_path: Path, edit) -> Path:
    path = tmp_path / "plan.json"
    content = json.loads(path.read_text())
    edit(content)
    path.write_text(json.dumps(content))
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c["values"].pop("data.spacing"), r"'values' lacks 'data\.spacing' \(a plan file holds data\.spacing, "),
    (lambda c: c.pop("fingerprint_digest"), r"the file lacks 'fingerprint_digest' \(a plan file holds format, "),
    (lambda c: c["values"].update({"model.bottleneck": "masa"}),
     r"unknown key 'model\.bottleneck' in 'values' A plan file holds data\.spacing, "),
    (lambda c: c["values"].update({"data.patch_szie": c["values"].pop("data.patch_size")}),
     r"unknown key 'data\.patch_szie' in 'values'; did you mean data\.patch_size\? A plan file holds "),
])
def test_a_plan_file_with_a_key_missing_or_unknown_is_refused_in_one_line(tmp_path: Path, no_gpu: None,  # noqa: F811
                                                                         edit, message: str) -> None:
    write_and_read(tmp_path, NAMED_CT, PlanningConfig(device="cuda"))
    path = _edited_plan_file(tmp_path, edit)
    with pytest.raises(ConfigError, match=rf"^plan\.file={path}: {message}") as error:
        read_plan_file(path, NAMED_CT, 3)
    assert "\n" not in str(error.value)


def test_a_medseg_plan_file_takes_no_nnunet_configuration(tmp_path: Path, no_gpu: None) -> None:  # noqa: F811
    write_and_read(tmp_path, NAMED_CT, PlanningConfig(device="cuda"))
    with pytest.raises(ConfigError, match=r"^plan\.nnunet_configuration=2d names a configuration of nnU-Net's plans; "
                                          r"plan\.file=.*plan\.json is a medseg plan file"):
        read_plan_file(tmp_path / "plan.json", NAMED_CT, 3, "2d")


def test_a_plan_file_s_values_pass_the_command_line_s_checks(tmp_path: Path, no_gpu: None) -> None:  # noqa: F811
    """The spacing [-0.8, 0.8, 2] the command line refuses is refused from a plan file too, with the same words."""
    write_and_read(tmp_path, NAMED_CT, PlanningConfig(device="cuda"))
    path = _edited_plan_file(tmp_path, lambda c: c["values"].update({"data.spacing": [-0.8, 0.8, 2]}))
    cfg = TrainConfig(data=DataConfig(root="x"), plan=PlanningConfig(file=str(path)))
    with pytest.raises(ConfigError) as command_line:
        check_config(TrainConfig(data=DataConfig(root="x", spacing=[-0.8, 0.8, 2])))
    assert str(command_line.value) == "data.spacing=[-0.8, 0.8, 2.0]: expected each entry > 0"
    with pytest.raises(ConfigError) as from_file:
        with_plan_file(cfg, read_plan_file(path, NAMED_CT, 3))
    assert str(from_file.value) == f"plan.file={path}: {command_line.value}"
    kept = TrainConfig(data=DataConfig(root="x", spacing=[0.8, 0.8, 2.0]), plan=PlanningConfig(file=str(path)))
    with pytest.raises(ConfigError) as config_wins:  # the config's spacing would win: the file is refused all the same
        with_plan_file(kept, read_plan_file(path, NAMED_CT, 3))
    assert str(config_wins.value) == f"plan.file={path}: {command_line.value}"
    write_and_read(tmp_path, NAMED_CT, PlanningConfig(device="cuda"))
    path = _edited_plan_file(tmp_path, lambda c: c["values"].update({"model.strides": [[2, 2, 3]] * 3}))
    with pytest.raises(ConfigError, match=rf"^plan\.file={path}: model\.strides"):
        with_plan_file(cfg, read_plan_file(path, NAMED_CT, 3))


@pytest.mark.full
def test_train_runs_on_nnunet_s_plan_and_folds(tmp_path: Path) -> None:
    """train.py with nnU-Net's ResEnc M plans and a splits_final.json: the run's patch, strides, kernels and encoder
    are the plan's (in RAS order), and its validation cases those of the file's fold 1."""
    root, _ = _ct(tmp_path)
    plans = _plans(tmp_path, CT_RESENC_M)
    splits = tmp_path / "splits_final.json"
    splits.write_text(json.dumps([{"train": ["ct_001", "ct_003"], "val": ["ct_000", "ct_002"]},
                                  {"train": ["ct_000", "ct_002"], "val": ["ct_001", "ct_003"]}]))
    run_dir = tmp_path / "run"
    trained = run_script("train.py", [
        "data=nnunet", f"data.root={root}", f"plan.file={plans}", f"data.splits={splits}", "data.num_folds=2",
        "data.fold=1", "model.channels=[4,8,8,8,8]", "trainer.device=cpu", "trainer.max_epochs=1",
        "trainer.iterations_per_epoch=2", "trainer.val_iterations=1", "trainer.progress=false",
        "trainer.log_images=false", "trainer.check_data=false", "data.num_workers=0",
        f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert ("patch [64, 56, 20], strides [[2, 2, 1], [2, 2, 1], [2, 2, 2], [2, 1, 2]], channels [4, 8, 8, 8, 8]"
            in log), log
    assert f"taken from plan.file={plans}; kept from the config: model.channels" in log
    assert "what medseg builds otherwise" not in log, "nnU-Net's kernels are built as they are"
    assert json.loads((run_dir / "splits.json").read_text())["val"] == ["ct_001", "ct_003"]
    model = load_checkpoint(run_dir / "checkpoints" / "last.pt")["config"]["model"]
    assert (model["conv_stages"], model["encoder_blocks"], model["decoder_convs"]) == ("nnunet_resenc",
                                                                                       [1, 3, 4, 6, 6], 1)


def test_nnunet_v1_plans_pickle_says_what_to_give_instead(tmp_path: Path) -> None:
    import pickle

    _, fingerprint = _ct(tmp_path)
    path = tmp_path / "nnUNetPlansv2.1_plans_3D.pkl"
    path.write_bytes(pickle.dumps({"plans_per_stage": {0: {"patch_size": [20, 64, 56]}}}))
    with pytest.raises(ConfigError, match=rf"^plan\.file={path}: a Python pickle, as nnU-Net v1 wrote its files, not "
                                          r"JSON; give nnU-Net v2's nnUNetPlans\.json") as error:
        read_plan_file(path, fingerprint, 3)
    assert "\n" not in str(error.value)
