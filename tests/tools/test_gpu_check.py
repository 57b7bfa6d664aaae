"""The GPU check (``scripts/gpu_check.py``, ``benchmark.py gpu``): the dry run end to end on the CPU, the part
runner's isolation, the readers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.cli import main
from tools import gpu_check as gpu
from tools.gpu_check import DEFAULT_BUDGET_S, Outcome, Part, read_attention, read_pytest, schedule

STATUSES = {"passed", "failed", "skipped", "timed out"}


def test_dry_run_records_every_part(tmp_path: Path) -> None:
    # Not timed: a budget no part comes near (the parts' limits are tested with a hanging part below); what keeps
    # the dry run short is its tiny sizes.
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


def test_a_failing_or_hanging_part_loses_only_itself(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    python = sys.executable

    def broken_reader() -> Outcome:
        raise KeyError("results")

    parts = [
        Part("hangs", "sleeps past its limit", 1, [python, "-c", "import time; time.sleep(120); print('woke')"]),
        Part("crashes", "exits with 3", 1, [python, "-c", "raise SystemExit(3)"]),
        Part("reads", "prints results.json as it is before it ran", 2,
             [python, "-c", f"print(open({str(out / 'results.json')!r}).read())"], lambda: Outcome({"x": 1})),
        Part("unreadable", "its outputs cannot be read", 2, [python, "-c", "pass"], broken_reader),
        Part("waits", "needs a file nobody made", 1, [python, "-c", "pass"], requires=tmp_path / "missing.pt"),
        Part("off", "not run", 0, None, note="why"),
    ]
    assert gpu.run_check(parts, DEFAULT_BUDGET_S, out, work, gpu.check_meta(True, DEFAULT_BUDGET_S, work)) == 1
    report = json.loads((out / "results.json").read_text())
    hangs, crashes, reads, unreadable, waits, off = report["parts"]
    assert hangs["status"] == "timed out" and hangs["returncode"] is None and "woke" not in hangs["output_tail"]
    assert crashes["status"] == "failed" and crashes["returncode"] == 3
    assert reads["status"] == "passed" and reads["figures"] == {"x": 1}
    seen = json.loads(reads["output_tail"])  # results.json as written before "reads" started
    assert [p["status"] for p in seen["parts"]] == ["timed out", "failed", "pending", "pending", "pending", "pending"]
    assert unreadable["status"] == "failed" and "KeyError" in unreadable["note"]
    assert waits["status"] == "skipped" and waits["returncode"] is None
    assert off["status"] == "skipped" and off["note"] == "why"


def test_the_schedule_fits_eight_minutes_and_the_dry_run_rehearses_it(tmp_path: Path) -> None:
    gpu_plan, dry_plan = schedule(tmp_path, dry_run=False), schedule(tmp_path, dry_run=True)
    assert sum(p.share_s for p in gpu_plan) == DEFAULT_BUDGET_S <= 8 * 60
    assert [p.name for p in gpu_plan] == [p.name for p in dry_plan]
    assert all(p.command is not None for p in gpu_plan)


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
