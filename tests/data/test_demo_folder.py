"""The demo writes only into a folder that is missing, empty or its own: never into someone's dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medseg.data.demo import DEMO_MARKER, ensure_demo_dataset, generate_demo_dataset
from medseg.errors import DatasetError
from tests.helpers.configs import run_script

SMALL = {"num_cases": 1, "shape": (8, 8, 8), "progress": False}


def someones_dataset(root: Path) -> dict[Path, bytes]:
    """An MSD folder of someone's (40 training cases, as the demo's default count), and its files' bytes."""
    (root / "imagesTr").mkdir(parents=True)
    (root / "imagesTr" / "spleen_1.nii.gz").write_bytes(b"their scan")
    (root / "dataset.json").write_text(json.dumps({"name": "Task09_Spleen", "numTraining": 40, "training": []}))
    return {path: path.read_bytes() for path in root.rglob("*") if path.is_file()}


def test_someones_dataset_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    before = someones_dataset(tmp_path / "spleen")
    with pytest.raises(DatasetError, match=r"holds a dataset\.json of 'Task09_Spleen'.*data=msd data\.root=.*spleen"):
        ensure_demo_dataset(tmp_path / "spleen", num_cases=40)
    with pytest.raises(DatasetError, match="the demo did not make"):
        generate_demo_dataset(tmp_path / "spleen", **SMALL)
    assert {path: path.read_bytes() for path in (tmp_path / "spleen").rglob("*") if path.is_file()} == before


def test_a_folder_of_other_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="holds files that the demo did not make"):
        generate_demo_dataset(tmp_path, **SMALL)
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("")
    with pytest.raises(DatasetError, match="is a file"):
        generate_demo_dataset(tmp_path / "file", **SMALL)


def test_a_missing_or_empty_folder_becomes_the_demo_s_own(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "missing", tmp_path / "empty"):
        generate_demo_dataset(root, **SMALL)
        assert (root / DEMO_MARKER).is_file() and json.loads((root / "dataset.json").read_text())["numTraining"] == 1
        generate_demo_dataset(root, **{**SMALL, "num_cases": 2})  # its own folder: regenerated
        assert json.loads((root / "dataset.json").read_text())["numTraining"] == 2


def test_a_demo_folder_from_before_the_marker_is_still_the_demo_s(tmp_path: Path) -> None:
    generate_demo_dataset(tmp_path, **SMALL)
    (tmp_path / DEMO_MARKER).unlink()
    assert ensure_demo_dataset(tmp_path, num_cases=1) == tmp_path


@pytest.mark.full
def test_train_on_someones_folder_without_a_dataset_preset_is_one_line(tmp_path: Path) -> None:
    before = someones_dataset(tmp_path / "spleen")
    result = run_script("train.py", [f"data.root={tmp_path / 'spleen'}", f"hydra.run.dir={tmp_path / 'run'}"],
                        cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: data.root=") and "data=msd" in lines[-1]
    assert "Traceback" not in result.stderr
    assert {path: path.read_bytes() for path in (tmp_path / "spleen").rglob("*") if path.is_file()} == before
