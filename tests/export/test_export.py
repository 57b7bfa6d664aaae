"""Export: the ONNX network through onnxruntime predicts the torch labels of a demo case from preprocessing.json
alone, the labels ``predict()`` and evaluate.py give too; every registered block exports; an unexportable block is
named; bad input is one line and writes nothing."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from torch import nn

from medseg import predict
from medseg.api import predict_exported
from medseg.attention import ATTENTION_BLOCKS, SpatialAttention, available_blocks, build_transformer_block
from medseg.config import DataConfig
from medseg.data.transforms import window
from medseg.errors import CheckpointError, ConfigError
from medseg.evaluation.evaluate import evaluate
from medseg.export import PREPROCESSING_FILE, export, load_exported
from medseg.export.formats import EXPORT_FORMATS, INPUT, ExportError, check_export, write_network
from medseg.models import build_model
from medseg.runs.checkpoint import load_checkpoint, save_checkpoint
from medseg.training.checks import check_config
from medseg.training.run import train
from tests.helpers.configs import MICRO_OVERRIDES, compose_config, run_script

UNEXPORTABLE = "data_dependent"


class DataDependentAttention(SpatialAttention):
    """Branches on a value of its input: no exporter can record that as a graph."""

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        return v if bool(q.sum() > 0) else -v


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_demo_root: Path) -> Path:
    """A micro U-Net trained for a few epochs on the tiny demo (16^3 windows over 32x32x16 volumes)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train(compose_config([*MICRO_OVERRIDES, f"data.root={tiny_demo_root}", f"output_dir={run_dir}",
                          "model.channels=[8,16]", "trainer.max_epochs=4", "trainer.val_every=4"]))
    return run_dir / "checkpoints" / "best.pt"


def random_checkpoint(path: Path, **model: object) -> Path:
    """A checkpoint as the trainer writes it, with untrained weights of a micro U-Net changed by ``model``."""
    cfg = asdict(check_config(compose_config([*MICRO_OVERRIDES, "output_dir=unused"])))
    cfg["model"].update(model)
    torch.manual_seed(0)
    state = build_model(cfg["model"], 1, 3, window(DataConfig(**cfg["data"]), 3).net_patch).state_dict()
    labels = {"0": "background", "1": "dim sphere", "2": "bright sphere"}
    return save_checkpoint(path, {"model": state, "config": cfg, "dataset": {"labels": labels,
                                                                           "channel_names": ["MRI"]}})


@pytest.mark.full
def test_onnx_export_predicts_the_torch_labels_of_a_demo_case(trained: Path, tiny_demo_root: Path,
                                                              tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx", reason="the ONNX exporter needs the export extra: pip install 'medseg[export]'")
    result = export({"ckpt": str(trained), "format": "onnx", "output": str(tmp_path / "export")})
    assert result.files == ["model.onnx", PREPROCESSING_FILE] and result.difference <= 1e-3
    description = json.loads((tmp_path / "export" / PREPROCESSING_FILE).read_text())
    state = load_checkpoint(trained)
    resolved = state["config"]["data"]
    assert [description[key] for key in ("spacing", "patch_size", "normalization")] == \
        [resolved[key] for key in ("spacing", "patch_size", "normalization")]
    assert description["classes"] == state["dataset"]["labels"] and description["postprocessing"] is None
    graph = onnx.load(tmp_path / "export" / "model.onnx").graph
    (image,) = [i for i in graph.input if i.name == INPUT]
    assert image.type.tensor_type.shape.dim[0].dim_param, "the batch axis is dynamic"
    assert [d.dim_value for d in image.type.tensor_type.shape.dim[1:]] == [1, *resolved["patch_size"]]

    case = tiny_demo_root / "imagesTr" / "demo_003.nii.gz"
    expected, torch_probs = predict(case, trained, device="cpu", return_probabilities=True)
    labels, onnx_probs = predict(case, load_exported(tmp_path / "export"), device="cpu", return_probabilities=True)
    assert np.abs(onnx_probs - torch_probs).max() <= 1e-3
    assert len(np.unique(expected)) > 1, "the model predicts foreground"
    np.testing.assert_array_equal(labels, expected)
    np.testing.assert_array_equal(predict_exported(case, tmp_path / "export"), expected)
    # the same case through evaluate.py's code: the label map it writes holds the same labels
    evaluate({"ckpt": str(trained), "input": str(case), "output": str(tmp_path / "evaluated"),
              "inference": {"progress": False}})
    written = nib.load(tmp_path / "evaluated" / "demo_003.nii.gz")
    np.testing.assert_array_equal(np.asarray(written.dataobj), expected)


def test_torchscript_export_carries_the_postprocessing(trained: Path, tiny_demo_root: Path, tmp_path: Path) -> None:
    decision = tmp_path / "decided.json"  # as scripts/crossval.py writes it (the keys its reader needs)
    decision.write_text(json.dumps({"classes": {"dim sphere": {"index": 1, "step": "largest_component"},
                                                "bright sphere": {"index": 2, "step": "none"}}}))
    output = tmp_path / "export"
    export({"ckpt": str(trained), "format": "torchscript", "output": str(output), "postprocessing": str(decision)})
    description = json.loads((output / PREPROCESSING_FILE).read_text())
    assert (output / description["postprocessing"]).read_text() == decision.read_text()
    assert description["network"]["file"] == "model.pt"
    case = tiny_demo_root / "imagesTr" / "demo_005.nii.gz"
    expected = predict(case, trained, device="cpu", postprocessing=str(decision))
    np.testing.assert_array_equal(predict_exported(case, output), expected)


def test_every_registered_block_traces_for_torchscript(tmp_path: Path) -> None:
    """All blocks in one 3D stack (the slow test below exports each in a U-Net, 2D and 3D, in both formats)."""
    torch.manual_seed(0)
    stack = nn.Sequential(*(build_transformer_block(name, 12, 3, grid=(4, 4, 4), num_heads=3)
                            for name in available_blocks()),
                          # RMT's per-head decays (experiment=rmt_official): one gamma per head
                          build_transformer_block("masa", 12, 3, num_heads=3, gamma=0.75, heads_range=4.0)).eval()
    example = torch.randn(2, 12, 4, 4, 4)
    write_network(stack, example, "torchscript", tmp_path / "stack.pt")
    assert check_export(stack, EXPORT_FORMATS["torchscript"].load(tmp_path / "stack.pt", "cpu"), example) <= 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("spatial_dims", [3, 2])
@pytest.mark.parametrize("block", available_blocks())
def test_every_registered_block_exports_in_a_unet(block: str, spatial_dims: int, tmp_path: Path) -> None:
    patch = [32, 32, 16][:spatial_dims]
    torch.manual_seed(0)
    model = build_model({"spatial_dims": spatial_dims, "channels": [12, 24, 48], "strides": [2, 2],
                         "bottleneck": block, "bottleneck_depth": 1, "decoder": block, "decoder_levels": 1,
                         "attention": {"num_heads": 3 if spatial_dims == 3 else 4}},  # cswin: heads per axis
                        1, 3, patch).eval()
    example = torch.randn(2, 1, *patch)
    for name, kind in EXPORT_FORMATS.items():
        write_network(model, example, name, tmp_path / kind.file)
        assert check_export(model, kind.load(tmp_path / kind.file, "cpu"), example) <= 1e-3


def test_an_unexportable_block_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    ATTENTION_BLOCKS[UNEXPORTABLE] = DataDependentAttention
    try:
        ckpt = random_checkpoint(tmp_path / "ckpt.pt", bottleneck=UNEXPORTABLE, bottleneck_depth=1)
        with pytest.raises(ExportError, match=f"attention block\\(s\\) {UNEXPORTABLE} to torchscript"):
            export({"ckpt": str(ckpt), "format": "torchscript", "output": str(tmp_path / "export")})
    finally:
        ATTENTION_BLOCKS.pop(UNEXPORTABLE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"], "no export folder, no temporary one"


def test_bad_checkpoints_and_outputs_are_refused_before_anything_is_written(trained: Path, tmp_path: Path) -> None:
    output = tmp_path / "export"
    decision = tmp_path / "decided.json"
    decision.write_text(json.dumps({"classes": {"liver": {"index": 1, "step": "none"}}}))
    with pytest.raises(ConfigError, match="is for the classes"):
        export({"ckpt": str(trained), "output": str(output), "postprocessing": str(decision)})
    with pytest.raises(CheckpointError, match="not found"):
        export({"ckpt": str(tmp_path / "missing.pt"), "output": str(output)})
    torch.save({"state_dict": {}}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not written by medseg"):
        export({"ckpt": str(tmp_path / "foreign.pt"), "output": str(output)})
    assert not output.exists()
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an earlier export"):
        export({"ckpt": str(tmp_path / "foreign.pt"), "output": str(tmp_path)})
    with pytest.raises(ConfigError, match="format='tflite' is not valid"):
        export({"ckpt": str(tmp_path / "foreign.pt"), "format": "tflite"})
    with pytest.raises(ConfigError, match="not a medseg export"):
        load_exported(tmp_path)


def test_an_output_that_cannot_be_written_is_refused_before_exporting(tmp_path: Path) -> None:
    ckpt = random_checkpoint(tmp_path / "ckpt.pt")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=rf"^output: {tmp_path / 'notes.txt'} is a file, not a folder"):
        export({"ckpt": str(ckpt), "format": "torchscript", "output": str(tmp_path / "notes.txt" / "export")})


@pytest.mark.full
def test_a_missing_runtime_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "onnxruntime"  # an onnxruntime that cannot be imported, as when not installed
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named onnxruntime')\n")
    result = run_script("export.py", [f"ckpt={tmp_path / 'any.pt'}", "output=export"], cwd=tmp_path,
                        env={"PYTHONPATH": str(shadow.parent)})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: format=onnx needs onnxruntime, not installed here: pip install 'medseg[export]'"]
    assert not (tmp_path / "export").exists()
