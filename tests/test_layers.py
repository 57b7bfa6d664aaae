"""The layer contract: each stage package imports only from the stages below it, and no module imports in a circle.

The order is import-linter's ``layers`` contract in ``pyproject.toml`` (``lint-imports``, run by ``.ci/run`` too).
grimp's graph counts every import, lazy ones inside functions included.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests.helpers.configs import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the contract of ``pyproject.toml`` over the ``medseg`` package found in
    ``package_parent``."""
    return subprocess.run([str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=package_parent, env={"PYTHONPATH": str(package_parent), "PATH": ""},
                          capture_output=True, text=True, timeout=120)


def cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """Every import edge ``a -> b`` whose target leads back to ``a``: the shortest circle through it."""
    found = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                found.append((importer, *back))
    return found


pytestmark = pytest.mark.skipif(not LINT_IMPORTS.is_file(), reason="import-linter is not installed (.[dev])")


def test_the_stages_keep_their_layers() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout


def test_the_contract_rejects_the_old_upward_import_of_the_schema(tmp_path: Path) -> None:
    """config.py once imported its choice lists from the training data module; the contract must refuse that."""
    shutil.copytree(REPO / "medseg", tmp_path / "medseg", ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "medseg" / "config.py"
    config.write_text(config.read_text() + "\n\ndef _choices():\n    from medseg.training.prepare import CACHE_MODES\n"
                      "    return CACHE_MODES\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1
    assert "medseg.config is not allowed to import medseg.training" in result.stdout
    assert "medseg.config -> medseg.training.prepare" in result.stdout


def test_the_package_imports_none_of_the_clones_benchmarks_or_tools() -> None:
    """``benchmarks/`` and ``tools/`` live beside the package, not in its wheel: no module of it may import them."""
    graph = grimp.build_graph("medseg", include_external_packages=True, cache_dir=None)
    assert "numpy" in graph.modules  # the graph holds what the package imports from outside it
    assert not {"benchmarks", "tools"} & graph.modules


def test_no_module_imports_in_a_circle() -> None:
    graph = grimp.build_graph("medseg", cache_dir=None)
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "circular"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from circular import b\n")  # lazy, inside a function
    (package / "b.py").write_text("import circular.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles(grimp.build_graph("circular", cache_dir=None)) == [("circular.a", "circular.b", "circular.a"),
                                                                     ("circular.b", "circular.a", "circular.b")]
