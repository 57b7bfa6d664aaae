"""Dataset verification: check every case of a :class:`DatasetInfo` before training, report every problem.

Like nnU-Net's ``--verify_dataset_integrity``, but it never stops at the first problem and each
message says what is wrong, in which case and which file, and what was expected:

- missing, unreadable or corrupt files, NaN or Inf voxels, unusable affines (the reader's error,
  :func:`medseg.data.reading.read_file`, no traceback);
- image dimensionality and channel count against ``dataset.json`` (one 3D file per channel, or one
  4D file with channels on the last axis); multi-file channels must share shape and affine;
- image/label spatial shape and affine (spacing, direction, origin) agreement;
- label values outside ``dataset.json``'s labels, non-integer label values (the check every label read makes:
  :func:`medseg.data.reading.label_problems`), 3D labels;
- an empty training list, duplicate case ids, validation entries that repeat training cases;
- a label without any foreground, and files outside the dataset folder (warnings, not errors).

:func:`check_dataset` is the trainer's gate; :func:`check_data_cli` backs ``scripts/check_data.py``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm import tqdm

from medseg.config import DataConfig
from medseg.data.datalist import DatasetInfo, case_id, dataset_from_config
from medseg.data.reading import (
    IMAGE,
    ImageReadError,
    affine_difference,
    drop_trailing_singletons,
    image_paths,
    label_problems,
    read_file,
)
from medseg.errors import DatasetError

log = logging.getLogger(__name__)

Severity = Literal["error", "warning"]


@dataclass
class Problem:
    """One problem found in one file of one case."""

    case: str
    file: str
    """The file concerned, relative to the dataset root when it lies inside it."""
    message: str
    severity: Severity = "error"

    def format(self) -> str:
        """One report line naming the severity, the case and the file."""
        return f"  {self.severity.upper():<8}{self.case}: {self.file}: {self.message}"


@dataclass
class VerificationReport:
    """All problems of one dataset verification."""

    problems: list[Problem] = field(default_factory=list)
    num_cases: int = 0
    """Number of cases checked (training and explicit validation entries)."""
    dataset: str = ""
    """The dataset's name and root, for the report header."""

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True when there are no errors (warnings allowed)."""
        return not self.errors

    def format(self) -> str:
        """A readable multi-line report, grouped per case, ending with a count line."""
        header = f"Dataset verification of {self.dataset}: {self.num_cases} cases checked"
        lines = [header] if self.dataset else []
        by_case: dict[str, list[Problem]] = {}
        for problem in self.problems:
            by_case.setdefault(problem.case, []).append(problem)
        for case, problems in by_case.items():
            lines.append(f"{case}:")
            lines.extend(problem.format() for problem in problems)
        lines.append(self._count_line(len(by_case)))
        return "\n".join(lines)

    def _count_line(self, cases_with_problems: int) -> str:
        if not self.problems:
            return f"OK: no problems in {self.num_cases} cases"
        status = "OK" if self.ok else "FAILED"
        return (f"{status}: {_plural(len(self.errors), 'error')}, {_plural(len(self.warnings), 'warning')} "
                f"in {cases_with_problems} of {self.num_cases} cases")


class DatasetVerificationError(DatasetError):
    """The dataset has errors; the message is the full verification report."""


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# --------------------------------------------------------------------------------------------- reading


@dataclass
class _Volume:
    """A loaded file: its (display) path, array with trailing singleton axes beyond 3D dropped, affine."""

    file: str
    array: np.ndarray
    affine: np.ndarray

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape[:3])


# ------------------------------------------------------------------------------------ geometry helpers


# ------------------------------------------------------------------------------------------- a case


@dataclass
class _CaseCheck:
    """Collects the problems of one case."""

    case: str
    root: Path
    in_channels: int
    channel_names: list[str]
    labels: dict[int, str]
    """Every label value a label file may hold -> its name (the ignore label included)."""
    tolerance: float
    problems: list[Problem] = field(default_factory=list)

    def display(self, path: str | Path) -> str:
        """``path`` relative to the dataset root when inside it."""
        try:
            return str(Path(path).resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)

    def add(self, file: str, message: str, severity: Severity = "error") -> None:
        self.problems.append(Problem(self.case, file, message, severity))

    def check_inside_root(self, paths: list[str]) -> None:
        """A file outside the dataset folder is a warning: the dataset then depends on another folder (a
        ``../`` or absolute path in ``dataset.json``, or a link), which a copy or a move of the folder loses."""
        root = self.root.resolve()
        for path in paths:
            if not Path(path).resolve().is_relative_to(root):
                self.add(self.display(path), f"file outside the dataset folder {root}; dataset.json's paths "
                                             f"should stay inside it", "warning")

    def load(self, path: str | Path) -> _Volume | None:
        """Read ``path`` once; on a missing or unreadable file record the problem and return None."""
        file = self.display(path)
        try:
            array, affine = read_file(path)
        except ImageReadError as err:
            self.add(file, err.reason)
            return None
        return _Volume(file, drop_trailing_singletons(array), affine)

    @property
    def channels_text(self) -> str:
        return f"{_plural(self.in_channels, 'channel')}: {', '.join(self.channel_names)}"

    def compare_geometry(self, reference: _Volume, volume: _Volume, what: str) -> None:
        """Record shape and affine mismatches of ``volume`` against ``reference``."""
        if volume.spatial_shape != reference.spatial_shape:
            self.add(volume.file, f"{what} shape {volume.spatial_shape} differs from the image shape "
                                  f"{reference.spatial_shape} ({reference.file})")
            return
        difference = affine_difference(reference.affine, volume.affine, self.tolerance)
        if difference:
            self.add(volume.file, f"{what} affine differs from the image's ({reference.file}) beyond "
                                  f"tolerance {self.tolerance:g}: {difference}")

    def check_image_file(self, volume: _Volume, multi_file: bool) -> bool:
        """Dimensionality and channel count of one image file; True when its first 3 axes are spatial."""
        shape, ndim = volume.array.shape, volume.array.ndim
        if ndim == 3:
            if not multi_file and self.in_channels > 1:
                self.add(volume.file, f"3D image of shape {shape}, but dataset.json declares "
                                      f"{self.channels_text}; expected a 4D file with the channels on "
                                      f"the last axis, or one 3D file per channel")
            return True
        if ndim == 4 and (multi_file or self.in_channels == 1):
            per = "one 3D file per channel" if multi_file else f"dataset.json declares {self.channels_text}"
            self.add(volume.file, f"4D image of shape {shape} where 3D is expected ({per})")
        elif ndim == 4 and shape[3] != self.in_channels:
            self.add(volume.file, f"image has {shape[3]} channels on its last axis (shape {shape}), "
                                  f"but dataset.json declares {self.channels_text}")
        elif ndim != 4:
            self.add(volume.file, f"{ndim}D image of shape {shape}; expected 3D, or 4D with the "
                                  f"channels on the last axis")
            return False
        return True

    def check_images(self, paths: list[str], multi_file: bool) -> _Volume | None:
        """Load and check a case's image file(s); return the reference volume for the label, if any."""
        if multi_file and len(paths) != self.in_channels:
            self.add(", ".join(self.display(p) for p in paths),
                     f"{len(paths)} image files, but dataset.json declares {self.channels_text}")
        reference = None
        for path in paths:
            volume = self.load(path)
            if volume is None:
                continue
            if not self.check_image_file(volume, multi_file):
                continue
            if reference is None:
                reference = volume
            else:
                self.compare_geometry(reference, volume, "channel")
        return reference

    def check_label(self, path: str, reference: _Volume | None) -> None:
        """Load and check a case's label: 3D, geometry matching the image, valid integer values."""
        volume = self.load(path)
        if volume is None:
            return
        if volume.array.ndim != 3:
            self.add(volume.file, f"label must be 3D, got shape {volume.array.shape}")
        elif reference is not None:
            self.compare_geometry(reference, volume, "label")
        self.check_label_values(volume)

    def check_label_values(self, volume: _Volume) -> None:
        """Non-integer, negative or undeclared values (:func:`~medseg.data.reading.label_problems`, the check every
        label read makes); a label without foreground is a warning."""
        problems = label_problems(volume.array, self.labels)
        for problem in problems:
            self.add(volume.file, problem)
        if not problems and not np.any(volume.array):
            self.add(volume.file, "no foreground: the label is all background (0)", "warning")


def _entry_case(entry: Mapping[str, Any]) -> str:
    return str(entry.get("case") or case_id(image_paths(entry)[0]))


def _check_case(entry: Mapping[str, Any], info: DatasetInfo, tolerance: float) -> list[Problem]:
    """Every problem of one training (or validation) entry; each file is read once."""
    check = _CaseCheck(
        case=_entry_case(entry), root=Path(info.root), in_channels=info.in_channels,
        channel_names=list(info.channel_names), labels=info.label_spec.declared, tolerance=tolerance,
    )
    paths = image_paths(entry)
    check.check_inside_root(paths + ([str(entry["label"])] if entry.get("label") else []))
    reference = check.check_images(paths, multi_file=isinstance(entry[IMAGE], list | tuple))
    if entry.get("label"):
        check.check_label(str(entry["label"]), reference)
    else:
        check.add(check.display(paths[0]), "training case without a label")
    return check.problems


def _list_problems(info: DatasetInfo) -> list[Problem]:
    """Dataset-level problems: an empty training list, duplicate case ids, validation entries that repeat training
    cases (their scores would be those of cases the network trained on)."""
    dataset_json = "dataset.json"
    if not info.training:
        return [Problem("(dataset)", dataset_json, "the training list is empty")]
    ids = [_entry_case(entry) for entry in info.training]
    problems = []
    for cid, count in Counter(ids).items():
        if count > 1:
            positions = ", ".join(f"#{i}" for i, other in enumerate(ids) if other == cid)
            problems.append(Problem(cid, dataset_json, f"case id appears {count} times in the training list "
                                                       f"(entries {positions}); case ids must be unique"))
    for position, entry in enumerate(info.validation or []):
        cid = _entry_case(entry)
        if cid in ids:
            problems.append(Problem(cid, dataset_json, f"validation entry #{position} repeats training case {cid} "
                                                       f"(training entry #{ids.index(cid)}); a validation case must "
                                                       f"not be trained on"))
    return problems


def verify_dataset(
    info: DatasetInfo, progress: bool = True, affine_tolerance: float = 1e-3
) -> VerificationReport:
    """Check every training (and explicit validation) case of ``info``; report every problem at once.

    Args:
        info: the dataset, from :func:`medseg.data.datalist.load_dataset`.
        progress: show a progress bar over the cases.
        affine_tolerance: allowed relative difference of spacing and origin (in voxels) and absolute
            difference of direction cosines between the files of one case.
    """
    cases = list(info.training) + list(info.validation or [])
    problems = _list_problems(info)
    for entry in tqdm(cases, desc="verifying dataset", unit="case", disable=not progress):
        problems.extend(_check_case(entry, info, affine_tolerance))
    return VerificationReport(problems, num_cases=len(cases), dataset=f"{info.name} ({info.root})")


def check_dataset(info: DatasetInfo, **kwargs: Any) -> VerificationReport:
    """Verify ``info`` (keyword arguments go to :func:`verify_dataset`), log warnings, raise on errors.

    Raises:
        DatasetVerificationError: the dataset has errors; the message is the full report.
    """
    report = verify_dataset(info, **kwargs)
    for problem in report.warnings:
        log.warning("dataset check: %s: %s: %s", problem.case, problem.file, problem.message)
    if not report.ok:
        raise DatasetVerificationError(report.format())
    return report


def check_data_cli(data: DataConfig, progress: bool = True) -> int:
    """Load the dataset of ``data``, verify it and print the report; the exit code (0 ok, 1 errors).

    An unusable dataset folder raises :class:`~medseg.errors.DatasetError` (one line, no traceback).
    """
    report = verify_dataset(dataset_from_config(data), progress=progress)
    print(report.format())
    return 0 if report.ok else 1
