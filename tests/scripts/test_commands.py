"""The ``medseg`` entry point of ``pyproject.toml``: one command per script of ``scripts/``, the same arguments, and a
``--help`` that loads no torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from medseg.commands import COMMANDS, main
from tests.helpers.configs import REPO, run_script

UPKEEP = {"benchmark.py", "config_reference.py", "gpu_check.py", "offline_bundle.py", "prepare_demo_data.py"}
"""The scripts that are no command, run from a clone: the benchmarks, the docs' reference page, the GPU check, the
offline bundle and the demo data."""


def entry_point(*args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    """``medseg ARGS`` as the installed console script runs it: ``sys.exit(<module>.<function>())`` of the entry
    point that ``pyproject.toml`` declares."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["medseg"]
    module, function = target.split(":")
    code = f"import sys; from {module} import {function}; sys.exit({function}())"
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, "HYDRA_FULL_ERROR": "0"})


def test_every_command_is_a_script_and_every_script_a_command() -> None:
    scripts = {path.name for path in (REPO / "scripts").glob("*.py")} - UPKEEP
    assert scripts == {name.replace("-", "_") + ".py" for name in COMMANDS}
    for name in COMMANDS:
        source = (REPO / "scripts" / (name.replace("-", "_") + ".py")).read_text()
        assert f'sys.exit(run_command("{name}"))' in source, name


def test_help_lists_every_command() -> None:
    result = entry_point("--help")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.split("commands:\n")[1].split("\n\n")[0].splitlines()]
    assert listed == list(COMMANDS)


def test_train_help_is_the_scripts_and_loads_no_torch(tmp_path: Path) -> None:
    result = entry_point("train", "--help", importtime=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == run_script("train.py", ["--help"], cwd=tmp_path).stdout
    assert "data: demo3d, demo3d_planned, msd, nnunet" in result.stdout
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines() if "|" in line}
    assert "hydra" in loaded and not loaded & {"torch", "monai", "numpy", "nibabel"}


def test_crossval_takes_the_multirun_folder_first(tmp_path: Path) -> None:
    result = entry_point("crossval", str(tmp_path), "--cfg", "job")
    assert result.returncode == 0, result.stderr
    assert f"dir: {tmp_path}\n" in result.stdout


def test_a_mistyped_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trian", "--help"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: unknown command 'trian'; did you mean train?") and len(error.splitlines()) == 1
    assert main([]) == 1 and "usage: medseg <command>" in capsys.readouterr().err
