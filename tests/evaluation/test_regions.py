"""Region-based training, the ignore label and gapped label values end to end on tiny BraTS-like data: what the loss
receives, per-region metrics against numpy, label maps written in ``regions_class_order`` with the dataset's values,
ignore voxels outside metrics and loss, sigmoid ensembles, and the postprocessing decided and applied per region."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
import yaml
from torch import nn

from medseg.config import DataConfig, InferenceConfig
from medseg.data.datalist import dataset_from_config, load_dataset
from medseg.data.labels import IGNORE_INDEX, LabelSpec
from medseg.data.reading import read_case
from medseg.data.transforms import train_transforms, window
from medseg.errors import ConfigError
from medseg.evaluation.crossval import cross_validate
from medseg.evaluation.evaluate import evaluate
from medseg.inference import model as model_module
from medseg.inference.cases import Case
from medseg.inference.ensemble import Ensemble
from medseg.inference.inferer import Inferer
from medseg.inference.model import load_model
from medseg.models import build_model
from medseg.postprocessing.components import ClassStep, Postprocessing, load
from medseg.runs.checkpoint import load_checkpoint, save_checkpoint
from medseg.training import trainer as trainer_module
from medseg.training.checks import check_config
from medseg.training.losses import build_loss
from medseg.training.run import train
from tests.helpers.checkpoints import TINY_MODEL
from tests.helpers.configs import compose_config
from tests.helpers.files import read_csv
from tests.helpers.realistic import BRATS_CHANNELS, BRATS_ORDER, BRATS_REGIONS, write_brats_dataset
from tests.helpers.references import reference_dice, reference_hd95, reference_nsd
from tests.helpers.runs import micro_config

SPACING = (1.0, 1.0, 2.0)
REGIONS_OVERRIDE = "data.regions={whole_tumor:[1,2,4],tumor_core:[2,4],enhancing:[4]}"
RUN = ["data.patch_size=[16,16,8]", "trainer.max_epochs=1", "data.fold=all"]
INFERENCE = InferenceConfig(progress=False)
IGNORE = 5


@pytest.fixture(scope="module")
def brats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("brats")
    return {fmt: write_brats_dataset(folder / fmt, fmt) for fmt in ("msd", "nnunet")}


@pytest.fixture(scope="module")
def regions(brats: dict[str, Path]) -> LabelSpec:
    return load_dataset(brats["nnunet"], "nnunet").label_spec


def save_region_checkpoint(path: Path, labels: LabelSpec, state: dict | None = None, seed: int = 0,
                           data: dict | None = None) -> Path:
    """A checkpoint as the trainer writes it for ``labels``: a resolved config, a tiny U-Net (weights drawn with
    ``seed``; ``state={}`` for an oracle), the dataset description. No resampling of the BraTS-like data."""
    cfg = asdict(check_config(compose_config(["output_dir=unused"])))
    cfg["model"].update(TINY_MODEL, spatial_dims=3)
    cfg["data"].update(spacing=list(SPACING), patch_size=[16, 16, 8], normalization="none", **(data or {}))
    if state is None:
        torch.manual_seed(seed)
        patch = window(DataConfig(**cfg["data"]), 3).net_patch
        state = build_model(cfg["model"], len(BRATS_CHANNELS), labels.num_outputs, patch).state_dict()
    dataset = {**labels.as_dict(), "channel_names": BRATS_CHANNELS}
    return save_checkpoint(path, {"model": state, "config": cfg, "dataset": dataset})


class Oracle(nn.Module):
    """Logits that are the input's first ``outputs`` channels (0/1 masks) turned to +-20: sigmoid or softmax then
    gives the masks back."""

    def __init__(self, outputs: int, offset: float) -> None:
        super().__init__()
        self.outputs, self.offset = outputs, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 20.0 * (x[:, :self.outputs] - self.offset)


def oracle_folder(brats: Path, dest: Path, channels, seed: int = 0) -> Path:
    """The nnU-Net BraTS-like dataset with images replaced by ``channels(label, rng)``: a list of four (X, Y, Z) masks
    in the label file's voxel order."""
    rng = np.random.default_rng(seed)
    (dest / "imagesTr").mkdir(parents=True)
    (dest / "labelsTr").symlink_to(brats / "labelsTr")
    (dest / "dataset.json").write_text((brats / "dataset.json").read_text())
    for path in sorted((brats / "labelsTr").glob("*.nii.gz")):
        label = nib.load(path)
        for index, mask in enumerate(channels(np.asarray(label.dataobj), rng)):
            nib.save(nib.Nifti1Image(mask.astype(np.float32), label.affine),
                     dest / "imagesTr" / f"{path.name[:-7]}_{index:04d}.nii.gz")
    return dest


def noisy_regions(label: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """The BraTS regions of ``label`` with 8% of the voxels flipped, plus an empty fourth channel."""
    masks = [np.isin(label, values) ^ (rng.random(label.shape) < 0.08) for values in BRATS_REGIONS.values()]
    return [*masks, np.zeros(label.shape, bool)]


def test_region_training_3d(brats: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            one_thread: None) -> None:
    """MSD data with regions from the config: the loss gets one logit channel per region and (B, 3, *patch) targets,
    ignore voxels -1 in every channel; validation and the checkpoint are per region."""
    seen: list[tuple[tuple[int, ...], torch.Tensor]] = []
    build = trainer_module.build_loss

    def recording(*args, **kwargs):
        loss = build(*args, **kwargs)

        def call(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
            seen.append((tuple(output.shape), label.detach().cpu().clone()))
            return loss(output, label)
        return call

    monkeypatch.setattr(trainer_module, "build_loss", recording)
    metrics = train(micro_config(tmp_path, brats["msd"], "data=msd", "recipe=light", REGIONS_OVERRIDE,
                                 "data.regions_class_order=[1,2,4]", *RUN))
    assert seen and all(shape[1] == 3 for shape, _ in seen)
    labels = torch.cat([label for _, label in seen])
    assert labels.shape[1:] == (3, 16, 16, 8) and set(labels.unique().tolist()) == {-1.0, 0.0, 1.0}
    ignored = labels == IGNORE_INDEX
    assert torch.equal(ignored.any(1), ignored.all(1)), "an ignore voxel is ignored in every region"
    known = labels.clamp_min(0)
    assert (known[:, 0] >= known[:, 1]).all() and (known[:, 1] >= known[:, 2]).all(), "nested regions"
    assert list(metrics["val_dice_per_class"]) == ["whole_tumor", "tumor_core", "enhancing"]
    dataset = load_checkpoint(tmp_path / "checkpoints" / "best.pt")["dataset"]
    assert dataset["regions"] == {"whole_tumor": [1, 2, 3], "tumor_core": [2, 3], "enhancing": [3]}
    assert dataset["label_values"] == [0, 1, 2, 4] and dataset["ignore_value"] == IGNORE
    assert load_model(tmp_path / "checkpoints" / "best.pt").label_spec.num_outputs == 3


@pytest.mark.slow
def test_region_training_2d_and_its_evaluation(brats: dict[str, Path], tmp_path: Path, one_thread: None) -> None:
    """nnU-Net's region syntax, a 2D model; its checkpoint evaluates to label maps in the dataset's values."""
    run = tmp_path / "run"
    metrics = train(micro_config(run, brats["nnunet"], "data=nnunet", "recipe=light", "model.spatial_dims=2", *RUN))
    assert list(metrics["val_dice_per_class"]) == list(BRATS_REGIONS)
    result = evaluate({"ckpt": str(run / "checkpoints" / "best.pt"), "input": str(brats["nnunet"]),
                       "split": "training", "output": str(tmp_path / "out"), "inference": {"progress": False}})
    assert result.exit_code == 0 and len(result.rows) == 4 * 3
    written = np.asarray(nib.load(tmp_path / "out" / "brats_001.nii.gz").dataobj)
    assert set(np.unique(written)) <= {0, 1, 2, 4}


def test_region_metrics_and_label_maps_against_numpy(brats: dict[str, Path], regions: LabelSpec, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    """An oracle whose sigmoid is a noisy copy of each region: metrics.csv equals numpy's on the masks without the
    ignore voxels; the label map writes 1, 2, 4 in regions_class_order; predictions that differ only on ignore voxels
    score the same."""
    monkeypatch.setattr(model_module, "build_model", lambda cfg, cin, cout, patch: Oracle(cout, 0.5))
    ckpt = save_region_checkpoint(tmp_path / "oracle.pt", regions, state={})
    first = oracle_folder(brats["nnunet"], tmp_path / "first", noisy_regions)
    second = oracle_folder(brats["nnunet"], tmp_path / "second",  # the same noise, inverted on the ignore voxels
                           lambda label, rng: [np.where(label == IGNORE, ~m, m) for m in noisy_regions(label, rng)])
    for folder in (first, second):
        result = evaluate({"ckpt": str(ckpt), "input": str(folder), "split": "training", "save_probabilities": True,
                           "output": str(tmp_path / f"out_{folder.name}"), "inference": {"progress": False}})
        assert result.exit_code == 0
    rows = read_csv(tmp_path / "out_first" / "metrics.csv")
    assert len(rows) == 4 * 3 and [r["class_name"] for r in rows[:3]] == list(BRATS_REGIONS)
    for row in rows:
        case, index = row["case"], int(row["class_index"])
        label_nii = nib.load(brats["nnunet"] / "labelsTr" / f"{case}.nii.gz")
        label, spacing = np.asarray(label_nii.dataobj), label_nii.header.get_zooms()[:3]
        pred = np.asarray(nib.load(first / "imagesTr" / f"{case}_{index - 1:04d}.nii.gz").dataobj) > 0.5
        pred &= label != IGNORE
        ref = np.isin(label, list(BRATS_REGIONS.values())[index - 1])
        assert float(row["dice"]) == pytest.approx(reference_dice(pred, ref))
        assert float(row["hd95_mm"]) == pytest.approx(reference_hd95(pred, ref, spacing), rel=1e-5)
        assert float(row["nsd"]) == pytest.approx(reference_nsd(pred, ref, spacing, 1.0), rel=1e-6)
    cases = sorted({row["case"] for row in rows})
    for case in cases:
        masks = [np.asarray(nib.load(first / "imagesTr" / f"{case}_{i:04d}.nii.gz").dataobj) > 0.5 for i in range(3)]
        expected = np.zeros(masks[0].shape, np.uint8)
        for mask, value in zip(masks, BRATS_ORDER):  # later regions overwrite earlier ones
            expected[mask] = value
        written = np.asarray(nib.load(tmp_path / "out_first" / f"{case}.nii.gz").dataobj)
        np.testing.assert_array_equal(written, expected)
        sigmoids = np.load(tmp_path / "out_first" / f"{case}.npz")["probabilities"]  # one map per region
        np.testing.assert_array_equal(sigmoids > 0.5, np.stack(masks))
    assert read_csv(tmp_path / "out_second" / "metrics.csv") == rows, "ignore voxels take no part in any metric"
    written = [np.asarray(nib.load(tmp_path / out / "brats_000.nii.gz").dataobj) for out in ("out_first", "out_second")]
    ignored = np.asarray(nib.load(brats["nnunet"] / "labelsTr" / "brats_000.nii.gz").dataobj) == IGNORE
    assert ignored.any() and not np.array_equal(*written) and np.array_equal(written[0][~ignored], written[1][~ignored])
    summary = json.loads((tmp_path / "out_first" / "summary.json").read_text())
    assert list(summary["classes"]) == list(BRATS_REGIONS)
    assert summary["classes"]["tumor core"]["dice"] == pytest.approx(
        np.mean([float(r["dice"]) for r in rows if r["class_name"] == "tumor core"]))


def test_the_loss_sees_no_ignore_voxel(brats: dict[str, Path]) -> None:
    """The training target is -1 on ignore voxels whatever lies there, and logits there change no loss."""
    info = dataset_from_config(DataConfig(format="msd", root=str(brats["msd"]), regions=dict(
        whole_tumor=[1, 2, 4], tumor_core=[2, 4], enhancing=[4]), regions_class_order=BRATS_ORDER))
    entry = info.training[0]
    shape = read_case(entry).label.shape
    data = DataConfig(spacing=list(SPACING), patch_size=list(shape), normalization="none", augment="none",
                      samples_per_volume=1)
    (patch,) = train_transforms(data, 3, info.label_spec)(dict(entry))
    target = patch["label"][None]
    ignored = target[:, :1] == IGNORE_INDEX
    assert ignored.any()
    cfg = check_config(compose_config(["output_dir=unused", "data.root=unused"]))
    loss = build_loss(cfg, info, None)
    logits = torch.randn(target.shape, generator=torch.Generator().manual_seed(0))
    changed = torch.where(ignored, torch.randn(target.shape, generator=torch.Generator().manual_seed(1)), logits)
    assert not torch.equal(logits, changed)
    assert float(loss(changed, target)) == pytest.approx(float(loss(logits, target)), abs=1e-6)


def test_gapped_values_round_trip_to_the_written_labels(brats: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    """Softmax classes for values 0/1/2/4 with an ignore label: an oracle writes the dataset's own values back."""
    labels = load_dataset(brats["msd"], "msd").label_spec
    assert not labels.region_based and labels.num_outputs == 4
    monkeypatch.setattr(model_module, "build_model", lambda cfg, cin, cout, patch: Oracle(cout, 0.0))
    ckpt = save_region_checkpoint(tmp_path / "oracle.pt", labels, state={})
    folder = oracle_folder(brats["nnunet"], tmp_path / "onehot",
                           lambda label, rng: [label == value for value in (0, 1, 2, 4)])
    result = evaluate({"ckpt": str(ckpt), "input": str(folder), "split": "training", "output": str(tmp_path / "out"),
                       "inference": {"progress": False}})
    assert result.exit_code == 0 and {r["class_name"] for r in result.rows} == {"edema", "non-enhancing", "enhancing"}
    assert all(r["dice"] == 1.0 for r in result.rows)
    for path in (brats["nnunet"] / "labelsTr").glob("*.nii.gz"):
        label = np.asarray(nib.load(path).dataobj)
        written = np.asarray(nib.load(tmp_path / "out" / path.name).dataobj)
        np.testing.assert_array_equal(written, np.where(label == IGNORE, 0, label))  # 4 stays 4; ignore never written


def test_ensemble_averages_sigmoids(brats: dict[str, Path], regions: LabelSpec, tmp_path: Path,
                                    one_thread: None) -> None:
    paths = [save_region_checkpoint(tmp_path / f"{seed}.pt", regions, seed=seed) for seed in (0, 1)]
    images = [str(brats["nnunet"] / "imagesTr" / f"brats_000_{c:04d}.nii.gz") for c in range(4)]
    case = Case("brats_000", images)
    a, b = (Inferer(load_model(path), INFERENCE).infer(case).probabilities for path in paths)
    assert a.shape == (3, 24, 24, 12) and not np.allclose(a, b)
    prediction = Ensemble.load(paths, INFERENCE).infer(case, keep_probabilities=True)
    np.testing.assert_allclose(prediction.probabilities, (a + b) / 2, atol=1e-6)
    assert not np.allclose(prediction.probabilities.sum(0), 1.0), "independent sigmoids, not a softmax"
    mean = (a + b) / 2 > 0.5
    expected = np.zeros(mean.shape[1:], np.uint8)
    for mask, value in zip(mean, BRATS_ORDER):
        expected[mask] = value
    np.testing.assert_array_equal(prediction.label_map(), expected)


def test_postprocessing_works_on_each_region_alone(regions: LabelSpec) -> None:
    """Keeping whole tumour's largest component removes the small one from whole tumour only: the core predicted
    there stays, and the label map shows it."""
    masks = np.zeros((3, 12, 12, 6), bool)
    masks[0, 1:7, 1:7, 1:5] = True  # whole tumour: a large component ...
    masks[0, 9:11, 9:11, 2:4] = True  # ... and a small one, with core inside
    masks[1, 9:11, 9:11, 2:4] = True
    processed = Postprocessing({1: ClassStep("largest_component")}).apply(masks, SPACING)
    assert not processed[0, 9:11, 9:11, 2:4].any() and processed[1, 9:11, 9:11, 2:4].all()
    assert (regions.label_map(processed)[9:11, 9:11, 2:4] == 2).all()


def make_region_sweep(sweep: Path, root: Path, labels: LabelSpec) -> Path:
    """A two-fold multirun of the nnU-Net BraTS-like data as ``train.py -m data.fold=0,1`` leaves it."""
    info = load_dataset(root, "nnunet")
    ids = sorted(entry["case"] for entry in info.training)
    for fold in (0, 1):
        job = sweep / str(fold)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"data.fold={fold}"]))
        val = ids[fold::2]
        (job / "splits.json").write_text(json.dumps({"fold": fold, "train": sorted(set(ids) - set(val)), "val": val}))
        save_region_checkpoint(job / "checkpoints" / "best.pt", labels, seed=fold,
                               data={"root": str(root), "format": "nnunet", "fold": fold, "num_folds": 2})
        (job / "metrics.json").write_text(json.dumps({"status": "completed", "best_val_dice": 0.5}))
    return sweep


def test_crossval_decides_and_evaluate_applies_postprocessing_per_region(brats: dict[str, Path], regions: LabelSpec,
                                                                         tmp_path: Path, one_thread: None) -> None:
    sweep = make_region_sweep(tmp_path / "multirun", brats["nnunet"], regions)
    (result,) = cross_validate({"dir": str(sweep), "inference": {"progress": False}})
    folder = sweep / "crossval"
    assert list(result.summary["classes"]) == list(BRATS_REGIONS)
    assert len(read_csv(folder / "metrics.csv")) == 4 * 3 and len(list(folder.glob("predictions/*.masks.npz"))) == 4
    decision = json.loads((folder / "postprocessing.json").read_text())
    assert {name: entry["index"] for name, entry in decision["classes"].items()} == {
        name: index for index, name in regions.outputs.items()}
    for name, entry in decision["classes"].items():  # "none" is scored on the masks as evaluation scored them
        assert entry["candidates"]["none"]["dice"] == pytest.approx(result.summary["classes"][name]["dice"])
    steps = load(folder / "postprocessing.json", regions.outputs)
    out = tmp_path / "out"
    evaluate({"ckpt": str(sweep), "input": str(brats["nnunet"]), "split": "training", "output": str(out),
              "postprocessing": "auto", "inference": {"progress": False}})
    ensemble = Ensemble.load(sweep, INFERENCE)
    for case in ("brats_000", "brats_003"):
        images = [str(brats["nnunet"] / "imagesTr" / f"{case}_{c:04d}.nii.gz") for c in range(4)]
        prediction = ensemble.infer(Case(case, images))
        expected = regions.label_map(steps.apply(prediction.masks(), SPACING))
        np.testing.assert_array_equal(np.asarray(nib.load(out / f"{case}.nii.gz").dataobj), expected)
    assert math.isfinite(result.summary["foreground_mean"]["dice"])


def test_export_refuses_what_preprocessing_json_cannot_describe(regions: LabelSpec, tmp_path: Path) -> None:
    from medseg.export import export

    ckpt = save_region_checkpoint(tmp_path / "regions.pt", regions)
    with pytest.raises(ConfigError, match=r"regions\.pt predicts regions; preprocessing\.json describes softmax"):
        export({"ckpt": str(ckpt), "format": "torchscript", "output": str(tmp_path / "export")})
    assert not (tmp_path / "export").exists()
