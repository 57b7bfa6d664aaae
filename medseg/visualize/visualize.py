"""See what the attention does: one voxel's attention maps in every attention slot of a checkpoint's network.

Behind ``scripts/visualize.py ckpt=RUN/checkpoints/best.pt input=VOLUME voxel=[i,j,k] output=DIR`` (``VOLUME`` a file
or a DICOM series folder, whose voxel indices are column, row and slice in position order). The volume is
read and preprocessed exactly as evaluation reads it (:class:`medseg.inference.inferer.Inferer`: RAS, the training
spacing, the normalisation). The query, ``voxel`` (indices of the file) or ``world`` (mm in the file's world
coordinates, RAS as in its affine), is mapped through the same spatial transforms into the preprocessed volume; by
default it is the predicted foreground's centre of mass (the foreground voxel nearest it, so that the query lies in
the foreground even when the foreground is several objects). The network then runs on the sliding window (the
training patch) that holds the query, centred on it where the volume allows, and
:func:`medseg.models.inspect.attention_maps` gives each slot's and block's maps for that query. Into ``output``:

- ``attention.json``: per slot, block and head the mean attention distance (mm), the entropy of the weights (nats)
  and, for MaSA, ``gamma`` (:mod:`.measures`), with the query in every coordinate system;
- ``<slot>_block<b>.png`` (and ``..._decay.png`` for MaSA): the window with each head's heat-map (:mod:`.montage`);
- ``<slot>_block<b>.nii.gz`` (and ``..._decay.nii.gz``): one 4D NIfTI per slot and block, a volume per head, on the
  input file's own grid (:mod:`.volumes`).

:mod:`.window` places the window; :mod:`medseg.training.attention_logging` logs the maps to TensorBoard during
validation.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from medseg.config import VisualizeConfig
from medseg.data.datalist import case_id
from medseg.data.dicom import is_series_folder
from medseg.data.reading import IMAGE, IMAGE_ENDINGS, read_file
from medseg.errors import ConfigError
from medseg.inference.cases import Case
from medseg.inference.checks import check_inference
from medseg.inference.inferer import Inferer, original_affine
from medseg.inference.model import load_model
from medseg.io import atomic_write_json
from medseg.models.inspect import AttentionMap, attention_maps, attention_slots
from medseg.tables import text_table
from medseg.typed_config import to_typed
from medseg.visualize.measures import map_summary
from medseg.visualize.montage import attention_figures, write_png
from medseg.visualize.volumes import original_volumes, write_volume
from medseg.visualize.window import QueryWindow, foreground_voxel, query_window

log = logging.getLogger("medseg")

SUMMARY_FILE = "attention.json"


@dataclass
class VisualizeResult:
    """What :func:`visualize` wrote into ``output``: ``attention.json``'s content and the files."""

    output: Path
    summary: dict[str, Any]
    files: list[str] = field(default_factory=list)


def check_config(cfg: VisualizeConfig | Mapping[str, Any] | DictConfig) -> VisualizeConfig:
    """Check ``cfg`` against :class:`VisualizeConfig` (its types and ranges, one query point, the ``inference``
    node); raises :class:`ConfigError` naming the key."""
    typed = to_typed(VisualizeConfig, cfg)
    if typed.voxel is not None and typed.world is not None:
        raise ConfigError(f"voxel={typed.voxel} and world={typed.world}: give one query point, not both")
    for key, value in (("voxel", typed.voxel), ("world", typed.world)):
        if value is not None and len(value) != 3:
            raise ConfigError(f"{key}={value}: expected three coordinates")
    check_inference(typed.inference)
    return typed


def _homogeneous(affine: np.ndarray, point: Sequence[float]) -> np.ndarray:
    return (affine @ np.array([*map(float, point), 1.0]))[:3]


def file_voxel(cfg: VisualizeConfig, shape: Sequence[int], affine: np.ndarray) -> tuple[int, int, int] | None:
    """The query voxel of the input file from ``voxel`` or ``world``; None when neither is set.

    Raises:
        ConfigError: the point lies outside the volume; the message gives the valid range.
    """
    if cfg.voxel is not None:
        voxel = tuple(int(v) for v in cfg.voxel)
        if not all(0 <= v < n for v, n in zip(voxel, shape)):
            ranges = ", ".join(f"0..{n - 1}" for n in shape)
            raise ConfigError(f"voxel={list(voxel)} lies outside the volume {cfg.input} of shape {tuple(shape)}: "
                              f"valid indices are [{ranges}]")
        return voxel  # type: ignore[return-value]
    if cfg.world is not None:
        continuous = _homogeneous(np.linalg.inv(affine), cfg.world)
        voxel = tuple(int(v) for v in np.rint(continuous))
        if not all(0 <= v < n for v, n in zip(voxel, shape)):
            last = np.subtract(shape, 1)
            corners = np.array([_homogeneous(affine, np.multiply(c, last)) for c in np.ndindex(2, 2, 2)])
            ranges = ", ".join(f"{'xyz'[a]} {corners[:, a].min():.1f}..{corners[:, a].max():.1f}" for a in range(3))
            raise ConfigError(f"world={list(cfg.world)} mm lies outside the volume {cfg.input} (it is its "
                              f"voxel {list(voxel)}, shape {tuple(shape)}): its voxel centres span {ranges} mm")
        return voxel  # type: ignore[return-value]
    return None


def network_voxel(voxel: Sequence[int], file_affine: np.ndarray, data: dict[str, Any]) -> tuple[int, int, int]:
    """A voxel of the input file in the preprocessed volume: through the world coordinates, by the file's affine and
    the one the preprocessing (reorientation, resampling) left on the image; clipped to the volume."""
    shape = data[IMAGE].shape[1:]
    affine = np.asarray(data[IMAGE].affine, dtype=np.float64)
    point = _homogeneous(np.linalg.inv(affine), _homogeneous(file_affine, voxel))
    return tuple(int(np.clip(np.rint(p), 0, n - 1)) for p, n in zip(point, shape))  # type: ignore[return-value]


def select_maps(maps: Sequence[AttentionMap], slot: str | None, block: int | None) -> list[AttentionMap]:
    """The maps of ``slot`` and ``block`` (None: all).

    Raises:
        ConfigError: no map for the slot or the block; the message lists the valid ones.
    """
    slots = list(dict.fromkeys(m.slot for m in maps))
    if slot is not None and slot not in slots:
        raise ConfigError(f"slot={slot!r} is not an attention slot of this network. Valid slots: {', '.join(slots)}")
    chosen = [m for m in maps if slot is None or m.slot == slot]
    blocks = sorted({m.block for m in chosen})
    if block is not None and block not in blocks:
        where = f"slot {slot!r}" if slot is not None else "any slot"
        raise ConfigError(f"block={block} is not a block of {where}. Valid blocks: {', '.join(map(str, blocks))}")
    return [m for m in chosen if block is None or m.block == block]


def file_stem(attention: AttentionMap) -> str:
    """``<slot>_block<b>``, the slot name made safe for a file name."""
    slot = re.sub(r"[^\w.-]+", "_", attention.slot)
    return f"{slot}_block{attention.block}"


def _query(cfg: VisualizeConfig, inferer: Inferer, data: dict[str, Any], shape: Sequence[int],
           file_affine: np.ndarray) -> tuple[tuple[int, int, int], str]:
    """The query voxel of the input file, and where it came from."""
    voxel = file_voxel(cfg, shape, file_affine)
    if voxel is not None:
        return voxel, "voxel" if cfg.voxel is not None else "world"
    log.info("no voxel= or world= given: predicting the volume for its foreground")
    voxel = foreground_voxel(inferer.infer_preprocessed(data).label_map())
    if voxel is None:
        log.warning("the network predicts no foreground in %s; using the centre of the volume", cfg.input)
        return tuple(n // 2 for n in shape), "volume centre"  # type: ignore[return-value]
    return voxel, "predicted foreground"  # type: ignore[return-value]


def _query_json(voxel: Sequence[int], source: str, file_affine: np.ndarray, window: QueryWindow) -> dict[str, Any]:
    return {"voxel": list(voxel), "from": source,
            "world_mm": [round(float(c), 3) for c in _homogeneous(file_affine, voxel)],
            "network_voxel": list(window.query), "window_start": list(window.start), "window_size": list(window.size)}


def visualize(cfg: VisualizeConfig | Mapping[str, Any] | DictConfig) -> VisualizeResult:
    """Compute the attention maps of one query voxel of ``cfg.input`` and write them into ``cfg.output``.

    Raises:
        ConfigError: a bad setting, a point outside the volume, a network without attention slots, an unknown slot or
            block.
        CheckpointError: a missing or foreign checkpoint. DatasetError: an unreadable volume, a wrong channel count.
    """
    checked = check_config(cfg)
    path = Path(checked.input).expanduser()
    if not (path.is_file() or is_series_folder(path)):
        raise ConfigError(f"input={path}: not a volume file ({', '.join(IMAGE_ENDINGS)}) or a DICOM series folder")
    net = load_model(checked.ckpt)
    if not attention_slots(net.model):
        raise ConfigError(f"ckpt={checked.ckpt}: its network has no attention slot to show (model.bottleneck and "
                          f"model.decoder are none); train one with model.bottleneck=<block>")
    inferer = Inferer(net, checked.inference)
    data = inferer.preprocess(Case(case_id(path), str(path)))
    shape, file_affine = read_file(str(path))[0].shape[:3], original_affine(data)
    voxel, source = _query(checked, inferer, data, shape, file_affine)
    window = query_window(network_voxel(voxel, file_affine, data), data[IMAGE].shape[1:], net.window, net.spatial_dims)
    spacing = [float(net.data.spacing[axis]) for axis in window.net_axes]
    image = window.crop(data[IMAGE].as_tensor())
    log.info("query voxel %s of %s (%s) -> voxel %s of the preprocessed volume; window %s from %s", list(voxel),
             path.name, source, list(window.query), list(window.size), list(window.start))
    maps = attention_maps(net.model, image[None].to(inferer.device), window.net_query, spacing)
    maps = select_maps(maps, checked.slot, checked.block)
    output = Path(checked.output).expanduser()
    files: list[str] = []
    entries = []
    for attention in maps:
        stem = file_stem(attention)
        written = {}
        for name, figure in attention_figures(image, attention, window, spacing).items():
            written[f"{name}_png"] = write_png(output / f"{stem}{'_decay' if name == 'decay' else ''}.png", figure).name
        for name, volume in original_volumes(attention, window, data, inferer).items():
            target = output / f"{stem}{'_decay' if name == 'decay' else ''}.nii.gz"
            written[f"{name}_nifti"] = write_volume(target, volume, data, str(path)).name
        files += written.values()
        entries.append({**map_summary(attention), "files": written})
        log.info("%s block %d (%s): %d head(s) written", attention.slot, attention.block, attention.kind,
                 len(attention.weights))
    summary = {"checkpoint": str(checked.ckpt), "input": str(path), "query": _query_json(voxel, source, file_affine,
                                                                                          window),
               "entropy_unit": "nats", "maps": entries}
    atomic_write_json(output / SUMMARY_FILE, summary)
    return VisualizeResult(output, summary, [SUMMARY_FILE, *files])


def summary_table(summary: Mapping[str, Any]) -> str:
    """Per slot, block and head: the mean attention distance, the entropy and gamma, as an aligned table."""
    rows = [[m["slot"], m["block"], m["kind"], h["head"], h["mean_distance_mm"], h["entropy_nats"], h.get("gamma")]
            for m in summary["maps"] for h in m["heads"]]
    return text_table(["slot", "block", "kind", "head", "distance_mm", "entropy_nats", "gamma"], rows)


def visualize_cli(cfg: DictConfig | Mapping[str, Any]) -> None:
    """``scripts/visualize.py``'s task: write the maps, print the table and what was written."""
    result = visualize(cfg)
    query = result.summary["query"]
    print(f"\nattention of voxel {query['voxel']} ({query['from']}; world {query['world_mm']} mm) in "
          f"{result.summary['input']}:")
    print(summary_table(result.summary))
    print(f"\nwritten into {result.output}: {', '.join(result.files)}")
