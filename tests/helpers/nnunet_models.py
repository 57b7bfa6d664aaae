"""Trained nnU-Net v2 models fabricated for tests, in nnU-Net's folder layout: ``plans.json`` (complete, as nnU-Net
2.8.1's planner writes it for the tests' synthetic CT), ``dataset.json``, and ``fold_<k>/checkpoint_final.pth`` in
the format of ``nnUNetTrainer.save_checkpoint``, with ``validation/`` naming the fold's held-out cases.

Two sources of weights: nnU-Net's own trainer (:func:`nnunet_trainer_weights`, where nnunetv2 is installed), or a
medseg network of nnU-Net's PlainConvUNet stages whose state dict is renamed and permuted into nnU-Net's keys and axes
(:func:`as_nnunet_state_dict`), so that CI, without nnunetv2, runs the same path.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medseg.models import SlottedUNet

CT_DATASET = {"channel_names": {"0": "CT"}, "labels": {"background": 0, "organ": 1, "lesion": 2}, "numTraining": 4,
              "file_ending": ".nii.gz"}
"""The ``dataset.json`` of ``write_ct_dataset(..., "nnunet")``."""

_RESAMPLING = {
    "resampling_fn_data": "resample_data_or_seg_to_shape", "resampling_fn_seg": "resample_data_or_seg_to_shape",
    "resampling_fn_data_kwargs": {"is_seg": False, "order": 3, "order_z": 0, "force_separate_z": None},
    "resampling_fn_seg_kwargs": {"is_seg": True, "order": 1, "order_z": 0, "force_separate_z": None},
    "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
    "resampling_fn_probabilities_kwargs": {"is_seg": False, "order": 1, "order_z": 0, "force_separate_z": None}}

NETWORKS = {"PlainConvUNet": ("n_conv_per_stage", 2), "ResidualEncoderUNet": ("n_blocks_per_stage", 1)}
"""nnU-Net's class -> its key of blocks per stage and its planners' decoder convs per stage."""
RESENC_M_BLOCKS = [1, 3, 4, 6, 6, 6]
"""ResEnc M's residual blocks per stage (nnUNetPlannerResEncM)."""


def ct_plans(network: str = "PlainConvUNet", features: Sequence[int] = (4, 6, 8, 8, 8),
             blocks: Sequence[int] | None = None) -> dict[str, Any]:
    """nnU-Net's plans for ``write_ct_dataset(..., "nnunet", shape=(64, 64, 20), orientation="LPS")`` (its axes
    (S, P, L)), as its planner wrote them for 20 such cases, with narrow ``features`` and ``network`` in both the
    ``3d_fullres`` and the ``2d`` configuration; ``blocks`` per stage default to the planners' (2 convs; ResEnc M's
    blocks)."""
    stages = len(features)
    key, decoder_convs = NETWORKS[network]
    blocks = list(blocks or ([2] * stages if network == "PlainConvUNet" else RESENC_M_BLOCKS[:stages]))

    def configuration(dims: int, patch: list[int], spacing: list[float], kernels: list[list[int]],
                      strides: list[list[int]], batch_dice: bool) -> dict[str, Any]:
        return {
            "data_identifier": f"nnUNetPlans_{dims}d{'_fullres' if dims == 3 else ''}",
            "preprocessor_name": "DefaultPreprocessor", "batch_size": 2, "patch_size": patch,
            "median_image_size_in_voxels": [float(p) for p in patch], "spacing": spacing,
            "normalization_schemes": ["CTNormalization"], "use_mask_for_norm": [False], **_RESAMPLING,
            "architecture": {
                "network_class_name": f"dynamic_network_architectures.architectures.unet.{network}",
                "arch_kwargs": {
                    "n_stages": stages, "features_per_stage": list(features),
                    "conv_op": f"torch.nn.modules.conv.Conv{dims}d", "kernel_sizes": kernels, "strides": strides,
                    key: blocks, "n_conv_per_stage_decoder": [decoder_convs] * (stages - 1), "conv_bias": True,
                    "norm_op": f"torch.nn.modules.instancenorm.InstanceNorm{dims}d",
                    "norm_op_kwargs": {"eps": 1e-05, "affine": True}, "dropout_op": None, "dropout_op_kwargs": None,
                    "nonlin": "torch.nn.LeakyReLU", "nonlin_kwargs": {"inplace": True}},
                "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"]},
            "batch_dice": batch_dice}

    strides_3d = [[1, 1, 1], [1, 2, 2], [1, 2, 2], [2, 2, 2], [2, 2, 2]][:stages]
    kernels_3d = [[1, 3, 3], [1, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3]][:stages]
    return {
        "dataset_name": "Dataset990_ct", "plans_name": "nnUNetPlans",
        "original_median_spacing_after_transp": [5.0, 0.699999988079071, 0.699999988079071],
        "original_median_shape_after_transp": [20, 64, 64], "image_reader_writer": "SimpleITKIO",
        "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2], "experiment_planner_used": "ExperimentPlanner",
        "label_manager": "LabelManager",
        "foreground_intensity_properties_per_channel": {"0": {
            "max": 104.0, "mean": 56.82228088378906, "median": 59.0, "min": -26.0, "percentile_00_5": -4.0,
            "percentile_99_5": 85.0, "std": 15.82016658782959}},
        "configurations": {
            "3d_fullres": configuration(3, [20, 64, 64], [5.0, 0.699999988079071, 0.699999988079071], kernels_3d,
                                        strides_3d, False),
            "2d": configuration(2, [64, 64], [0.699999988079071, 0.699999988079071], [[3, 3]] * stages,
                                [[1, 1]] + [[2, 2]] * (stages - 1), True)}}


CT_AXES = [2, 1, 0]
"""The RAS axis of each of nnU-Net's axes for :func:`ct_plans`' dataset (files L, P, S; nnU-Net's axes S, P, L)."""

_RENAMES = [
    (re.compile(r"^stem\.(\d+)\.(conv|norm)\."), lambda m, levels: f"encoder.stages.0.0.convs.{m[1]}.{m[2]}."),
    (re.compile(r"^down\.(\d+)\.(\d+)\.(conv|norm)\."),
     lambda m, levels: f"encoder.stages.{int(m[1]) + 1}.0.convs.{m[2]}.{m[3]}."),
    (re.compile(r"^up\.(\d+)\.transp_conv\."), lambda m, levels: f"decoder.transpconvs.{levels - 1 - int(m[1])}."),
    (re.compile(r"^up\.(\d+)\.convs\.(\d+)\.(conv|norm)\."),
     lambda m, levels: f"decoder.stages.{levels - 1 - int(m[1])}.convs.{m[2]}.{m[3]}."),
    (re.compile(r"^head\."), lambda m, levels: f"decoder.seg_layers.{levels - 1}."),
    (re.compile(r"^deep_heads\.(\d+)\."), lambda m, levels: f"decoder.seg_layers.{levels - 2 - int(m[1])}."),
]
"""medseg's keys of nnU-Net's PlainConvUNet stages -> nnU-Net's (its decoder stage ``s`` is medseg's level
``levels - 1 - s``)."""


def _nnunet_key(key: str, levels: int) -> str | None:
    for pattern, rename in _RENAMES:
        match = pattern.match(key)
        if match:
            return rename(match, levels) + key[match.end():]
    return None


def as_nnunet_state_dict(model: SlottedUNet, axes: Sequence[int]) -> dict[str, torch.Tensor]:
    """The state dict nnU-Net's ``PlainConvUNet`` holding ``model``'s conv stages (``conv_stages=nnunet_plain``) and
    heads (``deep_supervision=True``: a head per decoder stage, as nnU-Net's) would have, in nnU-Net's keys and axes
    (``axes``: the RAS axis of each nnU-Net axis in use), its copies included (each layer's ``all_modules`` and the
    decoder's ``encoder``). Attention slots are left out."""
    levels = len(model.up)
    to_nnunet = [sorted(axes).index(a) for a in axes]  # nnU-Net axis a is medseg's axis to_nnunet[a]
    state: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        name = _nnunet_key(key, levels)
        if name is None:
            continue
        if tensor.ndim == 2 + model.spatial_dims:
            tensor = tensor.permute(0, 1, *(2 + a for a in to_nnunet)).contiguous()
        state[name] = tensor.clone()
    assert len(model.deep_heads) == levels - 1, "nnU-Net's networks hold a head per decoder stage: deep supervision"
    layers = {key: value for key, value in state.items() if ".convs." in key and key.startswith("encoder.")}
    copies = {re.sub(r"\.(conv|norm)\.", lambda m: ".all_modules.0." if m[1] == "conv" else ".all_modules.1.", key):
              value for key, value in state.items() if ".convs." in key}
    return {**state, **{f"decoder.{key}": value for key, value in layers.items()}, **copies}


def perturb(network: torch.nn.Module, seed: int = 0) -> None:
    """Add noise to every parameter of ``network`` (norms' affines off their 1 and 0, biases off 0), so that a test
    of a mapping sees each value; a parameter a state dict holds under two keys (nnU-Net's copies) stays one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))


def write_nnunet_model(folder: Path, plans: dict[str, Any], weights: Mapping[str, torch.Tensor],
                       configuration: str = "3d_fullres", fold: int = 0,
                       validation_cases: Sequence[str] = (), dataset: Mapping[str, Any] = CT_DATASET) -> Path:
    """A trained-model folder as nnU-Net leaves it (see the module docstring); returns the checkpoint file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plans.json").write_text(json.dumps(plans, indent=2))
    (folder / "dataset.json").write_text(json.dumps(dataset, indent=2))
    fold_folder = folder / f"fold_{fold}"
    (fold_folder / "validation").mkdir(parents=True, exist_ok=True)
    for case in validation_cases:
        (fold_folder / "validation" / f"{case}{dataset['file_ending']}").write_bytes(b"")
    checkpoint = fold_folder / "checkpoint_final.pth"
    ema = np.float32(0.5)
    torch.save({
        "network_weights": dict(weights), "optimizer_state": {}, "grad_scaler_state": None,
        "logging": {"mean_fg_dice": [np.float64(0.4), ema], "ema_fg_dice": [ema], "epoch_start_timestamps": [1.0]},
        "_best_ema": ema, "current_epoch": 2,
        "init_args": {"plans": copy.deepcopy(plans), "configuration": configuration, "fold": fold,
                      "dataset_json": dict(dataset), "device": torch.device("cpu")},
        "trainer_name": "nnUNetTrainer",
        "inference_allowed_mirroring_axes": (0, 1, 2) if configuration.startswith("3d") else (0, 1)}, checkpoint)
    return checkpoint


def nnunet_trainer_weights(plans: dict[str, Any], configuration: str, dataset: Mapping[str, Any] = CT_DATASET,
                           seed: int = 0) -> dict[str, torch.Tensor]:
    """The state dict of the network nnU-Net's trainer builds for ``plans``
    (``nnUNetTrainer.build_network_architecture`` with deep supervision, as ``initialize`` calls it), its weights
    :func:`perturb`-ed. Needs nnunetv2."""
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    torch.manual_seed(seed)
    manager = PlansManager(copy.deepcopy(plans))
    labels = manager.get_label_manager(dict(dataset))
    network = nnUNetTrainer.build_network_architecture(manager, manager.get_configuration(configuration),
                                                       len(dataset["channel_names"]), labels.num_segmentation_heads,
                                                       True)
    perturb(network, seed)
    return network.state_dict()
