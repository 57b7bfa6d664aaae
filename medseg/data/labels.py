"""Label sets as datasets declare them: values with gaps, nnU-Net v2's ``ignore`` label, and regions.

A dataset's labels become one :class:`LabelSpec`:

- **classes**: the label values of ``dataset.json`` (background 0 first) as contiguous indices ``0..K-1``. MONAI's
  ``MapLabelValued`` maps the values to the indices on reading (:func:`value_transforms`), and predictions are
  written back in the values, so ``{"background": 0, "edema": 1, "non-enhancing": 2, "enhancing": 4}`` trains on
  classes 0..3 and writes 4 where it predicts enhancing tumour.
- **ignore**: a label named ``ignore`` (nnU-Net v2's convention; it must be the highest value) marks voxels outside
  the loss and the metrics. Its voxels hold :data:`IGNORE_INDEX` in the training targets; it is never predicted.
- **regions** (nnU-Net v2's region-based training): named unions of label values, e.g. whole tumour ``[1, 2, 4]``,
  tumour core ``[2, 4]``, enhancing ``[4]``. The network predicts one sigmoid channel per region (no background
  channel); the label map written back starts from 0 and, region after region, gives the voxels where a region is
  predicted its ``regions_class_order`` value (later regions overwrite earlier ones).

The network's **outputs** are the foreground classes (softmax) or the regions (sigmoid), numbered from 1 like the
classes of a label map. Validation, evaluation and postprocessing work on one boolean mask per output,
``(R, *spatial)``: :meth:`LabelSpec.prediction_masks` from the network's probabilities, :func:`member_masks` from a
label map (a region's reference is the union of its labels). Evaluation takes them one output at a time
(:meth:`LabelSpec.each_output_mask`, :func:`each_member_mask`), so that its memory does not grow with the outputs.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai import transforms as mt

from medseg.data.reading import check_label_values, describe_values
from medseg.errors import ConfigError, DatasetError, MedsegError

IGNORE_INDEX = -1
"""The value of ignore voxels in training targets: in the class-index map (softmax), and in every channel of the
region targets. MONAI's nearest-neighbour downsampling (deep supervision) keeps it."""
IGNORE_NAME = "ignore"
"""The label name that marks ignore voxels (nnU-Net v2)."""
REGION_THRESHOLD = 0.5
"""A region is predicted where the sigmoid of its channel exceeds this."""


@dataclass(frozen=True)
class LabelSpec:
    """A dataset's classes, ignore label and regions (see the module docstring)."""

    labels: dict[int, str]
    """Contiguous class index -> name, background (0) included, the ignore label excluded."""
    label_values: list[int]
    """The dataset's label value of each class index."""
    regions: dict[str, list[int]] | None = None
    """Region name -> its member class indices (contiguous), in the order they are written; None: softmax classes."""
    regions_class_order: list[int] | None = None
    """The label value written for each region (region mode only)."""
    ignore_value: int | None = None
    """The dataset's value of the ignore label, if it has one."""

    @classmethod
    def plain(cls, labels: Mapping[int, str]) -> LabelSpec:
        """Classes whose values are their indices ``0..K-1``: no gaps, no ignore label, no regions."""
        return cls(dict(sorted(labels.items())), sorted(labels))

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LabelSpec:
        """The inverse of :meth:`as_dict`; a description with ``labels`` alone (older checkpoints) is :meth:`plain`."""
        labels = {int(k): str(v) for k, v in state["labels"].items()}
        if state.get("label_values") is None:
            return cls.plain(labels)
        regions = state.get("regions")
        return cls(labels, [int(v) for v in state["label_values"]],
                   {str(k): [int(i) for i in v] for k, v in regions.items()} if regions is not None else None,
                   [int(v) for v in state["regions_class_order"]] if regions is not None else None,
                   None if state.get("ignore_value") is None else int(state["ignore_value"]))

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON (and ``torch.load(weights_only=True)``) types, for checkpoints."""
        return {"labels": {str(k): v for k, v in self.labels.items()}, "label_values": list(self.label_values),
                "regions": None if self.regions is None else {k: list(v) for k, v in self.regions.items()},
                "regions_class_order": None if self.regions_class_order is None else list(self.regions_class_order),
                "ignore_value": self.ignore_value}

    # --- what the network predicts ---------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        """Classes, background included (the ignore label is none)."""
        return len(self.labels)

    @property
    def class_names(self) -> list[str]:
        """The foreground classes' names, in class-index order."""
        return [self.labels[index] for index in sorted(self.labels) if index > 0]

    @property
    def region_based(self) -> bool:
        return self.regions is not None

    @property
    def num_outputs(self) -> int:
        """The network's output channels: the classes (background included), or one per region."""
        return len(self.regions) if self.regions is not None else self.num_classes

    @property
    def output_names(self) -> list[str]:
        """The foreground classes' names, or the regions' names."""
        return list(self.regions) if self.regions is not None else self.class_names

    @property
    def outputs(self) -> dict[int, str]:
        """Output number (from 1, as classes in a label map) -> name: what metrics and postprocessing are per."""
        return dict(enumerate(self.output_names, start=1))

    @property
    def activation(self) -> str:
        """``softmax`` over the classes, or ``sigmoid`` per region (a key of
        :data:`medseg.inference.sliding_window.ACTIVATIONS`)."""
        return "sigmoid" if self.region_based else "softmax"

    @property
    def output_classes(self) -> list[list[int]]:
        """The class indices each output stands for: one per foreground class, or a region's members."""
        return list(self.regions.values()) if self.regions is not None else [[c] for c in range(1, self.num_classes)]

    @property
    def output_values(self) -> list[list[int]]:
        """The dataset's label values each output stands for (a region's reference is their union)."""
        return [[self.label_values[c] for c in classes] for classes in self.output_classes]

    @property
    def written_values(self) -> list[int]:
        """The label value written where each output is predicted (:meth:`label_map`)."""
        return list(self.regions_class_order) if self.regions_class_order is not None else self.label_values[1:]

    @property
    def declared(self) -> dict[int, str]:
        """Every label value a label file may hold -> its name, the ignore label included."""
        names = dict(zip(self.label_values, (self.labels[i] for i in sorted(self.labels))))
        return names | ({self.ignore_value: IGNORE_NAME} if self.ignore_value is not None else {})

    @property
    def maps_values(self) -> bool:
        """Whether label files need mapping to class indices: values with gaps, or an ignore label."""
        return self.label_values != list(range(self.num_classes)) or self.ignore_value is not None

    # --- masks and label maps --------------------------------------------------------------------
    def prediction_outputs(self, probabilities: np.ndarray) -> np.ndarray:
        """What ``(C, *spatial)`` probabilities (the network's outputs) decide, in the least memory: softmax, the
        ``(*spatial)`` winning class index (uint8, uint16 from 256 classes); regions, ``(R, *spatial)`` bool, each
        region's sigmoid above :data:`REGION_THRESHOLD`."""
        if self.region_based:
            return probabilities > REGION_THRESHOLD
        # argmax(0) without numpy's contiguous copy of the classes moved last: a running maximum, the first
        # class of the highest probability winning as argmax's
        winner = np.zeros(probabilities.shape[1:], np.uint8 if len(probabilities) <= 256 else np.uint16)
        best = probabilities[0].copy()
        for index in range(1, len(probabilities)):
            higher = probabilities[index] > best
            winner[higher] = index
            np.maximum(best, probabilities[index], out=best)
        return winner

    def each_output_mask(self, outputs: np.ndarray) -> Iterator[np.ndarray]:
        """``(*spatial)`` bool, the mask of each output of :meth:`prediction_outputs` in turn, one at a time (only the
        one asked for is made): each foreground class where it wins, or each region's mask itself."""
        return iter(outputs) if self.region_based else (outputs == c for c in range(1, self.num_classes))

    def output_masks(self, outputs: np.ndarray) -> np.ndarray:
        """``(R, *spatial)`` bool, one mask per output, of :meth:`prediction_outputs` (:meth:`each_output_mask`
        stacked; the regions' masks themselves)."""
        return outputs if self.region_based else np.stack(list(self.each_output_mask(outputs)))

    def prediction_masks(self, probabilities: np.ndarray) -> np.ndarray:
        """``(R, *spatial)`` bool, one mask per output, from ``(C, *spatial)`` probabilities (the network's outputs).

        Softmax: each foreground class where it is the most probable. Regions: the sigmoid above
        :data:`REGION_THRESHOLD`.
        """
        return self.output_masks(self.prediction_outputs(probabilities))

    def label_map(self, masks: np.ndarray) -> np.ndarray:
        """The ``(*spatial)`` label map of ``(R, *spatial)`` output masks in the dataset's values: 0, then each output
        in order writes its :attr:`written_values` entry where its mask is set (later ones overwrite earlier ones).

        uint8, or uint16 for values above 255.
        """
        out = np.zeros(masks.shape[1:], self._label_dtype)
        for mask, value in zip(masks, self.written_values):
            out[mask] = value
        return out

    def outputs_label_map(self, outputs: np.ndarray) -> np.ndarray:
        """:meth:`label_map` of :meth:`prediction_outputs`; for classes, each voxel's winning class's value, without
        the masks."""
        if self.region_based:
            return self.label_map(outputs)
        return np.asarray([0, *self.written_values], self._label_dtype)[outputs]

    @property
    def _label_dtype(self) -> type[np.unsignedinteger]:
        """uint8, or uint16 for label values above 255."""
        return np.uint8 if max(self.written_values, default=0) < 256 else np.uint16

    def class_indices(self, label: np.ndarray, source: str | Path) -> np.ndarray:
        """``label`` (a label file's voxels) as int64 class indices, :data:`IGNORE_INDEX` at ignore voxels.

        Raises:
            DatasetError: non-integer or negative values, or a value the dataset does not declare
                (:func:`~medseg.data.reading.check_label_values`); the message names ``source`` (the file).
        """
        label = check_label_values(label, source, self.declared)
        table = np.zeros(max(int(label.max(initial=0)), *self.declared) + 1, np.int64)
        table[self.label_values] = np.arange(self.num_classes)
        if self.ignore_value is not None:
            table[self.ignore_value] = IGNORE_INDEX
        return table[label]


def each_member_mask(labels: np.ndarray, members: Sequence[Sequence[int]]) -> Iterator[np.ndarray]:
    """``(*spatial)`` bool, for each entry of ``members`` in turn, one at a time: where ``labels`` holds one of its
    values."""
    return (np.isin(labels, list(values)) for values in members)


def member_masks(labels: np.ndarray, members: Sequence[Sequence[int]]) -> np.ndarray:
    """``(R, *spatial)`` bool: :func:`each_member_mask` stacked."""
    return np.stack(list(each_member_mask(labels, members)))


# ------------------------------------------------------------------------------------ transforms


def value_transforms(spec: LabelSpec, key: Hashable = "label") -> list[mt.Transform]:
    """Label values -> class indices (ignore -> :data:`IGNORE_INDEX`) with MONAI's ``MapLabelValued``; none when
    the values are the indices already."""
    if not spec.maps_values:
        return []
    ignore = [spec.ignore_value] if spec.ignore_value is not None else []
    return [mt.MapLabelValued(key, orig_labels=[*spec.label_values, *ignore],
                              target_labels=[*range(spec.num_classes), *([IGNORE_INDEX] if ignore else [])],
                              dtype=np.float32)]


def target_transforms(spec: LabelSpec, key: Hashable = "label") -> list[mt.Transform]:
    """The class-index map -> the loss's targets: one channel per region in region mode (:class:`RegionTargetsd`)."""
    return [RegionTargetsd(key, spec.output_classes)] if spec.region_based else []


class RegionTargetsd(mt.MapTransform):
    """``(1, *spatial)`` class indices -> ``(R, *spatial)`` float32 region targets: 1 where the class is a member of
    the region, 0 elsewhere, :data:`IGNORE_INDEX` at ignore voxels in every channel."""

    def __init__(self, keys: Hashable | Sequence[Hashable], regions: Sequence[Sequence[int]]) -> None:
        super().__init__(keys)
        self.regions = [list(region) for region in regions]

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        out = dict(data)
        for key in self.key_iterator(out):
            classes = np.asarray(torch.as_tensor(out[key][0]).cpu())
            targets = member_masks(classes, self.regions).astype(np.float32)
            targets[:, classes == IGNORE_INDEX] = IGNORE_INDEX
            out[key] = torch.from_numpy(targets)
        return out


class RandCropByPosNegForegroundd(mt.RandCropByPosNegLabeld):
    """MONAI's ``RandCropByPosNegLabeld`` whose foreground is ``label > 0``: ignore voxels (:data:`IGNORE_INDEX`) are
    not foreground, so no foreground patch is centred on them."""

    def randomize(self, label: torch.Tensor | None = None, fg_indices: Any = None, bg_indices: Any = None,
                  image: torch.Tensor | None = None) -> None:
        super().randomize(None if label is None else label > 0, fg_indices, bg_indices, image)


# ------------------------------------------------------------------------------------ dataset.json and config


def _check_values(names: Mapping[int, str], where: str) -> LabelSpec:
    """The :class:`LabelSpec` of label values -> names (background 0, optionally ``ignore`` as the highest value)."""
    if 0 not in names:
        raise DatasetError(f"{where}: no background label 0 ({describe_values(names)})")
    if any(value < 0 for value in names):
        raise DatasetError(f"{where}: label values must be non-negative, got {sorted(names)}")
    ignore = [value for value, name in names.items() if name == IGNORE_NAME]
    if ignore and ignore[0] != max(names):
        raise DatasetError(f"{where}: the {IGNORE_NAME!r} label must have the highest value (nnU-Net's convention), "
                           f"got {ignore[0]} below {max(names)} ({names[max(names)]})")
    classes = sorted(value for value in names if value not in ignore)
    return LabelSpec({i: names[v] for i, v in enumerate(classes)}, classes, ignore_value=ignore[0] if ignore else None)


def msd_labels(labels: Mapping[int, str], path: Path) -> LabelSpec:
    """The labels of an MSD ``dataset.json``: ``{"0": "background", "1": "edema", ..., "5": "ignore"}``."""
    return _check_values({int(k): str(v) for k, v in labels.items()}, f"{path}: 'labels'")


def nnunet_labels(labels: Mapping[str, Any], regions_class_order: Sequence[int] | None, path: Path) -> LabelSpec:
    """The labels of an nnU-Net v2 ``dataset.json``: name -> value, or name -> list of values (regions; then every
    entry but background and ignore is a region, written in ``regions_class_order``)."""
    where = f"{path}: 'labels'"

    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not all(whole(v) or (isinstance(v, list) and v and all(whole(i) for i in v)) for v in labels.values()):
        raise DatasetError(f"{where} must map names to integer values, or to lists of them (regions); got {labels}")
    if not any(isinstance(v, list) for v in labels.values()):
        values = list(labels.values())
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise DatasetError(f"{where}: label value(s) {twice} declared more than once")
        return _check_values({v: str(k) for k, v in labels.items()}, where)
    special = {name: value for name, value in labels.items() if name in ("background", IGNORE_NAME)}
    regions = {str(name): value if isinstance(value, list) else [value]
               for name, value in labels.items() if name not in special}
    if special.get("background") != 0:
        raise DatasetError(f"{where}: region-based labels need \"background\": 0")
    members = {v for region in regions.values() for v in region}
    names = {0: "background", **{v: f"label {v}" for v in sorted(members - {0})}}
    if IGNORE_NAME in special:
        if not whole(special[IGNORE_NAME]):
            raise DatasetError(f"{where}: the {IGNORE_NAME!r} label must be one value, got {special[IGNORE_NAME]}")
        names[special[IGNORE_NAME]] = IGNORE_NAME
    return build_regions(_check_values(names, where), regions, regions_class_order, where,
                         f"{path}: 'regions_class_order'", DatasetError)


def build_regions(spec: LabelSpec, regions: Mapping[str, Sequence[int]], order: Sequence[int] | None, where: str,
                  order_key: str, error: type[MedsegError] = ConfigError) -> LabelSpec:
    """``spec`` with ``regions`` (name -> label values) written in ``order`` (one label value per region; may be
    None when no two regions share a value: each region then writes its lowest value).

    Raises:
        ``error``: a region that is empty or names a value that is not a foreground label, overlapping regions
            without ``order``, or an ``order`` of another length or with a value outside its region. ``where`` and
            ``order_key`` name the setting in the message.
    """
    foreground = {value: spec.labels[index] for index, value in enumerate(spec.label_values) if index > 0}
    if not regions:
        raise error(f"{where}: no regions")
    for name, values in regions.items():
        unknown = [v for v in values if v not in foreground]
        if not values or unknown:
            raise error(f"{where}: region {name!r} names label value(s) {unknown or '(none)'}; each region is a "
                        f"non-empty list of foreground label values: {describe_values(foreground)}")
    if order is None:
        for (a, first), (b, second) in combinations(regions.items(), 2):
            shared = sorted(set(first) & set(second))
            if shared:
                raise error(f"{where}: regions {a!r} and {b!r} overlap (both hold {shared}); set {order_key} to the "
                            f"label value each region writes, later regions overwriting earlier ones")
        order = [min(values) for values in regions.values()]
    if len(order) != len(regions):
        raise error(f"{order_key} has {len(order)} value(s) for {len(regions)} regions ({', '.join(regions)}); "
                    f"give one label value per region, in the regions' order")
    for value, (name, values) in zip(order, regions.items()):
        if value not in values:
            raise error(f"{order_key}: {value} is not a label value of region {name!r} ({sorted(values)}), so the "
                        f"label map would not show that region; give one of its values")
    index = {value: i for i, value in enumerate(spec.label_values)}
    return LabelSpec(spec.labels, spec.label_values, {name: sorted(index[v] for v in values)
                                                      for name, values in regions.items()},
                     [int(v) for v in order], spec.ignore_value)


def region_values(spec: LabelSpec) -> dict[str, list[int]] | None:
    """The regions of ``spec`` as label values (the form ``dataset.json`` and ``data.regions`` give them)."""
    return None if spec.regions is None else dict(zip(spec.regions, spec.output_values))


def config_regions(spec: LabelSpec, regions: Mapping[str, Sequence[int]] | None, order: Sequence[int] | None,
                   path: Path) -> LabelSpec:
    """``spec`` (of the ``dataset.json`` at ``path``) with the regions of ``data.regions`` and
    ``data.regions_class_order``; ``spec`` itself when both are unset.

    Raises:
        ConfigError: bad regions (:func:`build_regions`); ``data.regions_class_order`` without regions; or regions
            that differ from those ``dataset.json`` declares.
    """
    if regions is None and order is None:
        return spec
    if spec.region_based:
        declared = region_values(spec)
        wanted = {str(k): sorted(v) for k, v in (regions or declared).items()}
        if wanted != {k: sorted(v) for k, v in declared.items()} or order not in (None, spec.regions_class_order):
            raise ConfigError(f"data.regions={regions} / data.regions_class_order={order} differ from the regions "
                              f"{path} declares ({declared}, order {spec.regions_class_order}); leave both unset to "
                              f"use dataset.json's")
        return spec
    if regions is None:
        raise ConfigError(f"data.regions_class_order={list(order or [])} needs data.regions (name -> label values)")
    return build_regions(spec, {str(k): [int(v) for v in values] for k, values in regions.items()}, order,
                         "data.regions", "data.regions_class_order")


def renumbering(written: LabelSpec, scored: LabelSpec, where: str) -> dict[int, int] | None:
    """How a label map written with ``written``'s classes reads in ``scored``'s numbering: each label value of
    ``written`` -> the value ``scored`` gives the class of the same name (another tool's ``dataset.json`` may number
    the same classes otherwise); None when both number them alike. Region-based classes are matched as a whole.

    Raises:
        ConfigError: classes that cannot be matched by name (a class of one that the other lacks, or regions that
            differ), named; ``where`` names the predictions' source.
    """
    if (written.regions, written.regions_class_order) != (scored.regions, scored.regions_class_order) and (
            written.region_based or scored.region_based):
        raise ConfigError(f"{where}: regions {region_values(written)} (order {written.regions_class_order}) differ "
                          f"from the scored dataset's {region_values(scored)} (order {scored.regions_class_order})")
    theirs = {name: value for value, name in written.declared.items()}
    ours = {name: value for value, name in scored.declared.items()}
    if theirs == ours:
        return None
    only_theirs, only_ours = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
    if only_theirs or only_ours:
        parts = ([f"its classes {', '.join(only_theirs)} are not the scored dataset's"] if only_theirs else []) + (
            [f"the scored dataset's {', '.join(only_ours)} are not among its classes"] if only_ours else [])
        raise ConfigError(f"{where}: the classes cannot be matched by name: {'; '.join(parts)} (its labels: "
                          f"{describe_values(written.declared)}; the dataset's: {describe_values(scored.declared)})")
    return {value: ours[name] for name, value in theirs.items()}
