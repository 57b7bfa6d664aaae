"""What each key means, as ``--help`` prints it: the docstrings under the schema's fields, every key's type and range,
and each entry point's help text.

The schemas are :mod:`medseg.config`'s dataclasses; a field's meaning is the docstring under it in the source, found in
the class that declares it (a base of the schema for an inherited field). Like :mod:`medseg.config`, this module
imports no torch and does nothing at import.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Iterator, Sequence
from dataclasses import Field, is_dataclass
from functools import cache
from pathlib import Path

from medseg.config import SCHEMAS, key_range, leaves, type_text


def _docs_under_fields(body: list[ast.stmt]) -> dict[str, str]:
    """The docstring under each annotated field of a class body."""
    docs = {}
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


@cache
def _module_field_docs(module: str) -> dict[str, dict[str, str]]:
    """The field docstrings of every class of ``module``, by class name: its source parsed once (one
    ``inspect.getsource`` per class tokenises the whole file each time, most of a ``--help``'s time)."""
    tree = ast.parse(inspect.getsource(sys.modules[module]))
    return {node.name: _docs_under_fields(node.body) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def field_doc(cls: type, name: str) -> str:
    """The docstring under field ``name`` of dataclass ``cls``: in ``cls`` or, for an inherited field, in the nearest
    class of its method resolution order that documents it; "" when none does."""
    for owner in filter(is_dataclass, cls.__mro__):
        doc = _module_field_docs(owner.__module__).get(owner.__name__, {}).get(name)
        if doc is not None:
            return doc
    return ""


def leaf_fields(schema: type, prefix: str = "") -> Iterator[tuple[str, Field, str]]:
    """``(key, field, meaning)`` for every leaf key of ``schema``, in declaration order (nested nodes walked)."""
    for key, item, owner in leaves(schema, prefix):
        yield key, item, field_doc(owner, item.name)


def range_text(item: Field) -> str:
    """A field's range as ``--help`` shows it (``each >= 1`` for a list key); "" for a key without one."""
    valid = key_range(item)
    if valid is None:
        return ""
    return f"each {valid.text()}" if "list[" in type_text(item) and not valid.unconstrained else valid.text()


def key_docs(schema: type, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """``(key, type, range, meaning)`` for every leaf key of ``schema``, in declaration order; the range as
    :func:`range_text` writes it ("" for a key that is no number)."""
    for key, item, doc in leaf_fields(schema, prefix):
        yield key, type_text(item), range_text(item), doc


def help_line(key: str, kind: str, valid: str, doc: str) -> str:
    """One key of ``--help``: ``key (type, range): meaning``."""
    return f"  {key} ({kind}{f', {valid}' if valid else ''}): {doc}"


def extra_config_dirs(argv: Sequence[str]) -> list[Path]:
    """The folders a command line adds with ``--config-dir DIR`` (``-cd DIR``, ``--config-dir=DIR``)."""
    dirs = []
    for flag, following in zip(argv, [*argv[1:], ""]):
        if flag in ("--config-dir", "-cd") and following:
            dirs.append(Path(following))
        elif flag.startswith("--config-dir="):
            dirs.append(Path(flag.split("=", 1)[1]))
    return dirs


def config_groups_text(folders: Sequence[Path]) -> str:
    """``--help``'s config groups: ``data: demo3d, msd, ...``, one line per group folder of ``folders`` (Hydra's own
    ``hydra/`` groups left out). Listed from the folders, as Hydra's ``$APP_CONFIG_GROUPS`` would, without composing
    the schemas once per group (which takes seconds)."""
    options: dict[str, set[str]] = {}
    for folder in folders:
        for path in folder.rglob("*.yaml") if folder.is_dir() else []:
            group = path.parent.relative_to(folder).as_posix()
            if group != "." and group.split("/")[0] != "hydra":
                options.setdefault(group, set()).add(path.stem)
    return "\n".join(f"{group}: {', '.join(sorted(names))}" for group, names in sorted(options.items()))


def help_template(name: str, groups: str) -> str:
    """Hydra's ``--help`` text for entry point ``name`` of :data:`~medseg.config.SCHEMAS`: the config groups
    (``groups``, as :func:`config_groups_text` lists them), every key with its range and meaning, the config."""
    keys = "\n".join(help_line(*row) for row in key_docs(SCHEMAS[name]))
    return (f"medseg {name}: key=value overrides (Hydra); -m sweeps comma-separated values.\n\n"
            f"== Config groups ==\n{groups}\n\n"
            f"== Keys ==\n{keys}\n\n"
            "== Composed config (--cfg job prints it alone) ==\n$CONFIG\n\n"
            "Hydra's own options: --hydra-help")
