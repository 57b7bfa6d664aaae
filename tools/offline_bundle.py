"""An offline install bundle: the wheels medseg needs on a machine without network (``scripts/offline_bundle.py``).

Run it on a machine with the network and medseg installed (``pip install -e .``), for the target's Python and
platform::

    python scripts/offline_bundle.py --out .whl --python 3.12 --platform manylinux_2_28_x86_64 --provided FILE

:func:`missing_distributions` walks medseg's requirements as installed here, with their markers evaluated for the
target (:meth:`BundleTarget.environment`; no extras), and keeps every distribution the target does not already
have, descending into its requirements; a provided distribution brings its own. ``--provided FILE`` is the output
of ``python -m pip freeze --all`` (or ``pip list --format=freeze``) on the target (:func:`parse_freeze`); a provided
distribution whose version does not satisfy a requirement is bundled all the same. Without it, everything is
bundled. Each distribution is pinned to the version installed here (the one medseg's tests ran with).

:func:`make_bundle` saves one wheel per distribution into the folder: ``pip download`` of a wheel for the target
(pure-Python ``py3-none-any`` or one built for its CPython and platform tags), or, for a distribution published
only as a source archive, ``pip wheel`` here (which must give a pure-Python wheel); then it checks that the
folder holds one wheel of each, at its version, installable on the target (:func:`check_wheels`), and writes
``INSTALL.txt`` beside them with the install command (:func:`install_notes`).

A ``--platform`` tag brings the older tags of its family (:func:`expand_platform`). The defaults are this
machine's own: the Python version of this interpreter (``sys.version_info``) and the platform tags it installs
(:func:`packaging.tags.sys_tags`, most specific first).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags, sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from benchmarks import REPO
from medseg.cli import one_line_errors
from medseg.errors import MedsegError
from medseg.io import atomic_write_text

DEFAULT_FOLDER = REPO / ".whl"
"""The bundle's default folder: ``.whl/`` in the repository root (git-ignored)."""
NOTES = "INSTALL.txt"
MIB = 2**20
_LINUX = re.compile(r"^(?:manylinux\d*|musllinux|linux)(?:_\d+_\d+)?_(?P<machine>.+)$")
_MACOS = re.compile(r"^macosx_\d+_\d+_(?P<machine>.+)$")
_WINDOWS = {"win32": "x86", "win_amd64": "AMD64", "win_arm64": "ARM64"}
_LEGACY_MANYLINUX = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}
DESCRIPTION = """\
Save the wheels medseg needs into one folder, for installing it on a machine without network (a cluster node,
an air-gapped workstation). Run it here, with the network and medseg installed (`pip install -e .`); give the
target's Python version and platform tags when they are not this machine's, and its `pip freeze --all` so
that what it already has is left out. Beside the wheels, INSTALL.txt gives the command that installs them on
the target. See docs/offline-install.md.

example: python scripts/offline_bundle.py --python 3.12 --platform manylinux_2_28_x86_64 --provided target-freeze.txt
"""


class WheelError(MedsegError):
    """The bundle cannot be worked out or saved; the message names the distribution, line or tag."""


def this_platforms() -> tuple[str, ...]:
    """The platform tags this machine installs, most specific first (``any`` left out)."""
    return tuple(platform for platform in dict.fromkeys(tag.platform for tag in sys_tags()) if platform != "any")


def platform_markers(platform: str) -> dict[str, str]:
    """The marker values of a wheel platform tag's OS: ``manylinux_2_28_x86_64`` -> linux, Linux, x86_64, posix.

    Raises:
        WheelError: the tag is none of Linux's, macOS's or Windows'.
    """
    if match := _LINUX.match(platform):
        return {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                "platform_machine": match["machine"]}
    if match := _MACOS.match(platform):
        return {"sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix",
                "platform_machine": match["machine"]}
    if platform in _WINDOWS:
        return {"sys_platform": "win32", "platform_system": "Windows", "os_name": "nt",
                "platform_machine": _WINDOWS[platform]}
    raise WheelError(f"platform tag {platform!r}: expected a Linux (manylinux_2_28_x86_64, musllinux_1_2_aarch64), "
                     f"macOS (macosx_11_0_arm64) or Windows (win_amd64) one")


def expand_platform(platform: str) -> list[str]:
    """A platform tag and the older ones a machine with it installs, newest first: ``manylinux_2_28_x86_64`` ->
    ``manylinux_2_28_x86_64``, ..., ``manylinux_2_17_x86_64``, ``manylinux2014_x86_64``, ..., ``manylinux1_x86_64``;
    ``musllinux_1_2_aarch64`` -> ``musllinux_1_2_aarch64``, ``_1_1_``, ``_1_0_``; any other tag as it is."""
    match = re.fullmatch(r"(manylinux|musllinux)_(\d+)_(\d+)_(.+)", platform)
    if not match:
        return [platform]
    family, major, minor, machine = match[1], int(match[2]), int(match[3]), match[4]
    oldest = 0 if family == "musllinux" else 5 if machine in ("x86_64", "i686") else 17
    tags = []
    for older in range(minor, min(oldest, minor) - 1, -1):
        tags.append(f"{family}_{major}_{older}_{machine}")
        if family == "manylinux" and (major, older) in _LEGACY_MANYLINUX:
            tags.append(f"{_LEGACY_MANYLINUX[major, older]}_{machine}")
    return tags


@dataclass(frozen=True)
class BundleTarget:
    """The machine the bundle is for: its CPython version and the platform tags it installs (most specific first)."""

    python: tuple[int, int]
    platforms: tuple[str, ...]

    @classmethod
    def here(cls) -> BundleTarget:
        """This machine: this interpreter's version and :func:`this_platforms`."""
        return cls((sys.version_info.major, sys.version_info.minor), this_platforms())

    @property
    def python_version(self) -> str:
        return f"{self.python[0]}.{self.python[1]}"

    @property
    def label(self) -> str:
        """``CPython 3.12 on manylinux_2_28_x86_64`` (its first platform tag, with the count of the others)."""
        others = f" (+{len(self.platforms) - 1} more)" if len(self.platforms) > 1 else ""
        return f"CPython {self.python_version} on {self.platforms[0]}{others}"

    def environment(self) -> dict[str, str]:
        """Requirement markers' values on the target: this machine's, with the target's Python (full version
        ``X.Y.0`` when it is not this one) and, unless its platform is this machine's, the OS of its first tag."""
        environment: dict[str, str] = {**default_environment(), "extra": ""}
        if self.python != sys.version_info[:2]:
            full = f"{self.python_version}.0"
            environment.update(python_version=self.python_version, python_full_version=full,
                               implementation_version=full)
        if self.platforms[0] not in this_platforms():
            environment.update(platform_markers(self.platforms[0]))
        return environment

    def tags(self) -> set[Tag]:
        """The wheel tags the target's CPython installs."""
        abi = f"cp{self.python[0]}{self.python[1]}"
        return {*cpython_tags(self.python, platforms=self.platforms),
                *compatible_tags(self.python, abi, platforms=self.platforms)}


# ------------------------------------------------------------------------------------------- what to bundle


def parse_freeze(text: str, source: str = "the provided list") -> dict[str, str | None]:
    """The distributions a ``pip freeze`` (or ``pip list --format=freeze``) output names: canonical name -> its
    pinned version, None when it has none (``name @ file:///...``, ``-e ...#egg=name``).

    Blank lines, comments and other options (``-i URL``) are skipped, and so is an editable line without
    ``#egg=``, which names no distribution.

    Raises:
        WheelError: a line is none of these (``source`` and the line number name it).
    """
    provided: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if line.startswith(("-e ", "--editable")):
            if egg := re.search(r"#egg=([A-Za-z0-9._-]+)", raw):
                provided[canonicalize_name(egg[1])] = None
            continue
        if not line or line.startswith(("#", "-")):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            raise WheelError(f"{source}, line {number}: {raw.strip()!r} is not a `pip freeze` line") from None
        pins = [spec.version for spec in requirement.specifier if spec.operator in ("==", "===")]
        provided[canonicalize_name(requirement.name)] = pins[0] if len(pins) == 1 else None
    return provided


def read_provided(path: Path) -> dict[str, str | None]:
    """:func:`parse_freeze` of the file at ``path``.

    Raises:
        WheelError: the file cannot be read, or a line of it parsed.
    """
    try:
        return parse_freeze(path.read_text(), source=str(path))
    except OSError as error:
        raise WheelError(f"cannot read the provided list {path}: {error.strerror}") from None


def satisfies(requirement: Requirement, version: str | None) -> bool:
    """Whether a provided ``version`` meets ``requirement`` (an unknown or non-standard version is taken to)."""
    try:
        return version is None or requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return True


def missing_distributions(
    requirements: Iterable[str],
    environment: Mapping[str, str],
    provided: Mapping[str, str | None] | None = None,
    version_of: Callable[[str], str] = metadata.version,
    requires_of: Callable[[str], list[str] | None] = metadata.requires,
) -> dict[str, str]:
    """Every distribution that ``requirements`` need under ``environment`` (marker values) and ``provided``
    (canonical name -> version, None: unknown) lacks or has at a version they exclude, with the requirements of
    each in turn (a provided distribution brings its own): canonical name -> version installed here, in the
    order found.

    Raises:
        WheelError: a needed distribution is not installed here (no version to pin).
    """
    have = dict(provided or {})
    needed: dict[str, str] = {}
    queue = list(requirements)
    while queue:
        requirement = Requirement(queue.pop(0))
        name = canonicalize_name(requirement.name)
        applies = requirement.marker is None or requirement.marker.evaluate(dict(environment))
        if not applies or name in needed or (name in have and satisfies(requirement, have[name])):
            continue
        try:
            needed[name] = version_of(name)
        except metadata.PackageNotFoundError:
            raise WheelError(f"{requirement} is needed on the target but not installed here: install it, "
                             f"then make the bundle again") from None
        queue.extend(requires_of(name) or [])
    return needed


def medseg_requirements() -> list[str]:
    """medseg's requirements as its installed metadata lists them (extras' under their ``extra`` marker).

    Raises:
        WheelError: medseg is not installed here.
    """
    try:
        return metadata.requires("medseg") or []
    except metadata.PackageNotFoundError:
        raise WheelError("medseg is not installed here: run `pip install -e .` in the repository first") from None


# ------------------------------------------------------------------------------------------- the folder


def wheels_by_name(folder: Path) -> dict[str, list[Path]]:
    """The wheels in ``folder`` per canonical distribution name."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("*.whl")):
        found.setdefault(canonicalize_name(parse_wheel_filename(path.name)[0]), []).append(path)
    return found


def check_wheels(folder: Path, pins: Mapping[str, str], target: BundleTarget) -> list[Path]:
    """The wheel of each pinned distribution in ``folder``; one each, at its version, installable on ``target``.

    Raises:
        WheelError: a wheel is missing, doubled, of another version, or built for another Python or platform.
    """
    found, tags, wheels = wheels_by_name(folder), target.tags(), []
    for name, version in pins.items():
        paths = found.get(name, [])
        if len(paths) != 1:
            raise WheelError(f"{folder} holds {len(paths)} wheels of {name} ({[p.name for p in paths]}); expected one")
        _, wheel_version, _, wheel_tags = parse_wheel_filename(paths[0].name)
        if str(wheel_version) != version or not wheel_tags & tags:
            raise WheelError(f"{paths[0].name}: expected {name} {version} for {target.label}")
        wheels.append(paths[0])
    return wheels


def _pip(*args: str) -> bool:
    """Run ``python -m pip ARGS`` with this interpreter; whether it succeeded."""
    return subprocess.run([sys.executable, "-m", "pip", *args], check=False).returncode == 0


def save_wheel(name: str, version: str, folder: Path, target: BundleTarget) -> None:
    """Save ``name==version``'s wheel for ``target`` into ``folder``: a published wheel, else one built here."""
    platforms = [arg for platform in target.platforms for arg in ("--platform", platform)]
    spec = f"{name}=={version}"
    if _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", target.python_version,
            "--implementation", "cp", *platforms, "-d", str(folder), spec):
        return
    print(f"{spec}: no published wheel for the target (the error above); building one here", file=sys.stderr)
    if not _pip("wheel", "-q", "--no-deps", "-w", str(folder), spec):
        raise WheelError(f"no wheel of {spec} could be downloaded or built")


def install_notes(folder: Path, target: BundleTarget, wheels: Sequence[Path]) -> str:
    """``INSTALL.txt``: what the bundle is for and the commands that install it on the target."""
    shown = folder.relative_to(REPO) if folder.is_relative_to(REPO) else folder
    return "\n".join([
        f"medseg offline bundle: {len(wheels)} wheels for {target.label}.",
        "",
        "On the target, in the root of the medseg repository (copied with this folder):",
        "",
        '    SITE="$HOME/medseg-site"    # any folder; the target\'s own packages stay as they are',
        f'    python3 -m pip install --no-index --no-deps --upgrade --target "$SITE" {shown}/*.whl',
        '    export PYTHONPATH="$SITE:$PWD"',
        "",
        "Then `python scripts/gpu_check.py --out outputs/gpu_check` (on a CUDA machine) or the quick start",
        "checks the install. See docs/offline-install.md.",
        "",
        *(f"  {path.name}" for path in wheels),
    ]) + "\n"


def make_bundle(folder: Path, target: BundleTarget, provided: Mapping[str, str | None] | None = None) -> list[Path]:
    """Save into ``folder`` the wheels of what ``target`` lacks (see the module docstring), after removing other
    versions of the same distributions there, and write ``INSTALL.txt``; returns the wheels.

    Raises:
        WheelError: a distribution is not installed here, or its wheel could not be had or does not fit.
    """
    pins = missing_distributions(medseg_requirements(), target.environment(), provided)
    folder.mkdir(parents=True, exist_ok=True)
    for name, paths in wheels_by_name(folder).items():
        for path in paths:
            if name in pins and str(parse_wheel_filename(path.name)[1]) != pins[name]:
                path.unlink()
    for name, version in pins.items():
        if name not in wheels_by_name(folder):
            save_wheel(name, version, folder, target)
    wheels = check_wheels(folder, pins, target)
    atomic_write_text(folder / NOTES, install_notes(folder, target, wheels))
    return wheels


def describe(wheels: Sequence[Path], folder: Path) -> str:
    """What to tell the person who made the bundle in ``folder``: the set, its size, and any other wheels there
    (``*.whl`` installs them too)."""
    size = sum(path.stat().st_size for path in folder.glob("*.whl"))
    others = sorted(set(folder.glob("*.whl")) - set(wheels))
    lines = [*(f"  {path.name}" for path in wheels),
             f"{len(wheels)} wheels in {folder}, {size / MIB:.1f} MiB in all; install: {folder / NOTES}"]
    if others:
        lines.append(f"also in {folder} and installed with them: {', '.join(p.name for p in others)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- command line


def python_version(text: str) -> tuple[int, int]:
    """``3.12`` -> (3, 12), for ``--python``."""
    if not (match := re.fullmatch(r"(\d+)\.(\d+)", text)):
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR, e.g. 3.12, not {text!r}")
    return int(match[1]), int(match[2])


def build_parser() -> argparse.ArgumentParser:
    """``offline_bundle.py``'s parser; the defaults are this machine's Python and platform tags."""
    here = BundleTarget.here()
    parser = argparse.ArgumentParser(prog="offline_bundle.py", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_FOLDER,
                        help="the bundle's folder (default: .whl/ in the repository, git-ignored)")
    parser.add_argument("--python", type=python_version, default=here.python, metavar="X.Y",
                        help=f"the target's CPython version (default: this one, {here.python_version})")
    parser.add_argument("--platform", dest="platforms", action="append", metavar="TAG",
                        help="a platform tag the target installs, most specific first; repeat for more; "
                             "manylinux_2_28_x86_64 brings the older manylinux tags it includes "
                             f"(default: this machine's {len(here.platforms)}, from {here.platforms[0]})")
    parser.add_argument("--provided", type=Path, metavar="FILE",
                        help="`python -m pip freeze --all` of the target: what it has is not bundled "
                             "(default: bundle all)")
    return parser


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    """Make the bundle the command line asks for and print what it holds; returns the exit code."""
    args = build_parser().parse_args(argv)
    platforms = dict.fromkeys(tag for given in args.platforms for tag in expand_platform(given)) \
        if args.platforms else this_platforms()
    target = BundleTarget(args.python, tuple(platforms))
    provided = read_provided(args.provided) if args.provided else None
    folder = args.out.resolve()
    print(describe(make_bundle(folder, target, provided), folder))
    return 0
