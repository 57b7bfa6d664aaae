"""``docs/configuration.md``, generated from the schema: every key of every entry point with its type, default, valid
range and meaning, the same as ``--help`` prints (:mod:`medseg.config_docs`). A node that several commands take
(``model``, ``data``, ``trainer``, ``plan``, ``inference``) is one section, listed with the commands that take it; each
command's section holds its own keys and links the nodes it takes. ``scripts/config_reference.py`` writes the page;
the docs tests check that it is up to date."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import Field, fields, is_dataclass

from omegaconf import MISSING

from medseg.config import SCHEMAS, type_text, value_text
from medseg.config_docs import field_doc, leaf_fields, range_text

REFERENCE_PREAMBLE = """\
# Configuration reference

<!-- Generated from medseg/config.py by `python scripts/config_reference.py`; edit the schema, not this file. -->

Every key, with its type, default, valid range and meaning, is defined once: the dataclasses in
`medseg/config.py`, which Hydra composes the YAML presets onto (`configs/data/*.yaml`,
`configs/experiment/*.yaml` hold only what a preset changes). `python scripts/train.py --help` lists every key
of training with its type, range and meaning (each script's `--help` its own, and `medseg <command> --help` the same
as its script's: [the command line](cli.md)); `python scripts/train.py --cfg job` prints the whole composed config.
Every script checks each number it is given against its range before any work starts (a list key such as
`data.spacing`: each entry), and stops with one line that names the key, the value and the range; `any` marks a
number whose every value is valid.

Each command's section below lists its own keys and the nodes it takes; a node that several commands take (`model`,
`data`, `trainer`, `plan`, `inference`) is described once, in its own section, with the commands that take it.

The defaults below are the schema's. `python scripts/train.py` runs with the demo preset, `data=demo3d`
([configs/data/demo3d.yaml](../configs/data/demo3d.yaml)), which sets the demo's format and folder and
hand-set preprocessing and pooling on top of them (`data.spacing`, `data.patch_size`, `data.normalization`,
`data.pos_fraction`, `model.strides`; and `data.num_workers=0`) and trains with the schema's recipe (`recipe=light`);
`data=msd` and `data=nnunet` keep the schema's preprocessing, so the keys left `null` are planned from the data
([data and planning](data.md#what-is-planned-and-how-to-override-it)), and train with nnU-Net's recipe
(`recipe=nnunet`, [configs/recipe/nnunet.yaml](../configs/recipe/nnunet.yaml): its network,
resampling, augmentation, optimiser, epochs and validation; [recipes](recipe.md)). The config groups are `data`
(`demo3d`, `demo3d_planned`, `msd`, `nnunet`), `recipe` (`light`, `nnunet`), `experiment` (the presets of
[sweeps](sweeps.md), and `nnunet`: nnU-Net's recipe on any data), `hparams_search` and `hydra/launcher` (`slurm`, see
[several GPUs and SLURM](gpus.md#slurm)).

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

TABLE_HEAD = "| key | type | default | valid | meaning |\n|---|---|---|---|---|\n"

Node = tuple[str, type]
"""A node of the schemas: its key (``inference``) and its dataclass (``InferenceConfig``)."""


def default_text(item: Field) -> str:
    """A schema field's default as :func:`value_text` writes it; ``required`` for a key without one (``MISSING``)."""
    value = item.default_factory() if item.default_factory is not NO_DEFAULT else item.default
    return "required" if value is NO_DEFAULT or value == MISSING else value_text(value)


def _cell(text: str, code: bool = False) -> str:
    """``text`` safe inside a markdown table cell: pipes escaped; outside a code span (``code``) also ``<``, which
    markdown would read as the start of an HTML tag."""
    text = text.replace("|", "\\|")
    return f"`{text}`" if code else text.replace("<", "&lt;")


def _summary(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring, on one line, its literals as markdown code."""
    return " ".join((cls.__doc__ or "").split("\n\n")[0].split()).replace("``", "`")


def _table(rows: Iterable[tuple[str, Field, str]]) -> str:
    """The markdown table of ``(key, field, meaning)`` rows: key, type, default, valid range, meaning."""
    return TABLE_HEAD + "\n".join(
        f"| `{key}` | {_cell(type_text(item), code=True)} | {_cell(default_text(item), code=True)} | "
        f"{_cell(range_text(item), code=bool(range_text(item)))} | {_cell(doc)} |" for key, item, doc in rows)


def nodes(schema: type) -> list[Node]:
    """The nodes of ``schema``: its fields that hold a dataclass (``model``, ``inference``, ...), in order."""
    return [(item.name, item.default_factory) for item in fields(schema)  # type: ignore[misc]
            if is_dataclass(item.default_factory)]


def node_users() -> dict[Node, list[str]]:
    """Every node of :data:`SCHEMAS` with the entry points that take it, in first appearance, a node that derives
    from another of the same key after the others."""
    users: dict[Node, list[str]] = {}
    for name, schema in SCHEMAS.items():
        for node in nodes(schema):
            users.setdefault(node, []).append(name)
    return dict(sorted(users.items(), key=lambda entry: _base_node(entry[0], users) is not None))


def _base_node(node: Node, known: Iterable[Node]) -> Node | None:
    """The node of the same key whose dataclass ``node``'s derives from (training's ``inference``, a
    ``ValidationConfig``, from prediction's ``InferenceConfig``); None for a node of its own."""
    key, cls = node
    return next(((k, c) for k, c in known if k == key and c is not cls and issubclass(cls, c)), None)


def node_heading(node: Node, users: dict[Node, list[str]]) -> str:
    """``The `inference` node``, or for a node that derives from another of the same key ``The `inference` node of
    train``."""
    key, _ = node
    heading = f"The `{key}` node"
    return f"{heading} of {', '.join(users[node])}" if _base_node(node, users) else heading


def anchor(heading: str) -> str:
    """GitHub's anchor of ``heading``: lower case, punctuation but ``-`` and ``_`` dropped, spaces to hyphens."""
    return "".join(ch for ch in heading.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def _node_link(node: Node, users: dict[Node, list[str]]) -> str:
    heading = node_heading(node, users)
    return f"[{heading.replace('The ', 'the ', 1)}](#{anchor(heading)})"


def command_section(name: str, users: dict[Node, list[str]]) -> str:
    """Entry point ``name``'s section: its summary, the nodes it takes (linked, with what each is for here), and the
    table of its own keys."""
    schema = SCHEMAS[name]
    taken = nodes(schema)
    lines = [f"## {name}: `python {ENTRY_POINTS[name]}`", "", _summary(schema), ""]
    if taken:
        lines += ["It takes these nodes, each described once below:", ""]
        for node in taken:
            doc = field_doc(schema, node[0]) or _summary(node[1])
            lines.append(f"- {_node_link(node, users)}: {doc}")
        lines.append("")
    own = [row for row in leaf_fields(schema) if row[0].split(".")[0] not in {key for key, _ in taken}]
    lines.append(f"Its own keys:\n\n{_table(own)}" if own else "It has no keys of its own.")
    return "\n".join(lines) + "\n"


def node_section(node: Node, users: dict[Node, list[str]]) -> str:
    """A node's section: its summary, the commands that take it, and its keys; for a node that derives from another
    of the same key, only the keys it changes, and a link to the other."""
    key, cls = node
    commands = ", ".join(f"`{name}`" for name in users[node])
    lines = [f"## {node_heading(node, users)}", "", _summary(cls), "", f"Taken by {commands}.", ""]
    rows = list(leaf_fields(cls, f"{key}."))
    base = _base_node(node, users)
    if base is not None:
        changed = set(cls.__dict__.get("__annotations__", {}))
        rows = [row for row in rows if row[0].split(".")[1] in changed]
        lines += [f"The keys not listed here are {_node_link(base, users)}'s, with the same defaults.", ""]
    lines.append(_table(rows))
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """``docs/configuration.md``: :data:`REFERENCE_PREAMBLE`, a section per entry point of :data:`SCHEMAS` (its
    own keys, links to the nodes it takes), then a section per node (key, type, default, valid range, meaning): the
    same keys, ranges and meanings ``--help`` prints."""
    users = node_users()
    parts = [REFERENCE_PREAMBLE]
    parts += [command_section(name, users) for name in SCHEMAS]
    parts += [node_section(node, users) for node in users]
    return "\n".join(parts)
