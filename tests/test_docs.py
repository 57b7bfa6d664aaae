"""The documentation: README.md is a short front door, its links and the manual's (docs/*.md) resolve, and the
generated config reference is the schema's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from medseg.config import SCHEMAS
from medseg.config_docs import key_docs
from medseg.config_reference import reference_markdown
from tests.helpers.configs import REPO, run_script

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (whose brackets and ``#`` are no markdown)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of every heading of the markdown file ``path``, repeated headings numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            out.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return out


def relative_links(path: Path) -> list[str]:
    """The targets of the markdown links and images of ``path`` that point into the repository (no URL)."""
    targets = LINK.findall(prose(path.read_text(encoding="utf-8")))
    return [target for target in targets if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I)]


def test_slug_and_link_finding_follow_github() -> None:
    assert slug("MaSA: Manhattan self-attention (`masa`)") == "masa-manhattan-self-attention-masa"
    assert slug("Regions, an ignore label and label values with gaps") == (
        "regions-an-ignore-label-and-label-values-with-gaps")
    assert slug("Against nnU-Net v2: the same data, cases, machine and budget") == (
        "against-nnu-net-v2-the-same-data-cases-machine-and-budget")
    text = ("See [a](docs/a.md#x), ![b](img/b.png \"title\") and [web](https://example.org).\n"
            "`[not](a link)`\n```\n[not](either.md)\n```\n")
    assert LINK.findall(prose(text)) == ["docs/a.md#x", "img/b.png", "https://example.org"]


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved}")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(REPO)}")
    assert broken == [], f"{page.relative_to(REPO)}: broken links"


def test_readme_is_a_front_door_to_the_manual() -> None:
    """README.md links the manual's index, and the index links every page of the manual."""
    assert "docs/README.md" in relative_links(REPO / "README.md")
    index = {target.partition("#")[0] for target in relative_links(REPO / "docs" / "README.md")}
    pages = {path.name for path in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert pages - index == set(), "pages of docs/ that docs/README.md does not link"


def test_config_reference_is_generated_from_the_schema() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == reference_markdown(), "docs/configuration.md is stale: run python scripts/config_reference.py"


def reference_sections() -> dict[str, str]:
    """The sections of the generated reference: heading's anchor -> its text (the heading's line excluded)."""
    parts = reference_markdown().split("\n## ")[1:]
    return {slug(part.split("\n", 1)[0]): part.split("\n", 1)[1] for part in parts}


def section_rows(anchor: str, sections: dict[str, str]) -> dict[str, list[str]]:
    """The rows of the reference's section ``anchor``, after those of the node sections it links (a command's nodes;
    the node a node derives from): key -> [type, default, range, meaning]."""
    rows: dict[str, list[str]] = {}
    text = sections[anchor]
    for linked in re.findall(r"\]\(#([\w-]+)\)", text):
        rows.update(section_rows(linked, sections))
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[cells[0].strip("`")] = [cell.strip("`").replace("\\|", "|") for cell in cells[1:]]
    return rows


def reference_rows(name: str) -> dict[str, list[str]]:
    """Every key of entry point ``name`` in the generated reference, from its own section and the node sections it
    links: key -> [type, default, range, meaning]."""
    sections = reference_sections()
    (anchor,) = [anchor for anchor in sections if anchor.startswith(f"{slug(name)}-python-scripts")]
    return section_rows(anchor, sections)


def test_the_reference_describes_each_node_once_with_the_commands_that_take_it() -> None:
    sections = reference_sections()
    assert [anchor for anchor in sections if anchor.startswith("the-data-node")] == ["the-data-node"]
    assert "Taken by `train`, `plan`, `check_data`." in sections["the-data-node"]
    assert sum("`data.root`" in text for text in sections.values()) == 1
    validation = section_rows("the-inference-node-of-train", sections)
    assert validation["inference.overlap"][1] == "0.25" and reference_rows("predict")["inference.overlap"][1] == "0.5"


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_reference_tables_hold_every_key_with_the_schemas_default(name: str) -> None:
    rows = reference_rows(name)
    assert sorted(rows) == sorted(key for key, _, _, _ in key_docs(SCHEMAS[name]))
    defaults = OmegaConf.structured(SCHEMAS[name])
    for key, kind, valid, doc in key_docs(SCHEMAS[name]):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(defaults, parent) if parent else defaults
        if OmegaConf.is_missing(node, leaf):
            expected = "required"
        else:
            value = node[leaf]
            value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            expected = value if isinstance(value, str) else json.dumps(value).replace('"', "")
        assert rows[key][:3] == [kind, expected, valid], key
        assert rows[key][3] == doc.replace("|", "\\|").replace("<", "&lt;"), key


def test_the_reference_script_writes_and_checks_the_page(tmp_path: Path) -> None:
    page = tmp_path / "configuration.md"

    def reference(*args: str) -> int:
        return run_script("config_reference.py", ["--out", str(page), *args], cwd=tmp_path, timeout=120).returncode

    assert reference("--check") == 1, "no page yet"
    assert reference() == 0 and page.read_text(encoding="utf-8") == reference_markdown()
    assert reference("--check") == 0
    row = "| `trainer.lr` | `float` | `0.003` | `>= 0` |"
    assert row in page.read_text(encoding="utf-8")
    page.write_text(page.read_text(encoding="utf-8").replace(row, "| `trainer.lr` | `float` | `0.01` | `>= 0` |"))
    assert reference("--check") == 1


PEERS_INSTALL = re.compile(r"pip install [^\n`]*\.\[[^\]\n]*peers[^\]\n]*\][^\n`]*")
"""A ``pip install`` command line that installs the ``peers`` extra (nnU-Net v2, which pulls torchvision)."""
TORCH_KEPT = "\"torch==$(python -c 'import torch; print(torch.__version__)')\""
"""What such a command pins so that pip keeps the torch the user installed."""


def test_every_install_of_the_peers_extra_keeps_the_users_torch() -> None:
    """A plain ``pip install -e ".[peers]"`` lets torchvision replace the user's torch (a CPU build with the newest
    CUDA one): every command the docs' code blocks and the benchmarks' install hint give pins the installed torch."""
    from benchmarks.peers import INSTALL_HINT

    commands = [(path.name, command) for path in PAGES for match in FENCE.finditer(path.read_text(encoding="utf-8"))
                for command in PEERS_INSTALL.findall(match.group(0))] + [("benchmarks/peers.py", INSTALL_HINT)]
    assert len(commands) >= 4, "README.md, against-nnunet.md and performance.md give the command"
    unpinned = [f"{name}: {command}" for name, command in commands if TORCH_KEPT not in command]
    assert not unpinned, "\n".join(unpinned)
