"""Slab by slab equals the whole volume: the slabs of :func:`medseg.inference.sliding_window.infer_slabs`
along any axis, in 2D and 3D, mirrored or not, on odd shapes and with slabs that do not divide the length."""

from __future__ import annotations

import pytest
import torch

from medseg.inference.sliding_window import infer_slabs
from medseg.models import SlottedUNet

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
    options = {"overlap": 0.5, "mirror_axes": mirror_axes, "activation": activation, "skip_constant": False}
    for axis in range(3):
        ((start, whole),) = infer_slabs(model, image, ROI[spatial_dims], spatial_dims, SLICE_AXIS, axis=axis, **options)
        assert start == 0 and whole.shape == (1, 3, *shape)
        for slab in (1, 3, 4):  # 3 and 4 divide none of the lengths
            slabs = list(infer_slabs(model, image, ROI[spatial_dims], spatial_dims, SLICE_AXIS, axis=axis, slab=slab,
                                     **options))
            starts = [start for start, _ in slabs]
            assert starts == sorted(starts) and starts[0] == 0
            assert all(part.shape[axis + 2] <= slab for _, part in slabs)
            joined = torch.cat([part for _, part in slabs], dim=axis + 2)
            if activation == "softmax":  # the same sums in the same order, a softmax per voxel: bit for bit
                assert torch.equal(joined, whole), f"axis {axis}, slab {slab}"
            else:  # an elementwise sigmoid rounds its vectorised and its scalar part apart by 1 ulp
                torch.testing.assert_close(joined, whole, atol=1e-7, rtol=0)
                assert torch.equal(joined > 0.5, whole > 0.5)
