"""Every relative link in the user docs reaches a file of this repository (and its heading, when it names one).

Issue 27 found ``recipes/slime/README.md`` sending readers to a ``frameworks.md`` that is not in
the repository. This reads every Markdown link in ``README.md``, ``CHANGELOG.md``,
``docs/*.md``, ``packages/*/README.md`` and ``recipes/**/README.md``; links to the web are
left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("packages/*/README.md"),
        *ROOT.glob("recipes/**/README.md"),
    ]
)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def _links(doc: Path) -> list[str]:
    return [m[1] for m in _LINK.finditer(_FENCE.sub("", doc.read_text(encoding="utf-8")))]


def test_the_docs_are_read() -> None:
    assert len(DOCS) >= 15 and sum(len(_links(d)) for d in DOCS) >= 20


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for link in _links(doc):
        if re.match(r"^[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: no heading #{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


_NAMED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
#: Basenames of every Markdown file in the repository.
_IN_REPO = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts and "node_modules" not in p.parts}


@pytest.mark.parametrize(
    "doc", [d for d in DOCS if d.name != "internals.md"], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_files_named_in_prose_exist(doc: Path) -> None:
    """A ``.md`` file named in the text (``frameworks.md §1.2``) is one a reader can open; the spec's are said to be."""
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    missing = [
        m[1]
        for m in _NAMED.finditer(text)
        if Path(m[1]).name not in _IN_REPO and "spec" not in text[max(0, m.start() - 16) : m.end()]
    ]
    assert not missing, f"{doc.relative_to(ROOT)} names files that are not in the repository: {missing}"
