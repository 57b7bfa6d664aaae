"""``benchmark.py attention``: fwd+bwd time and peak memory of every attention block over token counts.

Per (block, grid) it runs the attention module alone, ``build_attention(name, dim, spatial_dims,
num_heads=heads)``, on a ``(batch, dim, *grid)`` float32 input: forward (under ``--precision``'s autocast,
as training runs it; fp32 by default), then ``out.sum().backward()`` (parameter gradients included). Extra
rows share MaSA's projections and LCE and differ only in the attention op: ``masa_naive``, the seed's form
(materialise the softmax, multiply by the decay matrix, renormalise), and ``sdpa``, plain unmasked fused
attention: the floor of what any global attention costs. ``masa_sdpa_bias`` (run only when ``--blocks``
names it) is fused SDPA with the dense decay bias, the path ``masa`` takes without FlexAttention: on CUDA
the reference its FlexAttention output is compared with (``max_abs_diff_masa_vs_sdpa_bias``).

* Time: one warm-up (the memory run below), then the median of up to ``--reps`` timed runs; a cell stops
  early when the next run would take it past ``--max-seconds``. When the warm-up alone exceeds
  ``--max-seconds`` its own time is reported (``reps = 0``, marked ``*``).
* Peak memory (:func:`benchmarks.common.peak_bytes`) during one fwd+bwd: on CUDA the allocator's high-water mark
  above the allocation before the run, on the CPU the allocator events ``torch.profiler`` records. Parameters and
  the input exist beforehand and are not counted; MaSA's bias cache is cleared first, so the bias it builds is.
* A cell whose analytic estimate (:func:`estimate_bytes`) exceeds ``--max-memory-gb`` is not run and
  reads ``OOM (est. X GB)``; a real out-of-memory ``RuntimeError`` is reported the same way.

``--maps`` measures instead what :mod:`medseg.models.inspect` adds to a forward pass: per registered block
and grid (batch 1), the peak memory (as above) and the time of one query's
:meth:`~medseg.attention.common.SpatialAttention.attention_row` (the centre token) from ``(1, N, dim)`` q and k,
the tensors the forward pass hands to the hook anyway; it writes ``attention_maps.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import (
    MIB,
    Target,
    add_results_argument,
    peak_bytes,
    ratio,
    size_label,
    targets_markdown,
    time_ms,
    write_report,
)
from medseg.attention import available_blocks, build_attention, functional
from medseg.attention.common import dense_bias_bytes
from medseg.attention.masa import MaSA
from medseg.attention.position import axis_scales
from medseg.runtime.device import PRECISIONS, amp_dtype, autocast
from medseg.tables import markdown_table

DEFAULT_SIZES = ("8^3", "16^3", "24^3", "32^3", "32^2", "64^2", "128^2")
QUICK_SIZES = ("4^3", "6^2")
GIB = 2**30

LINEAR_COPIES = 40
"""Estimate: float32 copies of a ``(batch, N, dim)`` activation alive at the peak of any block's fwd+bwd."""
NAIVE_COPIES = 7
"""Estimate: ``(batch, heads, N, N)`` float32 matrices alive in the naive form (measured 6.8 at 16^3)."""


def _log_decay(q: torch.Tensor, spatial_shape: Sequence[int], gamma: functional.Gamma,
               spacing: Sequence[float] | None) -> torch.Tensor:
    """MaSA's dense ``log(gamma) * dist`` bias ``(1, G, N, N)`` for ``q`` ``(B, heads, N, d)`` on its grid."""
    shape = tuple(spatial_shape)
    return functional.decay_bias(shape, axis_scales(len(shape), spacing), functional.log_gammas(gamma, q.shape[1]),
                                 q.device, q.dtype)


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
    log_decay = _log_decay(q, spatial_shape, gamma, spacing)
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


def sdpa_bias_masa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spatial_shape: Sequence[int],
    gamma: functional.Gamma,
    *,
    spacing: Sequence[float] | None = None,
) -> torch.Tensor:
    """MaSA as fused SDPA with the dense decay bias, on every device (``masa`` takes FlexAttention on CUDA)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_log_decay(q, spatial_shape, gamma, spacing))


class NaiveMaSA(MaSA):
    """MaSA with the seed's materialised attention (:func:`naive_masa`)."""

    attention = staticmethod(naive_masa)


class UnmaskedSDPA(MaSA):
    """MaSA's projections and LCE around unmasked SDPA (:func:`unmasked_sdpa`)."""

    attention = staticmethod(unmasked_sdpa)


class SdpaBiasMaSA(MaSA):
    """MaSA with the SDPA-bias path forced (:func:`sdpa_bias_masa`)."""

    attention = staticmethod(sdpa_bias_masa)


REFERENCES: dict[str, type[MaSA]] = {"masa_naive": NaiveMaSA, "sdpa": UnmaskedSDPA, "masa_sdpa_bias": SdpaBiasMaSA}
OPT_IN_ROWS = ("masa_sdpa_bias",)
"""Rows run only when ``--blocks`` names them: off CUDA ``masa`` itself takes the SDPA-bias path."""
DIFF_REFERENCES = {"masa_naive": "max_abs_diff_masa_vs_naive", "masa_sdpa_bias": "max_abs_diff_masa_vs_sdpa_bias"}
"""Rows whose outputs ``masa``'s is compared with, per grid, and the report's key of that maximum difference."""


def all_rows() -> list[str]:
    """Registered blocks, then the reference rows."""
    return [*available_blocks(), *REFERENCES]


def default_rows() -> list[str]:
    """The rows measured when ``--blocks`` is not given: :func:`all_rows` but the opt-in ones."""
    return [row for row in all_rows() if row not in OPT_IN_ROWS]


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


def estimate_bytes(name: str, shape: tuple[int, ...], batch: int, dim: int, heads: int, bias_heads: int) -> int:
    """Rough float32 peak of one fwd+bwd: linear activations, the block's dense bias (``bias_heads`` planes,
    :func:`~medseg.attention.common.dense_bias_bytes`, the U-Net's build check) and the naive form's matrices."""
    tokens = math.prod(shape)
    naive = NAIVE_COPIES * batch * heads * tokens**2 if name == "masa_naive" else 0
    return 4 * (LINEAR_COPIES * batch * tokens * dim + naive) + dense_bias_bytes(shape, bias_heads)


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


def _fwd_bwd(block: nn.Module, x: torch.Tensor, amp: torch.dtype | None) -> torch.Tensor:
    block.zero_grad(set_to_none=True)
    with autocast(x.device, amp):
        out = block(x)
    if out.requires_grad:  # a block without parameters (identity) has no backward pass of its own
        out.sum().backward()
    return out.detach()


def measure(
    name: str, shape: tuple[int, ...], args: argparse.Namespace, device: torch.device
) -> tuple[Cell, torch.Tensor | None]:
    """Time and peak memory of one block at one grid; also returns its forward output (None if not run)."""
    tokens = math.prod(shape)
    torch.manual_seed(0)  # every MaSA-based row gets the same weights
    block = make_block(name, args.dim, len(shape), args.heads)
    estimate = estimate_bytes(name, shape, args.batch, args.dim, args.heads, block.bias_heads)
    cell = Cell(name, shape, tokens, estimate / GIB)
    if estimate > args.max_memory_gb * GIB:
        cell.status = "oom"
        return cell, None
    block = block.to(device)
    x = torch.randn(args.batch, args.dim, *shape, device=device)
    amp = amp_dtype(args.precision, device)
    functional.clear_cache()
    try:
        start = time.perf_counter()
        peak, out = peak_bytes(lambda: _fwd_bwd(block, x, amp), device)
        warm_up = time.perf_counter() - start
        if warm_up > args.max_seconds:  # too slow to repeat: report the warm-up itself (reps = 0)
            cell.time_ms, cell.reps = 1000 * warm_up, 0
        else:
            cell.time_ms, cell.reps = time_ms(lambda: _fwd_bwd(block, x, amp), device, args.reps, args.max_seconds)
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


def _table(cells: Sequence[Cell], shapes: Sequence[tuple[int, ...]], key: str) -> str:
    """The markdown table of one measurement (``time_ms`` or ``peak_mib``): a row per block, a column per grid."""
    columns = [f"{size_label(s)} ({math.prod(s):,})" for s in shapes]
    by_block: dict[str, dict[tuple[int, ...], Cell]] = {}
    for cell in cells:
        by_block.setdefault(cell.block, {})[cell.shape] = cell
    rows = [[block, *(by_shape.get(s) for s in shapes)] for block, by_shape in by_block.items()]
    return markdown_table(["block", *columns], rows, formats=dict.fromkeys(columns, lambda c: _cell_text(c, key)),
                          align="<" + ">" * len(shapes))


def to_markdown(report: dict[str, Any], cells: Sequence[Cell], shapes: Sequence[tuple[int, ...]]) -> str:
    meta = report["meta"]
    lines = [
        "# Attention blocks: fwd+bwd time and peak memory",
        "",
        f"{meta['device']} ({meta['threads']} threads), torch {meta['torch']}; batch {meta['batch']}, "
        f"dim {meta['dim']}, {meta['heads']} heads, {meta['precision']}; columns are grids (tokens). Time: "
        f"median of up to {meta['reps']} runs after a warm-up (* = the warm-up alone, when it exceeded the "
        f"{meta['max_seconds']:g} s budget of a cell). Peak memory: allocator high-water mark during one fwd+bwd, "
        f"above parameters and input. OOM: analytic estimate over the {meta['max_memory_gb']:g} GB budget, not run.",
        "",
        "## fwd+bwd time (ms)",
        "",
        _table(cells, shapes, "time_ms"),
        "",
        "## peak memory (MiB)",
        "",
        _table(cells, shapes, "peak_mib"),
        "",
        "## targets",
        "",
        targets_markdown(report["targets"]),
    ]
    return "\n".join(lines) + "\n"


MAPS_TARGET_MIB = 100.0
"""``--maps``: the most one query's attention rows may add to a forward pass at a 32³ grid."""


def measure_rows(name: str, shape: tuple[int, ...], args: argparse.Namespace, device: torch.device) -> Cell:
    """Peak memory and time of block ``name``'s attention row for the centre token of ``shape``."""
    tokens = math.prod(shape)
    torch.manual_seed(0)
    block = build_attention(name, args.dim, len(shape), num_heads=args.heads).to(device)
    q, k = (torch.randn(1, tokens, args.dim, device=device) for _ in range(2))
    index = tokens // 2

    def row() -> object:
        with torch.no_grad():
            return block.attention_row(q, k, shape, index)

    cell = Cell(name, shape, tokens, estimate_gib=0.0)
    try:
        peak, _ = peak_bytes(row, device)
        cell.time_ms, cell.reps = time_ms(row, device, args.reps, args.max_seconds)
    except NotImplementedError as error:  # a block without attention rows
        cell.status, cell.detail = "error", str(error)
        return cell
    cell.peak_mib = peak / MIB
    return cell


def run_maps(args: argparse.Namespace, shapes: Sequence[tuple[int, ...]], device: torch.device) -> int:
    """``--maps``: :func:`measure_rows` for every registered block and grid; print and write the report."""
    cells = [measure_rows(name, shape, args, device) for shape in shapes for name in args.blocks
             if name in available_blocks()]
    large = [c.peak_mib for c in cells if c.shape == (32, 32, 32)]
    target = Target("largest attention-row peak of a block, 32³ (MiB)", max(large) if large and None not in large
                    else None, "<", MAPS_TARGET_MIB)
    report = {
        "meta": {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
                 "dim": args.dim, "heads": args.heads, "reps": args.reps},
        "results": [asdict(c) for c in cells],
        "targets": [asdict(target)],
    }
    lines = [
        "# Attention maps: memory and time of one query's attention rows",
        "",
        f"{device} ({torch.get_num_threads()} threads), torch {torch.__version__}; dim {args.dim}, {args.heads} "
        f"heads, batch 1; columns are grids (tokens). Peak: allocator high-water mark while the row of the centre "
        f"token is computed from the forward pass's q and k, i.e. what the maps add to a forward pass (a dense "
        f"N×N float32 matrix would need N²·4 bytes per head: 4 GiB at 32³). Time: median of up to {args.reps} runs.",
        "",
        "## peak memory (MiB)",
        "",
        _table(cells, shapes, "peak_mib"),
        "",
        "## time (ms)",
        "",
        _table(cells, shapes, "time_ms"),
        "",
        "## targets",
        "",
        targets_markdown(report["targets"]),
    ]
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    write_report(args.out, "attention_maps", markdown, report, args, device)
    return 0


def run(args: argparse.Namespace) -> int:
    """Measure every (block, size), print the markdown report, and write it (+ JSON) under ``--out``."""
    device = torch.device(args.device)
    sizes = QUICK_SIZES if args.quick else [s for item in args.sizes for s in item.split(",") if s]
    shapes = [parse_size(s) for s in sizes]
    if args.quick:
        args.reps = 1
    if args.maps:
        return run_maps(args, shapes, device)
    cells: list[Cell] = []
    max_diff: dict[str, dict[tuple[int, ...], float]] = {reference: {} for reference in DIFF_REFERENCES}
    for shape in shapes:
        outputs: dict[str, torch.Tensor] = {}
        for name in args.blocks:
            cell, out = measure(name, shape, args, device)
            cells.append(cell)
            if out is not None:
                outputs[name] = out
            print(f"{name:>16} {size_label(shape):>8}: {cell.status} {cell.time_ms or 0:.1f} ms", file=sys.stderr)
        for reference in DIFF_REFERENCES:
            if "masa" in outputs and reference in outputs:
                max_diff[reference][shape] = (outputs["masa"].float() - outputs[reference].float()).abs().max().item()
    report = {
        "meta": {
            "device": str(device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "batch": args.batch,
            "dim": args.dim,
            "heads": args.heads,
            "precision": args.precision,
            "reps": args.reps,
            "max_seconds": args.max_seconds,
            "max_memory_gb": args.max_memory_gb,
        },
        "results": [asdict(c) for c in cells],
        **{key: [{"shape": list(s), "value": d} for s, d in max_diff[reference].items()]
           for reference, key in DIFF_REFERENCES.items()},
        "targets": [asdict(t) for t in targets(cells, max_diff["masa_naive"])],
    }
    markdown = to_markdown(report, cells, shapes)
    print(markdown)
    write_report(args.out, "attention", markdown, report, args, device)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``benchmark.py attention``'s arguments."""
    parser.add_argument(
        "--sizes", nargs="+", default=list(DEFAULT_SIZES), help="grids, e.g. 16^3 64^2 5x7 (or comma-separated)"
    )
    parser.add_argument("--blocks", nargs="+", default=default_rows(), choices=all_rows(), help="rows to measure")
    parser.add_argument("--reps", type=int, default=3, help="timed runs per cell after the warm-up")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="time budget of a cell's timed runs")
    parser.add_argument("--max-memory-gb", type=float, default=8.0, help="skip cells estimated above this")
    parser.add_argument("--quick", action="store_true", help=f"tiny grids {QUICK_SIZES}, one rep (for tests)")
    parser.add_argument("--maps", action="store_true",
                        help="measure one query's attention rows (medseg.models.inspect) instead of fwd+bwd")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--precision", choices=[p for p in PRECISIONS if p != "auto"], default="fp32",
                        help="autocast of the forward pass (bf16, fp16) or none (fp32)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="write attention.md and attention.json here")
    add_results_argument(parser)
