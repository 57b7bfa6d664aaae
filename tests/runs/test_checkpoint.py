"""Checkpoints: atomic writes, safe loading, and clear errors for foreign, incomplete, non-finite or mismatching
files."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from medseg.errors import CheckpointError
from medseg.io import atomic_write
from medseg.runs.checkpoint import load_checkpoint, load_model_state, save_checkpoint


class _Payload:
    """Unpickling this runs ``os.system``: a malicious checkpoint must never get that far."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_roundtrip_keeps_tensors_and_plain_values(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    path = save_checkpoint(tmp_path / "last.pt", {"model": model.state_dict(), "epoch": 4, "config": {"a": [1, 2]},
                                                  "dataset": {}})
    state = load_checkpoint(path)
    assert state["epoch"] == 4 and state["config"] == {"a": [1, 2]}
    torch.testing.assert_close(state["model"]["weight"], model.weight.detach())
    assert not list(tmp_path.glob(".*.tmp")), "no temp file may be left behind"


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"format": "medseg-checkpoint", "version": 1, "model": _Payload(marker)}, path)
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint(path)
    assert not marker.exists()
    # a plain pickle file (not a torch zip) is refused too, also without running
    path.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    assert not marker.exists()


def test_missing_foreign_and_future_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope.pt")
    torch.save({"state_dict": {}}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not written by medseg"):
        load_checkpoint(tmp_path / "foreign.pt")
    torch.save({"format": "medseg-checkpoint", "version": 99, "medseg_version": "9.0"}, tmp_path / "future.pt")
    with pytest.raises(CheckpointError, match="format version 99"):
        load_checkpoint(tmp_path / "future.pt")
    (tmp_path / "garbage.pt").write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match="garbage.pt"):
        load_checkpoint(tmp_path / "garbage.pt")


def test_random_bytes_and_incomplete_checkpoints_are_not_medseg_checkpoints(tmp_path: Path) -> None:
    for name, data in (("random.pt", os.urandom(4096)), ("pickle.pt", pickle.dumps({"model": {}})),
                       ("torn.pt", save_checkpoint(tmp_path / "whole.pt", {"epoch": 1}).read_bytes()[:-40])):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError, match=rf"^checkpoint {tmp_path / name} is not a medseg checkpoint: ") as e:
            load_checkpoint(tmp_path / name)
        assert "pickled" not in str(e.value)
    path = save_checkpoint(tmp_path / "weights_only.pt", {"model": {}})
    with pytest.raises(CheckpointError, match=r"is not a medseg checkpoint: it lacks config, dataset$"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"it lacks optimizer$"):
        load_checkpoint(path, needs=("model", "optimizer"))


def test_non_finite_tensors_are_refused_naming_the_first(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    weights = model.state_dict()
    weights["1.bias"][1] = float("nan")
    path = save_checkpoint(tmp_path / "nan.pt", {"model": weights, "config": {}, "dataset": {}})
    with pytest.raises(CheckpointError, match=r"holds NaN or infinite values in model\.1\.bias: it is corrupt"):
        load_checkpoint(path)
    optimizer = {"state": {0: {"step": torch.tensor(3.0), "exp_avg_sq": torch.tensor([0.0, float("inf")])}}}
    path = save_checkpoint(tmp_path / "inf.pt", {"model": nn.Linear(3, 4).state_dict(), "optimizer": optimizer,
                                                 "config": {}, "dataset": {}, "history": [{"loss": float("nan")}]})
    with pytest.raises(CheckpointError, match=r"in optimizer\.state\.0\.exp_avg_sq: "):
        load_checkpoint(path)


def test_architecture_mismatch_names_the_keys(tmp_path: Path) -> None:
    source = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    target = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2), nn.ReLU())
    with pytest.raises(CheckpointError, match=r"shape differs: 0.bias, 0.weight, 1.weight"):
        load_model_state(target, source.state_dict(), "ckpt.pt")
    with pytest.raises(CheckpointError, match=r"unexpected: 2.weight"):
        load_model_state(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)),
                         {**source.state_dict(), "2.weight": torch.zeros(1)}, "ckpt.pt")


def test_failed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "last.pt", {"epoch": 1})

    def explode(handle) -> None:
        handle.write(b"partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, explode)
    assert load_checkpoint(path, needs=())["epoch"] == 1
    assert not list(tmp_path.glob(".*.tmp"))
