"""The cases of an evaluation's ``input``: a folder of images, ``imagesTs/`` + ``labelsTs/``, or a ``dataset.json``.

See :mod:`medseg.evaluation.evaluate` for the accepted layouts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from medseg.config import DataConfig
from medseg.data.datalist import case_id, dataset_cache_dir, load_dataset, parse_channel_file, split_cases, splits_path
from medseg.data.reading import IMAGE_ENDINGS, ImageSource
from medseg.errors import DatasetError
from medseg.inference.settings import EvaluationError


@dataclass
class Case:
    """One case to evaluate: its id, image file(s) (one per channel; or images in memory) and optional label file."""

    case: str
    image: ImageSource | list[ImageSource]
    label: str | None = None

    @property
    def image_files(self) -> list[ImageSource]:
        return list(self.image) if isinstance(self.image, list) else [self.image]


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.name.endswith(IMAGE_ENDINGS))


def group_channels(files: Sequence[Path], num_channels: int) -> list[Case]:
    """Cases of a folder of images: nnU-Net ``CASE_XXXX`` channel files grouped, else one file per case.

    Files count as nnU-Net channel files when every name ends in ``_XXXX``, every case has channel
    ``_0000`` and its channels are contiguous (and, for single-channel models, all ``_0000``).
    """
    groups: dict[str, dict[int, Path]] = {}
    for path in files:
        name = parse_channel_file(path)
        if name is None:
            groups = {}
            break
        groups.setdefault(name[0], {})[name[1]] = path
    nnunet = bool(groups) and all(sorted(g) == list(range(len(g))) for g in groups.values())
    if nnunet and num_channels == 1:
        nnunet = all(len(g) == 1 for g in groups.values())
    if not nnunet:
        return [Case(case_id(path), str(path)) for path in files]
    return [Case(cid, [str(g[c]) for c in sorted(g)] if len(g) > 1 else str(g[0])) for cid, g in sorted(groups.items())]


def attach_labels(cases: list[Case], label_dir: Path) -> list[Case]:
    """Give each case without a label the file of ``label_dir`` with the same case id, if there is one."""
    if not label_dir.is_dir():
        return cases
    labels = {case_id(p): str(p) for p in _image_files(label_dir)}
    for case in cases:
        if case.label is None:
            case.label = labels.get(case.case)
    return cases


def _dataset_cases(json_path: Path, split: str, trained_on: DataConfig | None) -> list[Case]:
    root = json_path.parent
    try:
        meta = json.loads(json_path.read_text())
        info = load_dataset(root, "nnunet" if "channel_names" in meta else "msd")
        if split == "validation" and not info.validation and trained_on is not None:
            if trained_on.fold == "all":
                raise EvaluationError(f"split=validation: the checkpoint was trained with data.fold=all, on every "
                                      f"case of {json_path}, so it has no validation cases; choose split=test, or "
                                      f"score a fold's checkpoint")
            stored = splits_path(dataset_cache_dir(info.root, trained_on.cache_dir), trained_on)
            _, entries = split_cases(info, trained_on.fold, trained_on.num_folds, trained_on.split_seed,
                                     splits_file=stored if stored.is_file() else None)
        else:
            entries = {"training": info.training, "test": info.test, "validation": info.validation or []}[split]
    except json.JSONDecodeError as err:
        raise EvaluationError(f"{json_path}: not valid JSON ({err})") from None
    except DatasetError as err:
        raise EvaluationError(str(err)) from None
    if not entries and split == "validation" and trained_on is None:
        raise EvaluationError(f"{json_path}: no validation list, and no single checkpoint whose fold to take (an "
                              f"ensemble): score each fold on its own cases with scripts/crossval.py, or choose "
                              f"split=test|training")
    if not entries:
        raise EvaluationError(f"{json_path}: the {split!r} list is empty (choose split=test|training|validation)")
    cases = [Case(e["case"], e["image"], e.get("label")) for e in entries]
    if split == "test":  # test labels are not in dataset.json; take them from labelsTs/ when present
        attach_labels(cases, root / "labelsTs")
    return cases


def find_cases(input_path: str | Path, split: str, num_channels: int,
               trained_on: DataConfig | None = None) -> list[Case]:
    """The cases of ``input_path`` (see :mod:`medseg.evaluation.evaluate` for the accepted layouts).

    ``trained_on`` is the checkpoint's data config (:attr:`EvalModel.data`); with it, ``split=validation``
    on a dataset without a validation list means the validation fold of that training run (refused for
    ``data.fold=all``, which trained on every case).

    Raises:
        EvaluationError: the path does not exist, holds no images, or has duplicate case ids.
    """
    path = Path(input_path).expanduser()
    if not path.exists():
        raise EvaluationError(f"input={path}: not found")
    if path.is_file() and path.suffix == ".json":
        if path.name != "dataset.json":
            raise EvaluationError(f"input={path}: a dataset description must be named dataset.json")
        cases = _dataset_cases(path, split, trained_on)
    elif path.is_file():
        cases = [Case(case_id(path), str(path))]
    elif (path / "dataset.json").is_file():
        cases = _dataset_cases(path / "dataset.json", split, trained_on)
    else:
        image_dir = next((path / d for d in ("imagesTs", "imagesTr") if (path / d).is_dir()), path)
        cases = group_channels(_image_files(image_dir), num_channels)
        if image_dir != path:
            attach_labels(cases, path / image_dir.name.replace("images", "labels"))
    if not cases:
        raise EvaluationError(f"input={path}: no images found ({', '.join(IMAGE_ENDINGS)} files, imagesTs/ "
                              f"+ labelsTs/, or a dataset.json)")
    ids = [c.case for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise EvaluationError(f"input={path}: duplicate case ids {duplicates}")
    return cases
