"""The errors medseg raises on purpose: bad config, bad data, bad checkpoint, training that cannot go on.

Every one derives from :class:`MedsegError`. The command-line entry points print a ``MedsegError`` as one
line and exit with status 1; any other exception is a bug (in medseg or a library) and shows its traceback.
The value-like errors also derive from ``ValueError``, so Python callers that catch ``ValueError`` (for
example around :func:`medseg.attention.build_attention`) keep working.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn


class MedsegError(Exception):
    """Base of every error medseg raises on purpose; the message says what is wrong and what to do."""


class ConfigError(MedsegError, ValueError):
    """A config value medseg cannot use; the message names the key and what was expected."""


class ParameterError(ConfigError):
    """A value a network or block cannot take for one of its own parameters (``num_heads``, ``strides``, ...); it
    knows nothing of the config. The layer that builds it from a config names the key instead (:func:`keyed`)."""

    def __init__(self, parameter: str, value: Any, reason: str) -> None:
        super().__init__(f"{parameter}={value}: {reason}")
        self.parameter, self.value, self.reason = parameter, value, reason

    def __reduce__(self) -> tuple[type, tuple[str, Any, str]]:  # picklable, so DataLoader workers can send it
        return type(self), (self.parameter, self.value, self.reason)


class DatasetError(MedsegError, ValueError):
    """A dataset folder, ``dataset.json`` or case file medseg cannot use; the message names the file."""


class ImageReadError(DatasetError):
    """An image file or DICOM series folder that is missing, that its reader cannot read, or whose voxels or affine
    medseg cannot use (:mod:`medseg.data.reading`, :mod:`medseg.data.dicom`); ``reason`` says why without the
    path."""

    def __init__(self, path: Any, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # picklable, so DataLoader workers can send it
        return type(self), (self.path, self.reason)


class PredictionError(ConfigError):
    """Prediction or scoring cannot start (bad settings, no images, predictions missing or on another grid, an output
    that would overwrite an input); the message says why in one line."""


class CheckpointError(MedsegError, ValueError):
    """A checkpoint that is missing, unsafe, foreign or incompatible; the message names the file."""


class TrainingError(MedsegError, RuntimeError):
    """Training cannot go on (e.g. the loss stays non-finite); the message says what to do."""


class NoSpaceError(MedsegError, OSError):
    """The disk (or the user's quota) is full: a file could not be written, and the file it would have replaced is
    intact; the message names both."""


class TrainingInterrupted(MedsegError):
    """SIGINT/SIGTERM stopped training after saving ``last.pt``; ``exit_code`` is 128 + the signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type, tuple[str, int]]:  # picklable, so DDP ranks can share it
        return type(self), (str(self), self.exit_code)


def exit_with(err: MedsegError) -> NoReturn:
    """End the process as a command ends on a :class:`MedsegError`: ``error: <message>`` on stderr, exit status 1."""
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


def one_line(err: BaseException) -> str:
    """``"ValueError: first line of its message"``: what a library raised, for a one-line message of medseg's."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def check_choice(key: str, value: Any, choices: Collection[str]) -> None:
    """Raise :class:`ConfigError` when ``value`` of config key ``key`` is not one of ``choices``: the one check (and
    message) of every key with a fixed set of values, made by the builder or registry that owns the set."""
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid. Valid values: {', '.join(choices)}")


def check_parameter(parameter: str, value: Any, choices: Collection[str]) -> None:
    """Raise :class:`ParameterError` when ``value`` of a network's or block's ``parameter`` is not one of
    ``choices``: :func:`check_choice` for the modules, which know their parameters and not the config."""
    if value not in choices:
        raise ParameterError(parameter, repr(value), f"not valid. Valid values: {', '.join(choices)}")


@contextmanager
def keyed(node: str, keys: Mapping[str, str] | None = None) -> Iterator[None]:
    """Re-raise a :class:`ParameterError` of the modules built inside as a :class:`ConfigError` that names the config
    key: ``node.<parameter>``, or ``keys[parameter]`` where a parameter's key has another name or node.

    Example: ``with keyed("model.attention"): build(...)`` turns ``num_heads=3: ...`` into
    ``model.attention.num_heads=3: ...``.
    """
    try:
        yield
    except ParameterError as err:
        key = (keys or {}).get(err.parameter, f"{node}.{err.parameter}")
        raise ConfigError(f"{key}={err.value}: {err.reason}") from err
