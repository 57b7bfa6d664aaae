"""scripts/train.py end to end, as a user runs it: outputs on disk, 2D and 3D, --cfg job, clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medseg.evaluation.evaluate import evaluate
from medseg.runs.checkpoint import load_checkpoint
from tests.helpers.configs import TINY_OVERRIDES, run_script
from tests.helpers.runs import check_run_outputs


def _train(tmp_path: Path, root: Path, *overrides: str) -> Path:
    run_dir = tmp_path / "run"
    result = run_script("train.py", [*TINY_OVERRIDES, f"data.root={root}", f"hydra.run.dir={run_dir}", *overrides],
                        cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir


@pytest.mark.full
def test_train_3d_with_masa_bottleneck(tmp_path: Path, tiny_demo_root: Path) -> None:
    run_dir = _train(tmp_path, tiny_demo_root, "model.bottleneck=masa", "model.decoder=focused_linear")
    metrics = check_run_outputs(run_dir, 3)
    # evaluate.py on the same validation cases reports the Dice the run selected its best checkpoint by
    evaluated = evaluate({"ckpt": str(run_dir / "checkpoints" / "best.pt"), "input": str(tiny_demo_root),
                          "split": "validation", "output": str(tmp_path / "preds"),
                          "inference": {"overlap": 0.25, "progress": False}})
    assert evaluated.summary["num_scored"] == len(json.loads((run_dir / "splits.json").read_text())["val"])
    assert evaluated.summary["foreground_mean"]["dice"] == pytest.approx(metrics["best_val_dice"], abs=0.02)
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["config"]["model"]["bottleneck"] == "masa"
    assert any(key.startswith("bottleneck.0.attention.lce") for key in state["model"])  # MaSA's LCE conv


@pytest.mark.full
def test_train_2d_slices(tmp_path: Path, tiny_demo_root: Path) -> None:
    run_dir = _train(tmp_path, tiny_demo_root, "model.spatial_dims=2", "data.patch_size=[32,32]",
                     "model.bottleneck=mha")
    check_run_outputs(run_dir, 2)


def test_cfg_job_shows_the_block_as_typed(tmp_path: Path) -> None:
    result = run_script("train.py", ["model.bottleneck=masa", "--cfg", "job"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "bottleneck: masa" in result.stdout


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.bottleneck=masaa", "Valid values: none, masa"),
        ("model.bottlenck=masa", "error: unknown config key 'model.bottlenck'; did you mean model.bottleneck"),
        ("+model.attention.gama=0.8", "unknown config key 'model.attention.gama'; did you mean model.attention.gamma"),
        ("data.root=/does/not/exist", "not found"),
        ("data=msd", "error: data.root is required for data=msd"),
        ("model.bottleneck=masa model.attention.num_heads=3",
         "model.attention.num_heads=3: expected a positive divisor"),
    ],
)
@pytest.mark.full
def test_bad_input_is_one_clean_line(tmp_path: Path, override: str, expected: str) -> None:
    args = [*override.split(), f"hydra.run.dir={tmp_path / 'run'}", "trainer.check_data=false"]
    if override.startswith("data.root"):
        args.append("data.format=msd")
    result = run_script("train.py", args, cwd=tmp_path)
    assert result.returncode == 1
    assert expected in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
