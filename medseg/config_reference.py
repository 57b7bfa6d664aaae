"""``docs/configuration.md``, generated from the schema: every key of every entry point with its type, default, valid
range and meaning, the same as ``--help`` prints (:mod:`medseg.config_docs`). ``scripts/config_reference.py`` writes
it; the docs tests check that it is up to date."""

from __future__ import annotations

from dataclasses import MISSING as NO_DEFAULT
from dataclasses import Field

from omegaconf import MISSING

from medseg.config import SCHEMAS, value_text
from medseg.config_docs import leaf_fields, range_text

REFERENCE_PREAMBLE = """\
# Configuration reference

<!-- Generated from medseg/config.py by `python scripts/config_reference.py`; edit the schema, not this file. -->

Every key, with its type, default, valid range and meaning, is defined once: the dataclasses in
`medseg/config.py`, which Hydra composes the YAML presets onto (`medseg/configs/data/*.yaml`,
`medseg/configs/experiment/*.yaml` hold only what a preset changes). `python scripts/train.py --help` lists every key
of training with its type, range and meaning (each script's `--help` its own, and `medseg <command> --help` the same
as its script's: [the command line](cli.md)); `python scripts/train.py --cfg job` prints the whole composed config.
Every script checks each number it is given against its range before any work starts (a list key such as
`data.spacing`: each entry), and stops with one line that names the key, the value and the range; `any` marks a
number whose every value is valid.

The defaults below are the schema's. `python scripts/train.py` runs with the demo preset, `data=demo3d`
([medseg/configs/data/demo3d.yaml](../medseg/configs/data/demo3d.yaml)), which sets the demo's format and folder and
hand-set preprocessing and pooling on top of them (`data.spacing`, `data.patch_size`, `data.normalization`,
`data.pos_fraction`, `model.strides`; and `data.num_workers=0`) and trains with the schema's recipe (`recipe=light`);
`data=msd` and `data=nnunet` keep the schema's preprocessing, so the keys left `null` are planned from the data
([data and planning](data.md#what-is-planned-and-how-to-override-it)), and train with nnU-Net's recipe
(`recipe=nnunet`, [medseg/configs/recipe/nnunet.yaml](../medseg/configs/recipe/nnunet.yaml): its network,
resampling, augmentation, optimiser, epochs and validation; [recipes](recipe.md)). The config groups are `data`
(`demo3d`, `demo3d_planned`, `msd`, `nnunet`), `recipe` (`light`, `nnunet`), `experiment` (the presets of
[sweeps](sweeps.md), and `nnunet`: nnU-Net's recipe on any data), `hparams_search` and `hydra/launcher` (`slurm`, see
[performance](performance.md#slurm)).

`model.bottleneck` and `model.decoder` are plain strings (a block name, or `none`) checked against the
registry of attention blocks, and every block's hyperparameters live in the one shared node
`model.attention.*`: each block reads the keys it uses and ignores the rest
([attention blocks](attention.md)). nnU-Net's recipe trains 1000 epochs of 250 steps; `trainer.max_epochs` or a
wall-clock budget (`trainer.max_minutes`) shortens it, the poly schedule spanning what is left.
"""
"""The hand-written head of ``docs/configuration.md``; the tables of :func:`reference_markdown` follow it."""

ENTRY_POINTS: dict[str, str] = {"train": "scripts/train.py", "predict": "scripts/predict.py",
                                "evaluate": "scripts/evaluate.py",
                                "crossval": "scripts/crossval.py DIR", "export": "scripts/export.py",
                                "visualize": "scripts/visualize.py", "plan": "scripts/plan.py",
                                "check_data": "scripts/check_data.py"}
"""The command behind each schema of :data:`SCHEMAS`."""


def default_text(item: Field) -> str:
    """A schema field's default as :func:`value_text` writes it; ``required`` for a key without one (``MISSING``)."""
    value = item.default_factory() if item.default_factory is not NO_DEFAULT else item.default
    return "required" if value is NO_DEFAULT or value == MISSING else value_text(value)


def _cell(text: str, code: bool = False) -> str:
    """``text`` safe inside a markdown table cell: pipes escaped; outside a code span (``code``) also ``<``, which
    markdown would read as the start of an HTML tag."""
    text = text.replace("|", "\\|")
    return f"`{text}`" if code else text.replace("<", "&lt;")


def reference_markdown() -> str:
    """``docs/configuration.md``: :data:`REFERENCE_PREAMBLE`, then one table per entry point of :data:`SCHEMAS`
    (key, type, default, valid range, meaning), the same keys, ranges and meanings ``--help`` prints."""
    parts = [REFERENCE_PREAMBLE]
    for name, schema in SCHEMAS.items():
        summary = " ".join((schema.__doc__ or "").split("\n\n")[0].split())
        rows = [f"| `{key}` | {_cell(str(item.type), code=True)} | {_cell(default_text(item), code=True)} | "
                f"{_cell(range_text(item), code=bool(range_text(item)))} | {_cell(doc)} |"
                for key, item, doc in leaf_fields(schema)]
        parts.append(f"## {name}: `python {ENTRY_POINTS[name]}`\n\n{summary}\n\n"
                     "| key | type | default | valid | meaning |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)
