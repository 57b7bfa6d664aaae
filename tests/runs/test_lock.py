"""One training per run folder: the lock file, its stale and foreign cases, a training that finds it held, and the
half-written files a killed run left, removed by the next run that owns the folder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from medseg.errors import ConfigError
from medseg.io import remove_temporaries
from medseg.runs.lock import acquire
from medseg.training.run import train
from tests.helpers.runs import micro_config


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen]:
    """A live process of this host that is not this one."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def test_a_held_folder_is_refused_naming_the_holder(tmp_path: Path, other_process: subprocess.Popen) -> None:
    (tmp_path / ".medseg.lock").write_text(f"{other_process.pid} {socket.gethostname()}\n")
    with pytest.raises(ConfigError, match=rf"in use by another training \(process {other_process.pid} on "):
        acquire(tmp_path)
    assert (tmp_path / ".medseg.lock").read_text().split()[0] == str(other_process.pid), "the holder's lock stays"


def test_the_lock_names_this_process_and_a_second_acquire_fails(tmp_path: Path) -> None:
    path = acquire(tmp_path / "run")
    assert path.read_text().split() == [str(os.getpid()), socket.gethostname()]
    with pytest.raises(ConfigError, match="hydra.run.dir"):
        acquire(tmp_path / "run")


def test_a_stale_lock_is_taken_over(tmp_path: Path) -> None:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".medseg.lock").write_text(f"{finished.stdout.strip()} {socket.gethostname()}\n")
    assert acquire(tmp_path).read_text().split()[0] == str(os.getpid())


def test_another_host_s_lock_or_an_unreadable_one_is_kept(tmp_path: Path) -> None:
    (tmp_path / ".medseg.lock").write_text("1 some-other-node\n")
    with pytest.raises(ConfigError, match="process 1 on some-other-node"):
        acquire(tmp_path)
    (tmp_path / ".medseg.lock").write_text("")
    with pytest.raises(ConfigError, match="a process that left no pid.*delete"):
        acquire(tmp_path)


def test_a_training_stops_before_any_work_in_a_held_folder_and_releases_its_own(
        tmp_path: Path, tiny_demo_root: Path, other_process: subprocess.Popen) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".medseg.lock").write_text(f"{other_process.pid} {socket.gethostname()}\n")
    with pytest.raises(ConfigError, match="in use by another training"):
        train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1"))
    assert sorted(path.name for path in run_dir.iterdir()) == [".medseg.lock"], "nothing written"
    (run_dir / ".medseg.lock").unlink()
    train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1"))
    assert (run_dir / "checkpoints" / "last.pt").is_file() and not (run_dir / ".medseg.lock").exists()


def test_the_run_that_owns_a_folder_removes_what_a_killed_run_half_wrote(tmp_path: Path, tiny_demo_root: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    half_written = [run_dir / "checkpoints" / ".last.pt.k3j_9x2q.tmp", run_dir / ".metrics.json.abcd1234.tmp",
                    run_dir / "predictions" / ".case_000.nii.gz.zz99zz99.tmp.nii.gz"]
    kept = [run_dir / ".hydra" / "config.yaml", run_dir / "notes.tmp", run_dir / ".keep.tmp"]
    for path in [*half_written, *kept]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
    assert sorted(remove_temporaries(run_dir)) == sorted(half_written)
    assert all(path.is_file() for path in kept) and not any(path.exists() for path in half_written)
    half_written[0].write_bytes(b"partial")
    train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1"))
    assert not half_written[0].exists() and (run_dir / "checkpoints" / "last.pt").is_file()
