"""Exact resume, end to end: a run stopped by SIGKILL, SIGTERM or SIGINT mid-epoch, then resumed, ends
exactly as an uninterrupted run with the same seed (``trainer.deterministic=true``, ``data.num_workers=0``).

The runs go through ``scripts/train.py`` in subprocesses and are stopped by real signals. Every signal is sent
while a known step is under way: a small driver (test code only) runs the script with the training step wrapped so
that it announces the step and waits for the signal (or, for SIGKILL, holds), which makes "mid-epoch" certain under
any load: no signal races the training.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from medseg.errors import CheckpointError
from medseg.runs.checkpoint import load_checkpoint
from tests.helpers.configs import MICRO_OVERRIDES, REPO, run_script

# A micro model on the tiny demo (8 cases, 6 of them for training): 3 steps of batch 2 per epoch.
EPOCHS = 3
# dropout draws from the torch RNG during each step, so a mid-epoch resume is exact only if it restores that RNG
RESUME_OVERRIDES = [*MICRO_OVERRIDES, f"trainer.max_epochs={EPOCHS}", "trainer.deterministic=true",
                    "model.dropout=0.1"]
# one thread keeps the runs fast on shared CPUs; any fixed thread count gives the same equality
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
TIMEOUT = 300.0

# Runs scripts/train.py with the trainer's step wrapped: before step STEP (0-based) of epoch EPOCH (0-based) it
# touches READY, then waits, for up to 120 s, until a stop was requested (MODE=resume) or forever (MODE=hold).
PAUSE_DRIVER = """
import runpy, sys, time
from pathlib import Path
from medseg.training.trainer import Trainer, TrainStep

epoch, step, ready, mode = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
train_epoch, train_step, running, taken = Trainer.train_epoch, TrainStep.__call__, {}, []

def tracked_epoch(self, stop):
    running.update(trainer=self, stop=stop)
    return train_epoch(self, stop)

def paused_train_step(self, image, label):
    trainer, stop = running["trainer"], running["stop"]
    taken.append(trainer.progress.epoch)
    if trainer.progress.epoch == epoch and taken.count(epoch) == step + 1:
        ready.touch()
        deadline = time.monotonic() + 120
        while (mode == "hold" or not stop.signum) and time.monotonic() < deadline:
            time.sleep(0.01)
    return train_step(self, image, label)

Trainer.train_epoch, TrainStep.__call__ = tracked_epoch, paused_train_step
sys.argv = sys.argv[5:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _train_args(root: Path, run_dir: Path, *extra: str) -> list[str]:
    return [*RESUME_OVERRIDES, f"data.root={root}", f"hydra.run.dir={run_dir}", *extra]


def _run(root: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    result = run_script("train.py", _train_args(root, run_dir, *extra), cwd=run_dir.parent, timeout=TIMEOUT, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _start(command: list[str], log_file: Path) -> subprocess.Popen:
    """Start ``command`` with stdout and stderr going to ``log_file`` (no pipe to fill up)."""
    with log_file.open("w") as handle:
        return subprocess.Popen(command, cwd=log_file.parent, env={**os.environ, **ENV}, stdout=handle,
                                stderr=subprocess.STDOUT, text=True)


def _start_paused(root: Path, run_dir: Path, epoch: int, step: int, mode: str) -> tuple[subprocess.Popen, Path, Path]:
    """Start a run that pauses in step ``step`` of epoch ``epoch`` (0-based); returns it, its ready file and log."""
    ready, log_file = run_dir.parent / "ready", run_dir.parent / f"{run_dir.name}.log"
    script = str(REPO / "scripts" / "train.py")
    command = [sys.executable, "-c", PAUSE_DRIVER, str(epoch), str(step), str(ready), mode, script,
               *_train_args(root, run_dir)]
    return _start(command, log_file), ready, log_file


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen, log_file: Path, what: str,
              timeout: float = TIMEOUT) -> None:
    """Poll ``condition()`` until true; fail if ``proc`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before {what}:\n{log_file.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}:\n{log_file.read_text()[-3000:]}")
        time.sleep(0.02)


def _wait(proc: subprocess.Popen, log_file: Path) -> int:
    try:
        return proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the run did not stop:\n{log_file.read_text()[-3000:]}")


def _last_epoch(last: Path) -> int:
    """The epoch of ``last.pt``, or -1 while there is none (writes are atomic, so any file read is whole)."""
    try:
        return load_checkpoint(last)["epoch"] if last.is_file() else -1
    except CheckpointError:  # replaced between the check and the read
        return -1


def _metrics(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metrics.json").read_text())


def _assert_same_run(run_dir: Path, reference: Path) -> None:
    """``run_dir`` ended exactly as ``reference``: metrics, per-epoch history (each epoch once) and weights."""
    got, want = _metrics(run_dir), _metrics(reference)
    assert [record["epoch"] for record in got["history"]] == list(range(1, EPOCHS + 1)), "an epoch ran twice"
    assert got["epochs"] == want["epochs"] == EPOCHS
    assert got["best_val_dice"] == want["best_val_dice"]
    assert got["best_epoch"] == want["best_epoch"]
    untimed = [[{k: v for k, v in record.items() if k != "train_seconds"} for record in run["history"]]
               for run in (got, want)]
    assert untimed[0] == untimed[1]  # loss, lr and val Dice of every epoch, to the last bit
    assert got["nonfinite_steps"] == 0
    got_state, want_state = (load_checkpoint(d / "checkpoints" / "last.pt") for d in (run_dir, reference))
    assert got_state["epoch"] == EPOCHS and got_state["step"] == 0
    for key, value in want_state["model"].items():
        torch.testing.assert_close(got_state["model"][key], value, rtol=0, atol=1e-6, msg=lambda m, k=key: f"{k}: {m}")
    best = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    assert best["best_metric"] == max(record["val_dice"] for record in got["history"]) == got["best_val_dice"]
    assert best["best_epoch"] == best["epoch"] == got["best_epoch"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, tiny_demo_root: Path) -> Path:
    """An uninterrupted run: what every stopped and resumed run must end as."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    _run(tiny_demo_root, run_dir)
    return run_dir


@pytest.mark.full
def test_sigkill_mid_training_then_resume_equals_uninterrupted_run(tmp_path: Path, tiny_demo_root: Path,
                                                                   reference: Path) -> None:
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.pt"
    proc, ready, log_file = _start_paused(tiny_demo_root, run_dir, epoch=1, step=1, mode="hold")
    _wait_for(ready.exists, proc, log_file, "step 2 of epoch 2")  # held there: the kill lands at a known point
    os.kill(proc.pid, signal.SIGKILL)
    assert _wait(proc, log_file) == -signal.SIGKILL
    killed_at = load_checkpoint(last)
    assert (killed_at["epoch"], killed_at["step"]) == (1, 0), "the last.pt of epoch 1, the last one written"
    assert not (run_dir / "metrics.json").exists()
    stale = last.parent / ".last.pt.k1llwr1t.tmp"  # what a kill during a checkpoint write leaves (atomic_save's name)
    stale.write_bytes(b"partial")

    result = _run(tiny_demo_root, run_dir, "trainer.resume=true")
    assert f"at epoch {killed_at['epoch']} (best val Dice" in result.stdout + result.stderr
    assert not stale.exists()
    _assert_same_run(run_dir, reference)


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
@pytest.mark.full
def test_graceful_stop_mid_epoch_then_resume_equals_uninterrupted_run(tmp_path: Path, tiny_demo_root: Path,
                                                                      reference: Path, sig: signal.Signals) -> None:
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.pt"
    proc, ready, log_file = _start_paused(tiny_demo_root, run_dir, epoch=1, step=1, mode="resume")
    _wait_for(ready.exists, proc, log_file, "step 2 of epoch 2")
    assert _last_epoch(last) == 1
    os.kill(proc.pid, sig)
    assert _wait(proc, log_file) == 128 + sig
    output = log_file.read_text()
    assert f"stopped by {sig.name} at epoch 2, step 2" in output and "Traceback" not in output
    assert f"hydra.run.dir={run_dir} trainer.resume=true" in output
    stopped_at = load_checkpoint(last)
    assert (stopped_at["epoch"], stopped_at["step"], len(stopped_at["epoch_losses"])) == (1, 2, 2)

    if sig == signal.SIGTERM:  # the printed command resumes
        command = shlex.split(re.search(r"to resume: (.+)", output).group(1))
        assert command[0] == "python"
        result = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, env={**os.environ, **ENV},
                                capture_output=True, text=True, timeout=TIMEOUT)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    else:  # ckpt_path= resumes from a file
        result = _run(tiny_demo_root, run_dir, f"ckpt_path={last}")
    assert "resumed from" in result.stdout + result.stderr and "at epoch 2, step 2" in result.stdout + result.stderr, \
        "the resume names the epoch and step as the stop did"
    _assert_same_run(run_dir, reference)


@pytest.mark.slow
def test_second_signal_stops_at_once_without_saving(tmp_path: Path, tiny_demo_root: Path) -> None:
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.pt"
    proc, ready, log_file = _start_paused(tiny_demo_root, run_dir, epoch=1, step=1, mode="hold")
    _wait_for(ready.exists, proc, log_file, "step 2 of epoch 2")
    os.kill(proc.pid, signal.SIGINT)
    _wait_for(lambda: "received SIGINT:" in log_file.read_text(), proc, log_file, "the first SIGINT to be handled")
    os.kill(proc.pid, signal.SIGINT)
    assert _wait(proc, log_file) == -signal.SIGINT
    assert "received SIGINT again: stopping now without saving" in log_file.read_text()
    state = load_checkpoint(last)
    assert (state["epoch"], state["step"]) == (1, 0)
