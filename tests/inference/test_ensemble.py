"""Ensembles: probabilities averaged on the input's grid (also across planned spacings), one label map per case,
multirun folders as their finished folds, the cross-validation's postprocessing found for exactly its folds, and
checkpoints that cannot be combined refused with both names."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml

from medseg.config import InferenceConfig
from medseg.errors import CheckpointError, PredictionError
from medseg.evaluation.evaluate import evaluate
from medseg.inference.cases import Case
from medseg.inference.ensemble import Ensemble, checkpoint_files
from medseg.inference.inferer import Inferer
from medseg.inference.model import load_model
from medseg.postprocessing.components import load
from tests.helpers.checkpoints import save_test_checkpoint
from tests.helpers.sweeps import make_fold_sweep
from tests.helpers.volumes import LABELS, assert_same_geometry, nnunet_folder

INFERENCE = InferenceConfig(progress=False)


@pytest.fixture(scope="module")
def two_spacings(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two checkpoints that resample to different spacings (and have different weights)."""
    folder = tmp_path_factory.mktemp("ens")
    return (save_test_checkpoint(folder / "a.pt", seed=1),
            save_test_checkpoint(folder / "b.pt", spacing=(0.8, 0.8, 2.0), seed=2))


def test_probabilities_averaged_on_the_input_grid(two_spacings: tuple[Path, Path], tiny_demo_root: Path) -> None:
    case = Case("demo_000", str(tiny_demo_root / "imagesTr" / "demo_000.nii.gz"))
    a, b = (Inferer(load_model(path), INFERENCE).infer(case).probabilities for path in two_spacings)
    assert a.shape == b.shape == (3, *nib.load(case.image).shape)
    ensemble = Ensemble.load(list(two_spacings), INFERENCE).infer(case, keep_probabilities=True)
    np.testing.assert_allclose(ensemble.probabilities, (a + b) / 2, atol=1e-6)
    # models with the same preprocessing read the case once and share it
    shared = Ensemble.load([two_spacings[0], two_spacings[0]], INFERENCE)
    assert shared.inferers[1].transform is shared.inferers[0].transform
    np.testing.assert_allclose(shared.infer(case, keep_probabilities=True).probabilities, a, atol=1e-6)


def test_evaluate_an_ensemble(two_spacings: tuple[Path, Path], tiny_demo_root: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = nnunet_folder(tiny_demo_root, tmp_path / "data", cases=2)
    out = tmp_path / "out"
    result = evaluate({"ckpt": [str(p) for p in two_spacings], "input": str(folder), "output": str(out),
                       "save_probabilities": True})
    assert result.exit_code == 0 and len(result.rows) == 2 * 2
    assert "4/4" in capsys.readouterr().err, "the progress bar counts cases x models"
    for name in ("demo_000", "demo_001"):
        labels = assert_same_geometry(out / f"{name}.nii.gz", folder / "imagesTs" / f"{name}_0000.nii.gz")
        probabilities = np.load(out / f"{name}.npz")["probabilities"].astype(np.float32)
        assert (probabilities.argmax(0) == labels).mean() > 0.99  # float16 ties aside
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoints"] == [str(p) for p in two_spacings] and summary["postprocessing"] == "none"
    with pytest.raises(PredictionError, match="no single checkpoint whose fold to take .* scripts/crossval.py"):
        evaluate({"ckpt": [str(p) for p in two_spacings], "input": str(tiny_demo_root), "split": "validation"})


def test_checkpoints_that_cannot_be_ensembled(two_spacings: tuple[Path, Path], tmp_path: Path) -> None:
    other_labels = save_test_checkpoint(tmp_path / "liver.pt", labels={"0": "background", "1": "liver", "2": "tumour"})
    with pytest.raises(CheckpointError, match=rf"{two_spacings[0]} and {other_labels} cannot be ensembled: their "
                                              r"classes differ .*'dim sphere'.*'liver'"):
        Ensemble.load([two_spacings[0], other_labels], INFERENCE)
    two_channels = save_test_checkpoint(tmp_path / "t2adc.pt", channel_names=("T2", "ADC"))
    with pytest.raises(CheckpointError, match=rf"{two_spacings[1]} and {two_channels} .*their channels differ"):
        Ensemble.load([two_spacings[1], two_channels], INFERENCE)


def test_a_multirun_folder_is_its_finished_folds(tmp_path: Path, tiny_demo_root: Path) -> None:
    sweep = make_fold_sweep(tmp_path / "multirun", tiny_demo_root)
    running = sweep / "2"
    (running / ".hydra").mkdir(parents=True)
    (running / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["data.fold=2"]))
    folds = [sweep / str(k) / "checkpoints" / "best.pt" for k in range(2)]
    assert checkpoint_files(str(sweep)) == folds
    run = tmp_path / "outputs" / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.pt").write_bytes(b"")
    assert checkpoint_files([str(run), str(sweep)]) == [run / "checkpoints" / "best.pt", *folds]
    with pytest.raises(CheckpointError, match="neither a training run .* nor a multirun"):
        checkpoint_files(str(tmp_path / "outputs"))
    (running / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["data.fold=2", "model.attention.gamma=0.5"]))
    with pytest.raises(CheckpointError, match=r"mixes configurations: its runs differ in \{'model.attention.gamma'"):
        checkpoint_files(str(sweep))


def test_auto_postprocessing_is_the_cross_validations_of_exactly_these_folds(tmp_path: Path,
                                                                            tiny_demo_root: Path) -> None:
    sweep = make_fold_sweep(tmp_path / "multirun", tiny_demo_root)
    classes = {name: {"index": int(i), "step": "largest_component", "min_volume_mm3": None}
               for i, name in LABELS.items() if i != "0"}
    decision = sweep / "crossval" / "postprocessing.json"
    decision.parent.mkdir()
    decision.write_text(json.dumps({"classes": classes, "checkpoints": ["0/checkpoints/best.pt",
                                                                        "1/checkpoints/best.pt"]}))
    folder = nnunet_folder(tiny_demo_root, tmp_path / "data", cases=2)
    runs = {}
    for name, ckpt, postprocessing in (("raw", str(sweep), "none"), ("auto", str(sweep), "auto"),
                                       ("fold", str(sweep / "0" / "checkpoints" / "best.pt"), "auto")):
        runs[name] = evaluate({"ckpt": ckpt, "input": str(folder), "output": str(tmp_path / name),
                               "postprocessing": postprocessing, "inference": {"progress": False}})
    assert runs["auto"].summary["postprocessing"] == "class 1: largest_component, class 2: largest_component"
    assert runs["fold"].summary["postprocessing"] == "none", "a single fold is not what it was decided for"
    steps = load(decision, {int(i): name for i, name in LABELS.items()})
    changed = 0
    for case in ("demo_000", "demo_001"):
        raw, auto = (nib.load(tmp_path / name / f"{case}.nii.gz") for name in ("raw", "auto"))
        spacing = raw.header.get_zooms()[:3]
        kept = steps.apply(np.stack([np.asarray(raw.dataobj) == c for c in (1, 2)]), spacing)  # per class mask
        np.testing.assert_array_equal(np.asarray(auto.dataobj), kept[0] * 1 + kept[1] * 2)
        changed += int((np.asarray(auto.dataobj) != np.asarray(raw.dataobj)).sum())
    assert changed, "the untrained folds predict scattered components, which the postprocessing removes"
