"""Label sets as datasets declare them (medseg.data.labels): nnU-Net's region syntax and ``data.regions`` give the same
regions; gapped values become classes and go back to the dataset's values; the ignore label becomes IGNORE_INDEX in
the targets, is no foreground for the crop sampler and no class in the fingerprint; bad label sets stop with one line
naming the key; the data check names undeclared values."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai import transforms as mt

from medseg.config import DataConfig
from medseg.data.datalist import dataset_from_config, load_dataset
from medseg.data.labels import IGNORE_INDEX, LabelSpec, RandCropByPosNegForegroundd, member_masks
from medseg.data.reading import read_case
from medseg.data.transforms import eval_transforms, train_transforms
from medseg.data.verify import verify_dataset
from medseg.errors import ConfigError, DatasetError
from medseg.planning.fingerprint import compute_fingerprint
from tests.helpers.realistic import BRATS_LABELS, BRATS_ORDER, BRATS_REGIONS, write_brats_dataset

REGIONS_OVERRIDE = {"whole_tumor": [1, 2, 4], "tumor_core": [2, 4], "enhancing": [4]}
VALUE_OF_CLASS = {0: 0, 1: 1, 2: 2, 3: 4}
"""The BraTS classes' label values, written out independently of the code under test."""


@pytest.fixture(scope="module")
def brats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("brats")
    return {fmt: write_brats_dataset(folder / fmt, fmt) for fmt in ("msd", "nnunet")}


def msd_config(root: Path, **keys) -> DataConfig:
    return DataConfig(format="msd", root=str(root), **keys)


def test_region_syntax_and_config_regions_give_the_same_regions(brats: dict[str, Path]) -> None:
    nnunet = load_dataset(brats["nnunet"], "nnunet")
    msd = dataset_from_config(msd_config(brats["msd"], regions=REGIONS_OVERRIDE, regions_class_order=BRATS_ORDER))
    for info, names in ((nnunet, list(BRATS_REGIONS)), (msd, list(REGIONS_OVERRIDE))):
        assert info.region_based and info.num_outputs == 3 and info.output_names == names
        assert info.label_values == [0, 1, 2, 4] and info.ignore_value == 5 and info.num_classes == 4
        assert list(info.regions.values()) == [[1, 2, 3], [2, 3], [3]]  # contiguous class indices
        assert info.regions_class_order == BRATS_ORDER
    plain = load_dataset(brats["msd"], "msd")
    assert not plain.region_based and plain.num_outputs == 4 and plain.output_names == ["edema", "non-enhancing",
                                                                                        "enhancing"]
    consistent = replace(msd_config(brats["nnunet"], regions=BRATS_REGIONS), format="nnunet")
    assert dataset_from_config(consistent).regions == nnunet.regions  # the same regions twice are fine
    assert LabelSpec.from_dict(msd.label_spec.as_dict()) == msd.label_spec
    assert LabelSpec.from_dict({"labels": {"0": "bg", "1": "fg"}}) == LabelSpec.plain({0: "bg", 1: "fg"})


def _msd_labels(root: Path, labels: dict[str, str]) -> None:
    meta = json.loads((root / "dataset.json").read_text())
    (root / "dataset.json").write_text(json.dumps({**meta, "labels": labels}))


def _nnunet_meta(root: Path, **changes) -> None:
    meta = json.loads((root / "dataset.json").read_text())
    (root / "dataset.json").write_text(json.dumps({**meta, **changes}))


@pytest.mark.parametrize(("fmt", "keys", "edit", "error", "message"), [
    ("msd", {"regions": {"bad": [1, 3]}}, None, ConfigError,
     r"data\.regions: region 'bad' names label value\(s\) \[3\]"),
    ("msd", {"regions": {"a": [1, 2], "b": [2, 4]}}, None, ConfigError,
     r"data\.regions: regions 'a' and 'b' overlap .* set data\.regions_class_order"),
    ("msd", {"regions": REGIONS_OVERRIDE, "regions_class_order": [1, 2]}, None, ConfigError,
     r"data\.regions_class_order has 2 value\(s\) for 3 regions"),
    ("msd", {"regions": {"core": [2, 4]}, "regions_class_order": [1]}, None, ConfigError,
     r"data\.regions_class_order: 1 is not a label value of region 'core'"),
    ("msd", {"regions_class_order": [1]}, None, ConfigError, r"data\.regions_class_order=\[1\] needs data\.regions"),
    ("msd", {}, lambda root: _msd_labels(root, {"0": "background", "1": "edema", "2": "ignore", "4": "enhancing"}),
     DatasetError, r"dataset\.json: 'labels': the 'ignore' label must have the highest value"),
    ("nnunet", {"regions": {"whole": [1, 2, 4]}}, None, ConfigError, r"data\.regions=.* differ from the regions"),
    ("nnunet", {}, lambda root: _nnunet_meta(root, regions_class_order=None), DatasetError,
     r"dataset\.json: 'labels': regions 'whole tumor' and 'tumor core' overlap .* 'regions_class_order'"),
    ("nnunet", {}, lambda root: _nnunet_meta(root, regions_class_order=[1, 2, 4, 4]), DatasetError,
     r"dataset\.json: 'regions_class_order' has 4 value\(s\) for 3 regions"),
])
def test_bad_label_sets_name_the_key(brats: dict[str, Path], tmp_path: Path, fmt: str, keys: dict, edit, error: type,
                                     message: str) -> None:
    root = brats[fmt]
    if edit is not None:
        root = Path(tmp_path / fmt)
        root.mkdir()
        (root / "dataset.json").write_text((brats[fmt] / "dataset.json").read_text())
        for sub in ("imagesTr", "labelsTr"):
            (root / sub).symlink_to(brats[fmt] / sub)
        edit(root)
    with pytest.raises(error, match=message):
        dataset_from_config(replace(msd_config(root, **keys), format=fmt))


def test_bad_regions_stop_training_before_it_starts(brats: dict[str, Path], tmp_path: Path) -> None:
    from medseg.training.run import train
    from tests.helpers.configs import MICRO_OVERRIDES, compose_config

    cfg = compose_config([*MICRO_OVERRIDES, "data=msd", "recipe=light", f"data.root={brats['msd']}",
                          f"output_dir={tmp_path}",
                          "data.regions={whole:[1,2,3]}"])
    with pytest.raises(ConfigError, match=r"^data\.regions: region 'whole' names label value\(s\) \[3\]"):
        train(cfg)
    assert not (tmp_path / "checkpoints").exists()


def test_gapped_values_become_classes_and_go_back(brats: dict[str, Path]) -> None:
    info = load_dataset(brats["msd"], "msd")
    entry = info.training[0]  # the case with an ignore region
    raw = read_case(entry).label
    data = DataConfig(spacing=[1.0, 1.0, 2.0], normalization="none")
    classes = eval_transforms(data, labels=info.label_spec)(dict(entry))["label"][0].numpy()
    expected = np.vectorize({0: 0, 1: 1, 2: 2, 4: 3, 5: IGNORE_INDEX}.get)(raw)
    np.testing.assert_array_equal(classes, expected)
    masks = member_masks(classes, [[1], [2], [3]])
    written = info.label_spec.label_map(masks)
    np.testing.assert_array_equal(written, np.where(raw == 5, 0, raw))  # the dataset's values, 4 included
    assert written.dtype == np.uint8 and set(np.unique(written)) == {0, 1, 2, 4}


def test_region_label_map_follows_regions_class_order() -> None:
    spec = LabelSpec({0: "background", 1: "a", 2: "b", 3: "c"}, [0, 1, 2, 4],
                     {"whole": [1, 2, 3], "core": [2, 3], "enhancing": [3]}, [1, 2, 4])
    # voxels: whole only, whole+core, all three, enhancing alone (not nested), core alone, none
    masks = np.array([[1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 0]], dtype=bool)
    np.testing.assert_array_equal(spec.label_map(masks), [1, 2, 4, 4, 2, 0])
    reversed_order = replace(spec, regions={"enhancing": [3], "core": [2, 3], "whole": [1, 2, 3]},
                             regions_class_order=[4, 2, 1])
    np.testing.assert_array_equal(reversed_order.label_map(masks[::-1]), [1, 1, 1, 4, 2, 0])  # later ones overwrite
    probabilities = np.array([[0.7, 0.9], [0.2, 0.51], [0.5, 0.49]])
    np.testing.assert_array_equal(spec.prediction_masks(probabilities), probabilities > 0.5)


def test_class_outputs_are_argmax_and_their_label_map_the_class_values() -> None:
    """The winning class of each voxel, the first of a tie as ``argmax``'s, on any view of the probabilities (a
    slab in a file's axis order is a permuted, flipped view); its label map is the masks' one."""
    spec = LabelSpec({0: "background", 1: "a", 2: "b", 3: "c"}, [0, 2, 5, 300])
    probabilities = np.random.default_rng(0).random((4, 9, 7, 5)).astype(np.float32)
    probabilities[1, 0, 0, 0] = probabilities[3, 0, 0, 0] = 2.0
    view = np.moveaxis(np.moveaxis(probabilities, 0, -1)[::-1, :, ::-1].copy(), -1, 0)
    for maps in (probabilities, view, np.moveaxis(np.moveaxis(probabilities, 0, -1).copy(), -1, 0)):
        outputs = spec.prediction_outputs(maps)
        np.testing.assert_array_equal(outputs, maps.argmax(0))
        np.testing.assert_array_equal(spec.outputs_label_map(outputs), spec.label_map(spec.prediction_masks(maps)))
    assert spec.prediction_outputs(probabilities)[0, 0, 0] == 1 and spec.outputs_label_map(outputs).dtype == np.uint16


def test_region_targets_carry_ignore_in_every_channel(brats: dict[str, Path]) -> None:
    info = dataset_from_config(msd_config(brats["msd"], regions=REGIONS_OVERRIDE, regions_class_order=BRATS_ORDER))
    entry = info.training[0]
    raw = read_case(entry).label  # RAS order, the training chain's
    data = DataConfig(spacing=[1.0, 1.0, 2.0], patch_size=list(raw.shape), normalization="none", augment="none",
                      samples_per_volume=1)
    (patch,) = train_transforms(data, 3, info.label_spec)(dict(entry))
    target = patch["label"].numpy()
    assert target.shape == (3, *raw.shape) and target.dtype == np.float32
    expected = np.stack([np.isin(raw, values) for values in REGIONS_OVERRIDE.values()]).astype(np.float32)
    expected[:, raw == BRATS_LABELS["ignore"]] = IGNORE_INDEX
    np.testing.assert_array_equal(target, expected)
    assert (target == IGNORE_INDEX).any()


def test_foreground_patches_are_not_centred_on_ignore_voxels() -> None:
    """One foreground voxel in a corner, a large block of ignore voxels: every foreground patch holds the voxel.
    MONAI's own sampler takes the ignore voxels (non-zero) for foreground."""
    label = torch.zeros(1, 40, 40, 40)
    label[0, 2, 2, 2] = 1
    label[0, 20:, 20:, 20:] = IGNORE_INDEX
    data = {"image": torch.zeros(1, 40, 40, 40), "label": label}
    kwargs = {"keys": ["image", "label"], "label_key": "label", "spatial_size": (6, 6, 6), "pos": 1.0, "neg": 0.0,
              "num_samples": 20}
    ours = RandCropByPosNegForegroundd(**kwargs)
    ours.set_random_state(0)
    assert all((patch["label"] == 1).any() for patch in ours(data))
    monai = mt.RandCropByPosNegLabeld(**kwargs)
    monai.set_random_state(0)
    assert sum(bool((patch["label"] == 1).any()) for patch in monai(data)) < 5


def test_fingerprint_counts_classes_without_ignore(brats: dict[str, Path]) -> None:
    info = load_dataset(brats["msd"], "msd")
    fingerprint = compute_fingerprint(info, progress=False)
    expected = np.zeros(4, np.int64)
    ignored = 0
    for entry in info.training:
        values = np.asarray(nib.load(entry["label"]).dataobj)
        ignored += int((values == 5).sum())
        for index, value in VALUE_OF_CLASS.items():
            expected[index] += int((values == value).sum())
    assert fingerprint["class_voxels"] == expected.tolist() and ignored > 0


def test_check_data_names_undeclared_values(brats: dict[str, Path], tmp_path: Path) -> None:
    assert verify_dataset(load_dataset(brats["msd"], "msd"), progress=False).ok  # ignore (5) is declared
    root = tmp_path / "msd"
    write_brats_dataset(root, "msd")
    path = root / "labelsTr" / "brats_001.nii.gz"
    image = nib.load(path)
    values = np.asarray(image.dataobj).copy()
    values[0, 0, 0], values[0, 0, 1] = 3, 7  # the gap, and above the ignore label
    nib.save(nib.Nifti1Image(values, image.affine, image.header), path)
    report = verify_dataset(load_dataset(root, "msd"), progress=False)
    (problem,) = report.errors
    assert problem.case == "brats_001" and "label values (3, 7) are not in dataset.json's labels" in problem.message
    assert "4 enhancing, 5 ignore" in problem.message
