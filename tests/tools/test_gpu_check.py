"""The GPU check (``scripts/gpu_check.py``, ``benchmark.py gpu``): the dry run end to end on the CPU, the part
runner's isolation and limits (with the runner and the clock replaced), the readers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.cli import main
from tools import gpu_check
from tools.gpu_check import (
    DEFAULT_BUDGET_S,
    Outcome,
    Part,
    read_attention,
    read_pipeline,
    read_pytest,
    schedule,
)

STATUSES = {"passed", "failed", "skipped", "timed out"}


@pytest.mark.full
def test_dry_run_records_every_part(tmp_path: Path) -> None:
    # Not timed: a budget no part comes near (the parts' limits are tested with the runner replaced below); what
    # keeps the dry run short is its tiny sizes. `benchmark.py gpu`, the older name, runs it.
    out, work = tmp_path / "out", tmp_path / "work"
    assert main(["gpu", "--dry-run", "--out", str(out), "--work", str(work), "--budget", "3600"]) == 0
    report = json.loads((out / "results.json").read_text())
    parts = {p["name"]: p for p in report["parts"]}
    assert list(parts) == [p.name for p in schedule(work, dry_run=True)]
    assert {p["status"] for p in parts.values()} <= STATUSES - {"failed", "timed out"}
    markdown = (out / "results.md").read_text()
    assert all(f"## {name}" in markdown for name in parts)

    tests = parts["gpu_tests"]["figures"]
    if not torch.cuda.is_available():
        assert parts["gpu_tests"]["status"] == "skipped" and tests["tests"] == tests["skipped"] > 0

    (grid,) = parts["attention"]["figures"]["grids"]
    assert grid["masa_ms"] > 0 and grid["sdpa_ms"] > 0 and grid["masa_over_sdpa"] == grid["masa_ms"] / grid["sdpa_ms"]
    assert grid["max_abs_diff_vs_sdpa_bias"] == 0.0  # off CUDA masa itself takes the SDPA-bias path

    models = json.loads((work / "models" / "models.json").read_text())
    (network,) = parts["models"]["figures"]["networks"]
    assert network["train_step_s"] > 0 and network["samples_per_s"] * network["train_step_s"] == pytest.approx(
        models["meta"]["batch"])
    assert parts["models_channels_first"]["figures"]["overrides"][-1] == "model.channels_last=false"

    metrics = json.loads((work / "demo_train" / "metrics.json").read_text())
    assert parts["demo_train"]["figures"]["best_val_dice"] == metrics["best_val_dice"]
    assert 0 <= metrics["best_val_dice"] <= 1 and (work / "demo_train" / "checkpoints" / "best.pt").is_file()

    dice = [{name: c["dice"] for name, c in json.loads((work / name / "summary.json").read_text())["classes"].items()}
            for name in ("evaluate_cuda", "evaluate_cpu")]
    assert dice[0] == dice[1] and len(dice[0]) == 2  # the same checkpoint, both on the CPU in a dry run
    (agreement,) = parts["evaluate_cpu"]["targets"]
    assert agreement["value"] == 0.0 and agreement["met"] is True

    planner = parts["planner"]["figures"]
    metrics = json.loads((work / "planner" / "metrics.json").read_text())
    assert metrics["estimated_memory_mb"] == planner["estimated_mib"] <= planner["budget_mib"] == 0.02 * 1024
    assert planner["channels"] == [8, 16] and len(planner["strides"]) == 1  # the tiny network, its strides planned
    assert planner["patch_size"] != [48, 48, 32], "planned, not the preset's patch"
    assert parts["planner"]["targets"] == [] and "budget target" in parts["planner"]["note"]

    assert parts["models_compiled"]["status"] == "skipped" and parts["models_compiled"]["note"]

    pipeline = json.loads((work / "pipeline" / "pipeline.json").read_text())
    settings = parts["pipeline"]["figures"]["settings"]
    assert settings == pipeline["settings"] and parts["pipeline"]["status"] == "passed"
    assert [(row["augment_on"], row["workers"]) for row in settings] == [
        ("workers", 1), ("workers", 2), ("device", 1), ("device", 2)]
    for row in settings:
        assert 0 < row["device_s_per_step"] <= row["step_s"] and 0 < row["busy_share"] <= 1
        assert row["patches_per_step"] == 2  # a case a step, nnU-Net's two patches of it
    assert parts["pipeline"]["targets"] == [] and "busy-share target" in parts["pipeline"]["note"]


class FakeRunner:
    """``run_command`` replaced: each part's scripted exit code (None: stopped at its limit), the limits it was
    given, and a clock that each part advances by its scripted seconds; what the part prints goes to its log."""

    def __init__(self, out: Path, script: dict[str, tuple[int | None, float]]) -> None:
        self.out, self.script, self.now, self.limits = out, script, 100.0, {}

    def clock(self) -> float:
        return self.now

    def __call__(self, command: list[str], limit_s: float, log: Path) -> int | None:
        name = log.stem
        code, seconds = self.script[name]
        self.limits[name] = limit_s
        self.now += seconds
        log.parent.mkdir(parents=True, exist_ok=True)
        # "reads" logs results.json as it was when it started
        log.write_text((self.out / "results.json").read_text() if name == "reads" else f"{name} ran\n")
        return code


def test_a_failing_or_stopped_part_loses_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, work = tmp_path / "out", tmp_path / "work"

    def broken_reader() -> Outcome:
        raise KeyError("results")

    parts = [
        Part("hangs", "stopped at its limit", 60, ["hangs"]),
        Part("crashes", "exits with 3", 60, ["crashes"]),
        Part("reads", "logs results.json as it is before it ran", 120, ["reads"], lambda: Outcome({"x": 1})),
        Part("unreadable", "its outputs cannot be read", 120, ["unreadable"], broken_reader),
        Part("waits", "needs a file nobody made", 60, ["waits"], requires=tmp_path / "missing.pt"),
        Part("off", "not run", 0, None, note="why"),
    ]
    runner = FakeRunner(out, {"hangs": (None, 60.0), "crashes": (3, 10.0), "reads": (0, 5.0),
                              "unreadable": (0, 5.0)})
    monkeypatch.setattr(gpu_check, "run_command", runner)
    monkeypatch.setattr(gpu_check, "time", SimpleNamespace(monotonic=runner.clock, perf_counter=runner.clock))
    assert gpu_check.run_check(parts, 2 * DEFAULT_BUDGET_S, out, work,
                               gpu_check.check_meta(True, DEFAULT_BUDGET_S, work)) == 1

    # each limit runs to the end of the part's share (doubled with the budget) counted from the start
    assert runner.limits == {"hangs": 120.0, "crashes": 240.0 - 60.0, "reads": 480.0 - 70.0,
                             "unreadable": 720.0 - 75.0}
    report = json.loads((out / "results.json").read_text())
    hangs, crashes, reads, unreadable, waits, off = report["parts"]
    assert hangs["status"] == "timed out" and hangs["returncode"] is None and hangs["seconds"] == 60.0
    assert hangs["note"] == "stopped after its 120 s limit" and hangs["output_tail"] == "hangs ran\n"
    assert crashes["status"] == "failed" and crashes["returncode"] == 3 and crashes["note"] == "exit code 3"
    assert reads["status"] == "passed" and reads["figures"] == {"x": 1}
    seen = json.loads(reads["output_tail"])  # results.json as written before "reads" started
    assert [p["status"] for p in seen["parts"]] == ["timed out", "failed", "pending", "pending", "pending", "pending"]
    assert unreadable["status"] == "failed" and "KeyError" in unreadable["note"]
    assert waits["status"] == "skipped" and waits["returncode"] is None and "waits" not in runner.limits
    assert off["status"] == "skipped" and off["note"] == "why"
    assert "## hangs" in (out / "results.md").read_text()


def test_a_command_past_its_limit_is_stopped(tmp_path: Path) -> None:
    # The command never ends by itself (it waits on an event nobody sets), so it is stopped however fast or slow
    # the machine: the outcome does not depend on time.
    forever = [sys.executable, "-c", "import threading; print('started', flush=True); threading.Event().wait()"]
    assert gpu_check.run_command(forever, 1.0, tmp_path / "forever.log") is None
    # A command that ends by itself gives its exit code and its output, well within a generous limit.
    ends = [sys.executable, "-c", "print('done'); raise SystemExit(3)"]
    assert gpu_check.run_command(ends, 600.0, tmp_path / "ends.log") == 3
    assert (tmp_path / "ends.log").read_text() == "done\n"


def test_the_schedule_fits_eight_minutes_and_the_dry_run_rehearses_it(tmp_path: Path) -> None:
    on_gpu, dry = schedule(tmp_path, dry_run=False), schedule(tmp_path, dry_run=True)
    assert sum(p.share_s for p in on_gpu) == DEFAULT_BUDGET_S <= 8 * 60
    assert [p.name for p in on_gpu] == [p.name for p in dry]
    assert all(p.command is not None for p in on_gpu)


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite tests="3" failures="{failures}" errors="0"
skipped="{skipped}"><testcase classname="tests.a" name="test_one"/><testcase classname="tests.a" name="test_two">{two}
</testcase><testcase classname="tests.b" name="test_three"><skipped message="needs CUDA"/></testcase></testsuite>
</testsuites>"""


def test_pytest_report_reading(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT.format(failures=1, skipped=1, two='<failure message="assert 1 == 2&#10;more"/>'))
    outcome = read_pytest(path)
    assert outcome.status == "failed" and outcome.figures["passed"] == 1
    assert outcome.figures["failed_tests"] == ["tests.a::test_two: assert 1 == 2"]
    assert outcome.targets[0].value == 1 and outcome.targets[0].met is False
    path.write_text(JUNIT.format(failures=0, skipped=3, two='<skipped message="needs CUDA"/>'))
    assert read_pytest(path).status == "skipped" and read_pytest(path).targets[0].met is None


def _attention_report(device: str) -> dict:
    cell = {"shape": [16, 16, 16], "status": "ok", "detail": "", "peak_mib": 10.0}
    return {"meta": {"device": device, "precision": "bf16"},
            "results": [{**cell, "block": "masa", "time_ms": 3.0}, {**cell, "block": "sdpa", "time_ms": 2.5},
                        {**cell, "block": "masa_sdpa_bias", "time_ms": 9.0}],
            "max_abs_diff_masa_vs_sdpa_bias": [{"shape": [16, 16, 16], "value": 0.01}]}


def test_attention_time_target_is_cuda_only() -> None:
    (target,) = read_attention(_attention_report("cuda")).targets
    assert target.value == 3.0 / 2.5 and target.met
    outcome = read_attention(_attention_report("cpu"))
    assert outcome.targets[0].value is None and outcome.figures["grids"][0]["max_abs_diff_vs_sdpa_bias"] == 0.01


def test_pipeline_reading_sets_the_busy_share_target_on_cuda_only() -> None:
    settings = [{"augment_on": where, "workers": workers, "step_s": 0.2, "device_s_per_step": 0.2 * share,
                 "wait_s_per_step": 0.0, "busy_share": share, "patches_per_step": 2}
                for where, workers, share in (("workers", 4, 0.4), ("device", 2, 0.7), ("device", 4, 0.95))]
    report = {"meta": {"patch": [96, 96, 40], "patches_per_step": 2, "channels": [32, 64]}, "settings": settings,
              "provenance": {"machine": {"device": "cuda (NVIDIA H100)"}}}
    (target,) = read_pipeline(report).targets
    assert target.value == 0.95 and target.met is True
    report["provenance"]["machine"]["device"] = "cpu"
    outcome = read_pipeline(report)
    assert outcome.targets == [] and outcome.figures["settings"] == settings
