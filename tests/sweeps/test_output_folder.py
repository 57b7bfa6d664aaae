"""A run or sweep folder that cannot be written is one line before Hydra makes it (``CheckOutputFolder``): on a
read-only mount, as root too, the check writes a file rather than reading permissions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from medseg.sweeps.callbacks import CheckOutputFolder
from tests.helpers.configs import REPO
from tests.helpers.read_only import read_only_command, read_only_mount


@pytest.mark.parametrize(("hook", "key"), [("on_run_start", "hydra.run.dir"), ("on_multirun_start", "hydra.sweep.dir")])
def test_a_read_only_mount_is_one_line_before_hydra_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str], hook: str,
                                                           key: str) -> None:
    mount = tmp_path / "mount"
    mount.mkdir()
    read_only_mount(monkeypatch, mount)
    assert os.access(mount, os.W_OK)  # the permissions allow it: only the write finds out
    monkeypatch.chdir(mount)  # Hydra's default folders are relative: the message names the folder in full
    config = OmegaConf.create({"hydra": {"run": {"dir": "outputs/run"}, "sweep": {"dir": "multirun/sweep"}}})
    with pytest.raises(SystemExit) as exit_info:
        getattr(CheckOutputFolder(), hook)(config=config)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: {key}: cannot write into {mount} (Read-only file system); give a folder you can write to"]
    assert list(mount.iterdir()) == []


def test_a_writable_folder_and_an_unresolvable_one_pass(tmp_path: Path) -> None:
    config = OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "new" / "run")},
                                         "sweep": {"dir": "${hydra:runtime.choices.nothing}"}}})
    CheckOutputFolder().on_run_start(config=config)
    CheckOutputFolder().on_multirun_start(config=config)  # resolved by Hydra later: left to Hydra
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mode", ["run", "multirun"])
def test_training_into_a_read_only_folder_is_one_line(tmp_path: Path, mode: str) -> None:
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    folder = ["hydra.run.dir=" if mode == "run" else "hydra.sweep.dir=", str(read_only / "out")]
    command = [sys.executable, str(REPO / "scripts" / "train.py"), *(["-m", "trainer.seed=1,2"] if mode == "multirun"
                                                                      else []), "".join(folder)]
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    result = subprocess.run(read_only_command(read_only, command), cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    key = "hydra.run.dir" if mode == "run" else "hydra.sweep.dir"
    assert line.startswith(f"error: {key}: cannot write into {read_only} (")
    assert list(read_only.iterdir()) == []
