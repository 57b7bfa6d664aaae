"""Slab by slab equals the whole volume: the slabs of :func:`medseg.inference.sliding_window.infer_slabs` along any
axis, in 2D and 3D, mirrored or not, on odd shapes and with slabs that do not divide the length; the resampling back
slab by slab against MONAI's ``Invertd`` of the whole; a whole prediction and its probabilities file."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from monai.transforms import Invertd

from medseg.config import InferenceConfig
from medseg.data.reading import from_ras
from medseg.data.transforms import IMAGE
from medseg.inference.cases import Case
from medseg.inference.inferer import Inferer, Prediction, original_affine
from medseg.inference.model import load_model
from medseg.inference.predict import predict
from medseg.inference.resample_back import Grids, back_to_file
from medseg.inference.sliding_window import SlidingWindow, infer_slabs
from medseg.models import SlottedUNet
from tests.helpers.checkpoints import save_test_checkpoint
from tests.helpers.volumes import oblique_volume, restore

ROI = {3: [16, 16, 8], 2: [16, 16, 1]}
SLICE_AXIS = 2


@pytest.mark.parametrize(("spatial_dims", "shape", "mirror_axes", "activation"), [
    (3, (37, 18, 11), (), "softmax"),
    (3, (21, 13, 5), (0, 1, 2), "softmax"),  # smaller than a window along two axes: padded
    (2, (23, 19, 7), (0, 1), "softmax"),
    (3, (29, 18, 9), (1,), "sigmoid"),
])
def test_slabs_equal_the_whole_volume(spatial_dims: int, shape: tuple[int, int, int], mirror_axes: tuple[int, ...],
                                      activation: str) -> None:
    torch.manual_seed(0)
    model = SlottedUNet(spatial_dims, 1, 3, channels=(4, 8), strides=(2,)).eval()
    image = torch.randn(1, 1, *shape)
    window = SlidingWindow(ROI[spatial_dims], spatial_dims, SLICE_AXIS, overlap=0.5, mirror_axes=mirror_axes,
                           activation=activation, skip_constant=False)
    for axis in range(3):
        ((start, whole),) = infer_slabs(model, image, window, axis=axis)
        assert start == 0 and whole.shape == (1, 3, *shape)
        for slab in (1, 3, 4):  # 3 and 4 divide none of the lengths
            slabs = list(infer_slabs(model, image, window, axis=axis, slab=slab))
            starts = [start for start, _ in slabs]
            assert starts == sorted(starts) and starts[0] == 0
            assert all(part.shape[axis + 2] <= slab for _, part in slabs)
            joined = torch.cat([part for _, part in slabs], dim=axis + 2)
            if activation == "softmax":  # the same sums in the same order, a softmax per voxel: bit for bit
                assert torch.equal(joined, whole), f"axis {axis}, slab {slab}"
            else:  # an elementwise sigmoid rounds its vectorised and its scalar part apart by 1 ulp
                torch.testing.assert_close(joined, whole, atol=1e-7, rtol=0)
                assert torch.equal(joined > 0.5, whole > 0.5)


def test_a_slab_stream_left_unfinished_leaves_autograd_on() -> None:
    """The network runs without autograd, but the stream does not hold that switch across its slabs: a caller that
    stops early (or trains next) still computes gradients."""
    model = SlottedUNet(3, 1, 3, channels=(4, 8), strides=(2,)).eval()
    slabs = infer_slabs(model, torch.randn(1, 1, 20, 20, 20), SlidingWindow(ROI[3], 3, SLICE_AXIS), slab=2)
    _, first = next(slabs)
    assert torch.is_grad_enabled() and not first.requires_grad


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Tiny 3D and 2D checkpoints whose spacing (1 x 1 x 1.5 mm) is not the scans' (so they resample)."""
    folder = tmp_path_factory.mktemp("slabs")
    return {dims: save_test_checkpoint(folder / f"{dims}d.pt", spatial_dims=dims, patch=(16, 16, 8), seed=dims)
            for dims in (3, 2)}


def scan(folder: Path, orientation: str | None) -> Case:
    """An oblique, anisotropic 37 x 30 x 13 scan (0.9 x 0.7 x 2.5 mm), stored with its axes in ``orientation``."""
    path = oblique_volume(folder / "scan.nii.gz")
    if orientation:
        restore(path, orientation)
    return Case("scan", str(path))


@pytest.mark.parametrize("orientation", [None, "RAI", "SLP"])  # LPS as written; the last axis flipped; permuted
def test_resampling_back_slab_by_slab_is_monai_invertd(checkpoints: dict[int, Path], tmp_path: Path,
                                                       orientation: str | None) -> None:
    inferer = Inferer(load_model(checkpoints[3]), InferenceConfig(progress=False, device="cpu"))
    data = inferer.preprocess(scan(tmp_path, orientation))
    torch.manual_seed(0)
    maps = torch.rand(3, *data[IMAGE].shape[1:])
    inverted = Invertd(keys="pred", transform=inferer.transform, orig_keys=IMAGE, nearest_interp=False)(
        {**data, "pred": MetaTensor(maps)})["pred"].as_tensor().numpy()
    expected = np.moveaxis(from_ras(np.moveaxis(inverted, 0, -1), original_affine(data)), -1, 0)
    whole = inferer.to_original(data, maps)
    assert whole.shape == (3, *nib.load(data[IMAGE].meta["filename_or_obj"]).shape)
    np.testing.assert_allclose(whole, expected, atol=1e-5)
    grids = Grids.of(data[IMAGE])
    for slab in (2, 5):
        back = np.zeros_like(whole)
        for first, stop, part in back_to_file(grids, iter([(0, maps)]), slab):
            assert part.shape[-1] == stop - first <= slab
            back[..., first:stop] = part
        # the interpolation's coordinates, float32 relative to each slab, round apart by a few 1e-6
        np.testing.assert_allclose(back, whole, atol=5e-6)


@pytest.mark.parametrize(("spatial_dims", "tta", "orientation"), [(3, False, None), (3, True, "RAI"), (2, True, None)])
def test_prediction_slab_by_slab_is_the_whole_scans(checkpoints: dict[int, Path], tmp_path: Path, spatial_dims: int,
                                                     tta: bool, orientation: str | None) -> None:
    case = scan(tmp_path, orientation)
    net = load_model(checkpoints[spatial_dims])

    def predicted(slab: int | None) -> Prediction:
        inference = InferenceConfig(progress=False, device="cpu", tta=tta, skip_constant=False, slab_slices=slab)
        return Inferer(net, inference).infer(case)

    whole = predicted(None)
    assert whole.probabilities is not None and whole.outputs.shape == nib.load(case.image).shape
    for slab in (3, 4):  # neither divides the 13 slices
        part = predicted(slab)
        np.testing.assert_allclose(part.probabilities, whole.probabilities, atol=5e-6)
        np.testing.assert_array_equal(part.label_map(), whole.label_map())


def test_probabilities_are_written_slab_by_slab(checkpoints: dict[int, Path], tmp_path: Path) -> None:
    case = scan(tmp_path, "RAI")  # the slabs come in decreasing slices
    out = tmp_path / "out"
    inference = {"progress": False, "device": "cpu", "slab_slices": 3}
    result = predict({"ckpt": [str(checkpoints[3])] * 2, "input": case.image, "output": str(out),
                      "save_probabilities": True, "inference": inference})
    assert result.exit_code == 0
    written = np.load(out / "scan.npz")["probabilities"]
    expected = Inferer(load_model(checkpoints[3]), InferenceConfig(**inference)).infer(case).probabilities
    assert written.dtype == np.float16 and written.shape == expected.shape
    np.testing.assert_array_equal(written, expected.astype(np.float16))
    np.testing.assert_array_equal(np.asarray(nib.load(out / "scan.nii.gz").dataobj), expected.argmax(0))
    assert sorted(p.name for p in out.iterdir()) == ["scan.nii.gz", "scan.npz", "summary.json"], "no temp file left"
