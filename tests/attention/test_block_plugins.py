"""Blocks from outside medseg: their own keys in ``model.attention``, a module ``model.block_modules`` names, an
installed package's entry point (docs/attention.md, "Your own block")."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from medseg.attention import ATTENTION_BLOCKS, SpatialAttention, register_attention
from medseg.config import BLOCK_KEYS, KernelKey
from medseg.errors import ConfigError
from medseg.hydra_config import help_text
from medseg.inference.model import load_model
from medseg.models import build_model
from medseg.runs.checkpoint import load_checkpoint, save_checkpoint
from medseg.training.checks import check_config
from tests.helpers.checkpoints import save_test_checkpoint
from tests.helpers.configs import REPO, TINY_OVERRIDES, compose_config, run_script

from . import throwaway_block as throwaway


def documented_block() -> str:
    """The complete user block of docs/attention.md, "Your own block" (the ``gated`` block): its first Python code
    block, run here as the user would run it, so the page cannot go stale."""
    section = (REPO / "docs" / "attention.md").read_text().split("## Your own block", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


GATED = documented_block()


def forget(name: str) -> None:
    """Take block ``name`` and its keys out of the registry."""
    ATTENTION_BLOCKS.pop(name, None)
    BLOCK_KEYS.pop(name, None)


@pytest.fixture
def throwaway_block() -> Iterator[str]:
    throwaway.register()
    yield throwaway.NAME
    throwaway.unregister()


@pytest.fixture
def gated_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The module of the ``gated`` block, importable (not yet imported) under a name of this test's own."""
    name = f"gated_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(GATED)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    forget("gated")
    sys.modules.pop(name, None)


def test_a_blocks_own_keys_join_model_attention(throwaway_block: str) -> None:
    cfg = check_config(compose_config([f"model.bottleneck={throwaway_block}", "model.attention.temperature=0.5",
                                       "model.channels=[8,16]", "model.strides=[2]", "output_dir=x"]))
    assert cfg.model.attention.temperature == 0.5
    net = build_model(cfg.model, 1, 2, (16, 16, 16))
    assert {m.temperature for m in net.modules() if isinstance(m, throwaway.ThrowawayAttention)} == {0.5}
    with pytest.raises(ConfigError, match=r"model.attention.temperature=0(\.0)?: expected > 0"):
        check_config(compose_config([f"model.bottleneck={throwaway_block}", "model.attention.temperature=0",
                                         "output_dir=x"]))
    assert "model.attention.temperature (float, > 0): throwaway: the softmax temperature" in help_text("train")
    throwaway.unregister()
    try:
        with pytest.raises(ConfigError, match="unknown config key 'model.attention.temperature'"):
            check_config({"model": {"attention": {"temperature": 0.5}}})
    finally:
        throwaway.register()


def test_a_node_with_a_blocks_keys_pickles(throwaway_block: str) -> None:
    """The node's class is made at run time; a config holding it crosses process boundaries (DataLoader workers,
    spawned ranks) by its values."""
    cfg = check_config(compose_config([f"model.bottleneck={throwaway_block}", "model.attention.temperature=0.5",
                                       "model.attention.gamma=0.8", "output_dir=x"]))
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg and again.model.attention.temperature == 0.5 and again.model.attention.gamma == 0.8


@dataclass
class Clashing:
    gamma: float = 0.5


@dataclass
class Untaken:
    width: int = 3


@dataclass
class Shared(KernelKey):
    depth: int = 1


class Mixer(SpatialAttention):
    def __init__(self, dim: int, spatial_dims: int, num_heads: int = 4, gamma: float = 0.5, kernel_size: int = 5,
                 depth: int = 1) -> None:
        super().__init__(dim, spatial_dims, num_heads)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spatial_shape: tuple[int, ...]) -> torch.Tensor:
        return v


def test_a_key_is_declared_once_or_alike() -> None:
    with pytest.raises(ValueError, match=r"model.attention.gamma is already declared by masa"):
        register_attention("clashing", Clashing)(Mixer)
    with pytest.raises(ValueError, match=r"Mixer takes no parameter \['width'\]"):
        register_attention("untaken", Untaken)(Mixer)
    assert "clashing" not in ATTENTION_BLOCKS and "untaken" not in ATTENTION_BLOCKS
    register_attention("shared", Shared)(Mixer)  # kernel_size as masa and focused_linear declare it
    try:
        assert compose_config(["model.attention.depth=2"]).model.attention.depth == 2
    finally:
        forget("shared")


def test_a_module_named_in_the_config_registers_its_blocks(gated_module: str) -> None:
    overrides = [f"model.block_modules=[{gated_module}]", "model.bottleneck=gated", "model.attention.gate=0.25",
                 "model.channels=[8,16]", "model.strides=[2]", "output_dir=x"]
    cfg = check_config(compose_config(overrides))
    assert (cfg.model.bottleneck, cfg.model.attention.gate) == ("gated", 0.25)
    net = build_model(cfg.model, 1, 2, (16, 16, 16))
    assert {m.gate for m in net.modules() if type(m).__name__ == "GatedAttention"} == {0.25}


def test_a_module_that_cannot_be_imported_is_named() -> None:
    with pytest.raises(ConfigError, match=r"model.block_modules: cannot import 'no_such_blocks' \(ModuleNotFound"):
        check_config(compose_config(["model.block_modules=[no_such_blocks]"]))


def test_a_checkpoint_names_the_block_module_it_cannot_import(tmp_path: Path) -> None:
    path = save_test_checkpoint(tmp_path / "gated.pt")
    state = load_checkpoint(path)
    state["config"]["model"]["block_modules"] = ["no_such_blocks"]
    save_checkpoint(path, state)
    with pytest.raises(ConfigError, match=r"^model.block_modules: cannot import 'no_such_blocks'"):
        load_model(path)


def install_gated_package(folder: Path) -> Path:
    """A package holding the ``gated`` block with an entry point of group ``medseg.attention_blocks``, installed
    offline (pip, no dependencies, this venv's setuptools) into ``folder / "site"``; returns that folder."""
    source = folder / "source"
    (source / "gated_blocks").mkdir(parents=True)
    (source / "gated_blocks" / "__init__.py").write_text(GATED)
    (source / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "gated-blocks"
        version = "1.0"

        [project.entry-points."medseg.attention_blocks"]
        gated = "gated_blocks"
        """))
    site = folder / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    return site


@pytest.mark.full
def test_an_installed_packages_block_is_chosen_by_name(tmp_path: Path) -> None:
    site = install_gated_package(tmp_path)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    shown = run_script("train.py", ["--help"], cwd=tmp_path, env=env)
    assert "model.attention.gate (float, in [0, 1]): gated:" in shown.stdout, shown.stdout + shown.stderr
    trained = run_script("train.py", [*TINY_OVERRIDES, "trainer.max_epochs=1", "model.bottleneck=gated",
                                       "model.attention.gate=0.25", "trainer.log_images=false",
                                       f"output_dir={tmp_path / 'run'}"], cwd=tmp_path, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True, map_location="cpu")
    assert state["config"]["model"]["bottleneck"] == "gated" and state["config"]["model"]["attention"]["gate"] == 0.25
    refused = run_script("train.py", ["model.bottleneck=gated", "model.attention.gate=2"], cwd=tmp_path, env=env)
    assert refused.returncode == 1 and "model.attention.gate=2.0: expected in [0, 1]" in refused.stderr
