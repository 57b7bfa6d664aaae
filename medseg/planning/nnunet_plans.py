"""nnU-Net v2's plan of the same dataset, read from its ``nnUNetPlans.json`` (or a ResEnc plans file,
``nnUNetResEncUNetMPlans.json`` ...): beside medseg's (``scripts/plan.py nnunet_plans=PATH``), or as the plan a run
trains on (``plan.file=PATH``, :func:`nnunet_values`).

One reader (:func:`read_configuration`) takes a configuration (``3d_fullres``, ``2d``, ``3d_lowres`` or any other,
``inherits_from`` resolved): plans of nnU-Net 2.3 and later describe the network in ``architecture.arch_kwargs``,
earlier ones in ``pool_op_kernel_sizes``, ``conv_kernel_sizes`` and ``UNet_base_num_features``.

Axis order: nnU-Net lists spacing, patch, strides and kernel sizes in its own array axes: its reader's (SimpleITK's,
and nibabel's as nnU-Net transposes it: the file's voxel axes reversed), permuted by ``transpose_forward`` (the
thickest axis first). medseg's are RAS (:mod:`medseg.planning.fingerprint`), so :func:`ras_axes` maps each nnU-Net axis
to the RAS axis it runs along by the orientation of each case's file, which the fingerprint records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medseg.data.transforms import thick_axis
from medseg.errors import ConfigError
from medseg.io import read_json_setting
from medseg.models.nnunet_stages import NNUNET_NETWORKS
from medseg.planning.plan import Plan, plan_normalization

CONFIGURATIONS = {3: "3d_fullres", 2: "2d"}
MEDIAN_SPACING = "original_median_spacing_after_transp"
"""The entry of nnU-Net's plans holding the dataset's median spacing, in nnU-Net's axis order."""
"""The nnU-Net configuration of each network dimension unless one is named."""
NORMALIZATIONS = {"CTNormalization": "ct", "ZScoreNormalization": "zscore", "NoNormalization": "none"}
"""nnU-Net's normalisation classes medseg has, by medseg's ``data.normalization`` scheme."""
REVERSING_READERS = ("SimpleITKIO", "NibabelIO")
"""nnU-Net image readers whose array axes are the file's voxel axes reversed."""
RAS_READER = "NibabelIOWithReorient"
"""nnU-Net's reader that reorients to RAS, its array axes then reversed (S, A, R)."""
RAS_AXIS = {"L": 0, "R": 0, "P": 1, "A": 1, "I": 2, "S": 2}
"""The RAS axis each orientation code runs along."""
MEMORY_TARGET_GB = {"nnUNetPlannerResEncL": 24.0, "nnUNetPlannerResEncXL": 40.0}
"""The GPU memory target of nnU-Net's planners (``experiment_planner_used``) that do not use its default of 8 GB."""
DEFAULT_MEMORY_TARGET_GB = 8.0


@dataclass(frozen=True)
class NnunetConfiguration:
    """One configuration of an nnU-Net plans file; every per-axis list in nnU-Net's axis order."""

    name: str
    """``3d_fullres``, ``2d``, ..."""
    patch_size: list[int]
    batch_size: int
    stages: int
    """Resolution stages, the first (stride 1) included: down-samplings + 1, as medseg's levels."""
    features: list[int]
    """Width per stage."""
    spacing: list[float]
    strides: list[list[int]]
    """Per stage, the first (nnU-Net's stem, stride 1) included."""
    kernel_sizes: list[list[int]]
    """Per stage."""
    network: str
    """The network class, without its module: ``PlainConvUNet``, ``ResidualEncoderUNet``, ..."""
    encoder_blocks: list[int]
    """Per stage: convs (``PlainConvUNet``'s ``n_conv_per_stage``) or residual blocks (``n_blocks_per_stage``)."""
    decoder_convs: list[int]
    """Per decoder stage."""
    normalization: list[str]
    """nnU-Net's normalisation class per channel."""
    use_mask_for_norm: list[bool]
    arch: dict[str, Any]
    """The rest of ``arch_kwargs`` (``norm_op``, ``nonlin``, ``dropout_op``, ...)."""
    previous_stage: str | None
    """The cascade's low-resolution configuration (``3d_cascade_fullres``), else None."""


def load_plans(path: str | Path, where: str) -> dict[str, Any]:
    """The JSON of the file at ``path``; ``where`` (``nnunet_plans=PATH``, ``plan.file=PATH``) names it in messages.

    Raises:
        ConfigError: the file is missing, an nnU-Net v1 pickle or not JSON (:func:`~medseg.io.read_json_setting`).
    """
    return read_json_setting(path, where, " (nnU-Net writes nnUNetPlans.json into nnUNet_preprocessed/<dataset>/)",
                             "give nnU-Net v2's nnUNetPlans.json (nnUNetv2_plan_and_preprocess writes it into "
                             "nnUNet_preprocessed/<dataset>/) or a medseg plan file (scripts/plan.py)")


def _plans_entry(plans: Mapping[str, Any], key: str, where: str, needed_for: str) -> Any:
    """``plans[key]`` of nnU-Net's plans, which medseg reads for ``needed_for``.

    Raises:
        ConfigError: one line naming ``where`` (the file) and ``key`` when the plans lack it.
    """
    if key not in plans:
        raise ConfigError(f"{where}: no {key!r} (medseg reads it for {needed_for}); expected an nnU-Net v2 plans file "
                          f"as nnUNetv2_plan_and_preprocess writes it")
    return plans[key]


def is_nnunet_plans(content: Any) -> bool:
    """Whether a file's JSON is an nnU-Net plans file (its ``configurations``)."""
    return isinstance(content, dict) and isinstance(content.get("configurations"), dict)


def _resolved(configurations: Mapping[str, Any], name: str, where: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """Configuration ``name`` with what it ``inherits_from`` beneath its own entries (nnU-Net's PlansManager)."""
    if name not in configurations:
        raise ConfigError(f"{where}: no {name} configuration; the file has {', '.join(configurations) or 'none'}")
    config = dict(configurations[name])
    parent = config.pop("inherits_from", None)
    if parent is None:
        return config
    if parent in (*seen, name):
        raise ConfigError(f"{where}: configuration {name} inherits from itself through {parent}")
    return {**_resolved(configurations, parent, where, (*seen, name)), **config}


def read_configuration(plans: Mapping[str, Any], name: str, spatial_dims: int, where: str) -> NnunetConfiguration:
    """Configuration ``name`` of nnU-Net plans ``plans`` (the file's JSON), for a ``spatial_dims``-D network.

    Raises:
        ConfigError: no such configuration, one of other dimensions, or one without a patch, spacing and network;
            the message names ``where``.
    """
    config = _resolved(plans.get("configurations", {}), name, where)
    dims = len(config.get("patch_size") or [])
    if dims != spatial_dims:
        raise ConfigError(f"{where}: {name} is a {dims}D configuration, model.spatial_dims={spatial_dims}")
    try:
        patch = [int(n) for n in config["patch_size"]]
        arch = config.get("architecture", {}).get("arch_kwargs")
        if arch is not None:
            arch = dict(arch)
            stages, features = int(arch.pop("n_stages")), [int(n) for n in arch.pop("features_per_stage")]
            strides, kernels = arch.pop("strides"), arch.pop("kernel_sizes")
            network = config["architecture"]["network_class_name"].rsplit(".", 1)[-1]
            blocks = arch.pop("n_blocks_per_stage", None) or arch.pop("n_conv_per_stage")
            decoder = arch.pop("n_conv_per_stage_decoder")
        else:  # nnU-Net before 2.3
            strides, kernels = config["pool_op_kernel_sizes"], config["conv_kernel_sizes"]
            stages = len(strides)
            cap = config.get("unet_max_num_features", 320 if spatial_dims == 3 else 512)
            features = [min(int(config["UNet_base_num_features"]) * 2**i, cap) for i in range(stages)]
            network = config.get("UNet_class_name", "PlainConvUNet")
            blocks = config.get("n_conv_per_stage_encoder", [2] * stages)
            decoder = config.get("n_conv_per_stage_decoder", [2] * (stages - 1))
            arch = {}
        configuration = NnunetConfiguration(
            name=name, patch_size=patch, batch_size=int(config["batch_size"]), stages=stages, features=features,
            spacing=[float(s) for s in config["spacing"]], strides=[[int(s) for s in level] for level in strides],
            kernel_sizes=[[int(k) for k in level] for level in kernels], network=network,
            encoder_blocks=[int(n) for n in blocks], decoder_convs=[int(n) for n in decoder],
            normalization=list(config.get("normalization_schemes", [])),
            use_mask_for_norm=[bool(m) for m in config.get("use_mask_for_norm", [])], arch=arch,
            previous_stage=config.get("previous_stage"))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ConfigError(f"{where}: no {name} configuration with a patch_size, spacing, batch_size and network "
                          f"({err!r}); expected an nnU-Net v2 plans file") from None
    _check_stage_lists(configuration, spatial_dims, where)
    return configuration


def _check_stage_lists(config: NnunetConfiguration, spatial_dims: int, where: str) -> None:
    """Refuse strides or kernel sizes that do not give each of the configuration's stages one entry per axis.

    Raises:
        ConfigError: naming the list and its first wrong entry, or its length.
    """
    for key, levels in (("strides", config.strides), ("kernel_sizes", config.kernel_sizes)):
        if len(levels) != config.stages:
            raise ConfigError(f"{where}: {config.name}'s {key} has {len(levels)} entries for {config.stages} stages; "
                              f"expected one per stage")
        wrong = next((index for index, level in enumerate(levels) if len(level) != spatial_dims), None)
        if wrong is not None:
            raise ConfigError(f"{where}: {config.name}'s {key}[{wrong}]={levels[wrong]}: expected {spatial_dims} "
                              f"entries (one per axis of a {spatial_dims}D configuration)")


def read_nnunet_plans(path: str | Path, spatial_dims: int, configuration: str | None = None) -> NnunetConfiguration:
    """Configuration ``configuration`` (None: :data:`CONFIGURATIONS`'s for a ``spatial_dims``-D network) of the
    nnU-Net plans file at ``path`` (``scripts/plan.py nnunet_plans=PATH [plan.nnunet_configuration=NAME]``).

    Raises:
        ConfigError: the file is missing, not JSON, or holds no such configuration; the message names
            ``nnunet_plans``.
    """
    where = f"nnunet_plans={path}"
    return read_configuration(load_plans(path, where), configuration or CONFIGURATIONS[spatial_dims], spatial_dims,
                              where)


def ras_axes(plans: Mapping[str, Any], fingerprint: Mapping[str, Any], where: str) -> list[int]:
    """The RAS axis each of nnU-Net's three axes runs along: its array axis (``transpose_forward``) is, for
    SimpleITK's and nibabel's readers, the file's voxel axis ``2 - a``, whose orientation code (each case's
    ``orientation`` in the fingerprint) names the RAS axis.

    Raises:
        ConfigError: a reader medseg cannot map (a 2D image reader), or cases whose orientations give nnU-Net's
            axes other RAS axes (one plan cannot hold both).
    """
    reader = plans.get("image_reader_writer", REVERSING_READERS[0])
    forward = [int(a) for a in plans.get("transpose_forward", [0, 1, 2])]
    if reader == RAS_READER:
        return [2 - a for a in forward]
    if reader not in REVERSING_READERS:
        raise ConfigError(f"{where}: nnU-Net read these images with {reader}; medseg maps the axes of "
                          f"{', '.join((*REVERSING_READERS, RAS_READER))} only")
    per_case = {case["case"]: [RAS_AXIS[case["orientation"][2 - a]] for a in forward] for case in fingerprint["cases"]}
    first, *_ = per_case
    other = next((case for case, axes in per_case.items() if axes != per_case[first]), None)
    if other is not None:
        cases = {case["case"]: case["orientation"] for case in fingerprint["cases"]}
        raise ConfigError(f"{where}: cases {first} ({cases[first]}) and {other} ({cases[other]}) are stored in "
                          f"orientations that give nnU-Net's axes other RAS axes; one nnU-Net plan cannot hold both")
    return per_case[first]


def _in_ras(values: Sequence[Any], axes: Sequence[int]) -> list[Any]:
    """``values`` of nnU-Net's ``axes`` (their RAS axes, in nnU-Net's order) in increasing RAS order."""
    return [value for _, value in sorted(zip(axes, values))]


def _normalization(plans: Mapping[str, Any], config: NnunetConfiguration, channels: int,
                   where: str) -> tuple[dict[str, Any], list[str]]:
    """``data.normalization`` of the configuration (CT: its clip and statistics, from
    ``foreground_intensity_properties_per_channel``), and what medseg does otherwise."""
    if len(config.normalization) != channels:
        raise ConfigError(f"{where}: {len(config.normalization)} channels in {config.name}'s normalization_schemes, "
                          f"the dataset has {channels}: planned for other data")
    unknown = sorted(set(config.normalization) - set(NORMALIZATIONS))
    if unknown:
        raise ConfigError(f"{where}: normalization {unknown[0]}: medseg has {', '.join(NORMALIZATIONS)}")
    schemes = {NORMALIZATIONS[name] for name in config.normalization}
    if len(schemes) > 1:
        raise ConfigError(f"{where}: one normalization per channel ({', '.join(config.normalization)}); medseg "
                          f"normalises every channel with one scheme")
    (scheme,) = schemes
    notes = (["use_mask_for_norm: nnU-Net z-scores inside the nonzero mask, medseg over the whole image"]
             if scheme == "zscore" and any(config.use_mask_for_norm) else [])
    if scheme != "ct":
        return {"scheme": scheme}, notes
    properties = _plans_entry(plans, "foreground_intensity_properties_per_channel", where, "CT normalisation")
    missing = [str(c) for c in range(channels) if not isinstance(properties, Mapping) or str(c) not in properties]
    if missing:
        raise ConfigError(f"{where}: 'foreground_intensity_properties_per_channel' has no channel {missing[0]} (medseg "
                          f"reads each channel's for CT normalisation)")
    return plan_normalization({"intensity": [properties[str(c)] for c in range(channels)]}, is_ct=True), notes


def _kernel_size(config: NnunetConfiguration, axes: list[int]) -> int | list[list[int]]:
    """``model.kernel_size``: the configuration's kernel of each stage in RAS order (``axes``: the RAS axis of each
    of nnU-Net's axes in use, as the strides'); one int when every stage's kernel is that int along every axis."""
    sizes = {k for level in config.kernel_sizes for k in level}
    if len(sizes) == 1:
        return sizes.pop()
    return [_in_ras(level, axes) for level in config.kernel_sizes]


def _network(config: NnunetConfiguration, axes: list[int], where: str) -> tuple[dict[str, Any], list[str]]:
    """``model.conv_stages`` (nnU-Net's network class, :data:`~medseg.models.nnunet_stages.NNUNET_NETWORKS`),
    ``model.kernel_size`` (:func:`_kernel_size`), ``model.encoder_blocks`` (its conv layers or residual blocks per
    stage) and ``model.decoder_convs`` of the configuration's network, and what medseg builds otherwise."""
    if config.network not in NNUNET_NETWORKS:
        raise ConfigError(f"{where}: network {config.network}: medseg builds {' and '.join(NNUNET_NETWORKS)}")
    if len(set(config.decoder_convs)) != 1:
        raise ConfigError(f"{where}: n_conv_per_stage_decoder={config.decoder_convs}: medseg builds the same number "
                          "of convs in every decoder stage")
    notes = []
    for key, expected in (("norm_op", "InstanceNorm"), ("nonlin", "LeakyReLU")):
        name = str(config.arch.get(key, expected)).rsplit(".", 1)[-1]
        if not name.startswith(expected):
            notes.append(f"{key} {name}: medseg's stages use {expected} (model.norm sets the norm)")
    if config.arch.get("dropout_op"):
        notes.append(f"dropout_op {config.arch['dropout_op']}: model.dropout sets medseg's dropout")
    if config.arch.get("conv_bias") is False:
        notes.append("conv_bias false: medseg's nnU-Net conv stages always have conv biases")
    return {"model.conv_stages": NNUNET_NETWORKS[config.network], "model.kernel_size": _kernel_size(config, axes),
            "model.encoder_blocks": config.encoder_blocks, "model.decoder_convs": config.decoder_convs[0]}, notes


def _spacing(plans: Mapping[str, Any], config: NnunetConfiguration, axes: list[int], where: str) -> list[float]:
    """The (3,) RAS target spacing: the configuration's; a 2D one's two in-plane entries, and along the slice axis
    (which nnU-Net does not resample) the median spacing. Checked to slice across nnU-Net's slice axis in 2D."""
    median = [float(s) for s in _plans_entry(plans, MEDIAN_SPACING, where, "the slice axis's spacing")]
    spacing = _in_ras(config.spacing if len(config.spacing) == 3 else [median[0], *config.spacing], axes)
    if len(config.patch_size) == 2 and thick_axis(spacing) != axes[0]:
        raise ConfigError(f"{where}: {config.name} slices across RAS axis {axes[0]}, but medseg would slice the "
                          f"target spacing {spacing} across its thickest axis {thick_axis(spacing)}")
    return spacing


def nnunet_values(plans: Mapping[str, Any], config: NnunetConfiguration, fingerprint: Mapping[str, Any],
                  where: str) -> tuple[dict[str, Any], list[str]]:
    """Configuration ``config`` of nnU-Net plans ``plans`` as medseg's config values (RAS order,
    :func:`ras_axes`): ``data.spacing``, ``data.patch_size``, ``data.normalization``, ``model.strides``,
    ``model.channels``, ``model.conv_stages`` (nnU-Net's network), ``model.kernel_size`` (each stage's kernel),
    ``model.encoder_blocks`` and ``model.decoder_convs``; and what the configuration holds that medseg builds
    otherwise, one sentence each (the run warns with them).

    A 2D configuration's patch, strides and kernels cover the two in-plane RAS axes, in increasing order, as medseg's.

    Raises:
        ConfigError: planned for other data (another number of channels, or another median spacing than the
            fingerprint's), or what medseg cannot train: the cascade, a first stage that pools, a network class,
            normalisation or decoder it does not build.
    """
    dims = len(config.patch_size)
    if config.previous_stage:
        raise ConfigError(f"{where}: {config.name} is the cascade's second stage (it reads {config.previous_stage}'s "
                          "predictions); medseg has no cascade: train 3d_fullres or 3d_lowres")
    axes = ras_axes(plans, fingerprint, where)
    median = _in_ras(_plans_entry(plans, MEDIAN_SPACING, where, "checking the plan against this dataset"), axes)
    if not np.allclose(median, fingerprint["median_spacing"], rtol=1e-3):
        raise ConfigError(f"{where}: nnU-Net's median spacing {[round(s, 4) for s in median]} mm (RAS) is not this "
                          f"dataset's {[round(s, 4) for s in fingerprint['median_spacing']]}: planned for other data")
    if any(s != 1 for s in config.strides[0]):
        raise ConfigError(f"{where}: {config.name}'s first stage pools ({config.strides[0]}); medseg's runs at full "
                          "resolution")
    in_use = axes if dims == 3 else axes[1:]
    normalization, notes = _normalization(plans, config, len(fingerprint["channel_names"]), where)
    network, network_notes = _network(config, in_use, where)
    values = {
        "data.spacing": _spacing(plans, config, axes, where),
        "data.patch_size": _in_ras(config.patch_size, in_use),
        "data.normalization": normalization,
        "model.strides": [_in_ras(level, in_use) for level in config.strides[1:]],
        "model.channels": config.features,
        **network,
    }
    return values, notes + network_notes


def memory_target_gb(plans: Mapping[str, Any]) -> float:
    """The GPU memory (GB) nnU-Net's planner sized the plan for, by ``experiment_planner_used``."""
    return MEMORY_TARGET_GB.get(plans.get("experiment_planner_used", ""), DEFAULT_MEMORY_TARGET_GB)


def comparison_text(plan: Plan, nnunet: NnunetConfiguration, path: str | Path) -> str:
    """Two lines: nnU-Net's configuration, and this plan's patch voxels and stages against it."""
    ratio = math.prod(plan.patch_size) / math.prod(nnunet.patch_size)
    widths = f"{nnunet.features[0]}...{max(nnunet.features)}" if nnunet.features else "?"
    stages = len(plan.strides) + 1
    depth = "the same depth" if stages == nnunet.stages else f"{stages - nnunet.stages:+d} stages"
    return (f"nnU-Net {nnunet.name} ({path}): patch {' x '.join(map(str, nnunet.patch_size))} (its axis order), "
            f"{nnunet.stages} stages, widths {widths}, batch {nnunet.batch_size}\n"
            f"against nnU-Net: {ratio:.2f}x its patch voxels, {stages} stages ({depth})")
