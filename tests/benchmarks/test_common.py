"""The benchmarks' shared measuring parts: the timed network (its counts, and the weights loaded through it) and a
window's FLOP count, against a count by hand."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.common import TimedNetwork, window_gflop


def test_a_windows_gflop_are_its_convolutions_multiply_adds_twice() -> None:
    network = nn.Sequential(nn.Conv3d(2, 4, 3, padding=1, bias=False), nn.InstanceNorm3d(4), nn.Conv3d(4, 3, 1))
    voxels = 5 * 6 * 7
    by_hand = 2 * voxels * (2 * 4 * 27 + 4 * 3)  # the norm and the 1x1 conv's bias are not counted
    assert window_gflop(network, [2, 5, 6, 7]) * 1e9 == by_hand


def test_the_timed_network_counts_windows_and_loads_weights_into_the_network_it_times() -> None:
    network = nn.Conv3d(1, 2, 3, padding=1)
    timed = TimedNetwork(network)
    weights = {name: torch.full_like(value, 0.5) for name, value in network.state_dict().items()}
    timed.load_state_dict(weights)  # nnU-Net's predictor loads each fold's weights into the network it was given
    assert torch.equal(network.weight, torch.full_like(network.weight, 0.5))
    timed(torch.zeros(3, 1, 4, 4, 4))
    timed(torch.zeros(2, 1, 4, 4, 4))
    assert timed.windows == 5 and timed.seconds > 0
