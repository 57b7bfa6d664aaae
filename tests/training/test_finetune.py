"""Fine-tuning (``trainer.init_from``): a demo model fine-tuned on a 2-class relabelled copy of the demo (with a
second channel) starts from its weights only, the layers that follow the classes and channels re-initialised;
``data.plan_from`` chooses whose preprocessing; another architecture and conflicting start options are one line."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from medseg.config import ModelConfig
from medseg.errors import CheckpointError, ConfigError
from medseg.models import build_model
from medseg.runs.checkpoint import load_checkpoint
from medseg.training.run import train
from medseg.typed_config import to_typed
from tests.helpers.runs import micro_config

SOURCE_SPACING = [1.0, 1.0, 1.5]
"""The source run's target spacing, unlike the micro config's (the demo preset's)."""


def relabelled_copy(root: Path, target: Path) -> Path:
    """The demo at ``root`` with both spheres merged into one class (background and sphere), and its image twice,
    the second time squared, as a second channel (MSD's 4D, channels-last files)."""
    shutil.copytree(root, target, ignore=shutil.ignore_patterns(".medseg_cache"))
    meta = json.loads((target / "dataset.json").read_text())
    meta["labels"], meta["modality"] = {"0": "background", "1": "sphere"}, {"0": "MRI", "1": "MRI squared"}
    (target / "dataset.json").write_text(json.dumps(meta))
    for path in (target / "labelsTr").glob("*.nii.gz"):
        image = nib.load(path)
        nib.save(nib.Nifti1Image((np.asarray(image.dataobj) > 0).astype(np.uint8), image.affine, image.header), path)
    for path in (target / "imagesTr").glob("*.nii.gz"):
        image = nib.load(path)
        values = np.asarray(image.dataobj, dtype=np.float32)
        nib.save(nib.Nifti1Image(np.stack([values, values**2], axis=-1), image.affine), path)
    return target


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, tiny_demo_root: Path) -> Path:
    """``best.pt`` of a micro run on the 3-class tiny demo, resampled to :data:`SOURCE_SPACING`."""
    run_dir = tmp_path_factory.mktemp("source") / "run"
    train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", f"data.spacing={SOURCE_SPACING}"))
    return run_dir / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def two_classes(tmp_path_factory: pytest.TempPathFactory, tiny_demo_root: Path) -> Path:
    return relabelled_copy(tiny_demo_root, tmp_path_factory.mktemp("relabelled") / "demo2")


def test_fine_tuning_starts_from_the_weights_only_with_new_input_and_output_layers(
        source: Path, two_classes: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="medseg"):  # lr 0: the weights stay what initialisation made them
        metrics = train(micro_config(run_dir, two_classes, "data.format=msd", "trainer.max_epochs=1", "trainer.lr=0",
                                     "trainer.weight_decay=0", f"trainer.init_from={source}"))
    before, after = load_checkpoint(source), load_checkpoint(run_dir / "checkpoints" / "last.pt")
    reinitialised = sorted(k for k in after["model"] if after["model"][k].shape != before["model"][k].shape)
    assert {k.split(".")[0] for k in reinitialised} == {"stem", "head"}, "the input and output layers only"
    for key, value in after["model"].items():
        if key not in reinitialised:
            torch.testing.assert_close(value, before["model"][key], rtol=0, atol=0, msg=key)
    lines = [r.getMessage() for r in caplog.records if "re-initialised" in r.getMessage()]
    assert len(lines) == 1 and "(classes 3 -> 2, input channels 1 -> 2)" in lines[0]
    layers = sorted({k.rsplit(".", 1)[0] for k in reinitialised})
    assert lines[0].endswith(f": {', '.join(layers)}")
    # a new run: its own epochs, history and classes, the new data's preprocessing (data.plan_from=data)
    assert after["epoch"] == metrics["epochs"] == 1 and len(after["history"]) == 1
    assert after["dataset"]["labels"] == {"0": "background", "1": "sphere"}
    assert after["config"]["data"]["spacing"] != SOURCE_SPACING


def test_plan_from_init_keeps_the_checkpoint_preprocessing(source: Path, two_classes: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(micro_config(run_dir, two_classes, "data.format=msd", "trainer.max_epochs=1", "data.plan_from=init",
                       f"trainer.init_from={source}", "data.patch_size=null", "model.strides=null"))
    resolved = load_checkpoint(run_dir / "checkpoints" / "last.pt")["config"]
    expected = load_checkpoint(source)["config"]
    for node, key in (("data", "spacing"), ("data", "patch_size"), ("data", "normalization"), ("model", "strides")):
        assert resolved[node][key] == expected[node][key], key
    # resumed (as the resume command of an interrupted run does: trainer.init_from dropped), it reads last.pt's plan
    train(micro_config(run_dir, two_classes, "data.format=msd", "trainer.max_epochs=2", "data.plan_from=init",
                       "trainer.resume=true", "data.patch_size=null", "model.strides=null"))
    resumed = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert resumed["epoch"] == 2 and resumed["config"]["data"]["spacing"] == expected["data"]["spacing"]


def test_another_architecture_is_a_clear_error(source: Path, two_classes: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"only the number of classes and input channels may differ.*"
                                              r"model\.channels=\[8, 16\] \(checkpoint: \[4, 8\]\)"):
        train(micro_config(tmp_path / "run", two_classes, "data.format=msd", "model.channels=[8,16]",
                           f"trainer.init_from={source}"))


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.resume=true"], "cannot be combined with trainer.resume"),
    (["ckpt_path=x.pt"], "cannot be combined with ckpt_path"),
])
def test_init_from_does_not_combine_with_resuming(overrides: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        train(micro_config(tmp_path / "run", tmp_path, "trainer.init_from=x.pt", *overrides))


def test_plan_from_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.plan_from=init takes the plan from the checkpoint"):
        train(micro_config(tmp_path / "run", tmp_path, "data.plan_from=init"))
    with pytest.raises(ConfigError, match="data.plan_from='source' is not valid. Valid values: data, init"):
        train(micro_config(tmp_path / "run", tmp_path, "data.plan_from=source"))


def test_a_plain_state_dict_of_medseg_s_network_starts_a_run(source: Path, two_classes: Path, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """``torch.save(model.state_dict())`` (or one under "state_dict") of the same network: its weights, the head and
    stem of other classes and channels re-initialised; a state dict of another network is refused naming tensors."""
    weights = load_checkpoint(source)["model"]
    plain = tmp_path / "weights.pt"
    torch.save({"state_dict": weights}, plain)
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="medseg"):
        train(micro_config(run_dir, two_classes, "data.format=msd", "trainer.max_epochs=1", "trainer.lr=0",
                           "trainer.weight_decay=0", f"data.spacing={SOURCE_SPACING}", f"trainer.init_from={plain}"))
    after = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    kept = [key for key in weights if after["model"][key].shape == weights[key].shape]
    assert {key.split(".")[0] for key in weights} - {key.split(".")[0] for key in kept} <= {"head"}
    for key in kept:
        torch.testing.assert_close(after["model"][key], weights[key], rtol=0, atol=0, msg=key)
    assert any(f"initialised from {plain} (its weights only)" in r.getMessage() for r in caplog.records)
    assert after["started_from"] == str(plain)
    torch.save({key: value for key, value in weights.items() if not key.startswith("down.0.")}, plain)
    with pytest.raises(CheckpointError, match=r"\(a state dict\) does not fit this model \(missing: down\.0\."):
        train(micro_config(tmp_path / "other", two_classes, "data.format=msd", f"trainer.init_from={plain}"))


@pytest.mark.parametrize("kind", ["monai_bundle", "nnunet_network", "neither"])
def test_weights_medseg_cannot_start_from_are_refused_in_one_line(kind: str, two_classes: Path,
                                                                   tmp_path: Path) -> None:
    if kind == "monai_bundle":  # MONAI's bundle layout: configs/ (its network_def) and models/model.pt
        (tmp_path / "bundle" / "configs").mkdir(parents=True)
        (tmp_path / "bundle" / "models").mkdir()
        path = tmp_path / "bundle" / "models" / "model.pt"
        torch.save({"model.0.conv.weight": torch.zeros(1)}, path)
        message = r"is in a MONAI bundle .*: its network is MONAI's, which medseg does not build"
    else:
        path = tmp_path / "weights.pt"
        torch.save({"encoder.stages.0.0.convs.0.conv.weight": torch.zeros(1)} if kind == "nnunet_network"
                   else {"epoch": 3}, path)
        message = (r"holds the weights of nnU-Net's network outside its trained-model folder: give that folder"
                   if kind == "nnunet_network" else r"is neither a medseg checkpoint nor a state dict")
    with pytest.raises(CheckpointError, match=message) as error:
        train(micro_config(tmp_path / "run", two_classes, "data.format=msd", f"trainer.init_from={path}"))
    assert "\n" not in str(error.value)


def test_a_block_inserted_into_a_trained_network_starts_as_the_identity(
        source: Path, tiny_demo_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The demo model (no attention) fine-tuned with MaSA in the bottleneck: every weight it has is loaded, the
    blocks it lacks start as the identity, so before the first step (here: at learning rate 0) the network computes
    the source's function."""
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="medseg"):
        train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1", "trainer.lr=0", "trainer.weight_decay=0",
                           f"data.spacing={SOURCE_SPACING}", "model.bottleneck=masa", f"trainer.init_from={source}"))
    assert any(r.getMessage().endswith("re-initialised 0 layer(s) of another shape: none; inserted as the identity: "
                                       "bottleneck.0, bottleneck.1") for r in caplog.records)
    before, after = load_checkpoint(source), load_checkpoint(run_dir / "checkpoints" / "last.pt")
    networks = []
    for state in (before, after):
        network = build_model(to_typed(ModelConfig, state["config"]["model"]), 1, 3, None)
        network.load_state_dict(state["model"])
        networks.append(network.eval())
    x = torch.randn(1, 1, 24, 20, 12)
    with torch.no_grad():
        torch.testing.assert_close(networks[1](x), networks[0](x), rtol=1e-5, atol=1e-5)
