"""A plan as a file, like nnU-Net's plans.json: written by ``scripts/plan.py plan.file=PATH`` on one machine, trained
from by ``scripts/train.py plan.file=PATH`` on another.

The file holds the resolved plannable keys (:func:`medseg.planning.from_config.plannable_values`), the machine the
plan is for (:class:`~medseg.planning.plan.PlanTarget`), what its patch was fit to, and a digest of the dataset
fingerprint it was planned from (:func:`fingerprint_digest`: the cases' spacings and shapes, channels, classes and
intensities, not their paths, so the same data under another root matches). Reading checks the digest and the
network's dimensions, so a plan never trains on data or a network it was not made for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from medseg.config import DataConfig, ModelConfig, PlanningConfig
from medseg.errors import ConfigError
from medseg.io import atomic_write_json
from medseg.planning.from_config import fill_unset
from medseg.planning.plan import Plan, PlanTarget
from medseg.version import __version__

PLAN_FORMAT = "medseg-plan"
"""The ``format`` entry of every plan file."""
PLAN_FILE_VERSION = 1
"""Bumped when the file's content changes; an older or newer file is refused."""
DIGESTED_KEYS = ("channel_names", "labels", "is_ct", "intensity", "class_voxels")
"""The fingerprint's dataset-level entries a plan depends on, digested with each case's spacing and shape."""


def fingerprint_digest(fingerprint: Mapping[str, Any]) -> str:
    """SHA-256 of what planning reads from a fingerprint: its cases' spacings and shapes (in order) and
    :data:`DIGESTED_KEYS`. File paths, sizes and times are left out: the same cases elsewhere give the same digest."""
    content = {key: fingerprint[key] for key in DIGESTED_KEYS}
    content["cases"] = [[case["spacing"], case["shape"]] for case in fingerprint["cases"]]
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class PlanFile:
    """A plan file's content."""

    values: dict[str, Any]
    """``{"data.spacing": ..., "data.patch_size": ..., "data.normalization": ..., "model.strides": ...,
    "model.channels": ...}``, resolved."""
    spatial_dims: int
    target: PlanTarget
    budget: str
    """What the patch was fit to, in words ("" for a patch set in the config)."""
    dataset: str
    """The dataset's name."""
    digest: str
    """:func:`fingerprint_digest` of the fingerprint it was planned from."""


def write_plan_file(path: str | Path, plan: Plan, values: Mapping[str, Any], fingerprint: Mapping[str, Any]) -> Path:
    """Atomically write ``plan`` as a plan file at ``path``; ``values`` are the configs' plannable keys with the plan
    applied (:func:`~medseg.planning.from_config.plannable_values` after
    :func:`~medseg.planning.from_config.apply_plan`)."""
    if plan.target is None:
        raise ValueError("a plan file needs the plan's target (plan_from_config)")
    content = {
        "format": PLAN_FORMAT, "version": PLAN_FILE_VERSION, "medseg": __version__,
        "dataset": fingerprint["name"], "fingerprint_digest": fingerprint_digest(fingerprint),
        "spatial_dims": plan.spatial_dims, "planned_for": plan.target.as_dict(), "budget": plan.budget,
        "values": dict(values),
        "estimated_memory_mb": None if plan.memory is None else round(plan.memory.total / 2**20, 1),
    }
    return atomic_write_json(Path(path).expanduser(), content)


def read_plan_file(path: str | Path, fingerprint: Mapping[str, Any], spatial_dims: int) -> PlanFile:
    """The plan file at ``path``, checked against the dataset it is to train on.

    Raises:
        ConfigError: no such file, not a medseg plan file (or another version of one), planned for another dataset
            (the fingerprints differ) or for a network of other dimensions; the message names ``plan.file``.
    """
    where = f"plan.file={path}"
    try:
        content = json.loads(Path(path).expanduser().read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file; write it with `python scripts/plan.py data=... {where}`") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{where}: not readable as JSON ({err})") from None
    if not isinstance(content, dict) or content.get("format") != PLAN_FORMAT:
        raise ConfigError(f"{where}: not a medseg plan file (no \"format\": \"{PLAN_FORMAT}\")")
    if content.get("version") != PLAN_FILE_VERSION:
        raise ConfigError(f"{where}: plan file version {content.get('version')}, this medseg reads version "
                          f"{PLAN_FILE_VERSION}; plan again with scripts/plan.py")
    if content["fingerprint_digest"] != fingerprint_digest(fingerprint):
        raise ConfigError(f"{where}: planned for dataset {content['dataset']!r} with other cases, spacings, shapes or "
                          f"intensities than {fingerprint['name']!r} has now; plan again with scripts/plan.py")
    if content["spatial_dims"] != spatial_dims:
        raise ConfigError(f"{where}: planned for a {content['spatial_dims']}D network, model.spatial_dims="
                          f"{spatial_dims}")
    record = content["planned_for"]
    memory = None if record["memory_gb"] is None else int(round(record["memory_gb"] * 2**30))
    target = PlanTarget(record["device"], record["precision"], memory, f"{where}: {record['source']}")
    return PlanFile(values=dict(content["values"]), spatial_dims=content["spatial_dims"], target=target,
                    budget=content["budget"], dataset=content["dataset"], digest=content["fingerprint_digest"])


def apply_plan_file(data: DataConfig, model: ModelConfig, planning: PlanningConfig,
                    plan_file: PlanFile) -> tuple[DataConfig, ModelConfig, PlanningConfig]:
    """Copies of the configs with their null plannable keys taken from ``plan_file`` (keys set in the config win), and
    the ``plan`` node set to the file's device, precision and budget, so that the training memory is estimated for
    the machine the file was planned for."""
    data, model = fill_unset(data, model, plan_file.values)
    target = plan_file.target
    memory_gb = None if target.memory_bytes is None else target.memory_bytes / 2**30
    return data, model, replace(planning, device=target.device, precision=target.precision, memory_gb=memory_gb)
