"""MSD and nnU-Net dataset reading, and fold splits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medseg.data.datalist import DatasetInfo, case_id, load_dataset, split_cases
from medseg.errors import ConfigError, DatasetError


def _write_msd(root: Path, ids: list[str], validation: list[str] | None = None) -> Path:
    entry = lambda cid: {"image": f"./imagesTr/{cid}.nii.gz", "label": f"./labelsTr/{cid}.nii.gz"}  # noqa: E731
    meta = {"name": "toy", "modality": {"0": "CT"}, "labels": {"0": "background", "1": "liver", "2": "tumour"},
            "training": [entry(c) for c in ids], "test": [f"./imagesTs/t{i}.nii.gz" for i in range(2)]}
    if validation:
        meta["validation"] = [entry(c) for c in validation]
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset.json").write_text(json.dumps(meta))
    return root


def test_msd_reads_cases_labels_and_channels(tmp_path: Path) -> None:
    info = load_dataset(_write_msd(tmp_path / "Task01", ["a_001", "a_002"]), "msd")
    assert [e["case"] for e in info.training] == ["a_001", "a_002"]
    assert info.training[0]["image"] == str(tmp_path / "Task01" / "imagesTr" / "a_001.nii.gz")
    assert info.num_classes == 3 and info.in_channels == 1 and info.is_ct
    assert info.labels == {0: "background", 1: "liver", 2: "tumour"}
    assert [e["case"] for e in info.test] == ["t0", "t1"]


def test_nnunet_reads_per_channel_files(tmp_path: Path) -> None:
    root = tmp_path / "Dataset002_Prostate"
    (root / "imagesTr").mkdir(parents=True)
    for cid in ("p_01", "p_02"):
        for ch in range(2):
            (root / "imagesTr" / f"{cid}_{ch:04d}.nii.gz").touch()
    (root / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "T2", "1": "ADC"}, "labels": {"background": 0, "PZ": 1, "TZ": 2},
        "numTraining": 2, "file_ending": ".nii.gz"}))
    info = load_dataset(root, "nnunet")
    assert info.channel_names == ["T2", "ADC"] and info.in_channels == 2 and not info.is_ct
    assert info.labels == {0: "background", 1: "PZ", 2: "TZ"}
    assert info.training[1]["image"] == [str(root / "imagesTr" / f"p_02_{c:04d}.nii.gz") for c in range(2)]
    assert info.training[1]["label"] == str(root / "labelsTr" / "p_02.nii.gz")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda root: None, "folder not found"),
        (lambda root: root.mkdir(), "dataset.json not found"),
        (lambda root: (root.mkdir(), (root / "dataset.json").write_text("{oops")), "not valid JSON"),
        (lambda root: (root.mkdir(), (root / "dataset.json").write_text('{"labels": {"0": "bg"}}')),
         "missing key 'modality'"),
        (lambda root: (root.mkdir(), (root / "dataset.json").write_text('["a"]')),
         r"dataset\.json: expected an object \(\{\.\.\.\}\) of keys, got a list"),
        (lambda root: (root.mkdir(), (root / "dataset.json").write_text(
            '{"labels": ["background", "organ"], "modality": {"0": "CT"}}')),
         r"dataset\.json: 'labels' must be an object \(\{\.\.\.\}\), got a list \(\[\.\.\.\]\): "
         r"\[\"background\", \"organ\"\]"),
        (lambda root: (root.mkdir(), (root / "dataset.json").write_text(
            '{"labels": {"0": "bg"}, "modality": {"0": "CT"}, "training": {"image": "a.nii.gz"}}')),
         r"dataset\.json: 'training' must be a list \(\[\.\.\.\]\), got an object"),
        (lambda root: (root.mkdir(), (root / "dataset.json").write_text(
            '{"labels": {"0": "bg"}, "modality": {"0": "CT"}, "training": ["a.nii.gz"]}')),
         r"dataset\.json: 'training' entry #0 must be an object with an 'image', got \"a\.nii\.gz\""),
    ],
)
def test_bad_dataset_folders_name_the_problem(tmp_path: Path, setup, message: str) -> None:
    root = tmp_path / "ds"
    setup(root)
    with pytest.raises(DatasetError, match=message):
        load_dataset(root, "msd")


def test_case_id_strips_image_endings() -> None:
    assert case_id("/x/liver_7.nii.gz") == "liver_7"
    assert case_id("/x/liver_7.mha") == "liver_7"
    assert case_id("/x/a.b_0000.nrrd") == "a.b_0000"


def _info(n: int) -> DatasetInfo:
    return DatasetInfo(Path("."), "msd", "toy", {0: "bg", 1: "fg"}, ["CT"],
                       [{"case": f"c{i:02d}", "image": "", "label": ""} for i in range(n)])


def test_folds_are_disjoint_cover_all_cases_and_are_stable(tmp_path: Path) -> None:
    info = _info(23)
    splits = tmp_path / "splits.json"
    vals = []
    for fold in range(5):
        train, val = split_cases(info, fold, splits_file=splits)
        train_ids, val_ids = {e["case"] for e in train}, {e["case"] for e in val}
        assert not train_ids & val_ids and len(train_ids | val_ids) == 23
        vals.append(val_ids)
    assert set().union(*vals) == {e["case"] for e in info.training}
    assert sum(len(v) for v in vals) == 23  # every case validated exactly once
    # the same seed gives the same split without the file; the file is reused when present
    fresh = split_cases(info, 2, splits_file=None)[1]
    assert {e["case"] for e in fresh} == vals[2]
    assert json.loads(splits.read_text())[2]["val"] == sorted(vals[2])


def test_fold_all_and_explicit_validation(tmp_path: Path) -> None:
    info = _info(6)
    train, val = split_cases(info, "all")
    assert train == val == info.training
    info.validation = [{"case": "v", "image": "", "label": ""}]
    assert split_cases(info, 0)[1] == info.validation


def test_stale_splits_file_is_an_error(tmp_path: Path) -> None:
    splits = tmp_path / "splits.json"
    split_cases(_info(10), 0, splits_file=splits)
    with pytest.raises(DatasetError, match="do not match"):
        split_cases(_info(12), 0, splits_file=splits)


def _nnunet_splits(path: Path, ids: list[str], num_folds: int) -> list[dict[str, list[str]]]:
    """An nnU-Net ``splits_final.json`` of ``ids``: fold k validates every num_folds-th case from the k-th, in
    reverse order (no shuffle medseg's split would make)."""
    order = ids[::-1]
    splits = [{"train": sorted(set(order) - set(order[k::num_folds])), "val": order[k::num_folds]}
              for k in range(num_folds)]
    path.write_text(json.dumps(splits))
    return splits


def test_fold_k_of_a_given_splits_file_is_its_fold_k_case_for_case(tmp_path: Path) -> None:
    info = _info(11)
    info.validation = [{"case": "v", "image": "", "label": ""}]  # data.splits wins over a validation list
    ids = [e["case"] for e in info.training]
    given = tmp_path / "splits_final.json"
    splits = _nnunet_splits(given, ids, 3)
    for fold in range(3):
        train, val = split_cases(info, fold, 3, splits_file=tmp_path / "unused.json", given=given)
        assert sorted(e["case"] for e in val) == sorted(splits[fold]["val"])
        assert sorted(e["case"] for e in train) == splits[fold]["train"]
    assert not (tmp_path / "unused.json").exists(), "a given split is not cached"
    run = tmp_path / "splits.json"  # a run's file: its fold only
    run.write_text(json.dumps({"fold": 1, **splits[1]}))
    assert sorted(e["case"] for e in split_cases(info, 1, 3, given=run)[1]) == sorted(splits[1]["val"])
    with pytest.raises(ConfigError, match=r"^data\.splits=.*splits\.json: a run's splits of fold 1 only; data\.fold=2"):
        split_cases(info, 2, 3, given=run)


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s[0]["val"].append("c99"), r"fold 0 names cases the dataset lacks: c99$"),
    (lambda s: s[0]["train"].remove("c00"), r"fold 0 misses cases of the dataset: c00$"),
    (lambda s: s[0]["train"].extend(s[0]["val"]), r"fold 0 puts cases in both train and val: c\d\d, c\d\d$"),
])
def test_a_splits_file_that_does_not_fit_the_dataset_is_one_line_naming_the_cases(tmp_path: Path, change,
                                                                                   message: str) -> None:
    info = _info(6)
    path = tmp_path / "splits_final.json"
    splits = _nnunet_splits(path, [e["case"] for e in info.training], 3)
    change(splits)
    path.write_text(json.dumps(splits))
    with pytest.raises(DatasetError, match=rf"^data\.splits={path}: {message}") as error:
        split_cases(info, 0, 3, given=path)
    assert "\n" not in str(error.value)


def test_data_num_folds_must_agree_with_the_splits_file(tmp_path: Path) -> None:
    info = _info(10)
    path = tmp_path / "splits_final.json"
    _nnunet_splits(path, [e["case"] for e in info.training], 5)
    with pytest.raises(ConfigError, match=r"splits_final\.json: 5 folds, data\.num_folds=3: set data\.num_folds=5$"):
        split_cases(info, 0, 3, given=path)
    path.write_text(json.dumps({"train": []}))
    with pytest.raises(ConfigError, match=r"splits_final\.json: not a splits file"):
        split_cases(info, 0, 5, given=path)
    with pytest.raises(ConfigError, match=r"missing\.json: no such file$"):
        split_cases(info, 0, 5, given=tmp_path / "missing.json")


def test_a_fold_without_validation_cases_is_refused_before_training(tmp_path: Path) -> None:
    """A given fold with an empty "val" list, or a generated fold past the number of cases, would train without a
    validated best.pt: refused by name."""
    info = _info(6)
    path = tmp_path / "splits_final.json"
    splits = _nnunet_splits(path, [e["case"] for e in info.training], 3)
    splits[1] = {"train": sorted(e["case"] for e in info.training), "val": []}
    path.write_text(json.dumps(splits))
    with pytest.raises(ConfigError, match=rf"^data\.splits={path}: fold 1 has an empty \"val\" list; every fold needs "
                                          r"validation cases"):
        split_cases(info, 1, 3, given=path)
    assert len(split_cases(info, 0, 3, given=path)[1]) == 2, "the other folds are usable"
    with pytest.raises(ConfigError, match=r"^data\.fold=6 of data\.num_folds=7: the dataset has 6 training case\(s\), "
                                          r"so this fold would have no validation cases; choose data\.fold below 6"):
        split_cases(info, 6, 7)
    assert len(split_cases(info, 5, 7)[1]) == 1, "more folds than cases: the folds that hold a case are usable"


def test_an_nnunet_v1_splits_pickle_says_what_to_give_instead(tmp_path: Path) -> None:
    import pickle

    info = _info(6)
    path = tmp_path / "splits_final.pkl"
    path.write_bytes(pickle.dumps([{"train": ["c00"], "val": ["c01"]}]))
    with pytest.raises(ConfigError, match=rf"^data\.splits={path}: a Python pickle, as nnU-Net v1 wrote its files, not "
                                          r"JSON; give nnU-Net v2's splits_final\.json") as error:
        split_cases(info, 0, 1, given=path)
    assert "\n" not in str(error.value)
