"""Attention maps for people: mean distance and entropy against hand computations, the window around a query, the PNG
montages, NIfTI maps on an oblique input's own grid with their peak at the query (a DICOM series' too),
attention.json, bad inputs, the maps during training (TensorBoard, metrics.json) and the sweep summary's column."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from medseg.config import DataConfig
from medseg.data.transforms import Window, window
from medseg.errors import ConfigError, DatasetError
from medseg.models.inspect import AttentionMap
from medseg.sweeps.report import build_summary, render_plot
from medseg.training.run import train
from medseg.visualize import visualize
from medseg.visualize.measures import decay_gamma, mean_attention_distance_mm, row_entropy, slot_distances
from medseg.visualize.montage import attention_figures
from medseg.visualize.window import foreground_voxel, query_window, to_voxels
from tests.helpers.checkpoints import MASA_GAMMA, MASA_SPACING, masa_checkpoint
from tests.helpers.runs import micro_config
from tests.helpers.volumes import oblique_volume

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def hand_map(weights: torch.Tensor, query: tuple[int, ...], spacing: tuple[float, ...],
             decay: torch.Tensor | None = None, stride: tuple[int, ...] | None = None) -> AttentionMap:
    grid = tuple(weights.shape[1:])
    return AttentionMap(slot="bottleneck", block=0, kind="masa" if decay is not None else "mha", grid=grid,
                        query=query, spacing_mm=spacing, weights=weights, decay=decay, content=None,
                        stride=stride or (1,) * len(grid))


# ------------------------------------------------------------------------------------------------- measures


def test_mean_distance_and_entropy_against_hand_computations() -> None:
    grid, query, spacing = (3, 4), (1, 1), (2.0, 0.5)
    weights = torch.zeros(3, *grid)
    weights[0, 1, 1] = 1.0                          # the query itself
    weights[1, 0, 1] = weights[1, 1, 3] = 0.5       # 2 mm up one row; 1 mm along two columns
    weights[2] = 1.0 / 12                           # uniform
    attention = hand_map(weights, query, spacing)

    uniform = sum(math.hypot((i - 1) * 2.0, (j - 1) * 0.5) for i in range(3) for j in range(4)) / 12
    assert mean_attention_distance_mm(attention).tolist() == pytest.approx([0.0, 1.5, uniform])
    assert row_entropy(attention).tolist() == pytest.approx([0.0, math.log(2), math.log(12)])


def test_mean_distance_in_3d_and_per_slot_means() -> None:
    grid, query, spacing = (2, 3, 4), (0, 2, 1), (0.8, 1.5, 3.0)
    weights = torch.rand(2, *grid, generator=torch.Generator().manual_seed(0))
    weights /= weights.flatten(1).sum(1).view(2, 1, 1, 1)
    expected = [sum(float(weights[h][m]) * math.dist([a * s for a, s in zip(m, spacing)],
                                                     [a * s for a, s in zip(query, spacing)])
                    for m in itertools.product(*map(range, grid))) for h in range(2)]
    first = hand_map(weights, query, spacing)
    assert mean_attention_distance_mm(first).tolist() == pytest.approx(expected)
    at_query = torch.zeros(2, *grid)
    at_query[:, 0, 2, 1] = 1.0
    second = AttentionMap(**{**asdict(first), "block": 1, "weights": at_query})
    other = AttentionMap(**{**asdict(first), "slot": "decoder_slots.1"})
    assert slot_distances([first, second, other]) == pytest.approx(
        {"bottleneck": sum(expected) / 4, "decoder_slots.1": sum(expected) / 2})


def test_gamma_is_read_off_the_decay_map() -> None:
    """``decay = gamma_h ** dist`` with the finest axis as the unit: the neighbour along it holds gamma_h."""
    grid, query, scales, gammas = (4, 5, 3), (3, 0, 1), (2.5, 1.0, 1.0), torch.tensor([0.5, 0.9])
    coords = torch.stack(torch.meshgrid(*map(torch.arange, grid), indexing="ij"), -1).double()
    dist = ((coords - torch.tensor(query)).abs() * torch.tensor(scales)).sum(-1)
    decay = gammas.double().view(2, 1, 1, 1) ** dist
    attention = hand_map(decay / decay.flatten(1).sum(1).view(2, 1, 1, 1), query, (2.0, 0.8, 0.8), decay)
    assert decay_gamma(attention).tolist() == pytest.approx([0.5, 0.9])
    assert decay_gamma(hand_map(torch.ones(1, 1, 1, 1), (0, 0, 0), (1.0,) * 3, torch.ones(1, 1, 1, 1))) is None
    assert decay_gamma(hand_map(decay, query, (1.0,) * 3, decay=None)) is None


# --------------------------------------------------------------------------------------------------- window


@pytest.mark.parametrize("spatial_dims", [3, 2])
def test_window_around_the_query_crops_and_pastes_back(spatial_dims: int) -> None:
    volume = torch.arange(2 * 20 * 9 * 7, dtype=torch.float32).reshape(2, 20, 9, 7)
    view = window(DataConfig(spacing=[0.8, 0.8, 2.0], patch_size=[8, 12, 4]), spatial_dims)
    query = (18, 4, 3)
    placed = query_window(query, volume.shape[1:], view, spatial_dims)
    # x: shifted to end inside the volume; y: the volume (9) is smaller than the patch (12): padded 1 before, 2 after
    assert placed.start[:2] == (12, -1)
    crop = placed.crop(volume)
    assert crop.shape == (2, *view.net_patch)
    assert crop[(slice(None), *placed.net_query)].tolist() == volume[(slice(None), *query)].tolist()
    back = placed.paste(crop, volume.shape[1:])
    inside = back != 0
    assert torch.equal(back[inside], volume[inside]) and inside.sum() > 0
    assert not back[:, :12].any(), "zeros outside the window"
    if spatial_dims == 3:
        assert placed.start[2] == 1 and crop[:, :, 0].abs().sum() == 0, "the zero-padded row before the volume"
    else:
        assert view.slice_axis == 2 and placed.size[2] == 1 and not back[..., [2, 4]].any()


def test_token_values_land_on_their_voxels() -> None:
    tokens = torch.zeros(1, 4, 3, 2)
    tokens[0, 2, 1, 0] = 1.0
    voxels = to_voxels(tokens, (2, 2, 4), (7, 6, 8))
    assert voxels.shape == (1, 7, 6, 8)
    peak = np.unravel_index(int(voxels.argmax()), voxels.shape[1:])
    assert (4 <= peak[0] <= 5) and (2 <= peak[1] <= 3) and (0 <= peak[2] <= 3)


def test_query_voxels_from_labels() -> None:
    ring = np.zeros((9, 9, 3))
    ring[2:7, 2:7, 1] = 1
    ring[3:6, 3:6, 1] = 0  # the centre of mass (4, 4, 1) is background
    voxel = foreground_voxel(ring)
    assert ring[voxel] == 1 and math.dist(voxel, (4, 4, 1)) == 2.0
    ring[4, 4, 1] = 2
    assert foreground_voxel(ring) == (4, 4, 1)
    assert foreground_voxel(np.zeros((3, 3, 3))) is None


# --------------------------------------------------------------------------------------------------- montage


@pytest.mark.parametrize("spatial_dims", [3, 2])
def test_montage_shows_each_head_over_the_image_with_the_query(spatial_dims: int) -> None:
    shape = (12, 10, 8) if spatial_dims == 3 else (12, 10)
    view = Window(2, [*shape[:2], 8 if spatial_dims == 3 else 1], list(shape))
    placed = query_window((5, 7, 3), (12, 10, 8), view, spatial_dims)
    grid = tuple(s // 2 for s in shape)
    weights = torch.zeros(2, *grid)
    weights[0][tuple(q // 2 for q in placed.net_query)] = 1.0
    weights[1] = 1.0 / math.prod(grid)
    decay = torch.rand(2, *grid)
    attention = hand_map(weights, tuple(q // 2 for q in placed.net_query), (1.6,) * spatial_dims, decay,
                         stride=(2,) * spatial_dims)
    figures = attention_figures(torch.randn(1, *shape), attention, placed, [0.8] * spatial_dims)
    assert set(figures) == {"weights", "decay"}
    axes = figures["weights"].axes
    assert len(axes) == 2 * (3 if spatial_dims == 3 else 1), "a row per head, a column per plane"
    planes = [(0, 1), (0, 2), (1, 2)] if spatial_dims == 3 else [(0, 1)]  # axial (x, y), coronal (x, z), sagittal
    for ax, (across, up) in zip(axes, planes):
        marker = ax.lines[0]
        assert (marker.get_xdata()[0], marker.get_ydata()[0]) == (placed.net_query[across], placed.net_query[up])
    first = axes[0]  # axial: x across, y up
    heat = first.images[1].get_array()
    peak_y, peak_x = np.unravel_index(int(np.argmax(heat)), heat.shape)
    assert abs(peak_x - placed.net_query[0]) <= 1 and abs(peak_y - placed.net_query[1]) <= 1
    assert axes[0].get_ylabel().startswith("head 0\n") and axes[0].get_ylabel().endswith(" mm")


# ----------------------------------------------------------------------------------------- whole volumes


@pytest.fixture(scope="module")
def scan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return oblique_volume(tmp_path_factory.mktemp("scan") / "oblique.nii.gz")


def expected_distances(entry: dict[str, Any]) -> float:
    """The mean attention distance of a row that is the decay alone (``gamma ** manhattan`` in tokens), by hand."""
    grid, query, spacing = entry["grid"], entry["query_token"], entry["token_spacing_mm"]
    positions = list(itertools.product(*map(range, grid)))
    weights = [MASA_GAMMA ** sum(abs(a - b) for a, b in zip(m, query)) for m in positions]
    return sum(w * math.dist([a * s for a, s in zip(m, spacing)], [a * s for a, s in zip(query, spacing)])
               for w, m in zip(weights, positions)) / sum(weights)


@pytest.mark.parametrize("spatial_dims", [3, 2])
def test_nifti_maps_lie_on_the_input_grid_with_their_peak_at_the_query(scan: Path, tmp_path: Path,
                                                                      spatial_dims: int) -> None:
    ckpt = masa_checkpoint(tmp_path / "masa.pt", spatial_dims)
    voxel = (9, 20, 5)
    result = visualize({"ckpt": str(ckpt), "input": str(scan), "voxel": list(voxel), "output": str(tmp_path / "out"),
                        "inference": {"device": "cpu"}})
    source = nib.load(scan)
    for name in ("bottleneck_block0.nii.gz", "bottleneck_block0_decay.nii.gz"):
        written = nib.load(tmp_path / "out" / name)
        assert written.shape == (*source.shape, 2), "the input's shape, one volume per head"
        np.testing.assert_array_equal(written.affine, source.affine)
        np.testing.assert_array_equal(written.header.get_sform(), source.header.get_sform())
        maps = np.asarray(written.dataobj)
        for head in range(2):
            peak = np.unravel_index(int(np.argmax(maps[..., head])), source.shape)
            offset = nib.affines.apply_affine(source.affine, peak) - nib.affines.apply_affine(source.affine, voxel)
            # the peak is the query token's centre: within half a token (1 x 1 x 2 mm) and an input voxel of it
            assert np.linalg.norm(offset) < 4.0, (name, head, peak)
        assert 0 < np.count_nonzero(maps[..., 0]) < maps[..., 0].size, "zeros outside the window"
    summary = json.loads((tmp_path / "out" / "attention.json").read_text())
    assert summary == result.summary and summary["query"]["voxel"] == list(voxel)
    (entry,) = summary["maps"]
    assert (entry["slot"], entry["block"], entry["kind"]) == ("bottleneck", 0, "masa")
    assert entry["token_spacing_mm"] == [2 * s for a, s in enumerate(MASA_SPACING) if spatial_dims == 3 or a != 2]
    for head in entry["heads"]:
        assert head["gamma"] == pytest.approx(MASA_GAMMA)
        assert head["mean_distance_mm"] == pytest.approx(expected_distances(entry), abs=1e-3)
        assert 0 < head["entropy_nats"] < entry["max_entropy_nats"]
    for name in ("bottleneck_block0.png", "bottleneck_block0_decay.png"):
        assert (tmp_path / "out" / name).read_bytes().startswith(PNG_MAGIC)
    assert entry["files"] == {"weights_png": "bottleneck_block0.png", "decay_png": "bottleneck_block0_decay.png",
                              "weights_nifti": "bottleneck_block0.nii.gz",
                              "decay_nifti": "bottleneck_block0_decay.nii.gz"}


def test_world_point_and_default_query(scan: Path, tmp_path: Path) -> None:
    ckpt = masa_checkpoint(tmp_path / "masa.pt")
    affine = nib.load(scan).affine
    world = nib.affines.apply_affine(affine, (12, 7, 8)) + 0.2  # off the voxel centre by less than half a voxel
    by_world = visualize({"ckpt": str(ckpt), "input": str(scan), "world": world.tolist(), "block": 0,
                          "output": str(tmp_path / "world"), "inference": {"device": "cpu"}}).summary
    assert by_world["query"]["voxel"] == [12, 7, 8] and by_world["query"]["from"] == "world"
    default = visualize({"ckpt": str(ckpt), "input": str(scan), "slot": "bottleneck", "output": str(tmp_path / "d"),
                         "inference": {"device": "cpu"}}).summary
    assert default["query"]["from"] in ("predicted foreground", "volume centre")
    assert all(0 <= v < n for v, n in zip(default["query"]["voxel"], nib.load(scan).shape))


def test_a_dicom_series_folder_is_visualised_on_its_own_grid(tmp_path: Path) -> None:
    """A series folder is read as evaluation reads it; its maps lie on the series' grid (columns, rows, slices)."""
    pytest.importorskip("pydicom")
    from medseg.data.reading import read_file
    from tests.helpers.dicom import write_ct_case

    series = write_ct_case(tmp_path, "case", "oblique").series.folder
    result = visualize({"ckpt": str(masa_checkpoint(tmp_path / "masa.pt")), "input": str(series),
                        "voxel": [20, 18, 6], "output": str(tmp_path / "out"), "inference": {"device": "cpu"}})
    array, affine = read_file(str(series))
    written = nib.load(tmp_path / "out" / "bottleneck_block0.nii.gz")
    assert written.shape == (*array.shape, 2) and result.summary["query"]["voxel"] == [20, 18, 6]
    np.testing.assert_allclose(written.affine, affine, atol=1e-5)


def test_bad_inputs_name_the_value_and_the_valid_range(scan: Path, tmp_path: Path) -> None:
    ckpt = str(masa_checkpoint(tmp_path / "masa.pt"))
    base = {"ckpt": ckpt, "input": str(scan), "output": str(tmp_path / "out"), "inference": {"device": "cpu"}}
    cases = [
        ({"voxel": [37, 0, 0]}, ["voxel=[37, 0, 0]", "0..36, 0..29, 0..12"]),
        ({"world": [500.0, 0.0, 0.0]}, ["world=[500.0, 0.0, 0.0]", "x ", " mm"]),
        ({"voxel": [1, 2, 3], "world": [0.0, 0.0, 0.0]}, ["voxel=", "world="]),
        ({"voxel": [1, 2]}, ["voxel=[1, 2]", "three"]),
        ({"voxel": [1, 2, 3], "slot": "decoder"}, ["slot='decoder'", "Valid slots: bottleneck"]),
        ({"voxel": [1, 2, 3], "block": 1}, ["block=1", "Valid blocks: 0"]),
        ({"input": str(tmp_path / "missing.nii.gz")}, ["input=", "missing.nii.gz"]),
    ]
    for extra, needles in cases:
        with pytest.raises(ConfigError) as err:
            visualize({**base, **extra})
        message = str(err.value)
        assert "\n" not in message and all(n in message for n in needles), (extra, message)
    plain = str(masa_checkpoint(tmp_path / "plain.pt", bottleneck="none"))
    with pytest.raises(ConfigError, match="no attention slot") as err:
        visualize({**base, "ckpt": plain})
    assert plain in str(err.value)
    scan_image = nib.load(scan)
    voxels = np.asarray(scan_image.dataobj, np.float32)
    voxels[1, 2, 3] = np.nan
    nan_scan = tmp_path / "nan.nii.gz"
    nib.save(nib.Nifti1Image(voxels, scan_image.affine), nan_scan)
    with pytest.raises(DatasetError, match=r"nan\.nii\.gz: contains 1 NaN voxels") as err:
        visualize({**base, "input": str(nan_scan), "voxel": [1, 2, 3]})
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists(), "nothing written"


# -------------------------------------------------------------------------------------------------- training


@pytest.mark.usefixtures("one_thread")
@pytest.mark.full
def test_training_logs_attention_maps_and_records_the_distance(tmp_path: Path, tiny_demo_root: Path) -> None:
    run_dir = tmp_path / "run"
    metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", "model.bottleneck=masa",
                                 "trainer.attention_maps=true"))
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0, "scalars": 0}).Reload()
    tags = events.Tags()
    assert {"val/attention/bottleneck/block0", "val/attention/bottleneck/block1/decay"} <= set(tags["images"])
    heads = [f"val/attention_distance_mm/bottleneck/block{b}/head{h}" for b in range(2) for h in range(4)]
    assert set(heads) <= set(tags["scalars"])
    recorded = json.loads((run_dir / "metrics.json").read_text())
    assert recorded["history"] == metrics["history"]
    for record in metrics["history"]:
        logged = [next(e.value for e in events.Scalars(tag) if e.step == record["epoch"]) for tag in heads]
        assert set(record["attention_distance_mm"]) == {"bottleneck"}
        assert record["attention_distance_mm"]["bottleneck"] == pytest.approx(np.mean(logged), rel=1e-5)
        # the bottleneck grid of the 16^3 patch: 8^3 tokens of 1.6 x 1.6 x 4 mm; no distance exceeds its diagonal
        assert 0 < record["attention_distance_mm"]["bottleneck"] < math.hypot(7 * 1.6, 7 * 1.6, 7 * 4.0)


# ------------------------------------------------------------------------------------------------------ sweep


def sweep_job(sweep: Path, name: str, gamma: float, history: list[dict[str, Any]], best_epoch: int = 2) -> None:
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([
        "model.bottleneck=masa", f"model.attention.gamma={gamma}", "trainer.attention_maps=true"]))
    (job / "metrics.json").write_text(json.dumps({
        "status": "completed", "best_val_dice": 0.9, "best_epoch": best_epoch, "epochs": 3, "train_seconds": 1.0,
        "val_dice_per_class": {"sphere": 0.9}, "params": 10, "peak_memory_mb": 1.0, "history": history}))


def test_sweep_summary_shows_each_runs_attention_distance(tmp_path: Path) -> None:
    sweep = tmp_path / "multirun"
    for index, gamma in enumerate((0.7, 0.8, 0.9)):
        sweep_job(sweep, str(index), gamma, [
            {"epoch": 1, "loss": 1.0},
            {"epoch": 2, "loss": 0.9, "attention_distance_mm": {"bottleneck": 10.0 * gamma, "decoder_slots.1": gamma}},
            {"epoch": 3, "loss": 0.8, "attention_distance_mm": {"bottleneck": 99.0, "decoder_slots.1": 99.0}},
        ])
    sweep_job(sweep, "3", 0.95, [{"epoch": 1, "loss": 1.0}], best_epoch=1)  # trained without attention maps
    summary = build_summary(sweep)
    columns = ["attention_distance_mm_bottleneck", "attention_distance_mm_decoder_slots.1"]
    assert set(columns) <= set(summary.headers)
    rows = [dict(zip(summary.headers, row)) for row in summary.rows]
    assert [row[columns[0]] for row in rows[:3]] == pytest.approx([7.0, 8.0, 9.0]) and rows[3][columns[0]] is None
    assert [row[columns[1]] for row in rows[:3]] == pytest.approx([0.7, 0.8, 0.9]), "the best epoch's, not the last"
    figure = render_plot(summary.runs, summary.swept, "best_val_dice")
    assert [ax.get_ylabel() for ax in figure.axes] == ["best_val_dice", *columns]
