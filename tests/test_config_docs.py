"""The keys' meanings come from the docstrings under the schema's fields, inherited fields' from the base class that
declares them."""

from __future__ import annotations

from dataclasses import dataclass

from medseg.config import DataConfig, ranged
from medseg.config_docs import help_line, key_docs


@dataclass
class BaseSettings:
    """A base schema."""

    shared: int = ranged(1, ge=1)
    """Declared and documented in the base."""
    redeclared: str = "base"
    """The base's meaning, kept where a subclass changes the default only."""
    redocumented: bool = False
    """The base's meaning, replaced below."""


@dataclass
class DerivedSettings(BaseSettings):
    """A schema that extends the base."""

    own: str = "x"
    """Declared in the subclass."""
    redeclared: str = "derived"
    redocumented: bool = True
    """The subclass's own meaning."""


@dataclass
class MyData(DataConfig):
    """A node whose base lives in another module (medseg.config)."""

    extra: int = ranged(0, ge=0)
    """Declared in this module."""


def test_inherited_fields_take_their_docstring_from_the_class_that_declares_them() -> None:
    docs = {key: doc for key, _, _, doc in key_docs(DerivedSettings)}
    assert docs["shared"] == "Declared and documented in the base."
    assert docs["own"] == "Declared in the subclass."
    assert docs["redeclared"] == "The base's meaning, kept where a subclass changes the default only."
    assert docs["redocumented"] == "The subclass's own meaning."


def test_a_base_in_another_module_documents_its_fields() -> None:
    rows = {key: (kind, valid, doc) for key, kind, valid, doc in key_docs(MyData, "data.")}
    assert rows["data.root"] == ("str", "", "Dataset folder, the one holding dataset.json.")
    assert rows["data.num_folds"] == ("int", ">= 2", "Folds of the cross-validation split.")
    assert rows["data.extra"] == ("int", ">= 0", "Declared in this module.")
    assert list(rows)[-1] == "data.extra", "the subclass's fields follow the base's"
    assert help_line("data.extra", *rows["data.extra"]) == "  data.extra (int, >= 0): Declared in this module."
