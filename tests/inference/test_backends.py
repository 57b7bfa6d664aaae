"""The backends of prediction: OpenVINO computes the torch network's logits on any batch of windows, in 3D with each
attention block and in 2D; ``inference.backend=openvino`` and ``inference.precision=bf16`` predict what torch in fp32
does; configs that cannot run are refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from medseg.config import ModelConfig
from medseg.errors import ConfigError
from medseg.evaluation.evaluate import evaluate
from medseg.inference.backends import OpenVinoNetwork, check_backend
from medseg.models import build_model
from tests.helpers.checkpoints import save_test_checkpoint


@pytest.fixture(scope="module")
def images(tiny_demo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    shutil.copy(tiny_demo_root / "imagesTr" / "demo_000.nii.gz", folder / "demo_000.nii.gz")
    return folder


def probabilities(ckpt: Path, images: Path, out: Path, **inference: object) -> np.ndarray:
    """``(C, X, Y, Z)`` the probabilities ``evaluate`` writes for the one image of ``images``."""
    result = evaluate({"ckpt": str(ckpt), "input": str(images), "output": str(out), "save_probabilities": True,
                       "inference": {"progress": False, "device": "cpu", **inference}})
    assert result.exit_code == 0
    return np.load(out / "demo_000.npz")["probabilities"].astype(np.float32)


@pytest.mark.parametrize("bottleneck", ["none", "masa", "focused_linear", "cswin"])
@pytest.mark.full
def test_openvino_computes_the_torch_logits_on_any_batch_of_odd_windows(bottleneck: str) -> None:
    pytest.importorskip("openvino")
    torch.manual_seed(0)
    cfg = ModelConfig(channels=[8, 16, 32], strides=[[2, 2, 1], [2, 2, 2]], bottleneck=bottleneck)
    model = build_model(cfg, 2, 3, (40, 24, 12)).eval()
    compiled = OpenVinoNetwork.export(model, (2, 40, 24, 12))
    windows = torch.randn(3, 2, 40, 24, 12)
    with torch.no_grad():
        expected = model(windows)
    for batch in (1, 3):
        torch.testing.assert_close(compiled(windows[:batch]), expected[:batch], atol=1e-4, rtol=1e-4)


@pytest.mark.full
def test_openvino_and_bf16_predict_what_torch_does_in_fp32(images: Path, tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    for spatial_dims in (3, 2):
        ckpt = save_test_checkpoint(tmp_path / f"best{spatial_dims}d.pt", spatial_dims=spatial_dims)
        reference = probabilities(ckpt, images, tmp_path / f"torch{spatial_dims}")
        openvino = probabilities(ckpt, images, tmp_path / f"openvino{spatial_dims}", backend="openvino")
        np.testing.assert_allclose(openvino, reference, atol=2e-3)  # float16 files
        bf16 = probabilities(ckpt, images, tmp_path / f"bf16{spatial_dims}", precision="bf16")
        assert np.abs(bf16 - reference).max() < 0.1
        assert (bf16.argmax(0) == reference.argmax(0)).mean() > 0.98


def test_configs_that_cannot_run_are_refused_in_one_line(images: Path, tmp_path: Path) -> None:
    ckpt = save_test_checkpoint(tmp_path / "best.pt")
    for inference, key in (({"backend": "tensorrt"}, r"^inference\.backend='tensorrt' is not valid"),
                           ({"precision": "fp8"}, r"^inference\.precision='fp8' is not valid")):
        with pytest.raises(ConfigError, match=key):
            evaluate({"ckpt": str(ckpt), "input": str(images), "output": str(tmp_path / "out"), "inference": inference})
    with pytest.raises(ConfigError, match=r"^inference\.backend=openvino runs on the CPU"):
        check_backend("openvino", "auto", torch.device("cuda"))
    with pytest.raises(ConfigError, match=r"^inference\.precision=fp16 with inference\.backend=openvino"):
        check_backend("openvino", "fp16", torch.device("cpu"))
