"""Windows that hold one value per channel are answered from one run of the network on such a window
(:class:`medseg.inference.sliding_window.ConstantWindows`): the result is the dense one, with fewer windows run."""

from __future__ import annotations

import itertools

import pytest
import torch

from benchmarks.common import TimedNetwork
from medseg.inference.sliding_window import ConstantWindows, SlidingWindow, infer_volume, window_count
from medseg.models import SlottedUNet

ROI = {3: [16, 16, 8], 2: [16, 16, 1]}
SLICE_AXIS = 2


def body_in_air(channels: int = 1) -> torch.Tensor:
    """A ``(1, C, 48, 40, 17)`` volume: a noisy body in the middle, each channel's air one value around it (CT air
    after clipping), so the windows in the corners are constant."""
    torch.manual_seed(1)
    image = torch.full((1, channels, 48, 40, 17), -1.7) + torch.arange(channels).view(1, -1, 1, 1, 1)
    image[:, :, 18:30, 16:24] = torch.randn(1, channels, 12, 8, 17)
    return image


def test_constant_windows_are_answered_from_one_run_and_match_the_network() -> None:
    torch.manual_seed(0)
    network = TimedNetwork(SlottedUNet(3, 2, 3, channels=(4, 8), strides=(2,)).eval())
    windows = torch.randn(5, 2, 16, 16, 8)
    windows[1] = windows[3] = torch.tensor([-1.7, 0.3]).view(2, 1, 1, 1)  # one constant per channel, twice
    windows[4] = torch.tensor([-1.7, 0.4]).view(2, 1, 1, 1)  # another constant
    predictor = ConstantWindows(network)
    with torch.no_grad():
        answered, dense = predictor(windows), network.network(windows)
        again = predictor(windows[1:2])
    # instance norm divides a constant map's float rounding by sqrt(eps): a window run alone and the same window run
    # in a batch differ by that noise, up to 1e-2 in these logits of an untrained network
    torch.testing.assert_close(answered, dense, atol=2e-2, rtol=0)
    torch.testing.assert_close(answered[[0, 2]], dense[[0, 2]], atol=1e-5, rtol=1e-4)  # the varying ones, as run
    assert network.windows == 2 + 2 and (predictor.run, predictor.answered) == (4, 2), "2 varying, 2 distinct constants"
    torch.testing.assert_close(again, answered[1:2], atol=0, rtol=0)  # kept: not run again
    assert network.windows == 4


@pytest.mark.parametrize(("spatial_dims", "channels", "mirror_axes"), [(3, 1, ()), (3, 2, (0, 2)), (2, 1, (1,))])
def test_a_volume_with_air_gives_the_dense_probabilities_with_fewer_windows_run(
        spatial_dims: int, channels: int, mirror_axes: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    network = TimedNetwork(SlottedUNet(spatial_dims, channels, 3, channels=(4, 8), strides=(2,)).eval())
    image = body_in_air(channels)

    def probabilities(skip_constant: bool) -> tuple[torch.Tensor, int]:
        network.windows = 0
        probs = infer_volume(network, image, SlidingWindow(ROI[spatial_dims], spatial_dims, SLICE_AXIS, overlap=0.5,
                                                           mirror_axes=mirror_axes, skip_constant=skip_constant))
        return probs, network.windows

    fast, run = probabilities(True)
    dense, every = probabilities(False)
    torch.testing.assert_close(fast, dense, atol=1e-3, rtol=0)  # the rounding noise of constant windows (above)
    assert run < 0.8 * every, f"{run} of {every} windows run"
    assert torch.equal(fast.argmax(1), dense.argmax(1)), "the same segmentation"


@pytest.mark.parametrize(("shape", "overlap"), [((48, 40, 17), 0.5), ((13, 40, 5), 0.25), ((16, 16, 8), 0.5)])
def test_the_progress_bar_counts_every_window_of_every_mirroring(shape: tuple[int, int, int], overlap: float,
                                                                 capsys: pytest.CaptureFixture) -> None:
    network = TimedNetwork(SlottedUNet(3, 1, 2, channels=(4, 8), strides=(2,)).eval())
    image = torch.randn(1, 1, *shape)
    infer_volume(network, image, SlidingWindow(ROI[3], 3, SLICE_AXIS, overlap=overlap, mirror_axes=(0, 2),
                                               skip_constant=False), progress=True)
    expected = 4 * window_count(shape, ROI[3], overlap)
    assert network.windows == expected, "window_count is the windows MONAI cuts, for each of the 4 passes"
    assert f"0/{expected} [" in capsys.readouterr().err, "one bar over the windows of all passes"


@pytest.mark.parametrize(("spatial_dims", "axes", "passes"), [(3, (0, 1, 2), 8), (2, (0, 1), 4), (3, (1,), 2)])
def test_mirroring_runs_the_identity_and_every_combination_of_the_axes(spatial_dims: int, axes: tuple[int, ...],
                                                                        passes: int) -> None:
    """nnU-Net's test-time mirroring: on a volume of one window, the network runs once per pass (8 in 3D, 4 in 2D)
    and the result is the softmax of the mean of the network's flipped-back logits on each flipped window."""
    torch.manual_seed(0)
    model = SlottedUNet(spatial_dims, 1, 3, channels=(4, 8), strides=(2,)).eval()
    network = TimedNetwork(model)
    image = torch.randn(1, 1, *ROI[3])  # one window (a slice in 2D) per position: the gaussian weights divide out
    probs = infer_volume(network, image, SlidingWindow(ROI[spatial_dims], spatial_dims, SLICE_AXIS, sw_batch_size=1,
                                                       mirror_axes=axes, skip_constant=False))
    assert network.windows == passes * window_count(image.shape[2:], ROI[spatial_dims], 0.25)
    assert network.windows == passes * (1 if spatial_dims == 3 else ROI[3][SLICE_AXIS])
    expected = torch.zeros_like(probs)
    with torch.no_grad():
        for size in range(len(axes) + 1):
            for combo in itertools.combinations(axes, size):
                dims = [axis + 2 for axis in combo]
                flipped = image.flip(dims) if dims else image
                if spatial_dims == 2:  # the slices across the slice axis, one by one
                    logits = torch.stack([model(flipped[..., k]) for k in range(flipped.shape[-1])], dim=-1)
                else:
                    logits = model(flipped)
                expected += logits.flip(dims) if dims else logits
    torch.testing.assert_close(probs, (expected / passes).softmax(1), atol=1e-5, rtol=1e-4)
