"""A local multirun stopped by SIGTERM or SIGINT, sent to its whole process group as ``kill -- -PGID``, ``timeout``,
``systemctl stop`` and Ctrl-C send them: the running job saves ``last.pt`` and exits, no further job starts, the exit
status is 128 + the signal, and the printed command resumes the sweep.

The sweep goes through ``scripts/train.py -m`` in a subprocess with one loader worker (which the signal reaches too).
A small driver (test code only) makes the sweep's first training step announce itself and wait for the signal, so the
signal is sent while a known step is under way: no signal races the training.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.configs import MICRO_OVERRIDES, REPO
from tests.helpers.files import read_csv

TIMEOUT = 300.0
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
SWEEP = [*(o for o in MICRO_OVERRIDES if not o.startswith("data.num_workers=")), "data.num_workers=1",
         "trainer.max_epochs=1", "trainer.seed=1,2"]
"""Two jobs of one epoch each (3 steps of the micro run), the batches loaded by one worker process."""

# Runs scripts/train.py with the training step wrapped: the sweep's first step touches READY, then waits, for up to
# 120 s, until the training process has received a stop signal.
PAUSE_DRIVER = """
import runpy, sys, time
from pathlib import Path
from medseg.training.loop import GracefulStop
from medseg.training.trainer import TrainStep

ready, train_step = Path(sys.argv[1]), TrainStep.__call__

def paused_first_step(self, image, label):
    if not ready.exists():
        ready.touch()
        deadline = time.monotonic() + 120
        while not GracefulStop.latest_signal and time.monotonic() < deadline:
            time.sleep(0.01)
    return train_step(self, image, label)

TrainStep.__call__ = paused_first_step
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def stopped_sweep(folder: Path, root: Path, sig: signal.Signals) -> tuple[Path, int, str]:
    """A two-job multirun into ``folder / "sweep"``, ``sig`` sent to its process group during its first training
    step; the sweep folder, the exit status and the output."""
    folder.mkdir(parents=True, exist_ok=True)
    sweep, ready, log_file = folder / "sweep", folder / "ready", folder / "sweep.log"
    command = [sys.executable, "-c", PAUSE_DRIVER, str(ready), str(REPO / "scripts" / "train.py"), "-m", *SWEEP,
               f"data.root={root}", f"hydra.sweep.dir={sweep}"]
    with log_file.open("w") as handle:
        proc = subprocess.Popen(command, cwd=folder, env={**os.environ, **ENV}, stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the sweep never reached its first step ({proc.poll()}):\n{log_file.read_text()[-3000:]}")
            time.sleep(0.02)
        os.killpg(proc.pid, sig)  # the whole group: the training process and its loader worker
        code = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    return sweep, code, log_file.read_text()


@pytest.fixture(scope="module")
def sigterm_sweep(tmp_path_factory: pytest.TempPathFactory, tiny_demo_root: Path) -> tuple[Path, int, str]:
    return stopped_sweep(tmp_path_factory.mktemp("sigterm"), tiny_demo_root, signal.SIGTERM)


def assert_stopped(sweep: Path, code: int, output: str, sig: signal.Signals) -> None:
    """The first job saved and stopped, with 128 + the signal; the second never started."""
    assert code == 128 + sig, output[-3000:]
    assert f"stopped by {sig.name} at epoch 1, step 1; saved {sweep / '0' / 'checkpoints' / 'last.pt'}" in output
    assert "Traceback" not in output and "job failed" not in output, output[-3000:]
    assert (sweep / "0" / "checkpoints" / "last.pt").is_file()
    assert not (sweep / "1").exists() and "#1 :" not in output, "the launcher started no second job"


@pytest.mark.slow
def test_sigterm_to_a_local_multirun_stops_the_sweep(sigterm_sweep: tuple[Path, int, str]) -> None:
    assert_stopped(*sigterm_sweep, signal.SIGTERM)


@pytest.mark.slow
def test_ctrl_c_stops_a_local_multirun(tmp_path: Path, tiny_demo_root: Path) -> None:
    assert_stopped(*stopped_sweep(tmp_path, tiny_demo_root, signal.SIGINT), signal.SIGINT)


@pytest.mark.slow
def test_the_printed_command_resumes_the_stopped_sweep(sigterm_sweep: tuple[Path, int, str]) -> None:
    sweep, _, output = sigterm_sweep
    command = shlex.split(re.search(r"to resume the sweep: (.+)", output).group(1))
    assert command[0] == "python" and "-m" in command and command[-2:] == [f"hydra.sweep.dir={sweep}",
                                                                          "trainer.resume=true"]
    result = subprocess.run([sys.executable, *command[1:]], cwd=sweep.parent, env={**os.environ, **ENV},
                            capture_output=True, text=True, timeout=TIMEOUT)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert f"resumed from {sweep / '0' / 'checkpoints' / 'last.pt'} at epoch 1, step 1" in log, "as the stop named it"
    assert f"{sweep / '1' / 'checkpoints' / 'last.pt'} does not exist: starting from scratch" in log
    assert [row["status"] for row in read_csv(sweep / "summary.csv")] == ["completed", "completed"]
