"""Real datasets end to end: one epoch of training on realistic MSD and nnU-Net folders, 2D and 3D.

Runs go in-process through :func:`medseg.training.run.train` with the real configs composed by Hydra
(``data=msd`` / ``data=nnunet`` plus the dataset root and a tiny model, nothing else), so the class
names, channels and every planned value come from the dataset. Also: fold splits across runs, the
memory/disk cache choice, 2D slicing across a non-S thick axis, volumes thinner than the patch, and
``.nrrd`` / ``.mha`` files (skipped without the ``formats`` extra).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from medseg.config import TrainConfig
from medseg.data.datalist import dataset_from_config, load_dataset
from medseg.data.transforms import thick_axis
from medseg.planning.plan import BASE_VOXEL_BUDGET
from medseg.runs.checkpoint import load_checkpoint
from medseg.runtime.launch import SINGLE_PROCESS
from medseg.training import prepare as engine_data
from medseg.training import run as run_module
from medseg.training import validation as validation_module
from medseg.training.checks import check_config
from medseg.training.planning import plan_config
from medseg.training.prepare import PreparedData, prepare_data
from medseg.training.run import train
from tests.helpers.configs import compose_config
from tests.helpers.realistic import (
    SAGITTAL_SHAPE,
    write_ct_dataset,
    write_mri_dataset,
    write_sagittal_dataset,
    write_thin_dataset,
    write_two_channel_dataset,
)

TINY = ["model.channels=[8,16,32]", "trainer.max_epochs=1", "trainer.progress=false", "trainer.batch_size=2",
        "data.samples_per_volume=1", "data.num_workers=0"]
"""Only what makes a run small: the dataset decides the rest (classes, channels, planned values)."""

WRITERS: dict[str, Callable[..., Path]] = {
    "ct": lambda root, fmt: write_ct_dataset(root, fmt, num_cases=4),          # int16 HU, LPS, 0.7x0.7x5 mm
    "mri": lambda root, fmt: write_mri_dataset(root, fmt, num_cases=4, shape=(40, 40, 32)),  # float, any scale
    "thin": lambda root, fmt: write_thin_dataset(root, fmt, num_cases=4),      # 12 slices
    "two_channel": lambda root, fmt: write_two_channel_dataset(root, fmt, num_cases=4),  # MSD 4D / 2 files
    "sagittal": lambda root, fmt: write_sagittal_dataset(root, fmt, num_cases=4),  # thick along R
}
FAST = {("ct", "msd", 3), ("two_channel", "nnunet", 2)}
"""Matrix entries in the default suite; the thin, sagittal and fold/caching tests below add more."""


@pytest.fixture(autouse=True)
def cpu_sized_patches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan small patches, so an epoch takes seconds on 2 CPU cores (3D convolution backward is slow there).

    With ``channels[0]=8`` the budget is 4x these: 16k voxels in 3D (e.g. 32x32x16), 64x64 in 2D.
    """
    monkeypatch.setitem(BASE_VOXEL_BUDGET, 3, 16**3)
    monkeypatch.setitem(BASE_VOXEL_BUDGET, 2, 32**2)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """``datasets(kind, fmt)``: the realistic dataset, written once per module on first use."""
    base = tmp_path_factory.mktemp("real")
    made: dict[tuple[str, str], Path] = {}

    def get(kind: str, fmt: str) -> Path:
        if (kind, fmt) not in made:
            made[kind, fmt] = WRITERS[kind](base / f"{kind}_{fmt}", fmt)
        return made[kind, fmt]

    return get


def run_config(root: Path, fmt: str, output_dir: Path, *overrides: str) -> Any:
    """The composed training config for a dataset folder: ``data=<fmt> data.root=<root>`` and :data:`TINY`."""
    return compose_config([f"data={fmt}", "recipe=light", f"data.root={root}", f"output_dir={output_dir}", *TINY,
                           *overrides])


def train_on(root: Path, fmt: str, output_dir: Path, *overrides: str) -> dict[str, Any]:
    """One training run (in-process); returns its metrics."""
    return train(run_config(root, fmt, output_dir, *overrides))


def prepare(root: Path, fmt: str, output_dir: Path, *overrides: str) -> tuple[TrainConfig, PreparedData]:
    """The planned config and :func:`prepare_data` alone (no model, no training), as a run would make them."""
    cfg = check_config(run_config(root, fmt, output_dir, *overrides))
    info = dataset_from_config(cfg.data)
    cfg, plan = plan_config(cfg, info, progress=False)
    return cfg, prepare_data(cfg, info, plan, output_dir, SINGLE_PROCESS)


@dataclass
class Calls:
    """What the network saw: input shapes while training and validating, and each validated volume."""

    train_inputs: list[tuple[int, ...]] = field(default_factory=list)
    eval_inputs: list[tuple[int, ...]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    """Per validated volume: ``image`` and ``probs`` shapes, ``roi_size``, ``slice_axis``."""


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Record every network input and sliding-window prediction of the next in-process run."""
    record = Calls()
    build_model, infer_volume = run_module.build_model, validation_module.infer_volume

    def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        (record.train_inputs if module.training else record.eval_inputs).append(tuple(inputs[0].shape))

    def spy_build(*args: Any, **kwargs: Any) -> torch.nn.Module:
        model = build_model(*args, **kwargs)
        model.register_forward_pre_hook(hook)
        return model

    def spy_predict(model: torch.nn.Module, image: torch.Tensor, window: Any, **kwargs: Any) -> torch.Tensor:
        probs = infer_volume(model, image, window, **kwargs)
        record.volumes.append({"image": tuple(image.shape), "probs": tuple(probs.shape),
                               "roi_size": list(window.roi_size), "slice_axis": window.slice_axis})
        return probs

    monkeypatch.setattr(run_module, "build_model", spy_build)
    monkeypatch.setattr(validation_module, "infer_volume", spy_predict)
    return record


def check_run(metrics: dict[str, Any], output_dir: Path, root: Path, fmt: str, spatial_dims: int) -> dict[str, Any]:
    """A completed epoch whose classes, channels and planned values all come from the dataset; returns the
    checkpoint's resolved config."""
    info = load_dataset(root, fmt)
    assert metrics["status"] == "completed" and metrics["epochs"] == 1
    assert 0.0 <= metrics["best_val_dice"] <= 1.0
    assert set(metrics["val_dice_per_class"]) == {info.labels[i] for i in range(1, info.num_classes)}
    state = load_checkpoint(output_dir / "checkpoints" / "last.pt")
    assert state["dataset"]["channel_names"] == info.channel_names
    assert {int(k): v for k, v in state["dataset"]["labels"].items()} == info.labels
    cfg = state["config"]
    data, model = cfg["data"], cfg["model"]
    assert model["spatial_dims"] == spatial_dims
    assert len(data["spacing"]) == 3 and len(data["patch_size"]) == spatial_dims
    assert len(model["strides"]) == len(model["channels"]) - 1
    assert all(len(level) == spatial_dims for level in model["strides"]), "strides planned per axis"
    assert data["normalization"]["scheme"] == ("ct" if info.is_ct else "zscore")
    first_layer = next(v for k, v in state["model"].items() if k.endswith("weight") and v.ndim == spatial_dims + 2)
    assert first_layer.shape[1] == info.in_channels
    return cfg


@pytest.mark.parametrize("config_name", ["train", "plan"])
@pytest.mark.parametrize("preset", ["msd", "nnunet", "demo3d_planned"])
def test_dataset_presets_leave_the_plannable_keys_null(preset: str, config_name: str) -> None:
    cfg = compose_config([f"data={preset}", "data.root=/data/Task01"], config_name=config_name)
    assert cfg.data.spacing is None and cfg.data.patch_size is None and cfg.data.normalization is None
    assert cfg.model.strides is None, "the network's pooling is planned too"
    demo = [16, 32, 64, 128] if preset == "demo3d_planned" else None
    assert cfg.model.channels == demo, "real data plans the widths too; the planned demo keeps its small network"
    assert cfg.model.spatial_dims == 3, "the rest of the model config is kept"
    kept = compose_config([f"data={preset}", "data.root=/x", "model.strides=[2,2,2]"], config_name=config_name)
    assert list(kept.model.strides) == [2, 2, 2], "a value typed on the command line wins"


MATRIX = [
    pytest.param(kind, fmt, dims, id=f"{kind}-{fmt}-{dims}d",
                 marks=() if (kind, fmt, dims) in FAST else pytest.mark.slow)
    for kind in ("ct", "mri", "thin", "two_channel") for fmt in ("msd", "nnunet") for dims in (3, 2)
]


@pytest.mark.parametrize(("kind", "fmt", "spatial_dims"), MATRIX)
def test_one_epoch_on_a_realistic_dataset(kind: str, fmt: str, spatial_dims: int, tmp_path: Path,
                                          datasets: Callable[[str, str], Path]) -> None:
    root = datasets(kind, fmt)
    metrics = train_on(root, fmt, tmp_path / "run", f"model.spatial_dims={spatial_dims}")
    cfg = check_run(metrics, tmp_path / "run", root, fmt, spatial_dims)
    if kind == "ct":  # 5 mm slices, 0.7 mm in-plane: the thick axis is S and is pooled later than R, A
        assert cfg["data"]["spacing"] == pytest.approx([0.7, 0.7, 5.0])
        assert spatial_dims == 2 or cfg["model"]["strides"][0] == [2, 2, 1]


def test_two_channels_load_the_same_from_msd_4d_and_nnunet_files(datasets: Callable[[str, str], Path],
                                                                 tmp_path: Path) -> None:
    _, msd = prepare(datasets("two_channel", "msd"), "msd", tmp_path / "msd", "data.cache=none")
    _, nnunet = prepare(datasets("two_channel", "nnunet"), "nnunet", tmp_path / "nnunet", "data.cache=none")
    first_msd, first_nnunet = msd.val_dataset[0], nnunet.val_dataset[0]
    assert first_msd["image"].shape[0] == 2 and first_msd["label"].shape[0] == 1
    assert torch.equal(first_msd["image"].as_tensor(), first_nnunet["image"].as_tensor())
    assert torch.equal(first_msd["label"].as_tensor(), first_nnunet["label"].as_tensor())
    channel_means = first_msd["image"].flatten(1).mean(1)
    assert channel_means == pytest.approx([0.0, 0.0], abs=1e-4), "each channel z-scored on its own"


@pytest.mark.parametrize(("spatial_dims", "patch"), [
    pytest.param(3, [16, 16, 32], id="3d-32-slices"),
    pytest.param(2, [96, 96], id="2d-larger-than-the-slice", marks=pytest.mark.slow),
])
def test_volume_smaller_than_the_patch_pads_in_training_and_inference(
    spatial_dims: int, patch: list[int], datasets: Callable[[str, str], Path], tmp_path: Path, calls: Calls
) -> None:
    root = datasets("thin", "nnunet")  # 64 x 64 x 12 voxels
    metrics = train_on(root, "nnunet", tmp_path / "run", f"model.spatial_dims={spatial_dims}",
                       f"data.patch_size=[{','.join(map(str, patch))}]")
    cfg = check_run(metrics, tmp_path / "run", root, "nnunet", spatial_dims)
    assert cfg["data"]["patch_size"] == patch
    assert calls.train_inputs and all(list(shape[2:]) == patch for shape in calls.train_inputs)
    assert calls.eval_inputs and all(list(shape[2:]) == patch for shape in calls.eval_inputs)
    assert calls.volumes, "validation ran"
    for volume in calls.volumes:
        assert volume["image"][2:] == (64, 64, 12), "the volume is validated whole, smaller than the patch"
        assert volume["probs"][2:] == volume["image"][2:], "padding removed again after inference"


def test_2d_slices_across_a_sagittal_thick_axis(datasets: Callable[[str, str], Path], tmp_path: Path,
                                                calls: Calls) -> None:
    root = datasets("sagittal", "msd")
    metrics = train_on(root, "msd", tmp_path / "run", "model.spatial_dims=2")
    cfg = check_run(metrics, tmp_path / "run", root, "msd", 2)
    in_plane = list(SAGITTAL_SHAPE[1:])  # A x S at 0.8 mm; R is 4 mm thick
    assert thick_axis(cfg["data"]["spacing"]) == 0
    assert cfg["data"]["patch_size"] == in_plane
    assert calls.train_inputs and all(len(s) == 4 and list(s[2:]) == in_plane for s in calls.train_inputs)
    assert calls.volumes, "validation ran"
    for volume in calls.volumes:
        assert volume["slice_axis"] == 0 and volume["roi_size"] == [1, *in_plane]
        assert volume["probs"][2:] == volume["image"][2:]
    assert all(len(s) == 4 and list(s[2:]) == in_plane for s in calls.eval_inputs), "the 2D net sees slices"
    slices = sum(volume["image"][2] for volume in calls.volumes)
    assert sum(s[0] for s in calls.eval_inputs) == slices, "one window per sagittal slice"


# ------------------------------------------------------------------------------------------------ folds


def read_splits(output_dir: Path) -> dict[str, Any]:
    return json.loads((output_dir / "splits.json").read_text())


def test_folds_are_disjoint_cover_all_cases_and_are_stable(datasets: Callable[[str, str], Path],
                                                           tmp_path: Path) -> None:
    root = datasets("mri", "nnunet")
    cases = {entry["case"] for entry in load_dataset(root, "nnunet").training}

    def split(name: str, *overrides: str) -> dict[str, Any]:
        prepare(root, "nnunet", tmp_path / name, "data.cache=none", "trainer.check_data=false", "data.num_folds=4",
                *overrides)
        return read_splits(tmp_path / name)

    folds = [split(f"fold{k}", f"data.fold={k}") for k in range(4)]
    for fold in folds:
        assert not set(fold["train"]) & set(fold["val"]) and set(fold["train"]) | set(fold["val"]) == cases
    assert sorted(c for fold in folds for c in fold["val"]) == sorted(cases), "each case validated once"
    assert split("again", "data.fold=2") == folds[2], "the same fold in a second run"
    for cached in (root / ".medseg_cache").glob("splits_seed*_k4.json"):
        cached.unlink()
    assert split("fresh", "data.fold=2") == folds[2], "the same fold after the splits cache is deleted"
    assert split("other_seed", "data.fold=2", "data.split_seed=7")["val"] != folds[2]["val"]


def test_fold_all_trains_and_validates_on_every_case(datasets: Callable[[str, str], Path], tmp_path: Path,
                                                     calls: Calls) -> None:
    root = datasets("sagittal", "msd")
    metrics = train_on(root, "msd", tmp_path / "run", "data.fold=all")
    check_run(metrics, tmp_path / "run", root, "msd", 3)
    cases = sorted(entry["case"] for entry in load_dataset(root, "msd").training)
    splits = read_splits(tmp_path / "run")
    assert splits["fold"] == "all" and sorted(splits["train"]) == sorted(splits["val"]) == cases
    assert len(calls.volumes) == len(cases)


# ---------------------------------------------------------------------------------------------- caching


def test_disk_cache_writes_preprocessed_cases(datasets: Callable[[str, str], Path], tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    root, cache_dir = datasets("thin", "msd"), tmp_path / "cache"
    with caplog.at_level(logging.INFO, logger="medseg"):
        metrics = train_on(root, "msd", tmp_path / "run", "data.cache=disk", f"data.cache_dir={cache_dir}",
                           "trainer.batch_size=1")  # every training case is loaded (none dropped)
    check_run(metrics, tmp_path / "run", root, "msd", 3)
    assert "cache=disk (data.cache=disk)" in caplog.text
    train_files = list(cache_dir.glob("preprocessed_*/train_pad*/*.pt"))
    val_files = list(cache_dir.glob("preprocessed_*/val/*.pt"))
    splits = read_splits(tmp_path / "run")
    assert len(train_files) == len(splits["train"]) and len(val_files) == len(splits["val"])
    assert (cache_dir / "fingerprint.json").is_file()


@pytest.mark.parametrize(("fraction", "expected"), [(1e-12, "disk"), (0.25, "memory")])
def test_auto_cache_follows_the_ram(fraction: float, expected: str, datasets: Callable[[str, str], Path],
                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(engine_data, "MEMORY_CACHE_FRACTION", fraction)
    with caplog.at_level(logging.INFO, logger="medseg"):
        _, prepared = prepare(datasets("mri", "msd"), "msd", tmp_path / "run",
                              f"data.cache_dir={tmp_path / 'cache'}", "trainer.check_data=false")
    assert f"cache={expected} (auto: " in caplog.text
    kind = {"disk": "PersistentDataset", "memory": "CacheDataset"}[expected]
    assert type(prepared.train_dataset).__name__ == type(prepared.val_dataset).__name__ == kind


def test_disk_cache_is_keyed_by_the_patch_padding(datasets: Callable[[str, str], Path], tmp_path: Path) -> None:
    """Training volumes are cached after padding to the patch: another patch must not reuse them."""
    root, common = datasets("thin", "msd"), ("data.cache=disk", f"data.cache_dir={tmp_path / 'cache'}",
                                             "trainer.check_data=false", "model.strides=[2,2]")
    _, small = prepare(root, "msd", tmp_path / "a", "data.patch_size=[16,16,8]", *common)
    _, large = prepare(root, "msd", tmp_path / "b", "data.patch_size=[16,16,32]", *common)
    assert small.train_dataset.cache_dir != large.train_dataset.cache_dir
    assert small.val_dataset.cache_dir == large.val_dataset.cache_dir, "whole volumes do not depend on the patch"
    for prepared in (small, large):
        prepared.train_dataset[0]  # writes the case's cache file
    cached = [torch.load(next(Path(p.train_dataset.cache_dir).glob("*.pt")), weights_only=False)
              for p in (small, large)]
    assert [c["image"].shape[-1] for c in cached] == [12, 32], "cached after padding to the patch"


# ------------------------------------------------------------------------------------------- file types


@pytest.mark.parametrize(("ending", "module", "fmt"), [(".nrrd", "nrrd", "msd"), (".mha", "itk", "nnunet")])
def test_other_file_types_plan_and_train(ending: str, module: str, fmt: str, tmp_path: Path) -> None:
    pytest.importorskip(module, reason=f"{ending} needs the formats extra: pip install 'medseg[formats]'")
    root = write_ct_dataset(tmp_path / "ct", fmt, num_cases=4, shape=(48, 40, 12), file_ending=ending)
    reference = write_ct_dataset(tmp_path / "ct_nifti", fmt, num_cases=4, shape=(48, 40, 12))
    assert sorted(p.suffix for p in (root / "imagesTr").iterdir()) == [ending] * 4
    (cfg, ours), (ref_cfg, theirs) = (prepare(r, fmt, tmp_path / f"prep{i}", "data.cache=none")
                                      for i, r in enumerate((root, reference)))
    assert cfg.data.spacing == pytest.approx(ref_cfg.data.spacing)  # NIfTI holds float32
    assert (cfg.data.patch_size, cfg.data.normalization) == (ref_cfg.data.patch_size, ref_cfg.data.normalization)
    assert cfg.model.strides == ref_cfg.model.strides
    ours, theirs = ours.val_dataset[0], theirs.val_dataset[0]
    assert np.allclose(ours["image"].numpy(), theirs["image"].numpy(), atol=1e-5)
    assert torch.equal(ours["label"].as_tensor(), theirs["label"].as_tensor())
    metrics = train_on(root, fmt, tmp_path / "run")
    check_run(metrics, tmp_path / "run", root, fmt, 3)
