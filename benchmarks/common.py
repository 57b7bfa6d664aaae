"""What the benchmarks share: timing, peak memory, the machine's description, the training config as
``scripts/train.py`` composes it, the report writers (targets; :func:`write_report`: ``<name>.md`` + ``<name>.json``
with the figures' provenance, and with ``--results`` the same in the clone's ``results/``), and a prediction run in a
process of its own (:func:`run_child`), stopped at a cap on its resident memory where one is given.

Peak memory (:func:`peak_bytes`): on CUDA ``torch.cuda.max_memory_allocated`` above the allocation before the run.
On the CPU, every allocation and free that PyTorch's CPU allocator reports to ``torch.profiler``
(``profile_memory=True``, read from its Chrome trace) while the function runs, summed in time order; the peak of
that running sum.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import operator
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import torch
from omegaconf import DictConfig
from torch.profiler import ProfilerActivity, profile

from benchmarks import REPO
from medseg.hydra_config import compose_config
from medseg.io import atomic_write_json, atomic_write_text
from medseg.runtime.host_memory import child_pids
from medseg.tables import markdown_table
from medseg.version import __version__ as MEDSEG_VERSION

MIB = 2**20
CAP_INTERVAL_S = 0.1
"""How often :func:`run_child` reads a capped process tree's resident memory."""
Result = TypeVar("Result")


# ------------------------------------------------------------------------------------------- timing


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, reps: int, max_seconds: float) -> tuple[float, int]:
    """Median wall time in ms of up to ``reps`` runs of ``fn``, stopping when the next one would pass
    ``max_seconds``; and the number of runs."""
    times: list[float] = []
    while len(times) < reps and sum(times) + (times[-1] if times else 0.0) <= max_seconds:
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), len(times)


class TimedNetwork(torch.nn.Module):
    """``network`` with the seconds it runs (``seconds``) and the windows it is given (``windows``) counted.

    Maps ``(B, C, *spatial)`` to what ``network`` maps it to; each call adds ``B`` windows. Weights loaded into it
    (``load_state_dict``) go to ``network``, so a predictor that loads each fold's weights into its network (nnU-Net's)
    can be given the timed one.
    """

    def __init__(self, network: torch.nn.Module) -> None:
        super().__init__()
        self.network, self.seconds, self.windows = network, 0.0, 0

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        output = self.network(batch)
        self.seconds += time.perf_counter() - started
        self.windows += len(batch)
        return output

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        return self.network.load_state_dict(state_dict, strict=strict, assign=assign)


def window_gflop(network: torch.nn.Module, window: Sequence[int]) -> float:
    """The GFLOP (a multiply-add counts 2) of ``network``'s convolutions and matrix products on one ``(C, *spatial)``
    window, as ``torch.utils.flop_counter`` counts them; normalisation and activations are left out."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        network(torch.zeros(1, *window))
    return counter.get_total_flops() / 1e9


def fp32_matmul_gflops(size: int = 2048, reps: int = 5) -> float:
    """This CPU's fp32 rate in GFLOP/s on all of torch's threads: the fastest of ``reps`` ``size`` x ``size`` matrix
    products (after one to warm up), the most its convolutions can expect."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = min(time_ms(lambda: torch.mm(a, b), torch.device("cpu"), 1, float("inf"))[0] for _ in range(reps))
    return 2 * size**3 / (best / 1000) / 1e9


# ------------------------------------------------------------------------------------------- peak memory


def cpu_allocations(prof: profile) -> list[int]:
    """The bytes of every allocation (> 0) and free (< 0) by PyTorch's CPU allocator in ``prof``, in time order.

    ``prof`` must have run with ``profile_memory=True``. Read from its Chrome trace (``export_chrome_trace``,
    public and documented), where each allocation and free is a ``[memory]`` event with its ``Bytes``. The
    ``[memory]`` entries of ``prof.events()`` do not serve: most allocations there are folded into the ops
    that made them, as net totals, and a net total hides the peak inside an op.
    """
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory = sorted((event for event in events if event.get("name") == "[memory]"), key=lambda event: event["ts"])
    return [event["args"]["Bytes"] for event in memory]


def peak_bytes(fn: Callable[[], Result], device: torch.device) -> tuple[int, Result]:
    """Peak bytes allocated while ``fn`` runs, above what was allocated before (see the module docstring),
    and ``fn``'s result."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base, out
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    return max(itertools.accumulate(cpu_allocations(prof), initial=0)), out


# ------------------------------------------------------------------------------------------- the machine


def machine(device: torch.device) -> str:
    """The device in words: GPU name, or the CPU's model (Linux) and threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU{cpu_model()}, {torch.get_num_threads()} threads"


def cpu_model() -> str:
    """`` (<model name>)`` of the CPU as ``/proc/cpuinfo`` gives it, with ``bf16`` where it computes bf16 natively
    (AMX or AVX512-BF16); empty where there is no such file."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    bf16 = ", native bf16" if re.search(r"\b(amx_bf16|avx512_bf16)\b", info) else ""
    return f" ({name}{bf16})" if name else ""


# ------------------------------------------------------------------------------------------- configs


def compose_train_config(overrides: Sequence[str] = ()) -> DictConfig:
    """``configs/train.yaml`` with ``overrides``, composed as ``scripts/train.py`` would (no Hydra run
    context)."""
    return compose_config("train", overrides)


# ------------------------------------------------------------------------------------------- reports


@dataclass
class Target:
    """A figure the design asks for; ``value`` is None when the run did not cover it."""

    label: str
    value: float | None
    relation: str
    goal: float
    met: bool | None = field(init=False)

    def __post_init__(self) -> None:
        compare = {">=": operator.ge, "<=": operator.le, "<": operator.lt}[self.relation]
        self.met = None if self.value is None else bool(compare(self.value, self.goal))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, None where either is missing."""
    return None if numerator is None or denominator is None else numerator / denominator


def size_label(shape: tuple[int, ...]) -> str:
    """A grid in a report: ``(16, 16, 16)`` -> ``16³``, ``(64, 64)`` -> ``64²``, ``(5, 7)`` -> ``5×7``."""
    if len(set(shape)) == 1:
        return f"{shape[0]}{'²' if len(shape) == 2 else '³'}"
    return "×".join(map(str, shape))


def targets_markdown(targets: Sequence[Mapping[str, Any]], value_format: str = ".3g") -> str:
    """The markdown table of a report's targets (``Target`` as dicts): label, value, goal, and whether it is met."""
    met = {True: "yes", False: "**no**", None: "n/a"}
    rows = [[t["label"], t["value"], f"{t['relation']} {t['goal']:g}", met[t["met"]]] for t in targets]
    return markdown_table(["target", "value", "goal", "met"], rows, formats={"value": value_format}, missing="n/a")


def add_results_argument(parser: argparse.ArgumentParser) -> None:
    """``--results DIR``: also write the report into ``DIR``; ``--results results`` in the clone's root writes the
    figures the docs quote, with their provenance, into ``results/``."""
    parser.add_argument("--results", type=Path, default=None, metavar="DIR",
                        help="also write the report here (<name>.md, and <name>.json with the machine, versions, "
                             "command and date beside the figures); the docs' figures are in the clone's results/")


def _version(package: str) -> str | None:
    """The installed version of ``package``; None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def provenance(command: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Where and how figures were measured: the machine (platform, CPU model, CPU count, torch's threads, the
    device), the versions of python, torch, monai and medseg, ``command`` and the date (UTC)."""
    device = torch.device(device)
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": {"platform": platform.platform(), "processor": cpu_model().strip(" ()") or platform.processor(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "device": machine(device) if device.type == "cuda" else str(device)},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "monai": _version("monai"),
                     "medseg": MEDSEG_VERSION},
    }


def write_report(out: Path | None, name: str, markdown: str, report: Mapping[str, Any],
                 invocation: argparse.Namespace | None, device: torch.device | str = "cpu") -> None:
    """The one writer of every benchmark's figures: ``<out>/<name>.md`` and ``<out>/<name>.json`` (atomically;
    nothing when ``out`` is None), and the same in ``invocation.results`` where ``--results`` was given
    (:func:`add_results_argument`). ``device`` is the device that ran the figures.

    The JSON holds ``report`` and, beside it, ``provenance`` (:func:`provenance`): the machine, the versions, the
    command (``invocation.command_line``, as :func:`benchmarks.cli.run_command` records it; else this process's
    ``sys.argv``) and the date.
    """
    command = getattr(invocation, "command_line", None) or shlex.join(sys.argv)
    data = {**report, "provenance": provenance(command, device)}
    for folder in (out, getattr(invocation, "results", None)):
        if folder is not None:
            atomic_write_text(folder / f"{name}.md", markdown)
            atomic_write_json(folder / f"{name}.json", data)


class OverCap(Exception):
    """A process of :func:`run_child` stopped because its tree's resident memory passed the cap."""

    def __init__(self, name: str, seconds: float, peak_bytes: int) -> None:
        super().__init__(f"{name}: over the memory cap after {seconds:.1f} s ({peak_bytes / 2**30:.2f} GB)")
        self.seconds, self.peak_bytes = seconds, peak_bytes


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants, summed (Linux ``/proc``; 0 where it is not readable).

    An upper bound: a forked worker's resident set counts the pages it shares with its parent again (training's
    own ``peak_ram_mb``, :class:`medseg.runtime.host_memory.PeakRam`, counts only what a worker adds). It is the one
    measure that applies to any system's process tree alike, so the comparisons use it for all.
    """
    total = 0
    for process in (pid, *child_pids(pid)):
        try:
            status = Path(f"/proc/{process}/status").read_text()
        except OSError:
            continue
        total += sum(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
    return total


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process it started (listed first: once ``pid`` is gone they are no longer its)."""
    for process in (pid, *child_pids(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process, signal.SIGKILL)


def wait_under_cap(process: subprocess.Popen, cap_bytes: int | None, name: str) -> int:
    """Wait for ``process`` and return its exit code; with ``cap_bytes``, read its tree's resident memory
    (:func:`tree_rss_bytes`) every :data:`CAP_INTERVAL_S` and kill the tree when it passes the cap.

    Raises:
        OverCap: the tree passed the cap (it has been killed and waited for).
    """
    if cap_bytes is None:
        return process.wait()
    started = time.perf_counter()
    while True:
        try:
            return process.wait(timeout=CAP_INTERVAL_S)
        except subprocess.TimeoutExpired:
            resident = tree_rss_bytes(process.pid)
            if resident > cap_bytes:
                _kill_tree(process.pid)
                process.wait()
                raise OverCap(name, time.perf_counter() - started, resident) from None


def run_child(module: str, name: str, spec: Mapping[str, Any], out: Path,
              cap_bytes: int | None = None) -> dict[str, Any]:
    """``python -m module SPEC RESULT`` in a process of its own (one prediction or evaluation of a benchmark), in
    ``out/name``: its ``spec.json`` (with ``output``: ``prediction/`` there), ``log.txt`` and ``result.json``; the
    result. With ``cap_bytes``, the process (and any it starts) is killed when its resident memory passes it
    (:func:`wait_under_cap`), so that the system's OOM killer never has to.

    Raises:
        OverCap: the process passed ``cap_bytes`` and was stopped.
        SystemExit: the process failed otherwise (the message names its log).
    """
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "output": str(folder / "prediction")}
    atomic_write_json(folder / "spec.json", spec)
    tag = module.rsplit(".", 1)[-1]
    print(f"[{tag}] {name} ...", flush=True)
    with open(folder / "log.txt", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", module, str(folder / "spec.json"),
                                    str(folder / "result.json")], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            code = wait_under_cap(process, cap_bytes, name)
        except OverCap as stopped:
            print(f"[{tag}] {stopped}", flush=True)
            raise
    if code:
        raise SystemExit(f"error: the {name} run failed (exit {code}); see {folder / 'log.txt'}")
    result = json.loads((folder / "result.json").read_text())
    print(f"[{tag}] {name}: {result['seconds']:.1f} s, peak RSS {result['peak_rss_mb']:.0f} MB", flush=True)
    return result
