"""``inference.precision=int8``: the network quantised by NNCF predicts what it does in fp32, calibrated on windows
of its fold's training cases only, quantised once and then read from its cache; what cannot run is refused in one
line."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from medseg.config import DataConfig, InferenceConfig
from medseg.data.datalist import CACHE_FOLDER as DATA_CACHE
from medseg.data.datalist import splits_path
from medseg.data.transforms import IMAGE
from medseg.errors import ConfigError
from medseg.inference.backends import check_backend, window_network
from medseg.inference.calibration import body_windows, calibration_windows, training_cases
from medseg.inference.inferer import inference_network
from medseg.inference.int8 import CACHE_FOLDER, MODEL_FILE
from medseg.inference.model import EvalModel, load_model
from tests.helpers.checkpoints import save_test_checkpoint
from tests.helpers.read_only import read_only_mount

TRAIN = [f"demo_{i:03d}" for i in range(6)]
VAL = ["demo_006", "demo_007"]
INT8 = InferenceConfig(device="cpu", backend="openvino", precision="int8", calibration_windows=8, progress=False)

# Slow: importing nncf into the test process makes a later in-process signal test (tests/training/test_run_faults.py)
# crash with a segmentation fault; `pytest -m slow tests/inference/test_int8.py` runs these apart.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tiny_demo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo dataset whose cached split (as training stores it) has fold 0 train on :data:`TRAIN` and
    validate on :data:`VAL`."""
    root = tmp_path_factory.mktemp("int8") / "demo3d"
    shutil.copytree(tiny_demo_root, root, ignore=shutil.ignore_patterns(DATA_CACHE))
    splits = splits_path(root / DATA_CACHE, DataConfig(root=str(root)))
    splits.parent.mkdir()
    splits.write_text(json.dumps([{"train": TRAIN, "val": VAL}] * 5))
    return root


def checkpoint(folder: Path, root: Path, spatial_dims: int = 3) -> Path:
    """A tiny U-Net's checkpoint of fold 0 of ``root`` (its split: :func:`dataset`'s)."""
    folder.mkdir(parents=True, exist_ok=True)
    return save_test_checkpoint(folder / "best.pt", spatial_dims=spatial_dims,
                                data={"root": str(root), "format": "msd", "fold": 0})


def counted_quantize(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``nncf.quantize`` counted: one entry per call."""
    import nncf

    calls, real = [], nncf.quantize
    monkeypatch.setattr(nncf, "quantize", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    return calls


def logits(network: torch.nn.Module, net: EvalModel, root: Path) -> torch.Tensor:
    """``network``'s logits on 4 windows of a validation case of ``root``, one the calibration never saw."""
    image = net.preprocessing({"case": VAL[0], IMAGE: str(root / "imagesTr" / f"{VAL[0]}.nii.gz")})[IMAGE]
    windows = body_windows(np.asarray(image), net.window.roi_size, 4, np.random.default_rng(1))
    with torch.no_grad():
        return network(torch.from_numpy(np.stack(list(windows))))


def test_the_calibration_windows_come_from_the_training_cases_only(dataset: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    net = load_model(checkpoint(tmp_path / "run", dataset))
    assert sorted(case.case for case in training_cases(net)) == TRAIN
    read: list[str] = []
    chain = net.preprocessing
    monkeypatch.setattr(EvalModel, "preprocessing", property(lambda self: lambda d: read.append(d["case"]) or chain(d)))
    windows = calibration_windows(net, 32)
    assert sorted(read) == TRAIN  # 32 windows need all 6 training cases (at most 4 each), and no validation case
    assert len(windows) == 32 and all(w.shape == (1, 32, 32, 16) and w.dtype == np.float32 for w in windows)
    assert all(np.ptp(w) > 0 for w in windows)  # around the body: none is one value (air, padding) throughout
    net2d = load_model(checkpoint(tmp_path / "run2d", dataset, spatial_dims=2))
    assert {w.shape for w in calibration_windows(net2d, 5)} == {(1, *net2d.window.net_patch)}


def test_int8_predicts_what_fp32_does_and_is_cached_once(dataset: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    calls = counted_quantize(monkeypatch)
    net = load_model(checkpoint(tmp_path / "run", dataset))
    with caplog.at_level(logging.INFO, logger="medseg"):
        first = inference_network(net, INT8)
    assert calls == [1] and "calibrating" in caplog.text
    cached = list((tmp_path / "run" / CACHE_FOLDER).iterdir())
    assert [p.name for p in cached[0].iterdir()] and (cached[0] / MODEL_FILE).is_file() and len(cached) == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="medseg"):
        second = inference_network(net, INT8)
    assert calls == [1] and "reusing" in caplog.text  # read back, not quantised again
    reference = logits(net.model, net, dataset)
    quantised = logits(first, net, dataset)
    torch.testing.assert_close(logits(second, net, dataset), quantised)
    # 8-bit weights and activations: the logits' error is a fraction of their spread, measured 0.19 of their standard
    # deviation (the fp32-compiled network's is 1e-5). This untrained U-Net's classes are near ties on most voxels
    # (fp32's top two logits within 0.5 on 90 % of them), where int8's rounding may swap them (measured: 13 % of the
    # voxels); where fp32 decides by more, int8 decides the same (measured: all of them)
    error = quantised - reference
    assert error.pow(2).mean().sqrt() < 0.25 * reference.std()
    top = reference.topk(2, dim=1).values
    same = quantised.argmax(1) == reference.argmax(1)
    assert same.float().mean() > 0.8 and same[top[:, 0] - top[:, 1] > 0.5].float().mean() > 0.99
    changed = InferenceConfig(**{**INT8.__dict__, "calibration_windows": 4})
    inference_network(net, changed)  # other calibration settings: another cache entry
    assert calls == [1, 1] and len(list((tmp_path / "run" / CACHE_FOLDER).iterdir())) == 2


def test_a_read_only_checkpoint_folder_is_not_cached(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    calls = counted_quantize(monkeypatch)
    net = load_model(checkpoint(tmp_path / "run", dataset))
    read_only_mount(monkeypatch, tmp_path / "run")
    with caplog.at_level(logging.INFO, logger="medseg"):
        inference_network(net, INT8)
        inference_network(net, INT8)
    assert calls == [1, 1] and not (tmp_path / "run" / CACHE_FOLDER).exists()
    assert "the quantised network is not cached" in caplog.text


def test_moved_training_cases_are_named_and_found_through_calibration_root(dataset: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(dataset, moved)
    net = load_model(checkpoint(tmp_path / "run", tmp_path / "gone"))
    with pytest.raises(ConfigError, match=rf"^inference\.precision=int8 calibrates on the checkpoint's training cases, "
                                          rf"but data\.root={tmp_path / 'gone'} \(of checkpoint .*best\.pt\) holds no "
                                          rf"dataset\.json: set inference\.calibration_root to the dataset folder"):
        training_cases(net)
    with pytest.raises(ConfigError, match=r"^inference\.precision=int8 .* but inference\.calibration_root=/nowhere "
                                          r"holds no dataset\.json"):
        training_cases(net, "/nowhere")
    assert sorted(case.case for case in training_cases(net, str(moved))) == TRAIN


def test_int8_runs_on_openvino_only() -> None:
    with pytest.raises(ValueError, match="calibrated on its checkpoint's training cases"):  # not fp32 in its place
        window_network(torch.nn.Identity(), "openvino", (1, 8, 8, 8), "int8")
    with pytest.raises(ConfigError, match=r"^inference\.precision=int8 runs on inference\.backend=openvino, not "
                                          r"inference\.backend=torch: set inference\.backend=openvino$"):
        check_backend("torch", "int8", torch.device("cpu"))
