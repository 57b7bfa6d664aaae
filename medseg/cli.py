"""What every command-line entry point shares: the configs' folder, override keys checked first, medseg's errors as
one line.

A Hydra command (:mod:`medseg.commands`) is ``run(main, schema)``, where ``main`` is its ``@hydra.main`` task, on the
configs of :data:`CONFIG_DIR`, wrapped in :func:`one_line_errors`. Importing this module registers the schemas
(:mod:`medseg.config`) and the configs' resolvers with Hydra. Before Hydra parses the command line only it,
:mod:`medseg.commands` and the light modules they import (:mod:`medseg.config`, :mod:`medseg.typed_config`, the
errors, the version, :mod:`medseg.runtime.launch`) are loaded, so ``--help`` and config mistakes answer without
torch or MONAI.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from string import Template
from typing import TypeVar

from omegaconf import OmegaConf

from medseg.config import CONFIG_DIR, SCHEMAS, help_template  # importing it registers the schemas with Hydra
from medseg.errors import MedsegError
from medseg.typed_config import check_override_keys

T = TypeVar("T")


def block_names() -> str:
    """``${medseg_blocks:}`` in a sweep preset (``experiment=compare_blocks``): none and every registered block."""
    from medseg.attention.registry import block_choices  # the registry loads only when a preset asks

    return ",".join(block_choices())


OmegaConf.register_new_resolver("medseg_blocks", block_names, replace=True)


def one_line_errors(task: Callable[..., T]) -> Callable[..., T]:
    """Wrap a Hydra task: a :class:`~medseg.errors.MedsegError` prints ``error: <message>`` and exits with 1.

    Every other exception propagates with its traceback: it is a bug, in medseg or below it.
    """

    @functools.wraps(task)
    def run_task(*args: object, **kwargs: object) -> T:
        try:
            return task(*args, **kwargs)
        except MedsegError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(1)

    return run_task


def run(main: Callable[[], object], schema: type) -> int:
    """Check the command line's override keys against ``schema``, then run ``main`` (a ``@hydra.main`` on
    :data:`CONFIG_DIR`, whose folders are the config groups); 0 when it returns (a failing task exits itself)."""
    groups = [path.name for path in CONFIG_DIR.iterdir() if path.is_dir()]
    try:
        check_override_keys(sys.argv[1:], schema, groups)
    except MedsegError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if {"--help", "-h"} & set(sys.argv[1:]) and print_help(schema, sys.argv[1:]):
        return 0
    main()
    return 0


def print_help(schema: type, args: list[str]) -> bool:
    """Print ``--help`` (:func:`medseg.config.help_template`, the config composed with ``args``' overrides) without
    Hydra's help path, which composes the schemas once per config group (seconds). False, printing nothing, for a
    command line that one composition cannot show (a sweep, Hydra's own flags): Hydra's ``--help`` answers it."""
    from hydra import compose, initialize_config_dir  # after the key check: only --help pays for it
    from hydra.errors import HydraException

    name = next(key for key, value in SCHEMAS.items() if value is schema)
    overrides = [arg for arg in args if arg not in ("--help", "-h")]
    if any(arg.startswith("-") for arg in overrides):
        return False
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name=name):
            cfg = compose(name, overrides=overrides)
    except HydraException:
        return False
    print(Template(help_template(name)).safe_substitute(CONFIG=OmegaConf.to_yaml(cfg)))
    return True
