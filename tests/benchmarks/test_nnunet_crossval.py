"""``benchmark.py nnunet_crossval``: nnU-Net v2 on every fold in its own layout, as ``compare.py nnunet=RESULTS`` reads
it (the run itself needs the peers extra and is in the slow suite)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from benchmarks.cli import main
from benchmarks.nnunet_crossval import training_length
from benchmarks.nnunet_peer import parse_length
from medseg.evaluation.external import fold_folders, nnunet_parameters


def test_bad_arguments_stop_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match="unknown argument 'systems'.*folds=, budget_minutes=, epochs=, iterations=, "
                                         "configuration="):
        main(["nnunet_crossval", "systems=nnunet", "--out", str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[peers\]"'):
        main(["nnunet_crossval", "data.root=x", "--out", str(tmp_path)])


@pytest.mark.parametrize(("own", "length"), [({}, "600.0"), ({"budget_minutes": "0.5"}, "30.0"),
                                            ({"epochs": "30", "iterations": "20"}, "30x20")])
def test_the_length_is_a_budget_or_epochs_of_iterations(own: dict[str, str], length: str) -> None:
    assert training_length(own) == length
    assert parse_length(length)[0] == ("FixedTrainer" if "x" in length else "BudgetTrainer")


@pytest.mark.parametrize("own", [{"epochs": "30"}, {"epochs": "3", "iterations": "2", "budget_minutes": "1"},
                                 {"epochs": "0", "iterations": "20"}, {"budget_minutes": "-1"},
                                 {"epochs": "a", "iterations": "2"}])
def test_a_length_given_two_ways_or_not_positive_stops(own: dict[str, str]) -> None:
    with pytest.raises(SystemExit, match="^error: "):
        training_length(own)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("nnunetv2") is None, reason="needs the peers extra (nnunetv2)")
def test_two_folds_leave_nnunets_layout(tmp_path: Path, tiny_demo_root: Path) -> None:
    assert main(["nnunet_crossval", f"data.root={tiny_demo_root}", "folds=0,1", "budget_minutes=0.5",
                 "--out", str(tmp_path)]) == 0
    paths = json.loads((tmp_path / "nnunet_crossval.json").read_text())
    splits = json.loads(Path(paths["splits"]).read_text())
    results = Path(paths["results"])
    validation = fold_folders(results)
    for fold in (0, 1):
        predicted = sorted(p.name.removesuffix(".nii.gz") for p in validation[fold].glob("*.nii.gz"))
        assert predicted == sorted(splits[fold]["val"])
        assert list((results / f"fold_{fold}").glob("training_log_*.txt"))
    params, why = nnunet_parameters(results)
    assert params is not None and params > 1000, why
