"""``scripts/offline_bundle.py``: what to bundle for a target, the target's ``pip freeze``, the folder check, the
command line. No test downloads: ``save_wheel`` (the only step that reaches the network) is replaced."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.tags import Tag
from packaging.utils import canonicalize_name

from tests.helpers.configs import REPO
from tools import offline_bundle
from tools.offline_bundle import (
    BundleTarget,
    WheelError,
    check_wheels,
    expand_platform,
    install_notes,
    make_bundle,
    missing_distributions,
    parse_freeze,
    platform_markers,
)

LINUX_312 = BundleTarget((3, 12), ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64"))
GRAPH = {
    "app": ["lib>=1", "torch>=2", "old ; python_version < '3.12'", "new ; python_version >= '3.12'",
            "tool ; extra == 'dev'", "winonly ; sys_platform == 'win32'"],
    "lib": ["leaf", "torch>=2"], "old": [], "new": [], "leaf": [], "torch": ["hidden"], "winonly": [],
}
VERSIONS = {"lib": "1.2", "leaf": "0.1", "old": "2", "new": "3", "torch": "2.5.1", "winonly": "1"}


def version_of(name: str) -> str:
    if name not in VERSIONS:
        raise metadata.PackageNotFoundError(name)
    return VERSIONS[name]


def needed(target: BundleTarget, provided: dict[str, str | None] | None) -> dict[str, str]:
    return missing_distributions(GRAPH["app"], target.environment(), provided, version_of, GRAPH.get)


def test_markers_are_evaluated_for_the_target_python_and_platform() -> None:
    assert needed(LINUX_312, {"torch": None}) == {"lib": "1.2", "new": "3", "leaf": "0.1"}
    linux_311 = BundleTarget((3, 11), LINUX_312.platforms)
    assert needed(linux_311, {"torch": None}) == {"lib": "1.2", "old": "2", "leaf": "0.1"}
    windows_312 = BundleTarget((3, 12), ("win_amd64",))
    assert needed(windows_312, {"torch": None}) == {"lib": "1.2", "new": "3", "winonly": "1", "leaf": "0.1"}


def test_what_the_target_provides_is_left_out_unless_too_old() -> None:
    # a provided torch brings its own needs; without it torch is bundled, and its own requirement is not installed here
    with pytest.raises(WheelError, match="hidden"):
        needed(LINUX_312, None)
    with pytest.raises(WheelError, match="hidden"):
        needed(LINUX_312, {"torch": "1.13.1"})  # older than torch>=2: bundled all the same
    assert needed(LINUX_312, {"torch": "2.1", "leaf": "0.1"}) == {"lib": "1.2", "new": "3"}
    assert needed(LINUX_312, {"torch": "2.1", "lib": "0.9"}) == {"lib": "1.2", "new": "3", "leaf": "0.1"}


FREEZE = """\
# Editable install with no version control (medseg==0.1.0)
-e /home/someone/medseg
-e git+https://example.org/lab/tool.git@0a1b2c3#egg=Lab_Tool
numpy==2.1.3
Pillow==10.4.0

torch @ file:///opt/wheels/torch-2.5.1-cp312-cp312-linux_x86_64.whl
-i https://example.org/simple
ruamel.yaml===0.18.6-custom
"""


def test_pip_freeze_lines() -> None:
    assert parse_freeze(FREEZE) == {"lab-tool": None, "numpy": "2.1.3", "pillow": "10.4.0", "torch": None,
                                    "ruamel-yaml": "0.18.6-custom"}
    with pytest.raises(WheelError, match="freeze.txt, line 2"):
        parse_freeze("numpy==2.1.3\nthis is not a requirement\n", source="freeze.txt")


def test_the_platform_tags_of_a_target() -> None:
    assert expand_platform("manylinux_2_28_x86_64") == [
        *(f"manylinux_2_{minor}_x86_64" for minor in range(28, 17, -1)), "manylinux_2_17_x86_64",
        "manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(16, 12, -1)),
        "manylinux_2_12_x86_64", "manylinux2010_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(11, 5, -1)),
        "manylinux_2_5_x86_64", "manylinux1_x86_64"]
    assert expand_platform("manylinux_2_18_aarch64") == ["manylinux_2_18_aarch64", "manylinux_2_17_aarch64",
                                                         "manylinux2014_aarch64"]
    assert expand_platform("musllinux_1_2_x86_64") == ["musllinux_1_2_x86_64", "musllinux_1_1_x86_64",
                                                       "musllinux_1_0_x86_64"]
    assert expand_platform("win_amd64") == ["win_amd64"]
    assert platform_markers("manylinux2014_aarch64")["platform_machine"] == "aarch64"
    assert platform_markers("macosx_11_0_arm64") == {"sys_platform": "darwin", "platform_system": "Darwin",
                                                     "os_name": "posix", "platform_machine": "arm64"}
    with pytest.raises(WheelError, match="freebsd"):
        platform_markers("freebsd_14_0_amd64")
    tags = LINUX_312.tags()
    assert {Tag("cp312", "cp312", "manylinux_2_17_x86_64"), Tag("cp312", "abi3", "manylinux_2_28_x86_64"),
            Tag("py3", "none", "any")} <= tags
    assert Tag("cp311", "cp311", "manylinux_2_17_x86_64") not in tags
    assert Tag("cp312", "cp312", "manylinux_2_34_x86_64") not in tags


def test_wheel_folder_check(tmp_path: Path) -> None:
    pins = {"monai": "1.6.1", "numpy-like": "2.0"}
    (tmp_path / "monai-1.6.1-py3-none-any.whl").touch()
    (tmp_path / "numpy_like-2.0-cp312-cp312-manylinux_2_17_x86_64.whl").touch()
    assert [p.name for p in check_wheels(tmp_path, pins, LINUX_312)] == [
        "monai-1.6.1-py3-none-any.whl", "numpy_like-2.0-cp312-cp312-manylinux_2_17_x86_64.whl"]
    (tmp_path / "monai-1.5.0-py3-none-any.whl").touch()
    with pytest.raises(WheelError, match="2 wheels of monai"):
        check_wheels(tmp_path, pins, LINUX_312)
    (tmp_path / "monai-1.5.0-py3-none-any.whl").unlink()
    (tmp_path / "numpy_like-2.0-cp312-cp312-manylinux_2_17_x86_64.whl").rename(
        tmp_path / "numpy_like-2.0-cp311-cp311-win_amd64.whl")
    with pytest.raises(WheelError, match="numpy-like 2.0 for CPython 3.12 on manylinux_2_28_x86_64"):
        check_wheels(tmp_path, pins, LINUX_312)


def test_make_bundle_saves_what_the_target_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything installed here but MONAI and nibabel is provided (their own needs included): the bundle is
    those two at the versions installed here, an older MONAI wheel in the folder is replaced, INSTALL.txt says how."""
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    provided = {name: version for name, version in installed.items() if name not in ("monai", "nibabel")}
    saved = []

    def fake_save(name: str, version: str, folder: Path, target: BundleTarget) -> None:
        saved.append(name)
        (folder / f"{name}-{version}-py3-none-any.whl").touch()

    monkeypatch.setattr(offline_bundle, "save_wheel", fake_save)
    (tmp_path / "monai-0.1.0-py3-none-any.whl").touch()
    wheels = make_bundle(tmp_path, BundleTarget.here(), provided)
    expected = [f"{name}-{metadata.version(name)}-py3-none-any.whl" for name in ("monai", "nibabel")]
    assert [path.name for path in wheels] == expected and sorted(saved) == ["monai", "nibabel"]
    assert sorted(path.name for path in tmp_path.glob("*.whl")) == expected
    notes = (tmp_path / "INSTALL.txt").read_text()
    assert f'--no-index --no-deps --upgrade --target "$SITE" {tmp_path}/*.whl' in notes
    assert all(name in notes for name in expected)


def test_install_notes_name_the_folder_in_the_repository() -> None:
    notes = install_notes(REPO / ".whl", LINUX_312, [])
    assert "python3 -m pip install --no-index --no-deps --upgrade --target \"$SITE\" .whl/*.whl" in notes
    assert 'export PYTHONPATH="$SITE:$PWD"' in notes


def test_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("numpy==2.1.3\n")
    made = []
    monkeypatch.setattr(offline_bundle, "make_bundle", lambda *args: made.append(args) or [])
    assert offline_bundle.main(["--out", str(tmp_path / "b"), "--python", "3.12", "--platform",
                                "manylinux_2_17_x86_64", "--provided", str(freeze)]) == 0
    assert made == [((tmp_path / "b").resolve(), BundleTarget((3, 12), ("manylinux_2_17_x86_64", "manylinux2014_x86_64",
                                                            *expand_platform("manylinux_2_16_x86_64"))),
                     {"numpy": "2.1.3"})]
    with pytest.raises(SystemExit):
        offline_bundle.main(["--provided", str(tmp_path / "missing.txt")])
    assert "cannot read the provided list" in capsys.readouterr().err

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "offline_bundle.py"), "--help"], env=env,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "--provided FILE" in result.stdout and "docs/offline-install.md" in result.stdout
