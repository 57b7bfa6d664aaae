"""A dataset on read-only storage trains: its caches go to the user's cache directory, with one log line.

The dataset folder is made read-only for real (:func:`~tests.helpers.read_only.read_only_command`), and, in process,
as a read-only mount whose permissions still allow writing (:func:`~tests.helpers.read_only.read_only_mount`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from medseg.data.datalist import CACHE_FOLDER, dataset_cache_dir
from tests.helpers.configs import REPO
from tests.helpers.read_only import read_only_command, read_only_mount
from tests.helpers.realistic import write_ct_dataset

TRAIN = ["data=msd", "recipe=light", "model.channels=[8,16,32]", "data.patch_size=[32,32,8]",
         "data.samples_per_volume=1",
         "data.num_workers=0", "trainer.max_epochs=1", "trainer.batch_size=2", "trainer.progress=false"]


@pytest.mark.full
def test_training_on_a_read_only_dataset_caches_in_the_user_cache(tmp_path: Path) -> None:
    root = write_ct_dataset(tmp_path / "ct", "msd", num_cases=4, shape=(40, 40, 10))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    run_dir, user_cache = tmp_path / "run", tmp_path / "user-cache"
    command = [sys.executable, str(REPO / "scripts" / "train.py"), *TRAIN, f"data.root={root}",
               f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "XDG_CACHE_HOME": str(user_cache), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(read_only_command(root, command), cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    expected = user_cache / "medseg" / f"ct-{hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:10]}"
    assert output.count("is not writable: its caches go to") == 1 and str(expected) in output
    assert (expected / "fingerprint.json").is_file() and list(expected.glob("splits_seed*_k5.json"))
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before, "nothing written into the dataset"
    assert not (root / CACHE_FOLDER).exists()
    assert (run_dir / "checkpoints" / "best.pt").is_file()


def test_a_read_only_mount_sends_the_caches_to_the_user_cache_even_where_permissions_allow_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ct"
    root.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    read_only_mount(monkeypatch, root)
    assert os.access(root, os.W_OK), "the permissions say writable: only a write finds the mount read-only"
    dataset_cache_dir.cache_clear()
    try:
        chosen = dataset_cache_dir(root)
    finally:
        dataset_cache_dir.cache_clear()
    digest = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:10]
    assert chosen == tmp_path / "user-cache" / "medseg" / f"ct-{digest}"
    assert list(root.iterdir()) == []
