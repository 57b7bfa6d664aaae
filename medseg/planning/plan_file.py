"""A plan as a file, like nnU-Net's plans.json: written by ``scripts/plan.py plan.file=PATH`` on one machine, trained
from by ``scripts/train.py plan.file=PATH`` on another.

The file holds the resolved plannable keys (:func:`medseg.planning.from_config.plannable_values`), the machine the
plan is for (:class:`~medseg.planning.plan.PlanTarget`), what its patch was fit to, and a digest of the dataset
fingerprint it was planned from (:func:`fingerprint_digest`: the cases' spacings and shapes, channels, classes and
intensities, not their paths, so the same data under another root matches). Reading checks the digest and the
network's dimensions, so a plan never trains on data or a network it was not made for; a key it lacks or does not
know is refused in one line naming the key and the file, and its values pass the command line's checks when the run
applies them (:func:`medseg.training.planning.with_plan_file`).

``plan.file`` may also name nnU-Net's plans file (``nnUNetPlans.json``, ``nnUNetResEncUNetMPlans.json``, ...): its
configuration ``plan.nnunet_configuration`` is read into the same keys, in RAS order, and what medseg builds
otherwise is named (:func:`medseg.planning.nnunet_plans.nnunet_values`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from medseg.config import DataConfig, ModelConfig, PlanningConfig
from medseg.errors import ConfigError
from medseg.io import atomic_write_json
from medseg.models.nnunet_stages import NNUNET_FROM_PLAN
from medseg.planning.from_config import fill_unset, plannable_values
from medseg.planning.nnunet_plans import (
    CONFIGURATIONS,
    is_nnunet_plans,
    load_plans,
    memory_target_gb,
    nnunet_values,
    read_configuration,
)
from medseg.planning.plan import Plan, PlanTarget
from medseg.version import __version__

PLAN_FORMAT = "medseg-plan"
"""The ``format`` entry of every plan file."""
PLAN_FILE_VERSION = 1
"""Bumped when the file's content changes; an older or newer file is refused."""
DIGESTED_KEYS = ("channel_names", "labels", "is_ct", "intensity", "class_voxels")
"""The fingerprint's dataset-level entries a plan depends on, digested with each case's spacing and shape."""
FILE_KEYS = ("format", "version", "medseg", "dataset", "fingerprint_digest", "spatial_dims", "planned_for", "budget",
             "values", "estimated_memory_mb")
"""The entries of a plan file, every one required."""
TARGET_KEYS = ("device", "precision", "memory_gb", "source")
"""The entries of a plan file's ``planned_for`` (:meth:`~medseg.planning.plan.PlanTarget.as_dict`)."""
VALUE_KEYS = tuple(plannable_values(DataConfig(), ModelConfig()))
"""The entries of a plan file's ``values``: the plannable keys."""
NETWORK_KEYS = ("model.conv_stages", "model.kernel_size", "model.encoder_blocks", "model.decoder_convs")
"""What an nnU-Net plan sets beyond :data:`VALUE_KEYS`: keys with a default rather than null, taken from the plan
where the config keeps the default."""


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
    """:func:`fingerprint_digest` of the fingerprint it was planned from ("" for nnU-Net's plans)."""
    notes: tuple[str, ...] = field(default=())
    """What the plan holds that medseg builds otherwise (nnU-Net's plans), one sentence each: the run warns."""


def write_plan_file(path: str | Path, plan: Plan, values: Mapping[str, Any], fingerprint: Mapping[str, Any]) -> Path:
    """Atomically write ``plan`` as a plan file at ``path``; ``values`` are the configs' plannable keys with the plan
    applied (:func:`~medseg.planning.from_config.plannable_values` after
    :func:`~medseg.planning.from_config.apply_plan`).

    Raises:
        ConfigError: ``path`` is nnU-Net's plans file.
    """
    if plan.target is None:
        raise ValueError("a plan file needs the plan's target (plan_from_config)")
    path = Path(path).expanduser()
    if path.is_file() and is_nnunet_plans(load_plans(path, f"plan.file={path}")):
        raise ConfigError(f"plan.file={path}: nnU-Net's plans file, which scripts/plan.py would overwrite with "
                          "medseg's plan; choose another plan.file (train.py reads nnU-Net's plans from plan.file)")
    content = {
        "format": PLAN_FORMAT, "version": PLAN_FILE_VERSION, "medseg": __version__,
        "dataset": fingerprint["name"], "fingerprint_digest": fingerprint_digest(fingerprint),
        "spatial_dims": plan.spatial_dims, "planned_for": plan.target.as_dict(), "budget": plan.budget,
        "values": dict(values),
        "estimated_memory_mb": None if plan.memory is None else round(plan.memory.total / 2**20, 1),
    }
    return atomic_write_json(path, content)


def _check_keys(entries: Mapping[str, Any], expected: Collection[str], what: str, where: str) -> None:
    """Refuse an entry of ``entries`` that ``expected`` lacks (naming the nearest expected ones) or an expected one
    that ``entries`` lacks, in one line naming the key, ``what`` holds it and the file."""
    unknown = next((key for key in entries if key not in expected), None)
    if unknown is not None:
        near = difflib.get_close_matches(unknown, expected, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise ConfigError(f"{where}: unknown key {unknown!r} in {what}{hint} A plan file holds {', '.join(expected)} "
                          f"there; plan again with scripts/plan.py")
    missing = next((key for key in expected if key not in entries), None)
    if missing is not None:
        raise ConfigError(f"{where}: {what} lacks {missing!r} (a plan file holds {', '.join(expected)} there); plan "
                          f"again with scripts/plan.py")


def read_plan_file(path: str | Path, fingerprint: Mapping[str, Any], spatial_dims: int,
                   nnunet_configuration: str | None = None) -> PlanFile:
    """The plan file at ``path``, checked against the dataset it is to train on: medseg's, or nnU-Net's plans file
    whose configuration ``nnunet_configuration`` (None: ``3d_fullres`` in 3D, ``2d`` in 2D) is read
    (:func:`read_nnunet_plan`).

    Raises:
        ConfigError: no such file, not a plan file (or another version of one), a key it lacks or does not know, planned
            for another dataset (the fingerprints differ) or for a network of other dimensions; the message names
            ``plan.file``. For nnU-Net's plans: see :func:`read_nnunet_plan`.
    """
    where = f"plan.file={path}"
    content = load_plans(path, where) if Path(path).expanduser().is_file() else None
    if content is None:
        raise ConfigError(f"{where}: no such file; write it with `python scripts/plan.py data=... {where}`")
    if is_nnunet_plans(content):
        return read_nnunet_plan(content, nnunet_configuration, fingerprint, spatial_dims, where)
    if not isinstance(content, dict) or content.get("format") != PLAN_FORMAT:
        raise ConfigError(f"{where}: not a medseg plan file (no \"format\": \"{PLAN_FORMAT}\") nor nnU-Net's plans "
                          "(no \"configurations\")")
    if nnunet_configuration is not None:
        raise ConfigError(f"plan.nnunet_configuration={nnunet_configuration} names a configuration of nnU-Net's "
                          f"plans; {where} is a medseg plan file: drop plan.nnunet_configuration")
    if content.get("version") != PLAN_FILE_VERSION:
        raise ConfigError(f"{where}: plan file version {content.get('version')}, this medseg reads version "
                          f"{PLAN_FILE_VERSION}; plan again with scripts/plan.py")
    _check_keys(content, FILE_KEYS, "the file", where)
    for key, expected in (("planned_for", TARGET_KEYS), ("values", VALUE_KEYS)):
        if not isinstance(content[key], dict):
            raise ConfigError(f"{where}: {key!r} is not a mapping")
        _check_keys(content[key], expected, repr(key), where)
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


def read_nnunet_plan(plans: Mapping[str, Any], configuration: str | None, fingerprint: Mapping[str, Any],
                     spatial_dims: int, where: str) -> PlanFile:
    """Configuration ``configuration`` (None: :data:`~medseg.planning.nnunet_plans.CONFIGURATIONS`'s for
    ``spatial_dims``) of nnU-Net's plans ``plans`` as a :class:`PlanFile`: its values in RAS order
    (:func:`~medseg.planning.nnunet_plans.nnunet_values`), planned for a CUDA GPU in fp16 (nnU-Net's autocast) with
    its planner's memory target.

    Raises:
        ConfigError: see :func:`~medseg.planning.nnunet_plans.read_configuration` and
            :func:`~medseg.planning.nnunet_plans.nnunet_values`; the message names ``plan.file`` (or
            ``plan.nnunet_configuration``).
    """
    name = configuration or CONFIGURATIONS[spatial_dims]
    config = read_configuration(plans, name, spatial_dims, f"{where} plan.nnunet_configuration={name}")
    values, notes = nnunet_values(plans, config, fingerprint, where)
    memory_gb = memory_target_gb(plans)
    planner = plans.get("experiment_planner_used", "nnU-Net's planner")
    target = PlanTarget("cuda", "fp16", int(memory_gb * 2**30),
                        f"{where}: nnU-Net's {name} of {plans.get('plans_name', 'its plans')}, {planner}'s "
                        f"{memory_gb:g} GB target")
    return PlanFile(values=values, spatial_dims=spatial_dims, target=target, budget="", notes=tuple(notes),
                    dataset=str(plans.get("dataset_name", "")), digest="")


def apply_plan_file(data: DataConfig, model: ModelConfig, planning: PlanningConfig,
                    plan_file: PlanFile) -> tuple[DataConfig, ModelConfig, PlanningConfig]:
    """Copies of the configs with their null plannable keys taken from ``plan_file`` (keys set in the config win), and
    the ``plan`` node set to the file's device, precision and budget, so that the training memory is estimated for
    the machine the file was planned for. The :data:`NETWORK_KEYS` of nnU-Net's plans are taken where the model config
    holds the schema's default, and all of them with ``model.conv_stages=nnunet`` (nnU-Net's network, the plan's
    class)."""
    data, model = fill_unset(data, model, plan_file.values)
    defaults = ModelConfig()
    from_plan = model.conv_stages == NNUNET_FROM_PLAN
    network = {name: value for name, value in ((key.split(".")[1], value) for key, value in plan_file.values.items()
                                               if key in NETWORK_KEYS)
               if from_plan or getattr(model, name) == getattr(defaults, name)}
    target = plan_file.target
    memory_gb = None if target.memory_bytes is None else target.memory_bytes / 2**30
    return data, replace(model, **network), replace(planning, device=target.device, precision=target.precision,
                                                    memory_gb=memory_gb)
