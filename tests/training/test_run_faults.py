"""Faults a training run meets from outside, in process: a full disk while saving, a stop (SIGTERM) during the last
validation (in a multirun: the sweep stops after it), a failure after a stop, Ctrl-C outside the training loop, a
stopped sweep's resume command, a loader worker that meets the stop, a checkpoint without an AMP-scaler entry to
resume, and a run folder it cannot write into.

Faults are injected from the test only (a writer that finds the disk full, a validation that sends the signal);
production code has no hooks.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shlex
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hydra.types import RunMode
from monai.data import DataLoader
from omegaconf import OmegaConf

from medseg.cli import one_line_errors
from medseg.errors import ConfigError, TrainingInterrupted
from medseg.runs.checkpoint import load_checkpoint, save_checkpoint
from medseg.training import run as run_module
from medseg.training import trainer as trainer_module
from medseg.training.loop import STOP_SIGNALS, GracefulStop, loader_worker_init
from medseg.training.run import train, train_cli
from tests.helpers.runs import micro_config

pytestmark = pytest.mark.usefixtures("one_thread")


class FullDisk(io.RawIOBase):
    """A file that takes ``room`` bytes, then fails as a full disk does (``OSError`` ENOSPC)."""

    def __init__(self, handle: io.BufferedIOBase, room: int) -> None:
        super().__init__()
        self.handle, self.room = handle, room

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.handle.write(data)


def test_a_full_disk_while_saving_is_one_line_naming_the_intact_last_pt(
        tmp_path: Path, tiny_demo_root: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.pt"
    save, last_writes = torch.save, []

    def disk_full_at_the_second_last_pt(obj: Any, handle: Any, *args: Any, **kwargs: Any) -> None:
        if Path(handle.name).name.startswith(".last.pt."):
            last_writes.append(handle.name)
        if len(last_writes) == 2:  # epoch 2's: torch's zip writer meets the full disk in its first kilobytes
            return save(obj, FullDisk(handle, room=1000), *args, **kwargs)
        return save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_the_second_last_pt)
    with pytest.raises(SystemExit) as exit_info:
        one_line_errors(train_cli)(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2"))
    assert exit_info.value.code == 1
    [error] = capsys.readouterr().err.splitlines()
    assert error == (f"error: no space left writing {last}; its previous version is intact; last.pt of epoch 1 is "
                     f"intact: free some space, then resume with trainer.resume=true")
    assert load_checkpoint(last)["epoch"] == 1
    assert not [p for p in last.parent.iterdir() if p.name.startswith(".")], "no temp file left"


def test_a_stop_during_the_last_validation_finishes_the_record(tmp_path: Path, tiny_demo_root: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    validate = trainer_module.validate

    def validate_then_sigterm(*args: Any, **kwargs: Any) -> Any:
        result = validate(*args, **kwargs)
        signal.raise_signal(signal.SIGTERM)  # SLURM's preemption notice arrives while the validation runs
        return result

    monkeypatch.setattr(trainer_module, "validate", validate_then_sigterm)
    run_dir = tmp_path / "run"
    metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1"))
    written = json.loads((run_dir / "metrics.json").read_text())
    assert written["status"] == metrics["status"] == "completed" and written["epochs"] == 1
    assert written["best_val_dice"] == load_checkpoint(run_dir / "checkpoints" / "best.pt")["best_metric"]


def test_the_stop_and_the_resume_name_the_same_epoch(tmp_path: Path, tiny_demo_root: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A stop after epoch 1's validation saves last.pt at the end of epoch 1; the stop and the resume both say so."""
    validate, calls = trainer_module.validate, []

    def validate_then_sigterm_once(*args: Any, **kwargs: Any) -> Any:
        result = validate(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGTERM)
        return result

    monkeypatch.setattr(trainer_module, "validate", validate_then_sigterm_once)
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingInterrupted) as stopped:
        train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", "trainer.val_every=1"))
    assert str(stopped.value).startswith("stopped by SIGTERM at epoch 1; saved ")
    with caplog.at_level("INFO", logger="medseg"):
        train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", "trainer.val_every=1",
                           "trainer.resume=true"))
    last = run_dir / "checkpoints" / "last.pt"
    assert f"resumed from {last} at epoch 1 (best val Dice" in caplog.text


def test_in_a_multirun_a_stop_during_the_last_validation_completes_the_run_then_stops_the_sweep(
        tmp_path: Path, tiny_demo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    validate = trainer_module.validate

    def validate_then_sigterm(*args: Any, **kwargs: Any) -> Any:
        result = validate(*args, **kwargs)
        signal.raise_signal(signal.SIGTERM)
        return result

    monkeypatch.setattr(trainer_module, "validate", validate_then_sigterm)
    monkeypatch.setattr(run_module, "_is_multirun", lambda: True)
    monkeypatch.setattr(GracefulStop, "latest_signal", 0)  # this process's record, restored after the test
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        train_cli(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1"))
    assert exit_info.value.code == 128 + signal.SIGTERM, "the launcher starts no further run"
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"


def test_in_a_multirun_a_run_failing_after_a_stop_is_recorded_and_stops_the_sweep(
        tmp_path: Path, tiny_demo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def stop_then_fail(self: Any, stop: Any) -> float:
        signal.raise_signal(signal.SIGINT)  # e.g. Ctrl-C, which also reached a helper process that then failed
        raise RuntimeError("a helper process ended by the same signal")

    monkeypatch.setattr(trainer_module.Trainer, "train_epoch", stop_then_fail)
    monkeypatch.setattr(run_module, "_is_multirun", lambda: True)
    monkeypatch.setattr(GracefulStop, "latest_signal", 0)  # this process's record, restored after the test
    monkeypatch.setattr(run_module.HydraConfig, "get", lambda: OmegaConf.create(
        {"runtime": {"output_dir": str(tmp_path / "run")}}))
    with pytest.raises(SystemExit) as exit_info:
        train_cli(micro_config(tmp_path / "run", tiny_demo_root, "trainer.max_epochs=1"))
    assert exit_info.value.code == 128 + signal.SIGINT
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics == {"status": "failed", "reason": "RuntimeError: a helper process ended by the same signal"}


def test_ctrl_c_outside_the_training_loop_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    def reading_the_data(cfg: Any) -> dict[str, Any]:
        raise KeyboardInterrupt  # Python's own SIGINT handler, while the data are read and cached

    monkeypatch.setattr(run_module, "train", reading_the_data)
    with pytest.raises(SystemExit) as exit_info:
        train_cli(OmegaConf.create({}))
    assert exit_info.value.code == 130
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "stopped by SIGINT outside the training loop (before it started, or after it ended)"]


def test_the_resume_command_of_a_multirun_is_the_sweeps_own_in_its_folder(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    hydra = OmegaConf.create({"mode": RunMode.MULTIRUN, "sweep": {"dir": "multirun/sweep"},
                              "sweeper": {"_target_": run_module.BASIC_SWEEPER}})
    monkeypatch.setattr(run_module, "HydraConfig", SimpleNamespace(initialized=lambda: True, get=lambda: hydra))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["scripts/train.py", "-m", "--config-name", "train", "trainer.seed=1,2",
                                      "hydra.sweep.dir=multirun/sweep", "model.channels=[4,8]", "trainer.resume=false"])
    assert shlex.split(run_module.resume_command()) == [
        "python", "scripts/train.py", "-m", "--config-name", "train", "trainer.seed=1,2", "model.channels=[4,8]",
        f"hydra.sweep.dir={tmp_path / 'multirun' / 'sweep'}", "trainer.resume=true"]
    hydra.sweeper._target_ = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert run_module.resume_command() is None, "a search samples its runs anew: no command resumes it"


def test_the_resume_command_of_medseg_train_is_medseg_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``medseg train`` names itself so in ``sys.argv[0]`` (medseg.commands.main): the command printed to resume a
    sweep or a single run starts with the words typed, ``medseg train``, never ``python 'medseg train'``."""
    hydra = OmegaConf.create({"mode": RunMode.MULTIRUN, "sweep": {"dir": "multirun/sweep"},
                              "sweeper": {"_target_": run_module.BASIC_SWEEPER}})
    monkeypatch.setattr(run_module, "HydraConfig", SimpleNamespace(initialized=lambda: True, get=lambda: hydra))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["medseg train", "-m", "trainer.seed=1,2"])
    assert shlex.split(run_module.resume_command()) == [
        "medseg", "train", "-m", "trainer.seed=1,2", f"hydra.sweep.dir={tmp_path / 'multirun' / 'sweep'}",
        "trainer.resume=true"]
    single = OmegaConf.create({"mode": RunMode.RUN, "overrides": {"task": ["trainer.seed=1"]},
                               "runtime": {"output_dir": str(tmp_path / "run")}})
    monkeypatch.setattr(run_module, "HydraConfig", SimpleNamespace(initialized=lambda: True, get=lambda: single))
    monkeypatch.setattr(sys, "argv", ["medseg train", "trainer.seed=1"])
    assert shlex.split(run_module.resume_command()) == [
        "medseg", "train", "trainer.seed=1", f"hydra.run.dir={tmp_path / 'run'}", "trainer.resume=true"]


class WorkerHandlers(torch.utils.data.Dataset):
    """One item: the SIGINT and SIGTERM handlers of the process that loads it."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> list[int]:
        return [int(signal.getsignal(sig) == signal.SIG_IGN) for sig in STOP_SIGNALS]


def test_training_loader_workers_leave_stop_signals_to_the_training_process() -> None:
    loader = DataLoader(WorkerHandlers(), num_workers=1, worker_init_fn=loader_worker_init)
    assert [int(flag) for flag in next(iter(loader))] == [1, 1], "a worker ignores SIGINT and SIGTERM"
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN, "the training process keeps its own handlers"


def test_resume_from_a_checkpoint_without_a_scaler_entry_starts_a_fresh_scaler(tmp_path: Path,
                                                                               tiny_demo_root: Path) -> None:
    run_dir = tmp_path / "run"
    train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1"))
    last = run_dir / "checkpoints" / "last.pt"
    save_checkpoint(last, {key: value for key, value in load_checkpoint(last).items() if key != "scaler"})
    metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", "trainer.resume=true"))
    assert metrics["epochs"] == 2 and [record["epoch"] for record in metrics["history"]] == [1, 2]
    assert "scaler" in load_checkpoint(last)


def test_a_run_folder_that_cannot_be_written_stops_before_any_work(tmp_path: Path, tiny_demo_root: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=rf"^output_dir: {tmp_path / 'notes.txt'} is a file, not a folder"):
        train(micro_config(tmp_path / "notes.txt" / "run", tiny_demo_root, "trainer.max_epochs=1"))
