"""Self-describing, crash-safe checkpoints.

A checkpoint is a dict of tensors and plain Python values only, so it loads with
``torch.load(weights_only=True)``: a file that carries any other pickled object is refused and its
payload never runs. It holds the model weights, the optimizer, scheduler and AMP-scaler states, the
epoch (and step, for a checkpoint written by a graceful stop mid-epoch), the best metric, and the
resolved config and dataset description as plain types, so that the checkpoint alone rebuilds the
model and its preprocessing. Writes go to a temp file, are fsynced, then renamed over the target.

:func:`load_checkpoint` is the one loader: it tells a file that is not a medseg checkpoint (random bytes,
another format, an entry its caller needs missing) from a refused one, and refuses NaN or infinite tensors.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medseg.errors import CheckpointError, one_line
from medseg.io import atomic_write
from medseg.models import unwrap_model
from medseg.version import __version__

CHECKPOINT_FORMAT = "medseg-checkpoint"
CHECKPOINT_VERSION = 1


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Atomically write ``state`` (plus format and version tags) to ``path``."""
    payload = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "medseg_version": __version__, **state}
    return atomic_write(path, lambda handle: torch.save(payload, handle))


MODEL_KEYS = ("model", "config", "dataset")
"""What every medseg checkpoint holds, and all that rebuilding its model needs: the weights, the resolved config and
the dataset description."""


def first_nonfinite(value: Any, name: str = "") -> str | None:
    """The dotted name of the first floating-point tensor in ``value`` (nested dicts and lists of a checkpoint) that
    holds a NaN or an infinity; None when every one is finite."""
    if isinstance(value, torch.Tensor):
        finite = not (value.is_floating_point() or value.is_complex()) or bool(torch.isfinite(value).all())
        return None if finite else name
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, item in items:
        found = first_nonfinite(item, f"{name}.{key}" if name else str(key))
        if found is not None:
            return found
    return None


def read_torch_file(path: Path, map_location: str | torch.device, what: str,
                    safe: Sequence[Any] = ()) -> Any:
    """The object a ``torch.save`` file at ``path`` holds, unpickled with ``weights_only=True`` (tensors and plain
    types only; ``safe`` adds more allowed classes); ``what`` names the file's kind in messages.

    Raises:
        CheckpointError: the file is missing, is not a torch file (random or truncated bytes, another format) or
            holds pickled objects beyond those allowed (refused unrun).
    """
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} not found")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; nothing else is unpickled at all
        raise CheckpointError(f"checkpoint {path} is not {what}: it is not a torch file (another format, or a "
                              f"truncated or corrupt copy)")
    try:
        with torch.serialization.safe_globals(list(safe)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"checkpoint {path} was refused: it holds pickled objects that are not tensors or plain "
            f"types, and medseg never runs them (weights_only=True). Details: {str(err).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} is not {what}: torch cannot read it ({one_line(err)})") from None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu",
                    needs: Collection[str] = MODEL_KEYS) -> dict[str, Any]:
    """Load a medseg checkpoint safely (``weights_only=True``): the one loader of every path (resume, evaluation,
    prediction, export, ``trainer.init_from``).

    Args:
        needs: the entries the caller reads; a checkpoint without one of them is not a medseg checkpoint to it.

    Raises:
        CheckpointError: the file is missing; is not a medseg checkpoint (random or truncated bytes, not a torch
            file, no medseg tag, an entry of ``needs`` missing); holds pickled objects beyond tensors and plain
            types (refused unrun); comes from an incompatible format version; or holds a tensor with NaN or
            infinite values (the message names the first).
    """
    path = Path(path)
    return _checked(read_torch_file(path, map_location, "a medseg checkpoint"), path, needs)


def _checked(state: Any, path: Path, needs: Collection[str]) -> dict[str, Any]:
    """``state`` read from ``path``, checked to be a medseg checkpoint holding ``needs`` (:func:`load_checkpoint`)."""
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a medseg checkpoint: it was not written by medseg (no "
                              f"'{CHECKPOINT_FORMAT}' tag)")
    if state.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {state.get('version')} (medseg "
            f"{state.get('medseg_version')}); this medseg ({__version__}) reads version {CHECKPOINT_VERSION}"
        )
    missing = [key for key in needs if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a medseg checkpoint: it lacks {', '.join(missing)}")
    bad = first_nonfinite(state)
    if bad is not None:
        raise CheckpointError(f"checkpoint {path} holds NaN or infinite values in {bad}: it is corrupt; use "
                              f"another checkpoint (best.pt, or an earlier run's)")
    return state


def _tensors(value: Any) -> dict[str, torch.Tensor] | None:
    """``value`` when it is a state dict (names to tensors), else None."""
    if isinstance(value, Mapping) and value and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                    for k, v in value.items()):
        return dict(value)
    return None


NNUNET_NETWORK_KEYS = ("encoder.", "decoder.")
"""The top-level modules of nnU-Net's networks (``PlainConvUNet``, ``ResidualEncoderUNet``)."""


def read_start_weights(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """What ``trainer.init_from`` names, but nnU-Net's trained models (:mod:`medseg.runs.nnunet_model`): a medseg
    checkpoint (:func:`load_checkpoint`), or a file holding a plain state dict of medseg's network (``torch.save(
    model.state_dict())``, or one under ``"state_dict"``), returned as ``{"model": it}``.

    Raises:
        CheckpointError: a MONAI bundle (its network is MONAI's), nnU-Net's network weights outside its trained-model
            folder (their plan, axes and labels are there), a file that is neither, or a medseg checkpoint refused by
            :func:`load_checkpoint`; in one line.
    """
    path = Path(path)
    bundle = next((folder for folder in (path, *path.parents[:2]) if (folder / "configs").is_dir()
                   and (folder / "models").is_dir()), None)
    if bundle is not None:
        raise CheckpointError(f"trainer.init_from={path} is in a MONAI bundle ({bundle}): its network is MONAI's, "
                              "which medseg does not build; medseg starts from its own checkpoints, plain state dicts "
                              "of its network and nnU-Net v2's trained-model folders")
    state = read_torch_file(path, map_location, "a medseg checkpoint or state dict")
    if isinstance(state, dict) and "format" in state:
        return _checked(state, path, MODEL_KEYS)
    weights = _tensors(state) or _tensors(state.get("state_dict") if isinstance(state, dict) else None)
    nnunet = weights is None and isinstance(state, dict) and "network_weights" in state
    if nnunet or (weights is not None and all(key.startswith(NNUNET_NETWORK_KEYS) for key in weights)):
        raise CheckpointError(f"trainer.init_from={path} holds the weights of nnU-Net's network outside its "
                              "trained-model folder: give that folder (plans.json, dataset.json, fold_<k>/), whose "
                              "plan, axes and labels say what the weights mean")
    if weights is None:
        raise CheckpointError(f"trainer.init_from={path} is neither a medseg checkpoint nor a state dict (a mapping of "
                              "names to tensors)")
    bad = first_nonfinite(weights)
    if bad is not None:
        raise CheckpointError(f"trainer.init_from={path} holds NaN or infinite values in {bad}: it is corrupt")
    return {"model": weights}


def state_mismatch(expected: Mapping[str, torch.Tensor], state_dict: Mapping[str, torch.Tensor]) -> str:
    """What keeps ``state_dict`` from loading into a model whose state is ``expected``: missing keys, unexpected
    keys and keys whose shape differs, eight of each at most; "" when it fits."""
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    wrong_shape = sorted(k for k in set(expected) & set(state_dict) if expected[k].shape != state_dict[k].shape)

    def show(keys: list[str]) -> str:
        return ", ".join(keys[:8]) + (f" (+{len(keys) - 8} more)" if len(keys) > 8 else "")

    return "; ".join(f"{label}: {show(keys)}" for label, keys in
                     (("missing", missing), ("unexpected", unexpected), ("shape differs", wrong_shape)) if keys)


def load_model_state(model: nn.Module, state_dict: dict[str, torch.Tensor], source: str | Path) -> None:
    """Load weights strictly; a different architecture gives an error naming the mismatching keys."""
    target = unwrap_model(model)
    mismatch = state_mismatch(target.state_dict(), state_dict)
    if mismatch:
        raise CheckpointError(f"checkpoint {source} does not fit this model's architecture; {mismatch}")
    target.load_state_dict(state_dict)


def load_fitting_state(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    """Load the tensors of ``state_dict`` whose key and shape ``model`` has; the others keep their values.

    Returns:
        The model's keys left as they were (absent from ``state_dict`` or of another shape), sorted.
    """
    target = unwrap_model(model)
    own = target.state_dict()
    fitting = {k: v for k, v in state_dict.items() if k in own and own[k].shape == v.shape}
    target.load_state_dict(fitting, strict=False)
    return sorted(set(own) - set(fitting))
