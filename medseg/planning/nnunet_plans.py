"""nnU-Net v2's plan of the same dataset, read from its ``nnUNetPlans.json``, beside medseg's (``scripts/plan.py
nnunet_plans=PATH``).

Only what a comparison needs is read from the configuration of the network's dimensions (``3d_fullres`` or ``2d``):
the patch, the batch size, the stages and their widths. Plans of nnU-Net 2.3 and later describe the network in
``architecture.arch_kwargs`` (``n_stages``, ``features_per_stage``, ``strides``); earlier ones in
``pool_op_kernel_sizes`` and ``UNet_base_num_features``. nnU-Net's axis order is its own (the files' array axes,
transposed by ``transpose_forward``), so patches are compared by their voxels, not axis by axis.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from medseg.errors import ConfigError
from medseg.planning.plan import Plan

CONFIGURATIONS = {3: "3d_fullres", 2: "2d"}
"""The nnU-Net configuration a medseg plan of each dimension compares with."""


@dataclass(frozen=True)
class NnunetConfiguration:
    """One configuration of an nnU-Net plans file."""

    name: str
    """``3d_fullres`` or ``2d``."""
    patch_size: list[int]
    """In nnU-Net's axis order."""
    batch_size: int
    stages: int
    """Resolution stages, the first (stride 1) included: down-samplings + 1, as medseg's levels."""
    features: list[int]
    """Width per stage."""


def read_nnunet_plans(path: str | Path, spatial_dims: int) -> NnunetConfiguration:
    """The configuration for a ``spatial_dims``-D network of the nnU-Net plans file at ``path``.

    Raises:
        ConfigError: the file is missing, not JSON, or holds no such configuration; the message names
            ``nnunet_plans``.
    """
    where = f"nnunet_plans={path}"
    try:
        plans = json.loads(Path(path).expanduser().read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file (nnU-Net writes nnUNetPlans.json into "
                          "nnUNet_preprocessed/<dataset>/)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{where}: not readable as JSON ({err})") from None
    name = CONFIGURATIONS[spatial_dims]
    try:
        config = plans["configurations"][name]
        arch = config.get("architecture", {}).get("arch_kwargs")
        if arch is not None:
            stages, features = int(arch["n_stages"]), [int(n) for n in arch["features_per_stage"]]
        else:  # nnU-Net before 2.3
            stages = len(config["pool_op_kernel_sizes"])
            cap = config.get("unet_max_num_features", 320 if spatial_dims == 3 else 512)
            features = [min(int(config["UNet_base_num_features"]) * 2**i, cap) for i in range(stages)]
        return NnunetConfiguration(name, [int(n) for n in config["patch_size"]], int(config["batch_size"]), stages,
                                   features)
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{where}: no {name} configuration with a patch_size, batch_size and network ({err!r}); "
                          "expected an nnU-Net v2 plans file") from None


def comparison_text(plan: Plan, nnunet: NnunetConfiguration, path: str | Path) -> str:
    """Two lines: nnU-Net's configuration, and this plan's patch voxels and stages against it."""
    ratio = math.prod(plan.patch_size) / math.prod(nnunet.patch_size)
    widths = f"{nnunet.features[0]}...{max(nnunet.features)}" if nnunet.features else "?"
    stages = len(plan.strides) + 1
    depth = "the same depth" if stages == nnunet.stages else f"{stages - nnunet.stages:+d} stages"
    return (f"nnU-Net {nnunet.name} ({path}): patch {' x '.join(map(str, nnunet.patch_size))} (its axis order), "
            f"{nnunet.stages} stages, widths {widths}, batch {nnunet.batch_size}\n"
            f"against nnU-Net: {ratio:.2f}x its patch voxels, {stages} stages ({depth})")
