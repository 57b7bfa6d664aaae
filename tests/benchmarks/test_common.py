"""The benchmarks' shared parts: the timed network (its counts, and the weights loaded through it), a window's FLOP
count against a count by hand, and the one report writer, which records the machine, the versions, the command and
the date beside the figures (and with ``--results DIR`` writes them there too)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
from datetime import datetime
from pathlib import Path

import monai
import torch
from torch import nn

import medseg
from benchmarks.cli import SUBCOMMANDS, command_parser, main
from benchmarks.common import TimedNetwork, window_gflop, write_report
from tests.helpers.configs import REPO


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


def test_write_report_records_the_figures_with_machine_versions_command_and_date(tmp_path: Path) -> None:
    invocation = argparse.Namespace(results=tmp_path / "results",
                                    command_line="python scripts/benchmark.py demo --results")
    write_report(tmp_path / "out", "demo", "| a |\n", {"rows": [{"seconds": 1.5}]}, invocation, "cpu")
    for folder in (tmp_path / "out", tmp_path / "results"):
        assert (folder / "demo.md").read_text() == "| a |\n"
        data = json.loads((folder / "demo.json").read_text())
        assert data["rows"] == [{"seconds": 1.5}]
        made = data["provenance"]
        assert made["command"] == "python scripts/benchmark.py demo --results"
        assert datetime.fromisoformat(made["date"]).tzinfo is not None
        assert made["machine"]["platform"] == platform.platform()
        assert made["machine"]["cpu_count"] == os.cpu_count() and made["machine"]["device"] == "cpu"
        assert made["machine"]["torch_threads"] == torch.get_num_threads()
        assert made["versions"] == {"python": platform.python_version(), "torch": torch.__version__,
                                    "monai": monai.__version__, "medseg": medseg.__version__}


def test_without_results_only_out_is_written(tmp_path: Path) -> None:
    write_report(tmp_path, "demo", "x\n", {}, argparse.Namespace(results=None), "cpu")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["demo.json", "demo.md"]
    assert json.loads((tmp_path / "demo.json").read_text())["provenance"]["command"]  # this process's argv


def test_every_benchmark_with_a_report_takes_results_and_records_its_command(tmp_path: Path) -> None:
    with_reports = [name for name, sub in SUBCOMMANDS.items() if sub.module.startswith("benchmarks.")
                    and "write_report(" in (REPO / (sub.module.replace(".", "/") + ".py")).read_text()]
    assert {"attention", "models", "quality", "peers", "prediction", "scan_prediction", "long_scan", "scaling",
            "loader"} <= set(with_reports)
    required = {"scan_prediction": ["--image", "scan.nii.gz", "--ckpt", "best.pt"]}
    for name in with_reports:
        parser = command_parser(SUBCOMMANDS[name].module, f"benchmark.py {name}")
        assert parser.parse_args([*required.get(name, []), "--results", "results"]).results == Path("results"), name
    argv = ["attention", "--quick", "--blocks", "masa", "--results", str(tmp_path)]
    assert main(argv) == 0
    made = json.loads((tmp_path / "attention.json").read_text())["provenance"]
    assert made["command"] == "python scripts/benchmark.py " + shlex.join(argv)
    assert {row["block"] for row in json.loads((tmp_path / "attention.json").read_text())["results"]} == {"masa"}
