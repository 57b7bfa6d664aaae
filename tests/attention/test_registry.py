"""Names and keys: the registry's contract with the config."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from benchmarks.cli import command_parser, main
from benchmarks.models import Sizes, prepare, train_config
from medseg.attention import (
    ATTENTION_BLOCKS,
    SpatialAttention,
    available_blocks,
    build_attention,
    build_transformer_block,
    register_attention,
)
from medseg.config import attention_schema
from medseg.training.checks import check_config
from tests.helpers.configs import REPO, compose_config

from . import throwaway_block as throwaway


def test_available_blocks_are_what_build_attention_takes() -> None:
    names = available_blocks()
    assert names and len(set(names)) == len(names)
    for name in names:
        block = build_attention(name, 24, 3)
        assert isinstance(block, ATTENTION_BLOCKS[name]) and isinstance(block, SpatialAttention)
    names.append("not_a_block")  # a copy: the registry is unchanged
    assert "not_a_block" not in available_blocks()
    assert "none" not in available_blocks()  # "none" leaves a U-Net slot empty; it is no block
    with pytest.raises(ValueError, match="unknown attention block 'none'"):
        build_attention("none", 24, 3)


def test_unknown_name_lists_valid_blocks() -> None:
    with pytest.raises(ValueError, match="unknown attention block 'swin'") as error:
        build_attention("swin", 32, 3)
    assert all(name in str(error.value) for name in available_blocks())
    with pytest.raises(ValueError, match="masa_decomposed"):
        build_transformer_block("none", 32, 3)


def test_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown model.attention key\(s\) \['gama'\]") as error:
        build_attention("masa", 32, 3, gama=0.8)
    assert all(key.name in str(error.value) for key in fields(attention_schema()))
    with pytest.raises(ValueError, match="gama"):
        build_transformer_block("masa", 32, 3, gama=0.8)


@pytest.mark.parametrize("name", available_blocks())
def test_every_config_key_is_accepted_and_unused_ones_ignored(name: str) -> None:
    cfg = asdict(attention_schema()())
    cfg.update(spacing=[1.5, 1.0, 1.0], layer_scale=1e-5, drop_path=0.1)
    block = build_transformer_block(name, 32, 3, **cfg)
    x = torch.randn(1, 32, 3, 4, 5)
    assert block(x).shape == x.shape


def test_omegaconf_values() -> None:
    cfg = OmegaConf.create({"num_heads": 4, "gamma": 0.8, "heads_range": 2, "spacing": [2, 1, 1], "kernel_size": 3})
    block = build_transformer_block("masa_decomposed", 32, 3, **cfg)
    assert block.attention.spacing == (2.0, 1.0, 1.0)
    assert len(block.attention.gamma) == 4
    x = torch.randn(1, 32, 3, 4, 5)
    assert block(x).shape == x.shape


@pytest.fixture
def throwaway_block() -> Iterator[str]:
    """The throwaway block (:mod:`tests.attention.throwaway_block`), registered for one test."""
    throwaway.register()
    yield throwaway.NAME
    throwaway.unregister()


def test_register_a_new_block(throwaway_block: str) -> None:
    assert available_blocks()[-1] == throwaway_block  # in registration order
    block = build_transformer_block(throwaway_block, 32, 2, num_heads=2, gamma=0.5)
    assert block(torch.randn(1, 32, 5, 7)).shape == (1, 32, 5, 7)
    for taken in (throwaway_block, "none"):
        with pytest.raises(ValueError, match="already taken"):
            register_attention(taken)(throwaway.ThrowawayAttention)
    with pytest.raises(TypeError, match="SpatialAttention"):
        register_attention("plain_identity")(torch.nn.Identity)
    assert "plain_identity" not in available_blocks()


GENERIC_TEST_FILES = ("tests/attention/test_blocks.py", "tests/attention/test_registry.py", "tests/test_compile.py")
"""The test files with tests that run every registered block."""


def pytest_with_throwaway_block(*args: str) -> subprocess.CompletedProcess:
    """pytest in a fresh process that registers the throwaway block before collecting (-p plugin), as a block
    registered in its own module is registered by the time a test module imports the registry."""
    command = [sys.executable, "-m", "pytest", "-p", throwaway.__name__, "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def parameters(node_id: str) -> set[str]:
    """The parameter ids of a test's node id: ``test_x[2d-mha-none]`` -> ``{"2d", "mha", "none"}``."""
    return set(re.split(r"[-\]]", node_id.partition("[")[2])) - {""}


@pytest.mark.full
def test_a_new_block_needs_no_other_edit(throwaway_block: str, tmp_path: Path) -> None:
    """docs/attention.md, "Your own block": registered in its own file, a block is a valid value of both U-Net slots, a
    row of both benchmarks, trains in a U-Net, and every generic test runs it."""
    name, row = throwaway_block, f"unet+{throwaway_block}"
    cfg = check_config(compose_config([f"model.bottleneck={name}", f"model.decoder={name}", "output_dir=x"]))
    assert (cfg.model.bottleneck, cfg.model.decoder) == (name, name)

    assert name in command_parser("benchmarks.attention", "attention").parse_args([]).blocks
    assert row in command_parser("benchmarks.models", "models").parse_args([]).models
    assert main(["attention", "--quick", "--blocks", name, "--out", str(tmp_path)]) == 0
    assert all(cell["status"] == "ok" for cell in json.loads((tmp_path / "attention.json").read_text())["results"])

    # the models benchmark's row, in both slots of a small U-Net, takes steps of the trainer's TrainStep
    small = [f"model.decoder={name}", "model.channels=[8,16]", "model.strides=[2]", "model.attention.num_heads=2"]
    sizes = Sizes((8, 8, 8), batch=1, precision="fp32", reps=1, warmup=0)
    runnable = prepare(row, train_config(row, small, sizes.patch), sizes, torch.device("cpu"))
    assert runnable.row.status == "ok", runnable.row.detail
    assert runnable.trainer_step is not None and runnable.step is not None
    slots = {path: module for path, module in runnable.trainer_step.model.named_modules()
             if isinstance(module, throwaway.ThrowawayAttention)}
    assert any("bottleneck" in path for path in slots) and any("decoder" in path for path in slots), list(slots)
    before = [p.detach().clone() for module in slots.values() for p in module.parameters()]
    assert math.isfinite(runnable.step())
    after = [p for module in slots.values() for p in module.parameters()]
    assert all(not torch.equal(old, new) for old, new in zip(before, after))

    # every test that runs each built-in block runs the new one too, and passes
    listed = pytest_with_throwaway_block("--collect-only", "-q", "-m", "slow or not slow", *GENERIC_TEST_FILES)
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
    nodes = [line for line in listed.stdout.splitlines() if "::" in line]
    by_test: dict[str, set[str]] = {}
    for node in nodes:
        by_test.setdefault(node.partition("[")[0], set()).update(parameters(node))
    built_in = set(available_blocks()) - {name}
    generic = [test for test, ids in by_test.items() if built_in <= ids]
    assert {test.partition("::")[0] for test in generic} == set(GENERIC_TEST_FILES)
    assert [test for test in generic if name not in by_test[test]] == []
    ran = pytest_with_throwaway_block("-q", *(node for node in nodes if name in parameters(node)))
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
