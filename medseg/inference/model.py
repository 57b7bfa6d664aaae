"""The network of a checkpoint, rebuilt with everything its inference needs (preprocessing, window, classes)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from monai.transforms import Compose
from torch import nn

from medseg.attention import load_blocks
from medseg.config import DataConfig, TrainConfig
from medseg.data.labels import LabelSpec
from medseg.data.transforms import Window, eval_transforms, window
from medseg.errors import CheckpointError
from medseg.models import build_model
from medseg.planning.from_config import unset_keys
from medseg.runs.checkpoint import load_checkpoint, load_model_state
from medseg.typed_config import to_typed


@dataclass
class EvalModel:
    """A network rebuilt from a checkpoint, with everything its inference needs."""

    model: nn.Module
    data: DataConfig
    """The training run's resolved ``data`` config: preprocessing (spacing, normalisation) and its fold."""
    spatial_dims: int
    window: Window
    labels: dict[int, str]
    """Class index -> name, background (0) included."""
    channel_names: list[str]
    checkpoint: Path | None = None
    """The file it was loaded from."""
    label_spec: LabelSpec | None = None
    """The classes' label values, ignore label and regions (:mod:`medseg.data.labels`); None: :meth:`LabelSpec.plain`
    of ``labels``."""
    tta: bool = False
    """Whether its training validated with mirroring: prediction's ``inference.tta=null``."""

    def __post_init__(self) -> None:
        if self.label_spec is None:
            self.label_spec = LabelSpec.plain(self.labels)

    @property
    def preprocessing(self) -> Compose:
        """Its MONAI preprocessing: ``{"image": path(s)}`` -> ``image`` ``(C, X', Y', Z')`` in RAS order, resampled to
        the training spacing and normalised as in training."""
        return eval_transforms(self.data, with_label=False)

    @property
    def preprocessing_key(self) -> str:
        """Equal for models whose :attr:`preprocessing` is the same (it reads the spacing, the normalisation and the
        resampling)."""
        return json.dumps([self.data.spacing, self.data.normalization, self.data.resampling], sort_keys=True)

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def in_channels(self) -> int:
        return len(self.channel_names)


def load_model(path: str | Path, device: torch.device | str = "cpu") -> EvalModel:
    """Rebuild the network of a medseg checkpoint, in eval mode on ``device``.

    Raises:
        CheckpointError: the file is missing, foreign or unsafe, lacks the config and dataset
            description, or its weights do not fit the architecture it describes.
        ConfigError: a module of its ``model.block_modules`` that cannot be imported.
    """
    state = load_checkpoint(path, map_location="cpu")
    model_config = state["config"].get("model") if isinstance(state.get("config"), dict) else None
    load_blocks(model_config.get("block_modules", []) if isinstance(model_config, dict) else [])  # before its keys
    try:
        cfg = to_typed(TrainConfig, state["config"])
        spec = LabelSpec.from_dict(state["dataset"])
        channel_names = [str(c) for c in state["dataset"]["channel_names"]]
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"checkpoint {path} lacks the config or dataset description evaluation needs "
                              f"({type(err).__name__}: {err})") from None
    unset = unset_keys(cfg.data, cfg.model)
    if unset:
        raise CheckpointError(f"checkpoint {path} has no resolved {', '.join(unset)}")
    view = window(cfg.data, cfg.model.spatial_dims)
    try:
        model = build_model(cfg.model, len(channel_names), spec.num_outputs, view.net_patch)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path}: cannot rebuild its model ({type(err).__name__}: {err})") from None
    load_model_state(model, state["model"], path)
    return EvalModel(model.to(device).eval(), cfg.data, cfg.model.spatial_dims, view, spec.labels, channel_names,
                     Path(path), spec, tta=cfg.inference.tta)
