"""From a composed config to a typed schema object: unknown keys named with their nearest valid keys, wrong types and
required values in one line each (:class:`~medseg.errors.ConfigError`), and the choice check every stage's settings
use.

The schemas themselves are :mod:`medseg.config`'s dataclasses. Like that module, this one imports no torch, so the
scripts check their command line before anything heavy loads.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, ValidationError

from medseg.config import node_schema, value_ranges, value_text
from medseg.errors import ConfigError, check_choice

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

Schema = TypeVar("Schema")


def _valid_keys(schema: type, path: str) -> list[str]:
    """The keys of the schema node at ``path`` ("" for the root); [] where the path leaves the schema."""
    node: Any = schema
    for part in [p for p in path.split(".") if p]:
        match = next((f for f in fields(node) if f.name == part), None) if is_dataclass(node) else None
        node = node_schema(match) if match is not None else None
        if node is None:
            return []
    return [f.name for f in fields(node)] if is_dataclass(node) else []


def unknown_key_message(schema: type, key: str) -> str:
    """One line for a key the schema lacks: the nearest valid keys first, then every key at that level."""
    parent, _, leaf = key.rpartition(".")
    valid = _valid_keys(schema, parent)
    near = difflib.get_close_matches(leaf, valid, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(f'{parent}.{n}' if parent else n for n in near)}?" if near else "."
    where = f" under {parent!r}" if parent else ""
    return f"unknown config key {key!r}{hint} Valid keys{where}: {', '.join(valid)}"


def parsed_overrides(argv: Sequence[str]) -> Iterator[Override]:
    """The arguments of a command line that are Hydra overrides (``key=value``, ``+key=value``, ``group=option``),
    parsed; Hydra's flags and their values are skipped."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for argument in argv:
        try:
            (override,) = parser.parse_overrides([argument])
        except OverrideParseException:
            continue
        yield override


def check_override_keys(argv: Sequence[str], schema: type, groups: Collection[str] = ()) -> None:
    """Refuse command-line overrides whose key is not in ``schema``, naming the nearest valid keys.

    Hydra would refuse them too, but only with a hint to add the key with ``+``. Arguments that are not overrides
    (Hydra's flags and their values), config-group choices (``data=msd``; ``groups`` are the top-level group names),
    Hydra's own keys and keys inside free-form nodes are left to Hydra.

    Raises:
        ConfigError: the first unknown key.
    """
    for override in parsed_overrides(argv):
        key = override.key_or_group
        if "/" in key or override.package or key.split(".")[0] in ("hydra", *groups):
            continue
        parts = key.split(".")
        for depth in range(len(parts)):  # the first segment the schema lacks; free-form nodes end the walk
            valid = _valid_keys(schema, ".".join(parts[:depth]))
            if not valid:
                break
            if parts[depth] not in valid:
                raise ConfigError(unknown_key_message(schema, ".".join(parts[:depth + 1])))


def _unknown_keys(node: DictConfig, schema: type, prefix: str = "") -> Iterator[str]:
    """The keys of ``node`` that dataclass ``schema`` lacks, depth first, as full dotted keys."""
    known = {f.name: f for f in fields(schema)}
    for key in node:
        if key not in known:
            yield f"{prefix}{key}"
            continue
        nested = node_schema(known[key])
        if nested is not None and not OmegaConf.is_missing(node, key) and isinstance(node[key], DictConfig):
            yield from _unknown_keys(node[key], nested, f"{prefix}{key}.")  # type: ignore[arg-type]


def to_typed(schema: type[Schema], cfg: Schema | Mapping[str, Any] | DictConfig, context: str = "") -> Schema:
    """``cfg`` merged onto ``schema``'s defaults and checked against its types and ranges; returns a ``schema``
    instance (``cfg`` itself when it is one, its ranges checked).

    Raises:
        ConfigError: an unknown key (with the nearest valid ones), a wrong type, a required value (``???``) left
            unset, or a number outside its key's range (:func:`check_ranges`). ``context`` (e.g. ``" for data=msd"``)
            ends the required-value message.
    """
    typed = cfg if isinstance(cfg, schema) else _merged(schema, cfg, context)
    check_ranges(typed)
    return typed


def check_ranges(typed: Any) -> None:
    """Raise :class:`ConfigError` for the first key of schema object ``typed`` whose number (or a number of whose
    list) lies outside the key's :class:`~medseg.config.Range`, naming the key, the value and the range."""
    for key, valid in value_ranges(type(typed)):
        value = _select(typed, key)
        if valid.first_outside(value) is not None:
            each = "each entry " if isinstance(value, list) else ""
            raise ConfigError(f"{key}={value_text(value)}: expected {each}{valid.text()}")


def _merged(schema: type[Schema], cfg: Mapping[str, Any] | DictConfig, context: str) -> Schema:
    """``cfg`` merged onto ``schema``'s defaults and checked against its types (:func:`to_typed`)."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))  # type: ignore[arg-type]
    unknown = next(_unknown_keys(node, schema), None)  # Hydra's "+key=value" adds keys even to a typed node
    if unknown is not None:
        raise ConfigError(unknown_key_message(schema, unknown))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(f"{missing[0]} is required{context} (set {missing[0]}=...)")
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except ConfigKeyError as err:
        raise ConfigError(unknown_key_message(schema, str(err.full_key))) from None
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} is required{context} (set {err.full_key}=...)") from None
    except ValidationError as err:
        raise ConfigError(f"{err.full_key}: {str(err.msg).splitlines()[0]}") from None


def _select(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_choices(cfg: Any, keys: Mapping[str, Sequence[str]]) -> None:
    """Raise :class:`ConfigError` for the first key of ``keys`` whose value in ``cfg`` is not a valid choice."""
    for key, choices in keys.items():
        check_choice(key, _select(cfg, key), choices)
