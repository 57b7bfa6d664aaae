"""The cases of a prediction's ``input`` (a folder of images or DICOM series, ``imagesTs/`` + ``labelsTs/``, or a
``dataset.json``: see :mod:`medseg.inference.predict`), and the reference labels of an evaluation's."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medseg.config import DataConfig
from medseg.data.datalist import (
    DatasetInfo,
    case_id,
    channel_groups,
    dataset_cache_dir,
    load_dataset,
    split_cases,
    splits_path,
)
from medseg.data.dicom import series_folders, series_sources
from medseg.data.reading import IMAGE_ENDINGS, ImageSource
from medseg.errors import DatasetError, PredictionError

log = logging.getLogger("medseg")


@dataclass
class Case:
    """One case to evaluate: its id, image file(s) (one per channel; DICOM series; or images in memory) and optional
    label file."""

    case: str
    image: ImageSource | list[ImageSource]
    label: str | None = None

    @property
    def image_files(self) -> list[ImageSource]:
        return list(self.image) if isinstance(self.image, list) else [self.image]


def image_files(folder: Path) -> list[Path]:
    """The image files of ``folder`` (by ending; hidden files left out), sorted."""
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.name.endswith(IMAGE_ENDINGS))


def files_by_case(folder: Path, where: str) -> dict[str, str]:
    """Case id -> file of each image file of ``folder`` (:func:`image_files`, the case id
    :func:`~medseg.data.datalist.case_id`): the one reader of a folder of label maps (references, predictions).

    Raises:
        PredictionError: a case held by two files (``case.nii`` and ``case.nii.gz``, or ``case.nii.gz`` and
            ``case.nrrd``), which one would be scored and which ignored is not for medseg to guess; ``where`` names
            the folder's setting.
    """
    files: dict[str, list[str]] = {}
    for path in image_files(folder):
        files.setdefault(case_id(path), []).append(path.name)
    ambiguous = {case: names for case, names in files.items() if len(names) > 1}
    if ambiguous:
        named = "; ".join(f"{case}: {', '.join(names)}" for case, names in sorted(ambiguous.items())[:3])
        raise PredictionError(f"{where}: {len(ambiguous)} case(s) held by two or more files in {folder} ({named}); "
                              f"keep one file per case")
    return {case: str(folder / names[0]) for case, names in files.items()}


def group_channels(files: Sequence[Path]) -> list[Case]:
    """Cases of a folder of images: nnU-Net ``CASE_XXXX`` channel files grouped (:func:`channel_groups`, the
    parser of dataset folders), else one file per case.

    Files count as nnU-Net channel files when every name ends in ``_XXXX`` and every case's channels are
    contiguous from ``_0000``; whether the channel count fits the model is :func:`check_channels`'s to say.
    """
    groups = channel_groups(files)
    nnunet = sum(map(len, groups.values())) == len(files) and all(
        list(g) == list(range(len(g))) for g in groups.values())
    if not (files and nnunet):
        return [Case(case_id(path), str(path)) for path in files]
    return [Case(cid, [str(p) for p in g.values()] if len(g) > 1 else str(g[0])) for cid, g in groups.items()]


def check_channels(cases: Sequence[Case], num_channels: int, where: str) -> None:
    """Refuse cases of one file per channel (nnU-Net's) whose number of files is not the model's ``num_channels``
    (a single file may hold the channels on its last axis: its count is checked on reading).

    Raises:
        PredictionError: naming ``where`` (the input), the first such cases and their files.
    """
    wrong = [case for case in cases if len(case.image_files) > 1 and len(case.image_files) != num_channels]
    if wrong:
        files = ", ".join(Path(str(f)).name for f in wrong[0].image_files)
        raise PredictionError(f"{where}: case {wrong[0].case} has {len(wrong[0].image_files)} channel files ({files})"
                              f"{f' and {len(wrong) - 1} more cases likewise' if len(wrong) > 1 else ''}, but the "
                              f"model takes {num_channels} channel(s); nnU-Net names CASE_XXXX are one file per "
                              f"channel (rename files that are cases of their own)")


def attach_labels(cases: list[Case], label_dir: Path) -> list[Case]:
    """Give each case without a label the file of ``label_dir`` with the same case id, if there is one.

    Raises:
        PredictionError: a case held by two files of ``label_dir`` (:func:`files_by_case`).
    """
    if not label_dir.is_dir():
        return cases
    labels = files_by_case(label_dir, str(label_dir))
    for case in cases:
        if case.label is None:
            case.label = labels.get(case.case)
    return cases


def series_cases(folder: Path) -> list[Case]:
    """The DICOM series under ``folder`` as cases: in the folder itself and in its sub-folders at any depth
    (:func:`~medseg.data.dicom.series_folders`; a ``DICOMDIR`` export's series lie a few levels down); the folders
    holding files but no DICOM file are named in the log. A series folder is a case named after its path below
    ``folder`` (``a_b`` for ``folder/a/b``; ``folder`` itself: its name), a folder of several series a case per
    ``SeriesInstanceUID`` (:func:`~medseg.data.dicom.series_sources`)."""
    folders, skipped = series_folders(folder)
    if skipped:
        names = [str(path.relative_to(folder)) for path in skipped]
        log.info("%s: skipped %d folder(s) holding no DICOM file: %s%s", folder, len(names), ", ".join(names[:5]),
                 f" and {len(names) - 5} more" if len(names) > 5 else "")
    cases = []
    for series_folder in folders:
        name = "_".join(series_folder.relative_to(folder).parts) or folder.name
        cases += [Case(case, source) for case, source in series_sources(series_folder, name)]
    return cases


def _folder_cases(folder: Path) -> list[Case]:
    """The cases of a folder of images or DICOM series, or of its ``imagesTs/`` (else ``imagesTr/``) with the labels
    of ``labelsTs/`` (``labelsTr/``)."""
    image_dir = next((folder / d for d in ("imagesTs", "imagesTr") if (folder / d).is_dir()), folder)
    cases = [*group_channels(image_files(image_dir)), *series_cases(image_dir)]
    if image_dir != folder:
        attach_labels(cases, folder / image_dir.name.replace("images", "labels"))
    return cases


def read_dataset(json_path: Path) -> DatasetInfo:
    """The dataset a ``dataset.json`` describes (nnU-Net's when it has ``channel_names``, else MSD's); its training
    cases are not required.

    Raises:
        PredictionError: the file is no valid JSON or no dataset description.
    """
    try:
        meta = json.loads(json_path.read_text())
        return load_dataset(json_path.parent, "nnunet" if "channel_names" in meta else "msd", require_training=False)
    except json.JSONDecodeError as err:
        raise PredictionError(f"{json_path}: not valid JSON ({err})") from None
    except DatasetError as err:
        raise PredictionError(str(err)) from None


def fold_split(info: DatasetInfo, trained_on: DataConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The (training, validation) entries of ``info`` in the fold a checkpoint trained on (its ``data`` config): as
    training split them (:func:`~medseg.data.datalist.split_cases`: ``data.splits``, the dataset's validation list,
    the split stored in the dataset's cache, or the same split made again from ``data.split_seed``), none stored.

    Raises:
        DatasetError: a splits file that does not fit the dataset's cases."""
    stored = splits_path(dataset_cache_dir(info.root, trained_on.cache_dir), trained_on)
    return split_cases(info, trained_on.fold, trained_on.num_folds, trained_on.split_seed,
                       splits_file=stored if stored.is_file() else None, given=trained_on.splits)


def _dataset_cases(json_path: Path, split: str, trained_on: DataConfig | None) -> list[Case]:
    root = json_path.parent
    info = read_dataset(json_path)
    try:
        if split == "validation" and not info.validation and trained_on is not None:
            if trained_on.fold == "all":
                raise PredictionError(f"split=validation: the checkpoint was trained with data.fold=all, on every "
                                      f"case of {json_path}, so it has no validation cases; choose split=test, or "
                                      f"score a fold's checkpoint")
            _, entries = fold_split(info, trained_on)
        else:
            entries = {"training": info.training, "test": info.test, "validation": info.validation or []}[split]
    except DatasetError as err:
        raise PredictionError(str(err)) from None
    if not entries and split == "validation" and trained_on is None:
        raise PredictionError(f"{json_path}: no validation list, and no single checkpoint whose fold to take (an "
                              f"ensemble): score each fold on its own cases with scripts/crossval.py, or choose "
                              f"split=test|training")
    if not entries and split == "test" and (root / "imagesTs").is_dir():  # no test list: the folder's imagesTs/
        return _folder_cases(root)
    if not entries:
        raise PredictionError(f"{json_path}: the {split!r} list is empty (choose split=test|training|validation)")
    cases = [Case(e["case"], e["image"], e.get("label")) for e in entries]
    if split == "test":  # test labels are not in dataset.json; take them from labelsTs/ when present
        attach_labels(cases, root / "labelsTs")
    return cases


def dataset_json(path: Path) -> Path | None:
    """The ``dataset.json`` that ``input`` names (the file, or the folder holding it); None for another input.

    Raises:
        PredictionError: a ``.json`` file of another name.
    """
    if path.is_file() and path.suffix == ".json":
        if path.name != "dataset.json":
            raise PredictionError(f"input={path}: a dataset description must be named dataset.json")
        return path
    return path / "dataset.json" if (path / "dataset.json").is_file() else None


def find_references(input_path: str | Path, split: str, trained_on: DataConfig | None = None) -> dict[str, str]:
    """Case id -> reference label file of every case of ``input_path`` that has one: a ``dataset.json``'s ``split``
    (as :func:`find_cases` reads it; test labels from ``labelsTs/``), a folder holding ``labelsTs/`` (else
    ``labelsTr/``), or a folder of label files.

    Raises:
        PredictionError: the path does not exist, holds no label file, or holds a case in two files
            (:func:`files_by_case`).
    """
    path = Path(input_path).expanduser()
    if not path.exists():
        raise PredictionError(f"input={path}: not found")
    description = dataset_json(path)
    if description is not None:
        labels = {case.case: case.label for case in _dataset_cases(description, split, trained_on) if case.label}
    else:
        folder = next((path / d for d in ("labelsTs", "labelsTr") if (path / d).is_dir()), path)
        labels = files_by_case(folder, f"input={path}")
    if not labels:
        raise PredictionError(f"input={path}: no reference labels found (a folder of label files, one holding "
                              f"labelsTs/ or labelsTr/, or a dataset.json whose {split!r} cases have labels)")
    return labels


def find_cases(input_path: str | Path, split: str, num_channels: int,
               trained_on: DataConfig | None = None) -> list[Case]:
    """The cases of ``input_path`` (see :mod:`medseg.inference.predict` for the accepted layouts).

    ``trained_on`` is the checkpoint's data config (:attr:`EvalModel.data`); with it, ``split=validation``
    on a dataset without a validation list means the validation fold of that training run (refused for
    ``data.fold=all``, which trained on every case).

    Raises:
        PredictionError: the path does not exist, holds no images, has duplicate case ids, or cases of one file
            per channel whose count is not ``num_channels`` (:func:`check_channels`).
        ImageReadError: a DICOM file of a series folder that pydicom cannot read, or no pydicom installed.
    """
    path = Path(input_path).expanduser()
    if not path.exists():
        raise PredictionError(f"input={path}: not found")
    description = dataset_json(path)
    if description is not None:
        cases = _dataset_cases(description, split, trained_on)
    elif path.is_file():
        cases = [Case(case_id(path), str(path))]
    else:
        cases = _folder_cases(path)
    if not cases:
        raise PredictionError(f"input={path}: no images found ({', '.join(IMAGE_ENDINGS)} files, DICOM series "
                              f"folders, imagesTs/ + labelsTs/, or a dataset.json)")
    check_channels(cases, num_channels, f"input={path}")
    ids = [c.case for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise PredictionError(f"input={path}: duplicate case ids {duplicates}")
    return cases
