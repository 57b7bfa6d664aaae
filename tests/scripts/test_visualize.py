"""``scripts/visualize.py`` end to end: the files and the table of one query voxel; bad input gives one line, exit 1.

Each run starts a Python with torch and MONAI (about 10 s on 2 busy cores): the default suite keeps one, the exit code
of a bad voxel; the in-process tests in ``tests/visualize/test_visualize.py`` cover the rest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.checkpoints import masa_checkpoint
from tests.helpers.configs import run_script
from tests.helpers.volumes import oblique_volume


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("visualize")
    return masa_checkpoint(folder / "masa.pt"), oblique_volume(folder / "scan.nii.gz")


@pytest.mark.slow
def test_script_writes_the_maps_and_prints_the_table(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, scan = inputs
    result = run_script("visualize.py", [f"ckpt={ckpt}", f"input={scan}", "voxel=[9,20,5]", "output=out",
                                         "inference.device=cpu"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert written == ["attention.json", "bottleneck_block0.nii.gz", "bottleneck_block0.png",
                       "bottleneck_block0_decay.nii.gz", "bottleneck_block0_decay.png"]
    summary = json.loads((tmp_path / "out" / "attention.json").read_text())
    for head in summary["maps"][0]["heads"]:
        assert f"{head['mean_distance_mm']:.4f}" in result.stdout and f"{head['entropy_nats']:.4f}" in result.stdout
    assert "distance_mm" in result.stdout and "written into out" in result.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["voxel=[9,99,5]"], "voxel=[9, 99, 5] lies outside the volume"),
    pytest.param(["voxel=[9,20,5]", "block=2"], "block=2 is not a block of any slot. Valid blocks: 0",
                 marks=pytest.mark.slow),
])
@pytest.mark.full
def test_bad_input_is_one_line_and_exit_1(inputs: tuple[Path, Path], tmp_path: Path, args: list[str],
                                          needle: str) -> None:
    ckpt, scan = inputs
    result = run_script("visualize.py", [f"ckpt={ckpt}", f"input={scan}", "inference.device=cpu", *args], cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    assert not (tmp_path / "attention").exists()
