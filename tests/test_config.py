"""The config contract: the real configs compose, and bad values fail early with one clear line."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from medseg.attention import available_blocks
from medseg.config import ConfigError, validate_config

from .conftest import compose_config


def _validated(*overrides: str):
    cfg = compose_config(["output_dir=unused", *overrides])
    return validate_config(cfg)


def test_defaults_compose_and_validate() -> None:
    cfg = _validated()
    assert cfg.model.bottleneck == "none" and cfg.model.spatial_dims == 3
    assert cfg.data.format == "demo" and cfg.trainer.max_epochs > 0
    assert OmegaConf.is_readonly(cfg)


@pytest.mark.parametrize("block", available_blocks())
def test_every_block_name_is_accepted_in_both_slots(block: str) -> None:
    cfg = _validated(f"model.bottleneck={block}", f"model.decoder={block}", "model.attention.gamma=0.85")
    assert cfg.model.bottleneck == block and cfg.model.decoder == block
    assert cfg.model.attention.gamma == 0.85


def test_unknown_block_lists_valid_names() -> None:
    with pytest.raises(ConfigError) as err:
        _validated("model.bottleneck=masaa")
    message = str(err.value)
    assert "model.bottleneck='masaa'" in message and "\n" not in message
    for name in ("none", *available_blocks()):
        assert name in message


def test_unknown_key_is_an_error_naming_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'model.attention.gama'.*gamma"):
        _validated("+model.attention.gama=0.8")
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.epochs'.*max_epochs"):
        _validated("+trainer.epochs=3")


def test_bottleneck_given_as_a_mapping_is_caught() -> None:
    cfg = OmegaConf.to_container(compose_config(["output_dir=unused"]))
    cfg["model"]["bottleneck"] = {"name": "masa", "gamma": 0.9}
    with pytest.raises(ConfigError, match="must be a block name"):
        validate_config(cfg)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.spatial_dims=4", "model.spatial_dims"),
        ("model.strides=[2,2]", "model.strides"),
        ("trainer.optimizer=adam", "trainer.optimizer"),
        ("model.attention.gamma=1.5", "model.attention.gamma"),
        ("model.attention.pe=learned", "model.attention.pe"),
        ("data.normalization=minmax", "data.normalization"),
        ("trainer.max_epochs=ten", "trainer.max_epochs"),
    ],
)
def test_bad_values_name_their_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _validated(override)


def test_data_groups_compose() -> None:
    for group in ("msd", "nnunet"):
        cfg = _validated(f"data={group}", "data.root=/somewhere")
        assert cfg.data.format == group and cfg.data.spacing is None and cfg.data.patch_size is None
