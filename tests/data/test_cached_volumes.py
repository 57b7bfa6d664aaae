"""What ``data.cache=memory`` holds: float32 images, small-integer labels, volumes that training never changes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from monai.data import MetaTensor

from medseg.data.datalist import dataset_from_config
from medseg.data.transforms import IMAGE, LABEL, CompactLabeld
from medseg.runtime.launch import SINGLE_PROCESS
from medseg.training import prepare as engine_data
from medseg.training.checks import check_config
from medseg.training.planning import plan_config
from medseg.training.prepare import PreparedData, prepare_data
from tests.helpers.configs import compose_config
from tests.helpers.realistic import write_ct_dataset


@pytest.mark.parametrize(("values", "dtype"), [([0, 1, 2], torch.int8), ([-1, 0, 127], torch.int8),
                                                ([0, 200], torch.int16), ([-1, 40000], torch.int32)])
def test_compact_labels_keep_their_values_in_the_smallest_integer_type(values: list[int], dtype: torch.dtype) -> None:
    label = MetaTensor(torch.tensor(values, dtype=torch.float32).reshape(1, -1, 1, 1), affine=torch.eye(4) * 2)
    out = CompactLabeld(LABEL)({LABEL: label, IMAGE: label.clone()})
    assert out[LABEL].dtype == dtype and out[LABEL].tolist() == label.tolist()
    assert torch.equal(out[LABEL].affine, label.affine), "the geometry stays with the label"
    assert out[IMAGE].dtype == torch.float32, "images are not labels"


def prepared_ct(tmp_path: Path, spatial_dims: int, *overrides: str) -> PreparedData:
    """A 4-case anisotropic CT set, planned and prepared with ``data.cache=memory`` and no loader workers."""
    root = write_ct_dataset(tmp_path / "ct", num_cases=4, shape=(48, 40, 12), spacing=[(0.7, 0.7, 5.0),
                                                                                       (0.8, 0.8, 4.0)])
    cfg = check_config(compose_config([
        "data=msd", "recipe=light", f"data.root={root}", f"output_dir={tmp_path / 'run'}",
        f"model.spatial_dims={spatial_dims}",
        "data.cache=memory", "data.num_workers=0", "trainer.check_data=false", "model.channels=[4,8]",
        "model.strides=[2]", "data.patch_size=[16,16,8]" if spatial_dims == 3 else "data.patch_size=[16,16]",
        *overrides]))
    info = dataset_from_config(cfg.data)
    cfg, plan = plan_config(cfg, info, progress=False)
    return prepare_data(cfg, info, plan, tmp_path / "run", SINGLE_PROCESS)


def assert_training_leaves_the_cache_as_it_was(prepared: PreparedData, cached: list[dict], epochs: int = 3) -> None:
    """Run ``epochs`` of the training loader; the ``cached`` volumes and their metadata must not change."""
    before = [{key: (item[key].clone(), copy.deepcopy(item[key].meta), len(item[key].applied_operations))
               for key in (IMAGE, LABEL)} for item in cached]
    for _ in range(epochs):
        for batch in prepared.train_loader:
            assert batch[IMAGE].dtype == batch[LABEL].dtype == torch.float32, "the batches are as before"
            assert batch[IMAGE].shape[2:] == tuple(prepared.window.net_patch)
    for item, kept in zip(cached, before):
        for key, (values, meta, operations) in kept.items():
            assert torch.equal(item[key], values), f"training wrote into the cached {key}"
            assert item[key].meta.keys() == meta.keys() and len(item[key].applied_operations) == operations


@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_the_memory_cache_holds_compact_volumes_that_training_never_changes(spatial_dims: int, tmp_path: Path) -> None:
    """The cache hands out its volumes without copying them (``copy_cache=False``): every epoch's crops and
    augmentations must leave the cached tensors and their metadata as they were."""
    prepared = prepared_ct(tmp_path, spatial_dims)
    cached = prepared.train_dataset._cache
    assert {(item[IMAGE].dtype, item[LABEL].dtype) for item in cached} == {(torch.float32, torch.int8)}
    assert_training_leaves_the_cache_as_it_was(prepared, cached)


@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_fold_all_samples_its_patches_from_the_validation_cache(spatial_dims: int, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.fold=all`` trains and validates on the same cases: each is preprocessed and held once, and the RAM
    estimate behind ``data.cache=auto`` counts it once."""
    counted: list[int] = []
    estimate = engine_data.estimate_training_ram
    monkeypatch.setattr(engine_data, "estimate_training_ram",
                        lambda *args: counted.append(args[2]) or estimate(*args))
    prepared = prepared_ct(tmp_path, spatial_dims, "data.fold=all")
    assert prepared.train_dataset.data is prepared.val_dataset and len(prepared.val_dataset._cache) == 4
    assert counted == [4], "cached cases counted once"
    assert_training_leaves_the_cache_as_it_was(prepared, prepared.val_dataset._cache, epochs=2)
