"""Dataset descriptions: MSD (Medical Segmentation Decathlon) and nnU-Net v2 raw folders, and folds.

Both formats become one :class:`DatasetInfo`: a list of cases, each a dict with ``case`` (id),
``image`` (a path, or a list of paths for one file per channel; a path may name a DICOM series folder:
:mod:`medseg.data.dicom`) and ``label`` (training cases only),
plus the classes (label values with gaps, an ``ignore`` label and nnU-Net's regions:
:mod:`medseg.data.labels`) and channel names. ``num_outputs`` and ``in_channels`` come from here, never
typed twice in a config.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from monai.data import load_decathlon_datalist

from medseg.config import DataConfig
from medseg.data.demo import ensure_demo_dataset
from medseg.data.labels import LabelSpec, config_regions, msd_labels, nnunet_labels
from medseg.data.reading import IMAGE_ENDINGS
from medseg.errors import ConfigError, DatasetError
from medseg.io import atomic_write_json, check_writable, read_json_setting

log = logging.getLogger("medseg")

CACHE_FOLDER = ".medseg_cache"
"""The cache folder inside a writable dataset folder."""

CHANNEL_FILE = re.compile(r"^(?P<case>.+)_(?P<channel>\d{4})$")
"""nnU-Net image names without their ending: ``CASE_0000`` for channel 0, ``CASE_0001`` for channel 1, ..."""


@dataclass
class DatasetInfo:
    """One dataset, whatever its on-disk format."""

    root: Path
    format: str
    name: str
    labels: dict[int, str]
    """Class index -> name, including 0 (background); contiguous indices, the ignore label excluded."""
    channel_names: list[str]
    """One entry per input channel, e.g. ``["CT"]`` or ``["T2", "ADC"]``."""
    training: list[dict[str, Any]]
    test: list[dict[str, Any]] = field(default_factory=list)
    validation: list[dict[str, Any]] | None = None
    """An explicit validation list from the dataset file; it wins over folds."""
    label_values: list[int] = field(default_factory=list)
    """The dataset's label value of each class index (background first); empty means the indices themselves."""
    regions: dict[str, list[int]] | None = None
    """Region name -> member class indices (contiguous): region-based training; None: softmax classes."""
    regions_class_order: list[int] | None = None
    """The label value written for each region."""
    ignore_value: int | None = None
    """The value of the ``ignore`` label, if the dataset has one."""

    def __post_init__(self) -> None:
        if not self.label_values:
            self.label_values = sorted(self.labels)

    @property
    def label_spec(self) -> LabelSpec:
        """Classes, ignore label and regions in one object (:mod:`medseg.data.labels`)."""
        return LabelSpec(self.labels, self.label_values, self.regions, self.regions_class_order, self.ignore_value)

    @property
    def num_classes(self) -> int:
        """Number of classes, background included (the ignore label is none)."""
        return len(self.labels)

    @property
    def class_names(self) -> list[str]:
        """The foreground classes' names, in class-index order."""
        return self.label_spec.class_names

    @property
    def region_based(self) -> bool:
        return self.regions is not None

    @property
    def num_outputs(self) -> int:
        """The network's output channels: the classes (background included), or one per region."""
        return self.label_spec.num_outputs

    @property
    def output_names(self) -> list[str]:
        """The foreground classes' names, or the regions' names: what validation scores."""
        return self.label_spec.output_names

    @property
    def in_channels(self) -> int:
        return len(self.channel_names)

    @property
    def is_ct(self) -> bool:
        """True when every channel is CT (Hounsfield units), which selects CT normalisation."""
        return all(map(is_ct_channel, self.channel_names))


def is_ct_channel(name: str) -> bool:
    """Whether a channel (``dataset.json``'s modality name) is CT, in Hounsfield units."""
    return name.strip().upper() == "CT"


def case_id(path: str | Path, file_ending: str | None = None) -> str:
    """The case id of an image or label path: its file name without the image ending (a DICOM series folder: its
    name)."""
    name = Path(path).name
    if Path(path).is_dir():
        return name
    for ending in ((file_ending,) if file_ending else ()) + IMAGE_ENDINGS:
        if name.endswith(ending):
            return name[: -len(ending)]
    return Path(name).stem


def channel_file_name(case: str, channel: int, file_ending: str) -> str:
    """nnU-Net's name of a case's image file for ``channel``: ``CASE_XXXX<file_ending>``."""
    return f"{case}_{channel:04d}{file_ending}"


def parse_channel_file(path: str | Path, file_ending: str | None = None) -> tuple[str, int] | None:
    """``(case, channel)`` of an nnU-Net image file named ``CASE_XXXX<file_ending>`` (any image ending when
    ``file_ending`` is None), or None for any other name."""
    if file_ending is not None and not Path(path).name.endswith(file_ending):
        return None
    match = CHANNEL_FILE.match(case_id(path, file_ending))
    return (match["case"], int(match["channel"])) if match else None


def channel_groups(paths: Iterable[str | Path], file_ending: str | None = None) -> dict[str, dict[int, Path]]:
    """nnU-Net image files grouped into cases by their names (:func:`parse_channel_file`): case id -> channel ->
    file, cases sorted; files with other names are left out. The one grouping of dataset folders and evaluation
    inputs."""
    groups: dict[str, dict[int, Path]] = {}
    for path in paths:
        name = parse_channel_file(path, file_ending)
        if name is not None:
            groups.setdefault(name[0], {})[name[1]] = Path(path)
    return {case: dict(sorted(channels.items())) for case, channels in sorted(groups.items())}


JSON_TYPES = {dict: "an object ({...})", list: "a list ([...])", str: "a string"}
"""The JSON types ``dataset.json``'s keys must have -> how messages name them."""


def _json_type(value: Any) -> str:
    """How a message names the JSON type of ``value``."""
    return next((name for kind, name in JSON_TYPES.items() if isinstance(value, kind)), type(value).__name__)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DatasetError(f"{path}: dataset.json not found (data.root must be a dataset folder)")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DatasetError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(meta, dict):
        raise DatasetError(f"{path}: expected {JSON_TYPES[dict]} of keys, got {_json_type(meta)}")
    return meta


def _require(meta: dict[str, Any], key: str, path: Path, kind: type = dict) -> Any:
    """``meta[key]``, which must be there and of JSON type ``kind``: the one check of every key the loaders read."""
    if key not in meta:
        raise DatasetError(f"{path}: missing key {key!r}")
    return _typed(meta, key, path, kind)


def _typed(meta: dict[str, Any], key: str, path: Path, kind: type) -> Any:
    """``meta[key]`` (None when absent), refused unless of JSON type ``kind``."""
    value = meta.get(key)
    if value is not None and not isinstance(value, kind):
        raise DatasetError(f"{path}: {key!r} must be {JSON_TYPES[kind]}, got {_json_type(value)}: "
                           f"{json.dumps(value)[:80]}")
    return value


def _entries(meta: dict[str, Any], key: str, path: Path) -> list[Any]:
    """The case list ``meta[key]`` of an MSD ``dataset.json``: a list of objects with an ``image`` (``test``'s entries
    may also be bare image paths). A missing ``label`` is left to the data check, which reports every case's."""
    entries = _typed(meta, key, path, list) or []
    for position, entry in enumerate(entries):
        if not (isinstance(entry, dict) and entry.get("image")) and not (key == "test" and isinstance(entry, str)):
            raise DatasetError(f"{path}: {key!r} entry #{position} must be an object with an 'image', got "
                               f"{json.dumps(entry)[:80]}")
    return entries


def _int_keyed(mapping: dict[str, Any], key: str, path: Path) -> dict[int, Any]:
    try:
        return {int(k): v for k, v in mapping.items()}
    except (TypeError, ValueError) as err:
        raise DatasetError(f"{path}: {key!r} keys must be integers, got {list(mapping)}") from err


def _load_msd(root: Path, require_training: bool) -> DatasetInfo:
    path = root / "dataset.json"
    meta = _read_json(path)
    labels = msd_labels(_int_keyed(_require(meta, "labels", path), "labels", path), path)
    modality = _int_keyed(_require(meta, "modality", path), "modality", path)
    channel_names = [modality[i] for i in sorted(modality)]

    def cases(key: str) -> list[dict[str, Any]]:
        if not _entries(meta, key, path):
            return []
        entries = load_decathlon_datalist(path, is_segmentation=True, data_list_key=key, base_dir=root)
        for entry in entries:
            first = entry["image"][0] if isinstance(entry["image"], list) else entry["image"]
            entry["case"] = case_id(first)
        return entries

    return DatasetInfo(
        root=root,
        format="msd",
        name=str(meta.get("name", root.name)),
        channel_names=channel_names,
        training=cases("training"),
        test=cases("test"),
        validation=cases("validation") or None,
        **asdict(labels),
    )


def _nnunet_cases(folder: Path, num_channels: int, file_ending: str, with_labels: bool) -> list[dict[str, Any]]:
    """Cases of an nnU-Net ``imagesTr``/``imagesTs`` folder: ``CASE_0000<ending>`` ... per channel."""
    if not folder.is_dir():
        return []
    ids = [case for case, channels in channel_groups(folder.iterdir(), file_ending).items() if 0 in channels]
    label_dir = folder.parent / folder.name.replace("images", "labels")
    entries = []
    for cid in ids:
        images = [str(folder / channel_file_name(cid, c, file_ending)) for c in range(num_channels)]
        entry: dict[str, Any] = {"case": cid, "image": images if num_channels > 1 else images[0]}
        if with_labels:
            entry["label"] = str(label_dir / f"{cid}{file_ending}")
        entries.append(entry)
    return entries


def _load_nnunet(root: Path, require_training: bool) -> DatasetInfo:
    path = root / "dataset.json"
    meta = _read_json(path)
    channels = _int_keyed(_require(meta, "channel_names", path), "channel_names", path)
    labels = nnunet_labels(_require(meta, "labels", path), _typed(meta, "regions_class_order", path, list), path)
    file_ending = _typed(meta, "file_ending", path, str) or ".nii.gz"
    channel_names = [channels[i] for i in sorted(channels)]
    training = _nnunet_cases(root / "imagesTr", len(channel_names), file_ending, with_labels=True)
    if require_training and not training:
        raise DatasetError(f"{root / 'imagesTr'}: no training images named CASE_0000{file_ending}")
    return DatasetInfo(
        root=root,
        format="nnunet",
        name=str(meta.get("name", root.name)),
        channel_names=channel_names,
        training=training,
        test=_nnunet_cases(root / "imagesTs", len(channel_names), file_ending, with_labels=False),
        **asdict(labels),
    )


def load_dataset(root: str | Path, format: str = "msd", require_training: bool = True) -> DatasetInfo:
    """Read the dataset at ``root`` (a folder holding ``dataset.json``) in the given on-disk format.

    ``require_training``: refuse a dataset without training cases (training, planning and the data check need
    them; evaluating its test cases, ``imagesTs/`` and ``labelsTs/`` beside the ``dataset.json``, does not).

    Raises:
        DatasetError: the folder, its ``dataset.json`` or its layout is unusable; the message names it.
    """
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise DatasetError(f"data.root={root}: folder not found")
    info = LOADERS[format](root, require_training)
    if require_training and not info.training:
        raise DatasetError(f"{root / 'dataset.json'}: the training list is empty")
    return info


LOADERS = {"msd": _load_msd, "nnunet": _load_nnunet}
"""On-disk dataset layouts -> their readers (``root``, ``require_training``)."""
DATASET_FORMATS = ("demo", *LOADERS)
"""The values of ``data.format``: ``demo`` is an MSD folder medseg generates on first use."""


def splits_path(cache_dir: str | Path, data: DataConfig) -> Path:
    """The file under a dataset's cache dir that stores the fold split for ``split_seed`` and ``num_folds``."""
    return Path(cache_dir) / f"splits_seed{data.split_seed}_k{data.num_folds}.json"


def _listed(cases: Iterable[str], limit: int = 5) -> str:
    """``a, b, c`` for at most ``limit`` sorted case ids, then how many more."""
    cases = sorted(cases)
    more = f" (and {len(cases) - limit} more)" if len(cases) > limit else ""
    return ", ".join(cases[:limit]) + more


def _fold_entry(entry: Any, where: str, fold: int) -> dict[str, list[str]]:
    """One fold of a splits file, ``{"train": [ids], "val": [ids]}``, its types checked."""
    if not (isinstance(entry, dict) and all(isinstance(entry.get(key), list) and all(
            isinstance(case, str) for case in entry[key]) for key in ("train", "val"))):
        raise ConfigError(f"{where}: fold {fold} is not {{\"train\": [case ids], \"val\": [case ids]}}")
    return {"train": entry["train"], "val": entry["val"]}


def read_splits(path: str | Path, fold: int, num_folds: int, ids: Iterable[str]) -> dict[str, list[str]]:
    """Fold ``fold`` of the splits file at ``path`` (``data.splits``), checked against the dataset's case ``ids``.

    The file is nnU-Net's ``splits_final.json`` or medseg's cached ``splits_seed*_k*.json`` (a list of
    ``{"train": [ids], "val": [ids]}``, entry k being fold k; its length must be ``num_folds``), or a run's
    ``splits.json`` (``{"fold": k, "train": [...], "val": [...]}``, fold k only).

    Raises:
        ConfigError: no such file, not JSON (an nnU-Net v1 pickle is named as one), not a splits file, another
            number of folds than ``num_folds``, a run's file of another fold, or a fold without validation cases
            (training would end without a validated ``best.pt``).
        DatasetError: the fold names cases the dataset lacks, misses some of its cases, or puts a case in both its
            training and validation cases.
    """
    where = f"data.splits={path}"
    content = read_json_setting(path, where, "", "give nnU-Net v2's splits_final.json (nnUNet_preprocessed/<dataset>/) "
                                "or a list of {\"train\": [case ids], \"val\": [case ids]} per fold")
    if isinstance(content, dict) and "fold" in content:  # a run's splits.json
        if content["fold"] != fold:
            raise ConfigError(f"{where}: a run's splits of fold {content['fold']} only; data.fold={fold}")
        entry = _fold_entry(content, where, fold)
    elif isinstance(content, list):
        if len(content) != num_folds:
            raise ConfigError(f"{where}: {len(content)} folds, data.num_folds={num_folds}: set "
                              f"data.num_folds={len(content)}")
        entry = _fold_entry(content[fold], where, fold)
    else:
        raise ConfigError(f"{where}: not a splits file (expected nnU-Net's splits_final.json, a list of "
                          "{\"train\": [...], \"val\": [...]} per fold, or a run's splits.json)")
    if not entry["val"]:
        raise ConfigError(f"{where}: fold {fold} has an empty \"val\" list; every fold needs validation cases (they "
                          f"choose best.pt): give a splits file whose fold {fold} holds some, or data.fold=all to "
                          f"train on every case")
    ids, train, val = set(ids), set(entry["train"]), set(entry["val"])
    for problem, cases in (("names cases the dataset lacks", (train | val) - ids),
                           ("misses cases of the dataset", ids - train - val),
                           ("puts cases in both train and val", train & val)):
        if cases:
            raise DatasetError(f"{where}: fold {fold} {problem}: {_listed(cases)}")
    return entry


def split_cases(
    info: DatasetInfo, fold: int | str, num_folds: int = 5, seed: int = 12345, splits_file: Path | None = None,
    given: str | Path | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split the training cases into (train, validation) for ``fold``.

    ``given`` (``data.splits``) names a splits file whose fold ``fold`` is taken as it is (:func:`read_splits`); it
    wins over an explicit validation list in the dataset file, which wins over the rest. ``fold="all"`` trains on
    every case and validates on them too (nnU-Net's convention). Otherwise the cases are shuffled with ``seed`` and
    dealt into ``num_folds`` folds; the split is stored in ``splits_file`` (if given) and reused, so
    a fold means the same cases across runs.

    Raises:
        ConfigError: see :func:`read_splits`; or a fold past the number of cases, which would have no validation
            cases.
        DatasetError: see :func:`read_splits`; stored splits that do not fit the dataset's cases.
    """
    ids = sorted(entry["case"] for entry in info.training)
    if given is not None and fold != "all":
        return _split_by(info, read_splits(given, int(fold), num_folds, ids)["val"])
    if info.validation:
        return info.training, info.validation
    if fold == "all":
        return info.training, info.training
    fold = int(fold)
    if fold >= len(ids):  # fold k validates every num_folds-th case from the k-th: none past the last case
        raise ConfigError(f"data.fold={fold} of data.num_folds={num_folds}: the dataset has {len(ids)} training "
                          f"case(s), so this fold would have no validation cases; choose data.fold below {len(ids)}, "
                          "or data.fold=all")
    if splits_file is not None and splits_file.is_file():
        splits = json.loads(splits_file.read_text())
    else:
        shuffled = ids.copy()
        random.Random(seed).shuffle(shuffled)
        splits = [{"train": sorted(set(shuffled) - set(shuffled[i::num_folds])),
                   "val": sorted(shuffled[i::num_folds])} for i in range(num_folds)]
        if splits_file is not None:
            atomic_write_json(splits_file, splits)
    if len(splits) != num_folds or set(splits[fold]["train"]) | set(splits[fold]["val"]) != set(ids):
        raise DatasetError(f"{splits_file}: stored splits do not match this dataset's cases; delete it")
    return _split_by(info, splits[fold]["val"])


def _split_by(info: DatasetInfo, val_ids: Iterable[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, validation) entries of ``info.training``: the validation ones those of ``val_ids``."""
    val_ids = set(val_ids)
    return ([e for e in info.training if e["case"] not in val_ids],
            [e for e in info.training if e["case"] in val_ids])


def dataset_from_config(data: DataConfig) -> DatasetInfo:
    """The :class:`DatasetInfo` of a ``data`` config (``format``: demo | msd | nnunet, ``root``).

    ``demo`` is an MSD folder at ``root``, generated (``num_cases`` cases) when missing. ``data.regions`` (and
    ``data.regions_class_order``) make the training region-based (:func:`medseg.data.labels.config_regions`).

    Raises:
        DatasetError: see :func:`load_dataset`. ConfigError: regions that do not fit the dataset's labels.
    """
    root = Path(data.root).expanduser()
    if data.format == "demo":
        ensure_demo_dataset(root, num_cases=data.num_cases)
    info = load_dataset(root, "msd" if data.format == "demo" else data.format)
    labels = config_regions(info.label_spec, data.regions, data.regions_class_order, info.root / "dataset.json")
    return replace(info, **asdict(labels))


def user_cache_root() -> Path:
    """medseg's folder in the user's cache directory (``$XDG_CACHE_HOME/medseg``, else ``~/.cache/medseg``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "medseg"


def _writable(folder: Path) -> bool:
    """Whether ``folder`` can be created or written to: :func:`medseg.io.check_writable`'s write of a file, which a
    read-only mount refuses as well as permissions do (even to root)."""
    try:
        check_writable(folder, "data.cache_dir")
    except ConfigError:
        return False
    return True


@cache
def dataset_cache_dir(root: str | Path, cache_dir: str | None = None) -> Path:
    """Where a dataset's fingerprint, fold splits and disk cache go.

    ``data.cache_dir`` when set; else ``<root>/.medseg_cache``; else, when the dataset lives on read-only
    storage, a folder under :func:`user_cache_root` named after the dataset and keyed by its resolved path
    (logged once).
    """
    if cache_dir:
        return Path(cache_dir).expanduser()
    root = Path(root).expanduser().resolve()
    default = root / CACHE_FOLDER
    if _writable(default):
        return default
    fallback = user_cache_root() / f"{root.name}-{hashlib.sha1(str(root).encode()).hexdigest()[:10]}"
    log.info("data.root %s is not writable: its caches go to %s (set data.cache_dir to choose)", root, fallback)
    return fallback
