"""The config contract: one schema, the real configs compose onto it, and bad values fail early with one line."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import Field, fields, is_dataclass
from typing import Any

import pytest
from omegaconf import MISSING, OmegaConf

from medseg.attention import available_blocks
from medseg.config import (
    SCHEMAS,
    DataConfig,
    EvaluateConfig,
    InferenceConfig,
    ModelConfig,
    Range,
    TrainConfig,
    TrainerConfig,
    key_range,
)
from medseg.config_docs import config_groups_text, extra_config_dirs, help_line, key_docs
from medseg.errors import ConfigError
from medseg.hydra_config import CONFIG_DIR
from medseg.training.checks import check_config
from medseg.typed_config import check_override_keys, to_typed
from tests.helpers.configs import REPO, compose_config, run_script


def _validated(*overrides: str) -> TrainConfig:
    return check_config(compose_config(["output_dir=unused", *overrides]))


def test_defaults_compose_and_validate_to_the_typed_schema() -> None:
    cfg = _validated()
    assert isinstance(cfg, TrainConfig) and isinstance(cfg.trainer, TrainerConfig)
    assert cfg.model.bottleneck == "none" and cfg.model.spatial_dims == 3
    assert cfg.data.format == "demo" and cfg.model.strides == [2, 2, 2], "the demo preset's hand-set values"
    assert cfg.model.channels == [16, 32, 64, 128] and cfg.trainer.batch_size == 2, "the demo's small, fast network"
    assert cfg.trainer == TrainerConfig(batch_size=2), "the trainer's other defaults are the schema's"
    assert ModelConfig().channels is None and TrainerConfig().batch_size == 1, "real data plans nnU-Net's network"


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_entry_point_composes_with_its_default_data_preset(name: str) -> None:
    """The demo preset sets model and trainer keys too: every schema with a data node takes them."""
    cfg = compose_config([], config_name=name)
    assert "data" not in cfg or cfg.data.format == "demo"


def test_every_key_is_documented_once() -> None:
    for name, schema in SCHEMAS.items():
        docs = list(key_docs(schema))
        assert docs, name
        undocumented = [key for key, _, _, doc in docs if not doc and key.split(".")[-1] not in ("model", "data")]
        assert undocumented == [], f"{name}: keys without a docstring in medseg/config.py"


def test_data_presets_hold_no_schema_defaults() -> None:
    """A data preset that restated a schema default would be a second place for it. (Experiment presets pin
    their values on purpose: ``experiment=seed_masa`` means gamma 0.9 whatever the default becomes.)"""
    defaults = {"data": DataConfig(root="?"), "model": ModelConfig(), "trainer": TrainerConfig()}
    for path in sorted((CONFIG_DIR / "data").glob("*.yaml")):
        node = OmegaConf.load(path) or OmegaConf.create()
        if "defaults" in node:  # built on another preset, whose values it may undo
            continue
        if "@package _global_" not in path.read_text():
            node = OmegaConf.create({"data": node})
        for section, schema in defaults.items():
            for key, value in (node.get(section) or {}).items():
                assert value != getattr(schema, key), f"{path.name}: {section}.{key} restates the default"


COMMENTED_KEY = re.compile(r"^# ( *[a-z_]+:(?: .*)?)$")
"""A commented YAML line of a config's block of the keys users change most (``#   bottleneck: none  # ...``)."""


def _flat(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` for every leaf of the nested mapping ``node``."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return flat


@pytest.mark.parametrize("name", ["train", "predict", "evaluate"])
def test_the_configs_show_the_keys_users_change_most_with_the_schema_defaults(name: str) -> None:
    """The commented block of ``configs/<name>.yaml`` names keys of the schema with their defaults, so that it cannot
    go stale."""
    lines = [match.group(1) for line in (CONFIG_DIR / f"{name}.yaml").read_text().splitlines()
             if (match := COMMENTED_KEY.match(line))]
    shown = _flat(OmegaConf.to_container(OmegaConf.create("\n".join(lines))))
    defaults = _flat(OmegaConf.to_container(OmegaConf.structured(SCHEMAS[name])))
    assert len(shown) >= 5, f"{name}.yaml: the block of the keys users change most"
    assert {key: defaults.get(key, "not a key of the schema") for key in shown} == shown


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
    groups = [path.name for path in CONFIG_DIR.iterdir() if path.is_dir()]
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
    for row in key_docs(TrainConfig):
        assert help_line(*row) in result.stdout
    assert "  trainer.batch_size (int, >= 1): " in result.stdout
    imports = subprocess.run([sys.executable, "-X", "importtime", str(REPO / "scripts" / "train.py"), "--help"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120).stderr
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in imports.splitlines() if "|" in line}
    assert "hydra" in loaded and not loaded & {"torch", "monai", "numpy", "nibabel"}


def _leaves(schema: type, prefix: str = "") -> Iterator[tuple[str, Field]]:
    """``(dotted key, field)`` for every leaf of ``schema``, walked here independently of medseg.config's walk."""
    for item in fields(schema):
        if is_dataclass(item.default_factory):
            yield from _leaves(item.default_factory, f"{prefix}{item.name}.")  # type: ignore[arg-type]
        else:
            yield f"{prefix}{item.name}", item


def _outside(valid: Range) -> list[float]:
    """Numbers just outside ``valid``: at or below its low bound, at or above its high one, an even one inside."""
    values = []
    if valid.low is not None:
        values.append(valid.low if valid.low_open else valid.low - 1)
    if valid.high is not None:
        values.append(valid.high if valid.high_open else valid.high + 1)
    if valid.odd:
        values.append((valid.low or 0) + 1 if (valid.low or 0) % 2 else (valid.low or 0) + 2)
    return values


def _required(schema: type) -> dict[str, Any]:
    """Placeholder values for the keys ``schema`` requires (``???``), so that only the value under test is wrong."""
    return {key: "x" for key, item in _leaves(schema) if item.default is MISSING}


SCHEMA_RANGES = [(name, key, item) for name, schema in SCHEMAS.items() for key, item in _leaves(schema)
                 if key_range(item) is not None and not key_range(item).unconstrained]


@pytest.mark.parametrize(("name", "key", "item"), SCHEMA_RANGES, ids=[f"{n}:{k}" for n, k, _ in SCHEMA_RANGES])
def test_every_constrained_key_refuses_a_value_outside_its_range_in_one_line(name: str, key: str, item: Field) -> None:
    schema, valid = SCHEMAS[name], key_range(item)
    listed = "list[" in str(item.type)
    for number in _outside(valid):
        node = OmegaConf.create()
        for required, value in {**_required(schema), key: [number] if listed else number}.items():
            OmegaConf.update(node, required, value)
        with pytest.raises(ConfigError) as err:
            to_typed(schema, node)
        message = str(err.value)
        expected = rf"^{re.escape(key)}=\[?-?[0-9.e+]*\]?: expected (each entry )?{re.escape(valid.text())}$"
        assert re.match(expected, message) and str(abs(number)) in message.replace(".0", ""), message
    inside = to_typed(schema, OmegaConf.merge(OmegaConf.create(), *[
        OmegaConf.from_dotlist([f"{k}={v}"]) for k, v in _required(schema).items()]))
    assert isinstance(inside, schema), "the defaults lie inside every range"


def test_every_numeric_key_has_a_range_or_a_reason_for_none() -> None:
    numeric = [(f"{name}:{key}", item) for name, schema in SCHEMAS.items() for key, item in _leaves(schema)
               if re.search(r"\b(int|float)\b", str(item.type))]
    assert len(numeric) > 40
    missing = [key for key, item in numeric if key_range(item) is None]
    assert missing == [], "numeric keys without a range: give them ranged(...) or unconstrained(..., reason)"
    unexplained = [key for key, item in numeric if key_range(item).unconstrained and not key_range(item).reason]
    assert unexplained == []
    for key in ("model.strides", "data.fold", "trainer.class_weights"):  # numbers in lists or beside words
        assert key_range(dict(_leaves(TrainConfig))[key]) is not None, key


def test_ranges_are_checked_on_typed_objects_too() -> None:
    with pytest.raises(ConfigError, match=r"^inference\.overlap=1\.0: expected in \[0, 1\)$"):
        to_typed(EvaluateConfig, EvaluateConfig(ckpt="a.pt", input="b", inference=InferenceConfig(overlap=1.0)))
    with pytest.raises(ConfigError, match=r"^model\.strides=\[2, \[2, 0, 2\]\]: expected each entry >= 1$"):
        to_typed(TrainConfig, {"data": {"root": "x"}, "model": {"strides": [2, [2, 0, 2]]}})
    assert to_typed(TrainConfig, {"data": {"root": "x", "fold": "all"}}).data.fold == "all", "words pass"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.batch_size=0", r"trainer\.batch_size=0: expected >= 1"),
        ("trainer.lr=-1", r"trainer\.lr=-1\.0: expected >= 0"),
        ("data.num_folds=1", r"data\.num_folds=1: expected >= 2"),
        ("data.samples_per_volume=0", r"data\.samples_per_volume=0: expected >= 1"),
        ("model.kernel_size=4", r"model\.kernel_size=4: expected odd, >= 1"),
        ("data.num_workers=-1", r"data\.num_workers=-1: expected >= 0"),
        ("model.dropout=1.5", r"model\.dropout=1\.5: expected in \[0, 1\)"),
        ("model.channels=[16,-32,64,128]", r"model\.channels=\[16, -32, 64, 128\]: expected each entry >= 1"),
        ("trainer.val_every=0", r"trainer\.val_every=0: expected >= 1"),
        ("inference.overlap=1.0", r"inference\.overlap=1\.0: expected in \[0, 1\)"),
        ("inference.sw_batch_size=0", r"inference\.sw_batch_size=0: expected >= 1"),
        ("inference.device=cpu", r"inference\.device=cpu: training validates on trainer\.device in "
                                 r"trainer\.precision with torch; inference\.device is for predict and evaluate; set "
                                 r"trainer\.device"),
        ("trainer.max_epochs=0", r"trainer\.max_epochs=0: expected >= 1"),
        ("data.spacing=[0,1,1]", r"data\.spacing=\[0\.0, 1\.0, 1\.0\]: expected each entry > 0"),
        ("data.patch_size=[0,32,16]", r"data\.patch_size=\[0, 32, 16\]: expected each entry >= 1"),
        ("model.strides=[3,3,3]", r"model\.strides=\[3, 3, 3\]: medseg's U-Net pools by 1 or 2"),
        ("data.patch_size=[8,8,8]", r"data\.patch_size=\[8, 8, 8\] pooled by model\.strides=\[2, 2, 2\] \(total "
                                    r"\[8, 8, 8\]\) leaves a bottleneck of \[1, 1, 1\] voxels"),
        ("model.name=monai_unet data.patch_size=[48,48,36]",
         r"model\.name=monai_unet needs data\.patch_size divisible by the total stride \[8, 8, 8\]"),
        ("model.name=monai_unetr data.patch_size=[48,48,40]",
         r"model\.name=monai_unetr needs data\.patch_size divisible by 16"),
    ],
)
def test_the_issues_bad_values_fail_at_start_up_in_one_line(override: str, message: str) -> None:
    """:func:`check_config` is the first thing a training does: each of these used to fail with a traceback, some
    only after a whole epoch (the validation keys), or to train on a meaningless value (spacing 0, no epochs)."""
    with pytest.raises(ConfigError) as err:
        _validated(*override.split())
    assert re.match(f"^{message}", str(err.value)) and "\n" not in str(err.value), str(err.value)


def test_a_2d_patch_is_checked_against_the_strides_at_start_up_when_it_has_two_sizes() -> None:
    with pytest.raises(ConfigError, match=r"leaves a bottleneck of \[1, 1\] voxels"):
        _validated("model.spatial_dims=2", "data.patch_size=[4,4]", "model.strides=[2,2,2]")
    assert _validated("model.spatial_dims=2", "data.patch_size=[4,4,8]", "model.strides=[2,2,2]"), (
        "three sizes in 2D: the slice axis is known after planning, where build_model checks the patch")


@pytest.mark.parametrize("override", ["trainer.val_every=0", "inference.overlap=1.0", "inference.sw_batch_size=0"])
def test_the_validation_keys_fail_before_any_work(override: str, tmp_path) -> None:
    """These used to crash at the first validation, after a whole epoch of training with nothing saved."""
    from medseg.training.run import train

    cfg = compose_config([f"data.root={tmp_path / 'demo'}", f"output_dir={tmp_path / 'run'}", override])
    with pytest.raises(ConfigError, match=f"^{re.escape(override.split('=')[0])}="):
        train(cfg)
    assert not (tmp_path / "demo").exists() and not (tmp_path / "run").exists(), "no demo generated, no run folder"


def test_help_lists_the_config_groups_from_the_folders_and_those_added_on_the_command_line(tmp_path) -> None:
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\n")
    (tmp_path / "hydra" / "launcher").mkdir(parents=True)
    (tmp_path / "hydra" / "launcher" / "cluster.yaml").write_text("{}\n")
    for argv in (["train.py", "--config-dir", str(tmp_path)], ["train.py", f"--config-dir={tmp_path}"]):
        lines = config_groups_text([CONFIG_DIR, *extra_config_dirs(argv)]).splitlines()
        experiments = sorted(path.stem for path in (CONFIG_DIR / "experiment").glob("*.yaml"))
        assert f"experiment: {', '.join(sorted([*experiments, 'mine']))}" in lines
        assert "data: demo3d, demo3d_planned, msd, nnunet" in lines
        assert not any(line.startswith("hydra") for line in lines)
