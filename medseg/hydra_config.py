"""medseg's configs in Hydra: the configs' folder, the schemas and ``--help`` texts registered in Hydra's ConfigStore,
and a config composed by Hydra's compose API.

The YAML files of :data:`CONFIG_DIR` (``train.yaml``, ``data/``, ``experiment/``, ...) hold only presets and Hydra
settings: their defaults lists name ``<command>_schema`` and ``hydra/help: medseg_<command>``, which
:func:`register` stores. Nothing is registered at import: every command registers before Hydra composes
(:func:`medseg.cli.run`), and so does :func:`compose_config`, for the code and tests that compose outside a command.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from medseg.config import BLOCK_ENTRY_POINTS, SCHEMAS
from medseg.config_docs import config_groups_text, extra_config_dirs, help_template
from medseg.typed_config import parsed_overrides


def find_config_dir(package: Path) -> Path:
    """The configs of the medseg ``package`` folder: the package ``medseg.configs`` beside its modules (its
    ``__init__.py``) when it is installed from a wheel, else the top-level ``configs/`` of the clone that holds it (an
    editable install, or the clone on ``PYTHONPATH``). Found beside the package, not by importing ``medseg.configs``:
    with a clone on ``PYTHONPATH``, the import system would find the configs of another checkout installed in the same
    environment."""
    installed = package / "configs"
    return installed if (installed / "__init__.py").is_file() else package.parent / "configs"


CONFIG_DIR = find_config_dir(Path(__file__).resolve().parent)
"""The YAML presets and Hydra settings (``train.yaml``, ``data/``, ``experiment/``, ...): the repository's top-level
``configs/``, installed as the package ``medseg.configs`` (:func:`find_config_dir`)."""


def block_names() -> str:
    """``${medseg_blocks:}`` in a sweep preset (``experiment=compare_blocks``): none and every registered block."""
    from medseg.attention.registry import block_choices  # the registry loads only when a preset asks

    return ",".join(block_choices())


@cache
def _config_groups(argv: tuple[str, ...]) -> str:
    """The config groups of :data:`CONFIG_DIR` and of the command line ``argv``'s ``--config-dir`` folders, listed
    once for every entry point's help."""
    return config_groups_text([CONFIG_DIR, *extra_config_dirs(argv)])


def help_text(name: str, argv: Sequence[str] = ()) -> str:
    """:func:`~medseg.config_docs.help_template` of entry point ``name``, its config groups those of
    :data:`CONFIG_DIR` and of the command line ``argv``'s ``--config-dir`` folders."""
    return help_template(name, _config_groups(tuple(argv)))


def block_modules(argv: Sequence[str]) -> list[str]:
    """The modules a command line's ``model.block_modules=[...]`` override names ([] without one)."""
    for override in parsed_overrides(argv):
        if override.key_or_group.lstrip("+") == "model.block_modules" and not override.is_sweep_override():
            value = override.value()
            return [str(module) for module in (value if isinstance(value, list) else [value])]
    return []


def register(argv: Sequence[str] = ()) -> None:
    """Store every schema of :data:`~medseg.config.SCHEMAS` as ``<name>_schema`` and its ``--help`` text
    (:func:`help_text` of ``argv``, the command line) as ``hydra/help/medseg_<name>`` in Hydra's ConfigStore, and
    the ``medseg_blocks`` resolver; again replaces them. The blocks of installed packages and of the command line's
    ``model.block_modules`` register first, so that their keys join ``model.attention`` (medseg's own blocks' keys
    are :mod:`medseg.config`'s: without other blocks, no torch loads).

    Raises:
        ConfigError: a block module that cannot be imported.
    """
    modules = block_modules(argv)
    if modules or entry_points(group=BLOCK_ENTRY_POINTS):
        from medseg.attention.registry import load_blocks  # other packages' blocks: their keys join the schema

        load_blocks(modules)
    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        store.store(name=f"{name}_schema", node=schema)
        store.store(group="hydra/help", name=f"medseg_{name}", node={"template": help_text(name, argv)})
    OmegaConf.register_new_resolver("medseg_blocks", block_names, replace=True)


def compose_config(name: str, overrides: Sequence[str] = (), return_hydra_config: bool = False) -> DictConfig:
    """``<name>.yaml`` of :data:`CONFIG_DIR` with ``overrides``, composed by Hydra's compose API after :func:`register`
    (of ``overrides``: their ``model.block_modules`` load first), as ``medseg <name>`` composes it (``hydra:``
    interpolations are available only with ``return_hydra_config``)."""
    from hydra import compose, initialize_config_dir

    register(overrides)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name=name):
        return compose(config_name=name, overrides=list(overrides), return_hydra_config=return_hydra_config)
