"""``inference.tta=null``: prediction mirrors as the checkpoint's training validated (nnU-Net's recipe: on), unless
the command line says otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from medseg.config import InferenceConfig
from medseg.inference.inferer import Inferer
from medseg.inference.model import load_model
from medseg.runs.checkpoint import load_checkpoint, save_checkpoint
from tests.helpers.checkpoints import save_test_checkpoint


def _checkpoint(tmp_path: Path, validated_with_tta: bool | None) -> Path:
    """A tiny checkpoint whose training validated with ``validated_with_tta`` (None: a checkpoint without the key)."""
    path = save_test_checkpoint(tmp_path / "best.pt")
    state = load_checkpoint(path)
    if validated_with_tta is None:
        del state["config"]["inference"]["tta"]
    else:
        state["config"]["inference"]["tta"] = validated_with_tta
    return save_checkpoint(path, state)


@pytest.mark.parametrize(("validated", "asked", "mirrored"), [
    (True, None, (0, 1, 2)), (False, None, ()), (None, None, ()),   # null: as the training validated
    (True, False, ()), (False, True, (0, 1, 2)),                    # set: as asked
])
def test_prediction_mirrors_as_the_checkpoint_validated_unless_asked(tmp_path: Path, validated: bool | None,
                                                                     asked: bool | None,
                                                                     mirrored: tuple[int, ...]) -> None:
    net = load_model(_checkpoint(tmp_path, validated))
    inferer = Inferer(net, InferenceConfig(device="cpu", tta=asked, progress=False))
    assert inferer.window.mirror_axes == mirrored
