"""Reliability of the training loop, in process: best.pt never gets worse, non-finite steps are skipped and
counted, gradient clipping is configurable, resuming another architecture fails cleanly, and every
checkpoint load in the code base is ``weights_only``.

Faults are injected from the test only (a wrapped loss, a scripted validation); production code has no hooks.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from medseg.cli import one_line_errors
from medseg.runs.checkpoint import load_checkpoint
from medseg.training import trainer as trainer_module
from medseg.training.run import train, train_cli
from medseg.training.validation import ValidationResult
from tests.helpers.configs import REPO
from tests.helpers.runs import micro_config

STEPS_PER_EPOCH = 3  # the micro run: 6 training cases (fold 0 of 8) in batches of 2

pytestmark = pytest.mark.usefixtures("one_thread")


class _InfiniteGradient(torch.autograd.Function):
    """The identity whose backward multiplies the gradient by infinity: a finite loss with non-finite gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class _FaultyLoss(nn.Module):
    """The training loss made non-finite (``fault="loss"``) or given non-finite gradients (``"gradient"``) on chosen
    calls."""

    def __init__(self, loss: nn.Module, is_bad: Callable[[int], bool], fault: str) -> None:
        super().__init__()
        self.loss, self.is_bad, self.fault, self.calls = loss, is_bad, fault, 0

    def forward(self, output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = self.loss(output, label)
        if not self.is_bad(self.calls):
            return loss
        return loss * float("nan") if self.fault == "loss" else _InfiniteGradient.apply(loss)


def _inject_faults(monkeypatch: pytest.MonkeyPatch, is_bad: Callable[[int], bool], fault: str = "loss") -> None:
    """Make the training loss faulty on the calls (counted from 1) where ``is_bad`` is true."""
    build = trainer_module.build_loss
    monkeypatch.setattr(trainer_module, "build_loss", lambda *args: _FaultyLoss(build(*args), is_bad, fault))


def _optimizer_steps(state: dict[str, Any]) -> int:
    """How many optimizer updates a checkpoint's AdamW state has seen."""
    return int(state["optimizer"]["state"][0]["step"])


def _all_finite(state: dict[str, Any]) -> bool:
    return all(torch.isfinite(value).all() for value in state["model"].values() if value.is_floating_point())


def test_best_checkpoint_is_never_replaced_by_a_worse_one(tmp_path: Path, tiny_demo_root: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    scripted = iter([0.3, 0.6, 0.4, 0.6])  # goes down after epoch 2, then only ties

    def validate(*args: Any) -> ValidationResult:
        dice, label_spec = next(scripted), args[4]
        return ValidationResult(dice, dict.fromkeys(label_spec.output_names, dice), None)

    monkeypatch.setattr(trainer_module, "validate", validate)
    run_dir = tmp_path / "run"
    metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=4"))
    history = json.loads((run_dir / "metrics.json").read_text())["history"]
    assert [record["val_dice"] for record in history] == [0.3, 0.6, 0.4, 0.6]
    best = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    assert best["best_metric"] == metrics["best_val_dice"] == max(record["val_dice"] for record in history)
    assert best["best_epoch"] == best["epoch"] == metrics["best_epoch"] == 2  # written at epoch 2, never after
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["epoch"] == 4


@pytest.mark.parametrize(("fault", "grad_clip"), [("loss", "12.0"), ("gradient", "null"), ("gradient", "12.0")])
def test_nonfinite_steps_are_skipped_and_counted(tmp_path: Path, tiny_demo_root: Path, monkeypatch: pytest.MonkeyPatch,
                                                 fault: str, grad_clip: str) -> None:
    _inject_faults(monkeypatch, lambda call: call in (2, 5), fault)  # one step in each of the 2 epochs
    run_dir = tmp_path / "run"
    metrics = train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", f"trainer.grad_clip={grad_clip}"))
    assert metrics["nonfinite_steps"] == 2
    assert json.loads((run_dir / "metrics.json").read_text())["nonfinite_steps"] == 2
    assert all(torch.isfinite(torch.tensor(record["loss"])) for record in metrics["history"])
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert _optimizer_steps(last) == 2 * STEPS_PER_EPOCH - 2  # the two bad steps changed nothing
    assert _all_finite(last)
    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/nonfinite_steps")] == [(1, 1.0), (2, 2.0)]


def test_nonfinite_streak_stops_the_run_naming_the_last_good_checkpoint(
        tmp_path: Path, tiny_demo_root: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _inject_faults(monkeypatch, lambda call: call > STEPS_PER_EPOCH)  # every step from epoch 2 on
    run_dir = tmp_path / "run"
    cfg = micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=3", "trainer.max_nonfinite_steps=2")
    with pytest.raises(SystemExit) as exit_info:
        one_line_errors(train_cli)(cfg)
    assert exit_info.value.code == 1
    [error] = capsys.readouterr().err.splitlines()
    last = run_dir / "checkpoints" / "last.pt"
    assert "non-finite for 2 steps in a row at epoch 2" in error
    assert f"Last good checkpoint: {last}." in error
    state = load_checkpoint(last)
    assert state["epoch"] == 1 and _optimizer_steps(state) == STEPS_PER_EPOCH and _all_finite(state)


@pytest.mark.parametrize("grad_clip", [None, 1e-3], ids=["null", "1e-3"])
def test_grad_clip_is_configurable(tmp_path: Path, tiny_demo_root: Path, monkeypatch: pytest.MonkeyPatch,
                                   grad_clip: float | None) -> None:
    calls: list[tuple[float, float, float]] = []  # (max_norm, norm before, norm after)
    clip = torch.nn.utils.clip_grad_norm_

    def spy(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        parameters = list(parameters)
        norm = clip(parameters, max_norm, *args, **kwargs)
        after = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        calls.append((max_norm, float(norm), float(after)))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    value = "null" if grad_clip is None else str(grad_clip)
    train(micro_config(tmp_path / "run", tiny_demo_root, "trainer.max_epochs=1", f"trainer.grad_clip={value}"))
    if grad_clip is None:
        assert calls == []
        return
    assert len(calls) == STEPS_PER_EPOCH
    for max_norm, before, after in calls:
        assert max_norm == grad_clip and before > grad_clip  # these gradients need clipping ...
        assert after <= grad_clip * (1 + 1e-4)  # ... and got it


def test_resume_with_another_architecture_is_one_clean_error(tmp_path: Path, tiny_demo_root: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    train(micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=1"))
    last = run_dir / "checkpoints" / "last.pt"
    for resume in ("trainer.resume=true", f"ckpt_path={last}"):
        capsys.readouterr()
        cfg = micro_config(run_dir, tiny_demo_root, "trainer.max_epochs=2", "model.bottleneck=masa", resume)
        with pytest.raises(SystemExit) as exit_info:
            one_line_errors(train_cli)(cfg)
        assert exit_info.value.code == 1
        [error] = capsys.readouterr().err.splitlines()
        assert error.startswith(f"error: checkpoint {last} does not fit this model's architecture; missing: ")
        assert "bottleneck." in error.split("missing: ")[1]


def _torch_load_calls(path: Path) -> Iterator[ast.Call]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
            yield node


def test_every_torch_load_is_weights_only() -> None:
    sources = sorted([*(REPO / "medseg").rglob("*.py"), *(REPO / "scripts").rglob("*.py")])
    calls = [(path, call) for path in sources for call in _torch_load_calls(path)]
    assert calls, "expected at least medseg.runs.checkpoint's torch.load"
    for path, call in calls:
        weights_only = [k.value for k in call.keywords if k.arg == "weights_only"]
        assert len(weights_only) == 1 and isinstance(weights_only[0], ast.Constant) and weights_only[0].value is True, \
            f"{path.relative_to(REPO)}:{call.lineno}: torch.load without weights_only=True"
