"""The plan report ``scripts/plan.py`` prints: the fingerprint's key statistics and the plan, as text tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from medseg.config import PlanCommandConfig
from medseg.data.datalist import dataset_from_config
from medseg.planning.fingerprint import case_array
from medseg.planning.from_config import apply_plan, dataset_fingerprint, plan_from_config, plannable_values
from medseg.planning.memory import MemoryEstimate
from medseg.planning.nnunet_plans import comparison_text, read_nnunet_plans
from medseg.planning.plan import Plan, axes_in_use, bytes_text, total_stride
from medseg.planning.plan_file import write_plan_file
from medseg.tables import CellFormat, text_table

AXIS_NAMES = ("R", "A", "S")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]],
           formats: Mapping[str, CellFormat] | None = None) -> list[str]:
    """The lines of an indented report table: numbers as :func:`_num` writes them (or by ``formats``), None as -."""
    formats = {**dict.fromkeys(header, _num), **(formats or {})}
    return text_table(header, rows, formats=formats, missing="-", indent="  ").splitlines()


def _num(value: Any) -> str:
    """Compact text of a number or a nested list of numbers."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_num(v) for v in value) + "]"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_plan(plan: Plan, fingerprint: Mapping[str, Any]) -> str:
    """A readable report (text) of the key fingerprint statistics and the plan."""
    return "\n".join([*_fingerprint_lines(fingerprint), "", *_plan_lines(plan)])


def _fingerprint_lines(fingerprint: Mapping[str, Any]) -> list[str]:
    """The report's lines on the dataset: its cases and files, spacing and shape, intensities and classes."""
    spacings, shapes = case_array(fingerprint, "spacing"), case_array(fingerprint, "shape")
    orientations: dict[str, int] = {}
    for case in fingerprint["cases"]:
        orientations[case["orientation"]] = orientations.get(case["orientation"], 0) + 1
    lines = [f"dataset {fingerprint['name']}: {fingerprint['num_cases']} cases, channels "
             f"{', '.join(fingerprint['channel_names'])}; files "
             f"{', '.join(f'{k} x{n}' for k, n in orientations.items())}", "", "fingerprint (RAS axes)"]
    lines += _table(["", *AXIS_NAMES], [
        ["spacing median (mm)", *np.median(spacings, axis=0)],
        ["spacing min (mm)", *spacings.min(axis=0)],
        ["spacing max (mm)", *spacings.max(axis=0)],
        ["shape median (voxels)", *(int(n) for n in np.median(shapes, axis=0))],
        ["shape min (voxels)", *(int(n) for n in shapes.min(axis=0))],
        ["shape max (voxels)", *(int(n) for n in shapes.max(axis=0))],
    ])
    lines += ["", "foreground intensity"]
    lines += _table(["channel", "mean", "std", "min", "max", "p0.5", "p99.5"], [
        [name, *((None,) * 6 if s is None else (s["mean"], s["std"], s["min"], s["max"],
                                                 s["percentile_00_5"], s["percentile_99_5"]))]
        for name, s in zip(fingerprint["channel_names"], fingerprint["intensity"])
    ])
    total = max(sum(fingerprint["class_voxels"]), 1)
    lines += ["", "classes"]
    lines += _table(["class", "voxels", "share"], [
        [f"{k} {fingerprint['labels'].get(str(k), '')}", n, n / total]
        for k, n in enumerate(fingerprint["class_voxels"])
    ], formats={"share": ".2%"})
    return lines


def _plan_lines(plan: Plan) -> list[str]:
    """The report's lines on the plan: per-axis geometry, normalisation, widths, budget and memory."""
    axes = axes_in_use(plan.spatial_dims, plan.slice_axis)
    lines = [f"plan ({plan.spatial_dims}D; thick axis {AXIS_NAMES[plan.slice_axis]})"]
    lines += _table(["", *(AXIS_NAMES[a] for a in axes)], [
        ["target spacing (mm)", *(plan.target_spacing[a] for a in axes)],
        ["median shape (resampled)", *plan.median_shape],
        ["patch size (voxels)", *plan.patch_size],
        *[[f"stride level {i + 1}", *level] for i, level in enumerate(plan.strides)],
        ["total stride", *total_stride(plan.strides, plan.spatial_dims)],
    ])
    norm = plan.normalization
    details = ", ".join(f"{k}={_num(v)}" for k, v in norm.items() if k != "scheme")
    lines += ["", f"normalization: {norm['scheme']}" + (f" ({details})" if details else ""),
              f"channels: {_num(plan.channels)} ({len(plan.channels)} levels)",
              f"patch voxels: {int(np.prod(plan.patch_size)):,}"
              + (f", fit to {plan.budget}" if plan.budget else " (data.patch_size)")]
    if plan.target is not None:
        lines.append(f"planned for: {plan.target.text()}")
    if plan.memory is not None:
        lines.append(f"training memory (estimate): {memory_text(plan.memory)}")
    lines.append(f"resampled dataset: {bytes_text(plan.dataset_bytes)} (float32 images and labels)")
    return lines


def memory_text(estimate: MemoryEstimate) -> str:
    """One line of an estimate: the step's total, and its parts."""
    shared = f", dense attention bias {bytes_text(estimate.shared)}" if estimate.shared else ""
    return (f"{bytes_text(estimate.total)} per training step: {estimate.batch} patches x "
            f"{bytes_text(estimate.per_sample)} per sample, weights, gradients and optimizer state "
            f"{bytes_text(estimate.states)}{shared}")


def plan_report(cfg: PlanCommandConfig) -> str:
    """The fingerprint-and-plan report of ``scripts/plan.py``: ``cfg.data`` planned for ``cfg.model``, the
    training ``cfg.trainer`` describes and the machine of ``cfg.plan`` (:func:`plan_from_config`, as
    training plans), compared with ``cfg.nnunet_plans`` when given; the plan is written to ``plan.file`` when
    that is set."""
    data, model = cfg.data, cfg.model
    info = dataset_from_config(data)
    fingerprint = dataset_fingerprint(info, data, cfg.progress)
    plan = plan_from_config(fingerprint, data, model, cfg.trainer, cfg.plan)
    text = format_plan(plan, fingerprint)
    if cfg.nnunet_plans:
        nnunet = read_nnunet_plans(cfg.nnunet_plans, model.spatial_dims, cfg.plan.nnunet_configuration)
        text += "\n" + comparison_text(plan, nnunet, cfg.nnunet_plans)
    kept = [f"{key}={value}" for key, value in plannable_values(data, model).items() if value is not None]
    if kept:
        text += f"\nkept from the config (set them to null to plan them): {'; '.join(kept)}"
    if cfg.plan.file:
        resolved = plannable_values(*apply_plan(data, model, plan))
        path = write_plan_file(cfg.plan.file, plan, resolved, fingerprint)
        text += f"\nplan written to {path}: train from it with plan.file={cfg.plan.file}"
    return text
