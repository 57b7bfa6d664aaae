"""The schemas reach Hydra only when registered: importing the schema module registers nothing and reads no command
line; :func:`medseg.hydra_config.register` stores every schema and its ``--help``, with the command line's config
folders; the configs are the clone's top-level ``configs/``, or the installed package ``medseg.configs``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hydra.core.config_store import ConfigStore

from medseg.config import SCHEMAS
from medseg.hydra_config import CONFIG_DIR, find_config_dir, register
from tests.helpers.configs import REPO

IMPORT_THEN_REGISTER = """
import json
import sys


class Unread:
    '''A sys.argv that fails on any use: iterating, indexing, measuring or calling a method of it.'''

    def refuse(self, *args):
        raise AssertionError("sys.argv was read")

    __iter__ = __len__ = __getitem__ = __contains__ = __bool__ = refuse

    def __getattr__(self, name):
        self.refuse()


def medseg_entries():
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    return sorted([*repo, *(f"hydra/help/{name}" for name in repo.get("hydra", {}).get("help", {}))])


argv, sys.argv = sys.argv, Unread()
import medseg.config

sys.argv = argv
loaded = sorted(name for name in sys.modules if name == "torch" or name.split(".")[0] == "medseg")
before = medseg_entries()
from medseg.hydra_config import register

register()
print(json.dumps({"loaded": loaded, "before": before, "after": medseg_entries()}))
"""


def medseg_entries() -> set[str]:
    """What registering medseg's schemas stores: ``<name>_schema.yaml`` and ``hydra/help/medseg_<name>.yaml``."""
    return {entry for name in SCHEMAS for entry in (f"{name}_schema.yaml", f"hydra/help/medseg_{name}.yaml")}


def test_importing_the_schema_registers_nothing_and_reads_no_command_line() -> None:
    result = subprocess.run([sys.executable, "-c", IMPORT_THEN_REGISTER], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["loaded"] == ["medseg", "medseg.config", "medseg.version"], "no other medseg module, no torch"
    assert not medseg_entries() & set(found["before"]), "nothing registered by the import"
    assert medseg_entries() <= set(found["after"]), "register() stores every schema and its help"


def test_registered_help_lists_the_config_groups_of_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\n")
    store = ConfigStore.instance()
    try:
        register(["train.py", "--config-dir", str(tmp_path)])
        template = store.load("hydra/help/medseg_train.yaml").node.template
        assert "\nexperiment: " in template and ", mine" in template
        assert store.load("train_schema.yaml").node.trainer.max_epochs == SCHEMAS["train"]().trainer.max_epochs
    finally:
        register()
    assert ", mine" not in store.load("hydra/help/medseg_train.yaml").node.template


def test_the_configs_are_the_clones_top_level_folder_or_the_installed_package(tmp_path: Path) -> None:
    assert CONFIG_DIR == REPO / "configs" and (CONFIG_DIR / "train.yaml").is_file(), "a clone reads its own configs/"
    package = tmp_path / "medseg"
    (package / "configs").mkdir(parents=True)  # no package: a folder left in a clone from before the move
    assert find_config_dir(package) == tmp_path / "configs"
    (package / "configs" / "__init__.py").touch()  # the package medseg.configs, as the wheel installs it
    assert find_config_dir(package) == package / "configs"
