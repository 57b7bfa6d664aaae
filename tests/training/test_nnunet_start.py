"""``trainer.init_from=<a trained nnU-Net v2 model>``: its folder read as nnU-Net leaves it, its weights mapped into
the network of its plan, every attention slot started as the identity, so that before the first step the run's
network computes nnU-Net's function; classes matched by name; a fold that trained on the run's validation cases
refused.

Without nnunetv2 (CI) the nnU-Net model is fabricated from a medseg network of nnU-Net's stages, renamed into nnU-Net's
keys and axes (:mod:`tests.helpers.nnunet_models`); with nnunetv2, from the network nnU-Net's trainer builds, and the
logits and label maps are compared with nnU-Net's own predictor loaded from the same folder.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from medseg.attention import available_blocks
from medseg.config import DataConfig, ModelConfig, PlanningConfig, TrainConfig, TrainerConfig
from medseg.data.datalist import load_dataset
from medseg.data.labels import LabelSpec, build_regions
from medseg.errors import CheckpointError, ConfigError
from medseg.models import SlottedUNet, build_model
from medseg.planning.fingerprint import compute_fingerprint
from medseg.planning.nnunet_plans import nnunet_values, read_configuration
from medseg.runs.checkpoint import load_checkpoint
from medseg.runs.nnunet_model import nnunet_model_folder, read_nnunet_model
from medseg.training.checks import check_config
from medseg.training.nnunet_start import check_no_leak, output_order, start_from_nnunet, with_nnunet_plan
from medseg.training.planning import plan_config
from medseg.typed_config import to_typed
from tests.helpers.configs import run_script
from tests.helpers.nnunet_models import (
    CT_AXES,
    as_nnunet_state_dict,
    ct_plans,
    nnunet_trainer_weights,
    perturb,
    write_nnunet_model,
)
from tests.helpers.realistic import write_ct_dataset

HAS_NNUNET = importlib.util.find_spec("nnunetv2") is not None
needs_nnunet = pytest.mark.skipif(not HAS_NNUNET, reason="needs the peers extra (nnunetv2)")
TRAIN = ["trainer.lr=0", "trainer.device=cpu", "trainer.max_epochs=1", "trainer.iterations_per_epoch=1",
         "trainer.val_iterations=1", "trainer.progress=false", "trainer.log_images=false", "trainer.check_data=false",
         "data.num_workers=0", "data.num_folds=2"]
"""One step at learning rate 0: the run's checkpoint holds the weights it started from."""
SPLITS = [{"train": ["ct_001", "ct_003"], "val": ["ct_000", "ct_002"]},
          {"train": ["ct_000", "ct_002"], "val": ["ct_001", "ct_003"]}]


@pytest.fixture(scope="module")
def ct(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four synthetic CTs in nnU-Net's raw layout (files L, P, S: nnU-Net's axes S, P, L), ``splits_final.json``."""
    folder = tmp_path_factory.mktemp("nnunet_start")
    root = write_ct_dataset(folder / "Dataset990_ct", "nnunet", num_cases=4, shape=(64, 64, 20), orientation="LPS")
    (folder / "splits_final.json").write_text(json.dumps(SPLITS))
    return root


def medseg_source(root: Path, plans: dict, configuration: str = "3d_fullres") -> SlottedUNet:
    """A medseg network of ``plans``' values (nnU-Net's PlainConvUNet stages, a head per stage), weights perturbed."""
    dims = 3 if configuration.startswith("3d") else 2
    fingerprint = compute_fingerprint(load_dataset(root, "nnunet"), progress=False)
    values, _ = nnunet_values(plans, read_configuration(plans, configuration, dims, "p"), fingerprint, "p")
    model = {key.split(".")[1]: value for key, value in values.items() if key.startswith("model.")}
    torch.manual_seed(0)
    network = build_model(ModelConfig(spatial_dims=dims, deep_supervision=True, **model), 1, 3, None)
    perturb(network)
    return network.eval()


def train_from(root: Path, model_dir: Path, run_dir: Path, *overrides: str, splits: bool = True) -> Path:
    """``train.py`` from the nnU-Net model at ``model_dir`` at learning rate 0, on the folds of
    ``splits_final.json`` (else those the run reads from the model); the run's checkpoint."""
    given = [f"data.splits={root.parent / 'splits_final.json'}"] if splits else []
    done = run_script("train.py", ["data=nnunet", f"data.root={root}", *given, f"trainer.init_from={model_dir}",
                                   *TRAIN, *overrides, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir / "checkpoints" / "last.pt"


def checkpoint_network(path: Path) -> SlottedUNet:
    state = load_checkpoint(path)
    network = build_model(to_typed(ModelConfig, state["config"]["model"]), 1, 3, None)
    network.load_state_dict(state["model"])
    return network.eval()


# ------------------------------------------------------------------------------------------ identity start


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("block", available_blocks())
def test_every_block_starts_as_the_identity_and_learns(block: str, dims: int) -> None:
    """With its slots started as the identity, a U-Net computes what its conv stages alone compute, on an odd,
    non-cubic input; the zeroed layers get gradients, so the blocks train from the first step."""
    torch.manual_seed(0)
    shape = dict(channels=(6, 12, 24), strides=(2, 2), attention={"num_heads": 3})
    plain = SlottedUNet(dims, 1, 3, **shape).eval()
    slotted = SlottedUNet(dims, 1, 3, bottleneck=block, decoder=block, decoder_levels=2, **shape).eval()
    slotted.load_state_dict(plain.state_dict(), strict=False)
    names = slotted.start_slots_as_identity()
    assert names == ["bottleneck.0", "bottleneck.1", "decoder_slots.0.0", "decoder_slots.1.0"]
    x = torch.randn(2, 1, *(13, 10, 7)[:dims])
    with torch.no_grad():
        torch.testing.assert_close(slotted(x), plain(x), rtol=0, atol=1e-6)
    slotted.train()
    slotted(x).square().mean().backward()
    block0 = slotted.bottleneck[0]
    last = block0.attention.proj if block0.attention.mixes_tokens else block0.attention_norm
    for layer in (block0.cpe, block0.ffn[2], last):
        assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------- the folder


def test_nnunet_s_layout_is_told_from_medseg_s_checkpoints(tmp_path: Path, ct: Path) -> None:
    plans = ct_plans(blocks=[1] * 5)
    checkpoint = write_nnunet_model(tmp_path / "model", plans, {}, fold=1)
    for path in (tmp_path / "model", tmp_path / "model" / "fold_1", checkpoint):
        assert nnunet_model_folder(path) == tmp_path / "model"
    assert nnunet_model_folder(tmp_path) is None
    assert nnunet_model_folder(tmp_path / "model" / "plans.json") is None, "a file beside the folds is no checkpoint"
    assert nnunet_model_folder(tmp_path / "run" / "checkpoints" / "best.pt") is None
    with pytest.raises(CheckpointError, match=r"has no fold_3 for data\.fold=3 \(it has fold_1\); start fold k from "
                                              r"fold k's model$"):
        read_nnunet_model(tmp_path / "model", 3)
    (checkpoint.parent / "checkpoint_best.pth").write_bytes(checkpoint.read_bytes())
    checkpoint.unlink()
    assert read_nnunet_model(tmp_path / "model", 1).checkpoint.name == "checkpoint_best.pth"


def test_a_checkpoint_holding_other_objects_is_refused_unrun(tmp_path: Path) -> None:
    checkpoint = write_nnunet_model(tmp_path / "model", ct_plans(), {})
    state = torch.load(checkpoint, weights_only=False)
    state["logging"]["when"] = re.compile("a pickled object")  # what weights_only=True never unpickles
    torch.save(state, checkpoint)
    with pytest.raises(CheckpointError, match=r"was refused: it holds pickled objects that are not tensors"):
        read_nnunet_model(checkpoint, 0)
    checkpoint.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"is not an nnU-Net checkpoint: it is not a torch file"):
        read_nnunet_model(checkpoint, 0)


# ------------------------------------------------------------------------------------------ the run's plan


def test_the_run_trains_on_the_model_s_plan(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    write_nnunet_model(folder, ct_plans(), {}, configuration="2d")
    source = read_nnunet_model(folder, 0)
    cfg = TrainConfig(data=DataConfig(root="x"), model=ModelConfig(conv_stages="nnunet"),
                      trainer=TrainerConfig(init_from=str(folder)))
    with pytest.raises(ConfigError, match=rf"is nnU-Net's nnUNetTrainer 2d fold 0 .*: the run trains on its plan; set "
                                          rf"plan\.file={re.escape(str(folder / 'plans.json'))} \(or "
                                          rf"data\.plan_from=init\)$"):
        with_nnunet_plan(cfg, source)
    init = with_nnunet_plan(replace(cfg, data=replace(cfg.data, plan_from="init"),
                                    model=ModelConfig()), source)
    assert (init.plan.file, init.plan.nnunet_configuration, init.model.conv_stages) == (
        str(folder / "plans.json"), "2d", "nnunet"), "data.plan_from=init: the model's whole plan"
    with pytest.raises(ConfigError, match=r"^plan\.nnunet_configuration=3d_fullres: .* trained with 2d$"):
        with_nnunet_plan(replace(cfg, plan=PlanningConfig(file="p", nnunet_configuration="3d_fullres")), source)
    with pytest.raises(ConfigError, match=r"^model\.conv_stages=medseg cannot hold the weights of trainer\.init_from="):
        with_nnunet_plan(replace(cfg, model=ModelConfig(), plan=PlanningConfig(file="p")), source)


# ------------------------------------------------------------------------------------------ classes, leaks


def test_the_head_s_classes_are_matched_by_name() -> None:
    ours = LabelSpec.plain({0: "background", 1: "organ", 2: "lesion"})
    assert output_order(LabelSpec.plain({0: "background", 1: "organ", 2: "lesion"}), ours) == [0, 1, 2]
    assert output_order(LabelSpec.plain({0: "background", 1: "lesion", 2: "organ"}), ours) == [0, 2, 1]
    assert output_order(LabelSpec.plain({0: "background", 1: "organ"}), ours) is None
    regions = build_regions(ours, {"whole": [1, 2], "core": [2]}, [1, 2], "r", "o")
    assert output_order(regions, ours) is None, "sigmoid regions are not softmax classes"


def test_a_fold_that_trained_on_the_run_s_validation_cases_is_refused(tmp_path: Path, ct: Path) -> None:
    info = load_dataset(ct, "nnunet")
    write_nnunet_model(tmp_path / "model", ct_plans(), {}, fold=1, validation_cases=["ct_001", "ct_003"])
    source = read_nnunet_model(tmp_path / "model", 1)
    assert check_no_leak(source, info, ["ct_001", "ct_003"]) == "the run validates on cases fold 1 held out"
    with pytest.raises(CheckpointError, match=r"fold 1 of nnU-Net's model trained on 2 case\(s\) this run validates on "
                                              r"\(ct_000, ct_002\); start data\.fold=k from nnU-Net's fold k"):
        check_no_leak(source, info, ["ct_000", "ct_002"])
    write_nnunet_model(tmp_path / "other", ct_plans(), {}, validation_cases=["liver_7"])
    assert "another dataset" in check_no_leak(read_nnunet_model(tmp_path / "other", 0), info, ["ct_000"])
    (tmp_path / "other" / "fold_0" / "validation" / "liver_7.nii.gz").unlink()
    (tmp_path / "other" / "fold_0" / "validation").rmdir()
    assert "was not checked" in check_no_leak(read_nnunet_model(tmp_path / "other", 0), info, ["ct_000"])


# ------------------------------------------------------------------------------------- the whole run (CI)


@pytest.mark.parametrize("bottleneck", ["none", "masa"])
@pytest.mark.full
def test_a_run_from_an_nnunet_model_computes_its_function_before_the_first_step(tmp_path: Path, ct: Path,
                                                                                  bottleneck: str) -> None:
    """train.py from nnU-Net's fold 1 (its plan, numpy scalars in its log, kernels in nnU-Net's axes; its folds given
    as data.splits, or read from the model): after one step at learning rate 0 the run's network computes the
    source's function, with MaSA in the bottleneck and decoder started as the identity."""
    plans = ct_plans(blocks=[1] * 5)
    plans["configurations"]["3d_fullres"]["architecture"]["arch_kwargs"]["n_conv_per_stage_decoder"] = [1] * 4
    source = medseg_source(ct, plans)
    for fold, split in enumerate(SPLITS):
        write_nnunet_model(tmp_path / "model", plans, as_nnunet_state_dict(source, CT_AXES), fold=fold,
                           validation_cases=split["val"])
    run = tmp_path / "run"
    checkpoint = train_from(ct, tmp_path / "model", run, "data.fold=1", "data.plan_from=init",
                            f"model.bottleneck={bottleneck}", f"model.decoder={bottleneck}",
                            splits=bottleneck == "masa")
    log = (run / "train.log").read_text()
    if bottleneck == "none":  # no data.splits: nnU-Net's folds, read from the model's fold_<k>/validation
        assert f"data.splits: nnU-Net's 2 folds, read from {tmp_path / 'model'}" in log
        assert json.loads((run / "splits.json").read_text())["val"] == ["ct_001", "ct_003"]
    slots = "bottleneck.0, bottleneck.1, decoder_slots.3.0" if bottleneck == "masa" else "no attention slot"
    assert (f"initialised from nnU-Net's nnUNetTrainer 3d_fullres fold 1 ({tmp_path / 'model'}/fold_1/"
            f"checkpoint_final.pth) (its weights only): the same classes; started as the identity: {slots}; started "
            "afresh: nothing else; the run validates on cases fold 1 held out") in log, log
    x = torch.randn(1, 1, 64, 64, 20)
    with torch.no_grad():
        torch.testing.assert_close(checkpoint_network(checkpoint)(x), source(x), rtol=1e-5, atol=1e-5)
    if bottleneck == "none":  # resumed as the printed command does (no trainer.init_from): last.pt's plan and folds
        resumed = run_script("train.py", ["data=nnunet", f"data.root={ct}", *TRAIN, "data.fold=1",
                                          "data.plan_from=init", "trainer.resume=true", "trainer.max_epochs=2",
                                          f"hydra.run.dir={run}"], cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert f"data.splits={run / 'nnunet_splits.json'}: the folds the resumed run trained on" in resumed.stdout + \
            resumed.stderr
        assert json.loads((run / "splits.json").read_text())["val"] == ["ct_001", "ct_003"]
        assert load_checkpoint(run / "checkpoints" / "last.pt")["epoch"] == 2


def test_other_classes_and_channels_start_the_head_and_stem_afresh(tmp_path: Path, ct: Path) -> None:
    """A model of other classes (organ alone) and two input channels: its heads and first conv do not fit the run's
    and start afresh, every other layer is its; classes of the same names in another order are reordered."""
    plans = ct_plans(blocks=[1] * 5)
    plans["configurations"]["3d_fullres"]["architecture"]["arch_kwargs"]["n_conv_per_stage_decoder"] = [1] * 4
    info = load_dataset(ct, "nnunet")
    cfg = check_config(TrainConfig(data=DataConfig(root=str(ct), format="nnunet", splits=str(ct.parent /
                                                                                             "splits_final.json")),
                                   model=ModelConfig(conv_stages="nnunet", deep_supervision=True),
                                   plan=PlanningConfig(file=str(tmp_path / "model" / "plans.json")),
                                   trainer=TrainerConfig(init_from=str(tmp_path / "model"), device="cpu")))
    source = medseg_source(ct, plans)
    weights = as_nnunet_state_dict(source, CT_AXES)
    swapped = {"background": 0, "lesion": 1, "organ": 2}
    write_nnunet_model(tmp_path / "model", plans, weights,
                       dataset={"channel_names": {"0": "CT"}, "labels": swapped, "file_ending": ".nii.gz"})
    cfg, _ = plan_config(cfg, info, False, tmp_path / "model")
    network = build_model(cfg.model, 1, 3, None)
    start = start_from_nnunet(network, cfg, info, read_nnunet_model(tmp_path / "model", 0), ["ct_000"])
    assert start.classes == "the same classes, its head's channels taken in order [0, 2, 1]"
    head = network.state_dict()["head.weight"]
    torch.testing.assert_close(head, source.state_dict()["head.weight"][[0, 2, 1]], rtol=0, atol=0)
    first_conv = "encoder.stages.0.0.convs.0.conv.weight"
    two_channels = {key: torch.cat([value, value], 1) if key == first_conv else value[:2]
                    if key.startswith("decoder.seg_layers.") else value for key, value in weights.items()}
    write_nnunet_model(tmp_path / "model", plans, two_channels, dataset={
        "channel_names": {"0": "CT", "1": "PET"}, "labels": {"background": 0, "organ": 1}, "file_ending": ".nii.gz"})
    network = build_model(cfg.model, 1, 3, None)
    start = start_from_nnunet(network, cfg, info, read_nnunet_model(tmp_path / "model", 0), ["ct_000"])
    assert start.fresh == ["deep_heads.0", "deep_heads.1", "deep_heads.2", "head", "stem.0.conv"]
    assert "the heads start afresh" in start.classes
    kept = "down.0.0.conv.weight"
    torch.testing.assert_close(network.state_dict()[kept], source.state_dict()[kept], rtol=0, atol=0)


# ------------------------------------------------------------------------- against nnU-Net's own (nnunetv2)


def nnunet_network(folder: Path) -> torch.nn.Module:
    """nnU-Net's own network of its trained-model ``folder``, as its predictor loads it (fold 0's final
    checkpoint)."""
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

    predictor = nnUNetPredictor(device=torch.device("cpu"))
    predictor.initialize_from_trained_model_folder(str(folder), use_folds=(0,), checkpoint_name="checkpoint_final.pth")
    predictor.network.load_state_dict(predictor.list_of_parameters[0])
    return predictor.network.eval()


@needs_nnunet
@pytest.mark.parametrize("bottleneck", ["none", "masa"])
@pytest.mark.parametrize("configuration", ["3d_fullres", "2d"])
@pytest.mark.parametrize("network", ["PlainConvUNet", "ResidualEncoderUNet"])
def test_the_loaded_network_s_logits_are_nnunet_s(tmp_path: Path, ct: Path, network: str, configuration: str,
                                                  bottleneck: str) -> None:
    """nnU-Net's PlainConvUNet and ResEnc M (its blocks per stage), 3D and 2D, built by nnU-Net's trainer: the
    run's network, planned and started as training does, gives nnU-Net's logits on the same input (medseg's in RAS
    order, nnU-Net's in its axes S, P, L), with MaSA in the bottleneck started as the identity."""
    plans = ct_plans(network)
    folder = tmp_path / "model"
    write_nnunet_model(folder, plans, nnunet_trainer_weights(plans, configuration), configuration,
                       validation_cases=["ct_000", "ct_002"])
    dims = 3 if configuration == "3d_fullres" else 2
    info = load_dataset(ct, "nnunet")
    cfg = check_config(TrainConfig(
        data=DataConfig(root=str(ct), format="nnunet", plan_from="init"), trainer=TrainerConfig(init_from=str(folder)),
        model=ModelConfig(spatial_dims=dims, deep_supervision=True, bottleneck=bottleneck)))
    cfg, _ = plan_config(cfg, info, False, folder)
    ours = build_model(cfg.model, 1, 3, None)
    start = start_from_nnunet(ours, cfg, info, read_nnunet_model(folder, 0), ["ct_000", "ct_002"])
    assert start.fresh == []
    assert start.identity_slots == (["bottleneck.0", "bottleneck.1"] if bottleneck == "masa" else [])
    theirs = nnunet_network(folder)
    torch.manual_seed(1)
    x = torch.randn(2, 1, *(8, 32, 48)[3 - dims:])  # nnU-Net's axes (S,) P, L: divisible by its strides
    to_ras = (0, 1, 4, 3, 2) if dims == 3 else (0, 1, 3, 2)
    ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(x.permute(to_ras)), theirs(x).permute(to_ras), rtol=1e-4, atol=1e-4)


def nnunet_predict(folder: Path, cases: Path, out: Path, gaussian: bool) -> np.ndarray:
    """``nnUNetv2_predict`` of fold 0 (its predictor: overlap 0.5, mirroring on every axis) on the one case in
    ``cases``; its label map."""
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

    predictor = nnUNetPredictor(tile_step_size=0.5, use_gaussian=gaussian, use_mirroring=True,
                                device=torch.device("cpu"), allow_tqdm=False)
    predictor.initialize_from_trained_model_folder(str(folder), use_folds=(0,), checkpoint_name="checkpoint_final.pth")
    predictor.predict_from_files(str(cases), str(out), save_probabilities=False, overwrite=True,
                                 num_processes_preprocessing=1, num_processes_segmentation_export=1)
    return np.asarray(nib.load(out / "ct_000.nii.gz").dataobj)


@needs_nnunet
@pytest.mark.full
def test_predict_py_gives_nnunet_predict_s_label_map(tmp_path: Path, ct: Path) -> None:
    """predict.py with the checkpoint of a run from nnU-Net's model (one step at learning rate 0) labels a case (one
    window) as nnU-Net's predictor does, overlap 0.5 and mirroring on every axis: the same preprocessing, network and
    mirroring. Without nnU-Net's gaussian the label maps are equal. nnU-Net 2.8.1 blends its windows in float16
    (``predicted_logits``, its gaussian weights), whose weights near a window's border fall to float16's smallest
    values (down to 6e-8): with its default gaussian the maps differ there, and at near ties, only."""
    from nnunetv2.inference.sliding_window_prediction import compute_gaussian

    plans = ct_plans()
    folder = tmp_path / "model"
    write_nnunet_model(folder, plans, nnunet_trainer_weights(plans, "3d_fullres"), validation_cases=["ct_000",
                                                                                                    "ct_002"])
    checkpoint = train_from(ct, folder, tmp_path / "run", "data.fold=0", "data.plan_from=init")
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "ct_000_0000.nii.gz").write_bytes((ct / "imagesTr" / "ct_000_0000.nii.gz").read_bytes())
    done = run_script("predict.py", [f"ckpt={checkpoint}", f"input={cases}", f"output={tmp_path / 'medseg'}",
                                     "save_probabilities=true", "inference.progress=false"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ours = np.asarray(nib.load(tmp_path / "medseg" / "ct_000.nii.gz").dataobj)
    assert len(np.unique(ours)) == 3, "a test of every class"
    plain = nnunet_predict(folder, cases, tmp_path / "nnunet_plain", gaussian=False)
    assert (ours == plain).mean() > 0.9999, "the same label map (but a tie float16 rounds otherwise)"
    blended = nnunet_predict(folder, cases, tmp_path / "nnunet", gaussian=True)
    weight = compute_gaussian((20, 64, 64), 1 / 8, 10, device=torch.device("cpu")).float().numpy().transpose(2, 1, 0)
    top = np.sort(np.load(tmp_path / "medseg" / "ct_000.npz")["probabilities"].astype(np.float32), axis=0)
    near_tie = top[-1] - top[-2] < 1e-2
    differ = ours != blended
    assert differ.mean() < 0.02
    assert ((weight < 1e-3) | near_tie)[differ].all(), "where float16 loses nnU-Net's weights or a near tie only"
