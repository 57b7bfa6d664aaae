"""``pip install`` of a wheel gives a working ``medseg`` command: the wheel holds the package and the repository's
top-level ``configs/`` as ``medseg/configs/``, and installed into a fresh venv (no editable install, no clone on the
path) and run from an empty folder, it trains and evaluates with those configs."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.helpers.configs import MICRO_OVERRIDES, REPO

TIMEOUT = 600


def build_wheel(out: Path) -> Path:
    """The wheel of the sources (``pyproject.toml``, ``README.md``, ``medseg/``, ``configs/``), built offline with this
    venv's setuptools from a copy, so the build leaves nothing in the repository."""
    source = out / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in ("medseg", "configs"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    check([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
           "-w", str(out / "dist"), str(source)], cwd=out)
    (wheel,) = (out / "dist").glob("medseg-*.whl")
    return wheel


def fresh_venv(folder: Path, wheel: Path) -> Path:
    """A venv at ``folder`` with ``wheel`` installed, and this venv's site-packages (torch, MONAI, Hydra, ...) after
    its own on the path as plain folders: their ``.pth`` files, the editable install of medseg among them, are not
    run. Returns its ``bin/`` folder."""
    check([sys.executable, "-m", "venv", "--without-pip", str(folder)], cwd=folder.parent)
    python = folder / "bin" / "python"
    check([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
           str(wheel)], cwd=folder.parent)
    own = check([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=folder.parent).stdout.strip()
    (Path(own) / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return folder / "bin"


def check(command: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``command``; it must exit with 0."""
    result = subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result


def test_the_wheel_holds_every_module_and_the_top_level_configs(tmp_path: Path) -> None:
    names = set(zipfile.ZipFile(build_wheel(tmp_path)).namelist())
    modules = {path.relative_to(REPO).as_posix() for path in (REPO / "medseg").rglob("*.py")}
    configs = {f"medseg/{path.relative_to(REPO).as_posix()}" for path in (REPO / "configs").rglob("*")
               if path.suffix in (".yaml", ".py")}
    assert "medseg/configs/train.yaml" in configs and "medseg/configs/data/demo3d.yaml" in configs
    assert modules | configs <= names, "pyproject.toml's packages and package-data"
    assert not [name for name in names if "bench" in name or name.startswith(("tools/", "configs/"))], (
        "benchmarks stay in the clone; the configs are the package medseg.configs")


@pytest.mark.slow
def test_the_installed_wheel_trains_and_evaluates_from_an_empty_folder(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "build")
    bin_dir = fresh_venv(tmp_path / "venv", wheel)
    work = tmp_path / "work"
    work.mkdir()
    kept = {key: value for key, value in os.environ.items()
            if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MEDSEG_DATA")}  # no clone on the path
    env = {**kept, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONNOUSERSITE": "1",
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}

    where = check([str(bin_dir / "python"), "-c", "import medseg.commands, medseg.hydra_config as h; "
                   "print(medseg.commands.__file__); print(h.CONFIG_DIR)"], work, env)
    for installed in map(Path, where.stdout.split()):  # the package and its configs, medseg/configs/
        assert installed.is_relative_to(tmp_path / "venv") and not installed.is_relative_to(REPO), installed
    assert "data: demo3d, demo3d_planned, msd, nnunet" in check(["medseg", "train", "--help"], work, env).stdout

    check(["medseg", "train", *MICRO_OVERRIDES, "trainer.max_epochs=1"], work, env)  # the demo into ./data/demo3d
    (ckpt,) = work.glob("outputs/train/*/*/checkpoints/best.pt")
    assert (ckpt.parents[1] / "train.log").is_file()
    check(["medseg", "evaluate", f"ckpt={ckpt}", "input=data/demo3d", "split=validation", "output=predictions",
           "inference.progress=false"], work, env)
    validation = json.loads((ckpt.parents[1] / "splits.json").read_text())["val"]
    assert len(list((work / "predictions").glob("*.nii.gz"))) == len(validation) > 0
    assert (work / "predictions" / "metrics.csv").is_file()
    check(["medseg", "predict", f"ckpt={ckpt}", "input=data/demo3d/imagesTr", "output=segmented",
           "inference.progress=false"], work, env)  # a folder of images, no labels
    assert len(list((work / "segmented").glob("*.nii.gz"))) == len(list((work / "data/demo3d/imagesTr").iterdir()))
    scored = check(["medseg", "evaluate", "pred=segmented", "input=data/demo3d/labelsTr", "inference.progress=false"],
                   work, env)
    assert "foreground mean" in scored.stdout and (work / "segmented" / "metrics.csv").is_file()
