"""What every command-line entry point shares: override keys checked first, the schemas registered with Hydra, medseg's
errors as one line.

A Hydra command (:mod:`medseg.commands`) is ``run(main, schema)``, where ``main`` is its ``@hydra.main`` task, on the
configs of :data:`~medseg.hydra_config.CONFIG_DIR`, wrapped in :func:`one_line_errors`; :func:`run` registers the
schemas, their ``--help`` texts and the configs' resolvers (:func:`medseg.hydra_config.register`) before Hydra
composes. Before Hydra parses the command line only this module, :mod:`medseg.commands`, the light modules they
import (:mod:`medseg.config`, :mod:`medseg.config_docs`, :mod:`medseg.hydra_config`, :mod:`medseg.typed_config`, the
errors, the version, :mod:`medseg.runtime.launch`) are loaded, and the blocks of other packages where there are some
(their keys are part of the schema), so ``--help`` and config mistakes answer without torch or MONAI.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from string import Template
from typing import TypeVar

from omegaconf import OmegaConf

from medseg.config import SCHEMAS
from medseg.errors import MedsegError, exit_with
from medseg.hydra_config import CONFIG_DIR, compose_config, help_text, register
from medseg.typed_config import check_override_keys

T = TypeVar("T")


def one_line_errors(task: Callable[..., T]) -> Callable[..., T]:
    """Wrap a Hydra task: a :class:`~medseg.errors.MedsegError` prints ``error: <message>`` and exits with 1.

    Every other exception propagates with its traceback: it is a bug, in medseg or below it.
    """

    @functools.wraps(task)
    def run_task(*args: object, **kwargs: object) -> T:
        try:
            return task(*args, **kwargs)
        except MedsegError as err:
            exit_with(err)

    return run_task


def run(main: Callable[[], object], schema: type) -> int:
    """Register the schemas with Hydra, check the command line's override keys against ``schema``, then run ``main``
    (a ``@hydra.main`` on :data:`~medseg.hydra_config.CONFIG_DIR`, whose folders are the config groups); 0 when it
    returns (a failing task exits itself)."""
    groups = [path.name for path in CONFIG_DIR.iterdir() if path.is_dir()]
    try:
        register(sys.argv)
        check_override_keys(sys.argv[1:], schema, groups)
    except MedsegError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if {"--help", "-h"} & set(sys.argv[1:]) and print_help(schema, sys.argv[1:]):
        return 0
    main()
    return 0


def print_help(schema: type, args: list[str]) -> bool:
    """Print ``--help`` (:func:`medseg.hydra_config.help_text`, the config composed with ``args``' overrides) without
    Hydra's help path, which composes the schemas once per config group (seconds). False, printing nothing, for a
    command line that one composition cannot show (a sweep, Hydra's own flags): Hydra's ``--help`` answers it."""
    from hydra.errors import HydraException  # after the key check: only --help pays for it

    name = next(key for key, value in SCHEMAS.items() if value is schema)
    overrides = [arg for arg in args if arg not in ("--help", "-h")]
    if any(arg.startswith("-") for arg in overrides):
        return False
    try:
        cfg = compose_config(name, overrides)
    except HydraException:
        return False
    print(Template(help_text(name, sys.argv)).safe_substitute(CONFIG=OmegaConf.to_yaml(cfg)))
    return True
