"""The wheels a lent GPU machine lacks, for ``benchmark.py gpu --prepare-wheels`` (run by hand, with the network).

The device machine of this workplace (x86-64 Linux, Python 3.12, PyTorch with CUDA, no network) holds the
packages of :data:`DEVICE_PACKAGES` but not everything medseg needs (MONAI, Hydra, OmegaConf, nibabel, ...).
:func:`missing_distributions` walks medseg's requirements as installed here, with the markers evaluated for
the device's Python (:data:`DEVICE_ENVIRONMENT`), and keeps every distribution the device does not provide,
descending into its own requirements; a provided one brings its own. Each is pinned to the version installed
here (the one the tests ran with). :func:`prepare_wheels` saves them into ``.whl/`` (git-ignored), one wheel
per distribution: ``pip download`` of a wheel for the device (pure-Python ``py3-none-any`` or manylinux
x86-64, Python 3.12), or, for a distribution published only as a source archive, ``pip wheel`` (which must
give a pure-Python wheel). The device command then installs them with :data:`INSTALL_PREFIX`, carrying
``.whl``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from medseg.errors import MedsegError

WHEEL_DIR = ".whl"
"""The wheels' folder, relative to the repository root (git-ignored); the device command carries it."""
DEVICE_PYTHON = (3, 12)
DEVICE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                    "manylinux2014_x86_64", "manylinux1_x86_64")
"""The platform tags ``pip download`` may pick for the device (its README's list)."""
DEVICE_ENVIRONMENT: dict[str, str] = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "x86_64", "os_name": "posix", "extra": "",
}
"""Requirement markers are evaluated for the device's Python, not this one (``extra`` empty: no extras)."""
DEVICE_PACKAGES = frozenset({
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio", "attrs",
    "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake", "colorama",
    "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit", "cupy-cuda13x", "cycler",
    "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock", "flatbuffers", "flax",
    "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py", "hf-xet", "httpcore",
    "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig", "interface-meta", "jax",
    "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib", "kiwisolver", "lazy-loader",
    "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml", "markdown", "markdown-it-py",
    "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath", "msgpack", "multidict",
    "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja", "numba", "numba-cuda", "numpy",
    "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cudnn-cu13",
    "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse", "nvidia-cusparselt-cu13",
    "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx", "onnx-ir",
    "onnxruntime", "onnxscript", "opencv-python-headless", "optax", "opt-einsum", "opt-einsum-fx", "optimistix",
    "orbax-checkpoint", "packaging", "pandas", "pathspec", "patsy", "peft", "pillow", "pip", "pluggy", "portalocker",
    "prometheus-client", "propcache", "protobuf", "psutil", "pyarrow", "pybind11", "py-cpuinfo", "pygments",
    "pyparsing", "pyproject-hooks", "pyre-extensions", "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock",
    "pytest-timeout", "pytest-xdist", "python-dateutil", "pytorch-lightning", "pyyaml", "regex", "requests", "rich",
    "sacrebleu", "safetensors", "scikit-build-core", "scikit-image", "scikit-learn", "scipy", "seaborn",
    "sentencepiece", "sentence-transformers", "setuptools", "shellingham", "simplejson", "six", "sortedcontainers",
    "statsmodels", "sympy", "tabulate", "tensorboard", "tensorboard-data-server", "tensorstore", "threadpoolctl",
    "tifffile", "tiktoken", "timm", "tokenizers", "toolz", "torch", "torchaudio", "torchdiffeq", "torch-geometric",
    "torchmetrics", "torchvision", "tqdm", "transformers", "treescope", "triton", "typer", "typing-extensions",
    "typing-inspect", "urllib3", "uvloop", "wadler-lindig", "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl",
    "zipp"
})
"""The Python packages of the device image ('cuda'), as its description listed them on 2026-11-17."""
INSTALL_PREFIX = (f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
                  f"--target /tmp/site {WHEEL_DIR}/*.whl && export PYTHONPATH=/tmp/site:. || exit;")
"""Starts a device command (in the repository root): installs the carried wheels beside the image's packages;
``.`` makes medseg importable."""
MIB = 2**20


class WheelError(MedsegError):
    """The wheel set cannot be worked out or saved; the message names the distribution."""


def missing_distributions(
    requirements: Iterable[str],
    provided: Iterable[str] = DEVICE_PACKAGES,
    environment: Mapping[str, str] = DEVICE_ENVIRONMENT,
    version_of: Callable[[str], str] = metadata.version,
    requires_of: Callable[[str], list[str] | None] = metadata.requires,
) -> dict[str, str]:
    """Every distribution that ``requirements`` need under ``environment`` and ``provided`` lacks, with the
    requirements of each in turn (a provided distribution brings its own): canonical name -> version installed
    here, in the order found.

    Raises:
        WheelError: a needed distribution is not installed here (no version to pin).
    """
    have = {canonicalize_name(name) for name in provided}
    needed: dict[str, str] = {}
    queue = list(requirements)
    while queue:
        requirement = Requirement(queue.pop(0))
        name = canonicalize_name(requirement.name)
        applies = requirement.marker is None or requirement.marker.evaluate(dict(environment))
        if not applies or name in have or name in needed:
            continue
        try:
            needed[name] = version_of(name)
        except metadata.PackageNotFoundError:
            raise WheelError(f"{requirement} is needed on the device but not installed here: install it, "
                             f"then prepare the wheels again") from None
        queue.extend(requires_of(name) or [])
    return needed


def device_tags() -> set[Tag]:
    """The wheel tags the device's CPython 3.12 on x86-64 Linux installs."""
    return {*cpython_tags(DEVICE_PYTHON, platforms=DEVICE_PLATFORMS),
            *compatible_tags(DEVICE_PYTHON, "cp312", platforms=DEVICE_PLATFORMS)}


def wheels_by_name(folder: Path) -> dict[str, list[Path]]:
    """The wheels in ``folder`` per canonical distribution name."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("*.whl")):
        found.setdefault(canonicalize_name(parse_wheel_filename(path.name)[0]), []).append(path)
    return found


def check_wheels(folder: Path, pins: Mapping[str, str]) -> list[Path]:
    """The wheel of each pinned distribution in ``folder``; one each, at its version, installable on the device.

    Raises:
        WheelError: a wheel is missing, doubled, of another version, or built for another platform.
    """
    found, tags, wheels = wheels_by_name(folder), device_tags(), []
    for name, version in pins.items():
        paths = found.get(name, [])
        if len(paths) != 1:
            raise WheelError(f"{folder} holds {len(paths)} wheels of {name} ({[p.name for p in paths]}); expected one")
        _, wheel_version, _, wheel_tags = parse_wheel_filename(paths[0].name)
        if str(wheel_version) != version or not wheel_tags & tags:
            raise WheelError(f"{paths[0].name}: expected {name} {version} for CPython 3.12 on x86-64 Linux")
        wheels.append(paths[0])
    return wheels


def _pip(*args: str) -> bool:
    """Run ``python -m pip ARGS`` with this interpreter; whether it succeeded."""
    return subprocess.run([sys.executable, "-m", "pip", *args], check=False).returncode == 0


def save_wheel(name: str, version: str, folder: Path) -> None:
    """Save ``name==version``'s wheel for the device into ``folder``: a published wheel, else one built here."""
    platforms = [arg for platform in DEVICE_PLATFORMS for arg in ("--platform", platform)]
    python = ".".join(map(str, DEVICE_PYTHON))
    spec = f"{name}=={version}"
    if _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python, "--implementation",
            "cp", *platforms, "-d", str(folder), spec):
        return
    print(f"{spec}: no published wheel for the device (the error above); building one here", file=sys.stderr)
    if not _pip("wheel", "-q", "--no-deps", "-w", str(folder), spec):
        raise WheelError(f"no wheel of {spec} could be downloaded or built")


def prepare_wheels(folder: Path) -> list[Path]:
    """Save into ``folder`` the wheels of what the device lacks (see the module docstring), after removing
    other versions of the same distributions there; returns them.

    Raises:
        WheelError: a distribution is not installed here, or its wheel could not be had or does not fit.
    """
    pins = missing_distributions(metadata.requires("medseg") or [])
    folder.mkdir(parents=True, exist_ok=True)
    for name, paths in wheels_by_name(folder).items():
        for path in paths:
            if name in pins and str(parse_wheel_filename(path.name)[1]) != pins[name]:
                path.unlink()
    for name, version in pins.items():
        if name not in wheels_by_name(folder):
            save_wheel(name, version, folder)
    return check_wheels(folder, pins)


def describe(wheels: list[Path], folder: Path) -> str:
    """What to tell the person who prepared the wheels into ``folder`` (the repository's :data:`WHEEL_DIR`): the
    set, its size, the device tool's carry and the command prefix."""
    size = sum(path.stat().st_size for path in folder.glob("*.whl"))
    others = sorted(set(folder.glob("*.whl")) - set(wheels))
    lines = [*(f"  {path.name}" for path in wheels),
             f"{len(wheels)} wheels in {folder}, {size / MIB:.1f} MiB in all (the device tool carries at most 64 MiB)"]
    if others:
        lines.append(f"also in {folder} and installed with them: {', '.join(p.name for p in others)}")
    lines += [f'carry: ["{WHEEL_DIR}"]', f"command prefix: {INSTALL_PREFIX}"]
    return "\n".join(lines)
