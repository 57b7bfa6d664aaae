"""``scripts/benchmark.py``: run from a clone from any folder, it imports a subcommand's module only when that
subcommand runs, so a broken benchmark breaks only itself; ``gpu`` is the GPU check under its older name; every
``benchmark.py`` command of the docs names a subcommand."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cli import SUBCOMMANDS, Subcommand, main
from tests.helpers.configs import REPO, run_script

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_help_lists_every_subcommand_and_imports_none(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-X", "importtime", str(REPO / "scripts" / "benchmark.py"), "--help"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.split("commands:\n")[1].split("\n\n")[0].splitlines()]
    assert listed == list(SUBCOMMANDS)
    loaded = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert not loaded & {sub.module for sub in SUBCOMMANDS.values()}
    assert not loaded & {"torch", "monai"}


def test_a_broken_benchmark_breaks_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken_benchmark.py").write_text("raise ImportError('a dependency is missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(SUBCOMMANDS, "broken", Subcommand("broken_benchmark", "fails to import"))
    with pytest.raises(ImportError, match="a dependency is missing"):
        main(["broken"])
    with pytest.raises(SystemExit) as exit_info:
        main(["prediction", "--help"])
    assert exit_info.value.code == 0 and "--sw-batch-size" in capsys.readouterr().out


@pytest.mark.full
def test_gpu_is_the_gpu_check(tmp_path: Path) -> None:
    alias = run_script("benchmark.py", ["gpu", "--help"], cwd=tmp_path)
    check = run_script("gpu_check.py", ["--help"], cwd=tmp_path)
    assert alias.returncode == check.returncode == 0, alias.stderr + check.stderr
    assert alias.stdout.startswith("usage: benchmark.py gpu") and check.stdout.startswith("usage: gpu_check.py")
    assert alias.stdout.split("\n\n", 1)[1] == check.stdout.split("\n\n", 1)[1]  # all but the usage line(s)
    assert "--dry-run" in check.stdout


def test_every_documented_benchmark_command_is_a_subcommand() -> None:
    named = {match for page in DOCS for match in re.findall(r"benchmark\.py (\w+)", page.read_text())}
    assert named and named <= set(SUBCOMMANDS), named - set(SUBCOMMANDS)
