"""The training loop in process on the CPU: each precision, deep supervision, and every ``model.norm``.

Each test trains the micro model of ``MICRO_OVERRIDES`` on the tiny demo (3 steps per epoch) through
:func:`medseg.training.run.train` and watches the model and the training step from the test side.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from medseg.models import NORMS
from medseg.runs.checkpoint import load_checkpoint
from medseg.training.checks import check_config
from medseg.training.run import train
from tests.helpers.runs import micro_config, record_forwards, record_step

pytestmark = pytest.mark.usefixtures("one_thread")

AUTOCAST_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""``trainer.precision`` -> the dtype the model's forward must produce on the CPU (fp32: no autocast)."""
INITIAL_LOSS_SCALE = 2.0**16
"""``torch.amp.GradScaler``'s default initial scale."""


@pytest.mark.parametrize("precision", AUTOCAST_DTYPE)
def test_precision_inside_the_trainer(precision: str, tmp_path: Path, tiny_demo_root: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 and fp16 autocast reach the model in training and validation; fp16, and only fp16, scales the loss
    with a GradScaler whose state the checkpoint keeps."""
    forwards, watched = record_forwards(monkeypatch), record_step(monkeypatch)
    updates: list[float] = []
    update = torch.amp.GradScaler.update

    def counted_update(self: torch.amp.GradScaler, *args, **kwargs) -> None:
        update(self, *args, **kwargs)
        updates.append(self.get_scale())

    monkeypatch.setattr(torch.amp.GradScaler, "update", counted_update)
    run_dir = tmp_path / "run"
    metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1", f"trainer.precision={precision}"))

    assert metrics["nonfinite_steps"] == 0 and all(math.isfinite(r["loss"]) for r in metrics["history"])
    assert {f.training for f in forwards} == {True, False}, "expected training and validation"
    assert {dtype for f in forwards for dtype in f.dtypes} == {AUTOCAST_DTYPE[precision]}
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    scaler = state["scaler"]
    assert watched.step is not None and watched.step.scaler.is_enabled() == (precision == "fp16")
    if precision != "fp16":
        assert scaler == {}, "a disabled GradScaler has no state"
        return
    assert len(updates) == len(watched.loss_inputs), "the scaler took part in every step"
    restored = torch.amp.GradScaler("cpu")
    restored.load_state_dict(scaler)
    scale = restored.get_scale()
    assert scale == updates[-1], "the checkpoint keeps the scaler's state"
    halvings = math.log2(INITIAL_LOSS_SCALE / scale)  # one per overflowing step; it grows only after 2000 steps
    optimizer_steps = int(state["optimizer"]["state"][0]["step"])
    assert halvings.is_integer() and optimizer_steps + halvings == len(watched.loss_inputs), \
        "each step updated or backed off"


def test_deep_supervision_trains_every_head_and_validates_on_the_full_resolution_one(
        tmp_path: Path, tiny_demo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forwards, watched = record_forwards(monkeypatch), record_step(monkeypatch)
    run_dir = tmp_path / "run"
    cfg = micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1", "model.deep_supervision=true",
                       "model.channels=[4,8,16,16]", "model.strides=[2,2,2]")
    metrics = train(cfg)
    typed = check_config(cfg)
    patch, strides = typed.data.patch_size, typed.model.strides
    train_cases = len(json.loads((run_dir / "splits.json").read_text())["train"])
    # one output per decoder level above the bottleneck: the full-resolution head, then each lower stride
    expected = [tuple(size // math.prod(strides[:level]) for size in patch) for level in range(len(strides))]

    assert metrics["nonfinite_steps"] == 0 and math.isfinite(metrics["history"][0]["loss"])
    assert len(watched.loss_inputs) == train_cases // typed.trainer.batch_size, "one loss call per training step"
    for shapes in watched.loss_inputs:
        assert [shape[2:] for shape in shapes] == expected
    assert watched.step is not None  # the last step's gradients are still there: every head was trained
    untrained = [name for name, p in watched.step.model.named_parameters() if p.grad is None or not p.grad.any()]
    lowest = len(strides) - 2  # nnU-Net's weights: the lowest-resolution output's is 0
    assert untrained == [f"deep_heads.{lowest}.conv.conv.weight", f"deep_heads.{lowest}.conv.conv.bias"], \
        "parameters the loss gave no gradient"
    validation = [f for f in forwards if not f.training]
    assert validation, "the run validated"
    for forward in validation:
        assert len(forward.shapes) == 1 and forward.shapes[0][2:] == tuple(patch)  # sliding windows of the patch


@pytest.mark.parametrize("norm", NORMS)
def test_one_epoch_with_every_norm(norm: str, tmp_path: Path, tiny_demo_root: Path,
                                   caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="medseg"):
        metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1", f"model.norm={norm}"))
    assert metrics["epochs"] == 1 and metrics["nonfinite_steps"] == 0
    # the end-of-run table shows the compute
    table = caplog.text.split("run finished", 1)[1]
    for row in ("wall time, whole run (s)", "s per training step", "GFLOPs, forward of one patch", "peak memory"):
        assert row in table
    assert f"{metrics['gflops_per_patch_forward']:.4g}" in table
    assert math.isfinite(metrics["history"][0]["loss"]) and math.isfinite(metrics["best_val_dice"])
    weights = load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"]
    # batch norm alone keeps running statistics: the checkpoint shows which norm the run built
    assert any(key.endswith("running_mean") for key in weights) == (norm == "batch")
