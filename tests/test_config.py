"""The config contract: one schema, the real configs compose onto it, and bad values fail early with one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from medseg.attention import available_blocks
from medseg.config import SCHEMAS, DataConfig, ModelConfig, TrainConfig, TrainerConfig, key_docs
from medseg.errors import ConfigError
from medseg.training.settings import check_config
from medseg.typed_config import check_override_keys, to_typed
from tests.helpers.configs import REPO, compose_config, run_script


def _validated(*overrides: str) -> TrainConfig:
    return check_config(compose_config(["output_dir=unused", *overrides]))


def test_defaults_compose_and_validate_to_the_typed_schema() -> None:
    cfg = _validated()
    assert isinstance(cfg, TrainConfig) and isinstance(cfg.trainer, TrainerConfig)
    assert cfg.model.bottleneck == "none" and cfg.model.spatial_dims == 3
    assert cfg.data.format == "demo" and cfg.model.strides == [2, 2, 2], "the demo preset's hand-set values"
    assert cfg.trainer == TrainerConfig(), "the trainer's defaults are the schema's"


def test_every_key_is_documented_once() -> None:
    for name, schema in SCHEMAS.items():
        docs = list(key_docs(schema))
        assert docs, name
        undocumented = [key for key, _, doc in docs if not doc and key.split(".")[-1] not in ("model", "data")]
        assert undocumented == [], f"{name}: keys without a docstring in medseg/config.py"


def test_data_presets_hold_no_schema_defaults() -> None:
    """A data preset that restated a schema default would be a second place for it. (Experiment presets pin
    their values on purpose: ``experiment=seed_masa`` means gamma 0.9 whatever the default becomes.)"""
    defaults = {"data": DataConfig(root="?"), "model": ModelConfig(), "trainer": TrainerConfig()}
    for path in sorted((REPO / "configs" / "data").glob("*.yaml")):
        node = OmegaConf.load(path) or OmegaConf.create()
        if "defaults" in node:  # built on another preset, whose values it may undo
            continue
        if "@package _global_" not in path.read_text():
            node = OmegaConf.create({"data": node})
        for section, schema in defaults.items():
            for key, value in (node.get(section) or {}).items():
                assert value != getattr(schema, key), f"{path.name}: {section}.{key} restates the default"


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


def test_unknown_key_names_the_nearest_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'model.attention.gama'; did you mean "
                                          r"model.attention.gamma\?.*Valid keys under 'model.attention': num_heads"):
        _validated("+model.attention.gama=0.8")
    with pytest.raises(ConfigError, match=r"'trainer.epochs'; did you mean trainer.max_epochs or"):
        check_config({"trainer": {"epochs": 3}, "data": {"root": "x"}})
    with pytest.raises(ConfigError, match=r"'model.bottlenck'; did you mean model.bottleneck or"):
        check_override_keys(["model.bottlenck=masa", "--cfg", "job"], TrainConfig)
    with pytest.raises(ConfigError, match=r"'modle'; did you mean model\?"):
        check_override_keys(["modle.bottleneck=masa"], TrainConfig)
    with pytest.raises(ConfigError, match=r"^unknown config key 'epochs'\. Valid keys: model, data, trainer"):
        check_override_keys(["epochs=3"], TrainConfig, groups=["data", "experiment"])
    groups = [path.name for path in (REPO / "configs").iterdir() if path.is_dir()]
    check_override_keys(["-m", "model.bottleneck=masa,mha", "data=msd", "hydra.run.dir=x", "+experiment=seed_masa",
                         "data.normalization.scheme=ct", "--config-name", "train"], TrainConfig, groups)


def test_bottleneck_given_as_a_mapping_is_caught() -> None:
    cfg = OmegaConf.to_container(compose_config(["output_dir=unused"]))
    cfg["model"]["bottleneck"] = {"name": "masa", "gamma": 0.9}
    with pytest.raises(ConfigError, match="must be a block name"):
        check_config(cfg)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.spatial_dims=4", "model.spatial_dims"),
        ("model.strides=[2,2]", "model.strides"),
        ("model.norm=layer", "model.norm"),
        ("trainer.optimizer=adam", "trainer.optimizer"),
        ("trainer.scheduler=step", "trainer.scheduler"),
        ("trainer.precision=fp8", "trainer.precision"),
        ("model.bottleneck=masa model.attention.gamma=1.5", "model.attention.gamma"),
        ("model.bottleneck=mha model.attention.pe=learned", "model.attention.pe"),
        ("data.normalization=minmax", "data.normalization"),
        ("data.cache=ssd", "data.cache"),
        ("data.fold=7", "data.fold"),
    ],
)
def test_bad_values_name_their_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _validated(*override.split())


def test_wrong_types_name_their_key() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.max_epochs: Value 'ten'"):
        to_typed(TrainConfig, {"trainer": {"max_epochs": "ten"}, "data": {"root": "x"}})


@pytest.mark.parametrize("group", ["msd", "nnunet"])
def test_a_required_value_is_required(group: str) -> None:
    with pytest.raises(ConfigError, match=rf"^data\.root is required for data={group} \(set data\.root=\.\.\.\)$"):
        _validated(f"data={group}")
    cfg = _validated(f"data={group}", "data.root=/somewhere")
    assert cfg.data.format == group and cfg.data.spacing is None and cfg.data.patch_size is None
    assert cfg.model.strides is None, "planned"


def test_help_lists_every_key_without_loading_torch(tmp_path) -> None:
    result = run_script("train.py", ["--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "data: demo3d, demo3d_planned, msd, nnunet" in result.stdout
    for key, kind, doc in key_docs(TrainConfig):
        assert f"{key} ({kind}): {doc}" in result.stdout
    imports = subprocess.run([sys.executable, "-X", "importtime", str(REPO / "scripts" / "train.py"), "--help"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120).stderr
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in imports.splitlines() if "|" in line}
    assert "hydra" in loaded and not loaded & {"torch", "monai", "numpy", "nibabel"}
