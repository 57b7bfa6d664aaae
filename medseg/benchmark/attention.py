"""``benchmark.py attention``: fwd+bwd time and peak memory of every attention block over token counts.

Per (block, grid) it runs the attention module alone, ``build_attention(name, dim, spatial_dims,
num_heads=heads)``, on a ``(batch, dim, *grid)`` float32 input: forward, then ``out.sum().backward()``
(parameter gradients included). Two extra rows share MaSA's projections and LCE and differ only in the
attention op: ``masa_naive``, the seed's form (materialise the softmax, multiply by the decay matrix,
renormalise), and ``sdpa``, plain unmasked fused attention: the floor of what any global attention costs.

* Time: one warm-up (the memory run below), then the median of up to ``--reps`` timed runs; a cell stops
  early when the next run would take it past ``--max-seconds``. When the warm-up alone exceeds
  ``--max-seconds`` its own time is reported (``reps = 0``, marked ``*``).
* Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` above the allocation before the run. On CPU,
  every allocation and free that PyTorch's CPU allocator reports to ``torch.profiler``
  (``profile_memory=True``) during one fwd+bwd, summed in time order; the peak of that running sum.
  Parameters and the input exist beforehand and are not counted; MaSA's bias cache is cleared first, so
  the bias it builds is.
* A cell whose analytic estimate (:func:`estimate_bytes`) exceeds ``--max-memory-gb`` is not run and
  reads ``OOM (est. X GB)``; a real out-of-memory ``RuntimeError`` is reported the same way.
"""

from __future__ import annotations

import argparse
import math
import operator
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from medseg.attention import available_blocks, build_attention, functional
from medseg.attention.masa import MaSA
from medseg.attention.position import axis_scales
from medseg.benchmark import targets_markdown, write_report

DEFAULT_SIZES = ("8^3", "16^3", "24^3", "32^3", "32^2", "64^2", "128^2")
QUICK_SIZES = ("4^3", "6^2")
GIB = 2**30
MIB = 2**20

LINEAR_COPIES = 40
"""Estimate: float32 copies of a ``(batch, N, dim)`` activation alive at the peak of any block's fwd+bwd."""
NAIVE_COPIES = 7
"""Estimate: ``(batch, heads, N, N)`` float32 matrices alive in the naive form (measured 6.8 at 16^3)."""


def naive_masa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spatial_shape: Sequence[int],
    gamma: functional.Gamma,
    *,
    spacing: Sequence[float] | None = None,
) -> torch.Tensor:
    """The seed's MaSA: ``softmax(q k^T / sqrt(d)) * gamma ** dist``, rows renormalised, times ``v``."""
    shape = tuple(spatial_shape)
    log_decay = functional.decay_bias(
        shape, axis_scales(len(shape), spacing), functional.log_gammas(gamma, q.shape[1]), q.device, q.dtype
    )
    attn = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1) * log_decay.exp()
    return attn / attn.sum(dim=-1, keepdim=True) @ v


def unmasked_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spatial_shape: Sequence[int],
    gamma: functional.Gamma,
    *,
    spacing: Sequence[float] | None = None,
) -> torch.Tensor:
    """Plain fused attention, ignoring the decay: the cost floor for MaSA."""
    return F.scaled_dot_product_attention(q, k, v)


class NaiveMaSA(MaSA):
    """MaSA with the seed's materialised attention (:func:`naive_masa`)."""

    attention = staticmethod(naive_masa)


class UnmaskedSDPA(MaSA):
    """MaSA's projections and LCE around unmasked SDPA (:func:`unmasked_sdpa`)."""

    attention = staticmethod(unmasked_sdpa)


REFERENCES: dict[str, type[MaSA]] = {"masa_naive": NaiveMaSA, "sdpa": UnmaskedSDPA}


def all_rows() -> list[str]:
    """Registered blocks, then the reference rows."""
    return [*available_blocks(), *REFERENCES]


def make_block(name: str, dim: int, spatial_dims: int, heads: int) -> nn.Module:
    if name in REFERENCES:
        return REFERENCES[name](dim, spatial_dims, num_heads=heads)
    return build_attention(name, dim, spatial_dims, num_heads=heads)


def parse_size(text: str) -> tuple[int, ...]:
    """``"16^3"`` -> ``(16, 16, 16)``; ``"5x7"`` -> ``(5, 7)``."""
    if "^" in text:
        side, power = text.split("^")
        shape = (int(side),) * int(power)
    else:
        shape = tuple(int(s) for s in text.lower().split("x"))
    if len(shape) not in (2, 3) or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected a 2D/3D grid like 16^3 or 5x7")
    return shape


def size_label(shape: tuple[int, ...]) -> str:
    if len(set(shape)) == 1:
        return f"{shape[0]}{'²' if len(shape) == 2 else '³'}"
    return "×".join(map(str, shape))


def estimate_bytes(name: str, tokens: int, batch: int, dim: int, heads: int) -> int:
    """Rough float32 peak of one fwd+bwd: linear activations plus the ``N x N`` tensors the form keeps."""
    quadratic = {"masa": 1, "masa_naive": NAIVE_COPIES * batch * heads}.get(name, 0)
    return 4 * (LINEAR_COPIES * batch * tokens * dim + quadratic * tokens**2)


@dataclass
class Cell:
    """One (block, grid) measurement."""

    block: str
    shape: tuple[int, ...]
    tokens: int
    estimate_gib: float
    status: str = "ok"
    """``ok`` | ``oom`` (estimated over budget, or a real out-of-memory error) | ``error``."""
    time_ms: float | None = None
    reps: int = 0
    peak_mib: float | None = None
    detail: str = ""


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


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fwd_bwd(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    block.zero_grad(set_to_none=True)
    out = block(x)
    out.sum().backward()
    return out.detach()


def peak_bytes(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[int, torch.Tensor]:
    """Peak bytes allocated while ``fn`` runs (see the module docstring), and ``fn``'s result."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base, out
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    allocations, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.typed[0] == _EventType.Allocation:
            allocations.append((event.start_time_ns, event.typed[1].alloc_size))
        stack.extend(event.children)
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak, out


def time_ms(fn: Callable[[], torch.Tensor], device: torch.device, reps: int, max_seconds: float) -> tuple[float, int]:
    """Median wall time of up to ``reps`` runs, stopping when the next one would pass ``max_seconds``."""
    times: list[float] = []
    while len(times) < reps and sum(times) + (times[-1] if times else 0.0) <= max_seconds:
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), len(times)


def measure(
    name: str, shape: tuple[int, ...], args: argparse.Namespace, device: torch.device
) -> tuple[Cell, torch.Tensor | None]:
    """Time and peak memory of one block at one grid; also returns its forward output (None if not run)."""
    tokens = math.prod(shape)
    estimate = estimate_bytes(name, tokens, args.batch, args.dim, args.heads)
    cell = Cell(name, shape, tokens, estimate / GIB)
    if estimate > args.max_memory_gb * GIB:
        cell.status = "oom"
        return cell, None
    torch.manual_seed(0)  # every MaSA-based row gets the same weights
    block = make_block(name, args.dim, len(shape), args.heads).to(device)
    x = torch.randn(args.batch, args.dim, *shape, device=device)
    functional.clear_cache()
    try:
        start = time.perf_counter()
        peak, out = peak_bytes(lambda: _fwd_bwd(block, x), device)
        warm_up = time.perf_counter() - start
        if warm_up > args.max_seconds:  # too slow to repeat: report the warm-up itself (reps = 0)
            cell.time_ms, cell.reps = 1000 * warm_up, 0
        else:
            cell.time_ms, cell.reps = time_ms(lambda: _fwd_bwd(block, x), device, args.reps, args.max_seconds)
    except RuntimeError as error:  # torch.OutOfMemoryError is one
        message = str(error).splitlines()[0]
        out_of_memory = "out of memory" in message.lower() or "can't allocate" in message.lower()
        cell.status, cell.detail = ("oom" if out_of_memory else "error"), message[:200]
        return cell, None
    finally:
        functional.clear_cache()
    cell.peak_mib = peak / MIB
    return cell, out


def find(cells: Sequence[Cell], block: str, shape: tuple[int, ...]) -> Cell | None:
    return next((c for c in cells if c.block == block and c.shape == shape and c.status == "ok"), None)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or denominator is None else numerator / denominator


def targets(cells: Sequence[Cell], max_diff: dict[tuple[int, ...], float]) -> list[Target]:
    """The design's figures: MaSA vs naive at 16^3, decomposed memory at 32^3, focused-linear scaling."""
    mid, large = (16, 16, 16), (32, 32, 32)
    masa, naive = find(cells, "masa", mid), find(cells, "masa_naive", mid)
    decomposed = find(cells, "masa_decomposed", large)
    linear_mid, linear_large = find(cells, "focused_linear", mid), find(cells, "focused_linear", large)

    def get(cell: Cell | None, key: str) -> float | None:
        return None if cell is None else getattr(cell, key)

    return [
        Target("MaSA speed-up over naive, 16³ (×)", ratio(get(naive, "time_ms"), get(masa, "time_ms")), ">=", 2.5),
        Target("MaSA / naive peak memory, 16³", ratio(get(masa, "peak_mib"), get(naive, "peak_mib")), "<=", 0.5),
        Target("max abs. difference MaSA vs naive output, 16³", max_diff.get(mid), "<=", 1e-5),
        Target("masa_decomposed peak, 32³ (GiB)", ratio(get(decomposed, "peak_mib"), 1024), "<", 2.0),
        Target(
            "focused_linear time 32³ / 16³", ratio(get(linear_large, "time_ms"), get(linear_mid, "time_ms")), "<=", 10
        ),
    ]


def _cell_text(cell: Cell, key: str) -> str:
    if cell.status == "oom":
        return f"OOM (est. {cell.estimate_gib:.1f} GB)"
    if cell.status == "error":
        return "error"
    value = getattr(cell, key)
    text = f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    return text + "*" if key == "time_ms" and cell.reps == 0 else text


def _table(cells: Sequence[Cell], rows: Sequence[str], shapes: Sequence[tuple[int, ...]], key: str) -> list[str]:
    header = ["block", *(f"{size_label(s)} ({math.prod(s):,})" for s in shapes)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        by_shape = {c.shape: c for c in cells if c.block == row}
        lines.append("| " + " | ".join([row, *(_cell_text(by_shape[s], key) for s in shapes)]) + " |")
    return lines


def to_markdown(report: dict[str, Any], cells: Sequence[Cell], shapes: Sequence[tuple[int, ...]]) -> str:
    meta = report["meta"]
    rows = list(dict.fromkeys(c.block for c in cells))
    lines = [
        "# Attention blocks: fwd+bwd time and peak memory",
        "",
        f"{meta['device']} ({meta['threads']} threads), torch {meta['torch']}; batch {meta['batch']}, "
        f"dim {meta['dim']}, {meta['heads']} heads, float32; columns are grids (tokens). Time: median of up to "
        f"{meta['reps']} runs after a warm-up (* = the warm-up alone, when it exceeded the {meta['max_seconds']:g} s "
        f"budget of a cell). Peak memory: allocator high-water mark during one fwd+bwd, above "
        f"parameters and input. OOM: analytic estimate over the {meta['max_memory_gb']:g} GB budget, not run.",
        "",
        "## fwd+bwd time (ms)",
        "",
        *_table(cells, rows, shapes, "time_ms"),
        "",
        "## peak memory (MiB)",
        "",
        *_table(cells, rows, shapes, "peak_mib"),
        "",
        "## targets",
        "",
        targets_markdown(report["targets"]),
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Measure every (block, size), print the markdown report, and write it (+ JSON) under ``--out``."""
    device = torch.device(args.device)
    sizes = QUICK_SIZES if args.quick else [s for item in args.sizes for s in item.split(",") if s]
    shapes = [parse_size(s) for s in sizes]
    if args.quick:
        args.reps = 1
    cells: list[Cell] = []
    max_diff: dict[tuple[int, ...], float] = {}
    for shape in shapes:
        outputs: dict[str, torch.Tensor] = {}
        for name in args.blocks:
            cell, out = measure(name, shape, args, device)
            cells.append(cell)
            if out is not None:
                outputs[name] = out
            print(f"{name:>16} {size_label(shape):>8}: {cell.status} {cell.time_ms or 0:.1f} ms", file=sys.stderr)
        if "masa" in outputs and "masa_naive" in outputs:
            max_diff[shape] = (outputs["masa"] - outputs["masa_naive"]).abs().max().item()
    report = {
        "meta": {
            "device": str(device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "batch": args.batch,
            "dim": args.dim,
            "heads": args.heads,
            "reps": args.reps,
            "max_seconds": args.max_seconds,
            "max_memory_gb": args.max_memory_gb,
        },
        "results": [asdict(c) for c in cells],
        "max_abs_diff_masa_vs_naive": [{"shape": list(s), "value": d} for s, d in max_diff.items()],
        "targets": [asdict(t) for t in targets(cells, max_diff)],
    }
    markdown = to_markdown(report, cells, shapes)
    print(markdown)
    write_report(args.out, "attention", markdown, report)
    return 0


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Register ``attention`` with :func:`medseg.benchmark.build_parser`."""
    parser = subparsers.add_parser(
        "attention",
        help="time and memory of every attention block",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes", nargs="+", default=list(DEFAULT_SIZES), help="grids, e.g. 16^3 64^2 5x7 (or comma-separated)"
    )
    parser.add_argument("--blocks", nargs="+", default=all_rows(), choices=all_rows(), help="rows to measure")
    parser.add_argument("--reps", type=int, default=3, help="timed runs per cell after the warm-up")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="time budget of a cell's timed runs")
    parser.add_argument("--max-memory-gb", type=float, default=8.0, help="skip cells estimated above this")
    parser.add_argument("--quick", action="store_true", help=f"tiny grids {QUICK_SIZES}, one rep (for tests)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="write attention.md and attention.json here")
    parser.set_defaults(func=run)
